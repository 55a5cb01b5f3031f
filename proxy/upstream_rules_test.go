package proxy_test

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/preforkd/preforkd/core"
	"github.com/preforkd/preforkd/internal/waitfor"
	"github.com/preforkd/preforkd/metrics"
	"github.com/preforkd/preforkd/shm"
)

// TestHigherMinorResponseReused: a response whose status line says a
// higher minor version than 1 (HTTP/1.2) is read as HTTP/1.1 (RFC 9112
// §2.3): its chunked framing is chunked, and its connection carries the
// next request, on every engine.
func TestHigherMinorResponseReused(t *testing.T) {
	t.Parallel()
	for _, reply := range []string{
		"HTTP/1.2 200 OK\r\nContent-Length: 5\r\n\r\nhello",
		"HTTP/1.2 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
	} {
		eachEngine(t, withNetHTTP(), func(t *testing.T, e storyEngine) {
			const want = `client [200 "hello" whole 200 "second" whole]; upstream connections 1`
			if got := relayOnce(t, e, reply); got != want {
				t.Errorf("%q: %s, want %s", reply, got, want)
			}
		})
	}
}

// TestInvalidSwitchRefused: a 101 is a tunnel only to a request that
// asked for an upgrade, and only when it says the protocol it switches
// to (RFC 9110 §15.2.2: Upgrade is a MUST in a 101), one the request
// asked for (§7.8: a server MUST NOT switch to another; h2c, which the
// engines never ask for, would carry HTTP/2 requests past the core).
// Else it is an invalid response, on every engine: 502 with the problem
// body, the upstream connection closed, counted as a response failure.
func TestInvalidSwitchRefused(t *testing.T) {
	t.Parallel()
	const asks = "GET /ws HTTP/1.1\r\nHost: a\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n"
	for _, tc := range []struct{ send, reply string }{
		{asks, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\n\r\n"},
		{asks, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade:\r\n\r\n"},
		{asks, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\n"},
		{asks, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket, h2c\r\n\r\n"},
		{"GET /ws HTTP/1.1\r\nHost: a\r\n\r\n", "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n"},
	} {
		eachEngine(t, withNetHTTP(), func(t *testing.T, e storyEngine) {
			closed := make(chan error, 1)
			up := startUpstream(t, func(req *seenRequest, w *bufio.Writer, c net.Conn) {
				w.WriteString(tc.reply)
				w.Flush()
				c.SetReadDeadline(time.Now().Add(5 * time.Second))
				_, err := c.Read(make([]byte, 1))
				closed <- err
			})
			c, region := configCoreIn(t, "", func(*core.Options) {})
			r := e.serve(t, storyOptions{Upstream: up.URL(), Core: c})
			conn, br := dial(t, r.Addr)
			conn.SetDeadline(time.Now().Add(10 * time.Second))
			io.WriteString(conn, tc.send)
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatalf("%q: %v", tc.reply, err)
			}
			body, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != 502 || resp.Header.Get("Content-Type") != "application/problem+json" {
				t.Errorf("%q: %d %q %s, want a 502 problem", tc.reply, resp.StatusCode, resp.Header.Get("Content-Type"), body)
			}
			if err := <-closed; err != io.EOF {
				t.Errorf("%q: the upstream connection: %v, want it closed", tc.reply, err)
			}
			if n := metrics.Total(region, metrics.UpstreamErrors, metrics.UpstreamResponse); n != 1 {
				t.Errorf("%q: %d response failures counted, want 1", tc.reply, n)
			}
		})
	}
}

// TestStrayBytesCounted: bytes an upstream sends past the end of a
// response, with it or on the idle connection after it, close its
// connection and are counted as a response failure on every engine,
// while the client, which got the whole response, gets it as sent and
// keeps its connection.
func TestStrayBytesCounted(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ reply, late string }{
		{"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhelloEXTRA", ""},
		{"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\nEXTRA", ""},
		{"HTTP/1.1 204 No Content\r\n\r\nEXTRA", ""},
		{"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello", "EXTRA"},
	} {
		eachEngine(t, withNetHTTP(), func(t *testing.T, e storyEngine) {
			up := startUpstream(t, func(req *seenRequest, w *bufio.Writer, c net.Conn) {
				if req.Line != "GET /first HTTP/1.1" {
					w.WriteString("HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nsecond")
					return
				}
				w.WriteString(tc.reply)
				if tc.late != "" {
					w.Flush()
					time.Sleep(20 * time.Millisecond)
					w.WriteString(tc.late)
				}
			})
			c, region := configCoreIn(t, "", func(*core.Options) {})
			r := e.serve(t, storyOptions{Upstream: up.URL(), Core: c})
			conn, br := dial(t, r.Addr)
			conn.SetDeadline(time.Now().Add(10 * time.Second))
			var got []string
			for i, path := range []string{"/first", "/second"} {
				if i > 0 {
					time.Sleep(100 * time.Millisecond) // late bytes have come
				}
				io.WriteString(conn, "GET "+path+" HTTP/1.1\r\nHost: a\r\n\r\n")
				resp, err := http.ReadResponse(br, nil)
				if err != nil {
					t.Fatalf("%q: %s: %v", tc.reply, path, err)
				}
				body, err := io.ReadAll(resp.Body)
				if err != nil || resp.Close {
					t.Errorf("%q: %s: %v, close %v: want it whole and the connection kept", tc.reply, path, err, resp.Close)
				}
				got = append(got, resp.Status[:3]+" "+string(body))
			}
			want := "200 hello, 200 second"
			if strings.HasPrefix(tc.reply, "HTTP/1.1 204") {
				want = "204 , 200 second"
			}
			if g := strings.Join(got, ", "); g != want {
				t.Errorf("%q: the client got %s, want %s", tc.reply, g, want)
			}
			if seen := up.Requests(); len(seen) != 2 || seen[1].Conn != 2 {
				t.Errorf("%q: the second request went on the same upstream connection", tc.reply)
			}
			if n := metrics.Total(region, metrics.UpstreamErrors, metrics.UpstreamResponse); n != 1 {
				t.Errorf("%q: %d response failures counted, want 1", tc.reply, n)
			}
		})
	}
}

// TestStrayBytesAfterA304RefreshNothing: a 304 to the cache's
// revalidation followed by bytes (a body a 304 cannot have) is not
// trusted, as a 200 followed by more than its length is not, on every
// engine: the client gets the stored response it revalidated, but the
// 304's fields are not stored, the entry stays stale (the next request
// revalidates again), and the bytes are counted as a response failure.
// The 304 refreshed the entry all the same: the stray bytes went
// unseen with the connection, which a replaced response closes.
func TestStrayBytesAfterA304RefreshNothing(t *testing.T) {
	t.Parallel()
	eachEngine(t, withNetHTTP(), func(t *testing.T, e storyEngine) {
		get, region := serveStray304(t, e, "max-age=1")
		if got := get(); got != "MISS v1 " {
			t.Fatalf("first: %q", got)
		}
		if got := get(); !strings.HasPrefix(got, "REVALIDATED v1 ") {
			t.Errorf("revalidated: %q, want the stored body", got)
		}
		if got := get(); got != "REVALIDATED v1 " {
			t.Errorf("after a 304 with stray bytes: %q; want the entry revalidated again, unchanged", got)
		}
		if n := metrics.Total(region, metrics.UpstreamErrors, metrics.UpstreamResponse); n != 1 {
			t.Errorf("%d response failures counted, want 1", n)
		}
	})
}

// TestStrayBytesAfterA304RefreshNothingInTheBackground: the same 304,
// to the background refresh of a response served stale, refreshes
// nothing either: the entry is still stale, served so and refreshed
// again, on every engine.
func TestStrayBytesAfterA304RefreshNothingInTheBackground(t *testing.T) {
	t.Parallel()
	eachEngine(t, withNetHTTP(), func(t *testing.T, e storyEngine) {
		get, region := serveStray304(t, e, "max-age=1, stale-while-revalidate=600")
		get()
		if got := get(); got != "STALE v1 " {
			t.Fatalf("stale: %q", got)
		}
		// The refresh ends after its 304: its fill is not stored.
		if !waitfor.Cond(5*time.Second, func() bool { return metrics.Total(region, metrics.CacheFills, metrics.CacheNotStored) == 1 }) {
			t.Fatalf("the background refresh did not end with nothing stored: %q", get())
		}
		if got := get(); got != "STALE v1 " {
			t.Errorf("after a background 304 with stray bytes: %q, want the entry served stale again, unchanged", got)
		}
	})
}

// serveStray304 serves, through a cache, /r: first a 200 whose
// Cache-Control is cc, then a 304 followed by stray bytes (and a field
// X-New), then clean 304s. Each get is a request on a connection of its
// own, 5 s after the one before, and says the response's X-Cache, body
// and X-New.
func serveStray304(t *testing.T, e storyEngine, cc string) (get func() string, region *shm.Region) {
	var n atomic.Int32
	up := startUpstream(t, func(req *seenRequest, w *bufio.Writer, c net.Conn) {
		switch n.Add(1) {
		case 1:
			w.WriteString("HTTP/1.1 200 OK\r\nETag: \"x\"\r\nCache-Control: " + cc + "\r\nContent-Length: 2\r\n\r\nv1")
		case 2:
			w.WriteString("HTTP/1.1 304 Not Modified\r\nETag: \"x\"\r\nCache-Control: max-age=600\r\nX-New: stray\r\n\r\nEXTRA")
		default:
			w.WriteString("HTTP/1.1 304 Not Modified\r\nETag: \"x\"\r\nCache-Control: max-age=600\r\n\r\n")
		}
	})
	var clock atomic.Int64
	c, region := configCoreIn(t, "[table]\nresponses = 64\nresponse_bytes = \"256KiB\"\n[[cache]]\npath = \"/*\"\nmax_body = \"64KiB\"\n",
		func(o *core.Options) { o.Now = func() time.Duration { return time.Hour + time.Duration(clock.Load()) } })
	r := e.serve(t, storyOptions{Upstream: up.URL(), Core: c})
	return func() string {
		defer clock.Add(int64(5 * time.Second))
		conn, br := dial(t, r.Addr)
		defer conn.Close()
		resp, body := roundTrip(t, conn, br, "GET /r HTTP/1.1\r\nHost: a\r\n\r\n")
		return resp.Header.Get("X-Cache") + " " + string(body) + " " + resp.Header.Get("X-New")
	}, region
}
