package proxy_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/preforkd/preforkd/core"
	"github.com/preforkd/preforkd/engine"
	"github.com/preforkd/preforkd/internal/waitfor"
	"github.com/preforkd/preforkd/internal/wiretest"
	"github.com/preforkd/preforkd/metrics"
)

// eventsArriveOneByOne has the upstream answer req with head (its fields
// and framing: "chunked", "length" or "close") and three events, each
// written only once the client has read the one before; it fails if the
// engine holds a piece back (a buffer that waits to fill, a response held
// until it ends).
func eventsArriveOneByOne(t *testing.T, e storyEngine, c *core.Core, framing, fields, req string) {
	t.Helper()
	next := make(chan struct{})
	up := startUpstream(t, func(_ *seenRequest, w *bufio.Writer, c net.Conn) {
		ev := func(i int) string { return fmt.Sprintf("data: %d\n\n", i) }
		switch framing {
		case "chunked":
			w.WriteString("HTTP/1.1 200 OK\r\n" + fields + "Transfer-Encoding: chunked\r\n\r\n")
		case "length":
			fmt.Fprintf(w, "HTTP/1.1 200 OK\r\n%sContent-Length: %d\r\n\r\n", fields, 3*len(ev(0)))
		case "close":
			w.WriteString("HTTP/1.1 200 OK\r\n" + fields + "Connection: close\r\n\r\n")
		}
		w.Flush()
		for i := range 3 {
			if _, ok := <-next; !ok {
				c.Close() // the test failed: nothing is left hanging
				return
			}
			if framing == "chunked" {
				fmt.Fprintf(w, "%x\r\n%s\r\n", len(ev(i)), ev(i))
			} else {
				w.WriteString(ev(i))
			}
			w.Flush()
		}
		switch framing {
		case "chunked":
			w.WriteString("0\r\n\r\n")
		case "close":
			w.Flush()
			c.Close()
		}
	})
	defer close(next)
	r := e.serve(t, storyOptions{Upstream: up.URL(), Core: c})
	conn, br := dial(t, r.Addr)
	conn.SetReadDeadline(time.Now().Add(2 * time.Second))
	resp := roundTripHead(t, conn, br, req)
	events := bufio.NewReader(resp.Body)
	for i := range 3 {
		next <- struct{}{}
		conn.SetReadDeadline(time.Now().Add(2 * time.Second))
		line, err := events.ReadString('\n')
		if want := fmt.Sprintf("data: %d\n", i); line != want || err != nil {
			t.Fatalf("event %d: %q, %v; want %q on its own", i, line, err, want)
		}
		events.ReadString('\n')
	}
}

// Every engine passes each piece of a response on as the upstream sends
// it, the head first, whatever its framing, and whatever the cache or
// idempotency would keep of it (a stream the cache may store, one it may
// not, a keyed POST whose response is kept for its retries).
func TestEventsArriveOneByOne(t *testing.T) {
	t.Parallel()
	const sse = "Content-Type: text/event-stream\r\n"
	const get = "GET /events HTTP/1.1\r\nHost: a\r\n\r\n"
	cases := []struct {
		name, toml, framing, fields, req string
	}{
		{"chunked", "", "chunked", sse, get},
		{"length", "", "length", sse, get},
		{"close", "", "close", sse, get},
		{"cacheable", "[[cache]]\npath = \"/events\"\n", "chunked", sse + "Cache-Control: max-age=60\r\n", get},
		{"not cacheable", "[[cache]]\npath = \"/events\"\n", "chunked", sse + "Cache-Control: no-store\r\n", get},
		{"idempotency key", "[[idempotency]]\npath = \"/events\"\n", "chunked", sse,
			"POST /events HTTP/1.1\r\nHost: a\r\nIdempotency-Key: \"k\"\r\nContent-Length: 2\r\n\r\nhi"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			eachEngine(t, withNetHTTP(), func(t *testing.T, e storyEngine) {
				eventsArriveOneByOne(t, e, configCore(t, tc.toml, nil), tc.framing, tc.fields, tc.req)
			})
		})
	}
}

// A stream under a cache block that will not be stored (its head says
// no-store, or it is a stream, which is passed through and never stored
// whatever its Cache-Control) does not hold the key's fill lock until it
// ends: a second subscriber's request goes upstream while the first
// stream lives, not after lock_timeout.
func TestUnstoredStreamHoldsNoFill(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, fields string }{
		{"no-store", "Content-Type: text/plain\r\nCache-Control: no-store\r\n"},
		{"events max-age", "Content-Type: text/event-stream; charset=utf-8\r\nCache-Control: max-age=60\r\n"},
		{"X-Accel-Buffering", "Content-Type: text/plain\r\nX-Accel-Buffering: no\r\nCache-Control: max-age=60\r\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			eachEngine(t, withNetHTTP(), func(t *testing.T, e storyEngine) {
				up, stop := liveStream(t, tc.fields, nil)
				c := configCore(t, "[[cache]]\npath = \"/events\"\nlock_timeout = \"60s\"\n", nil)
				r := e.serve(t, storyOptions{Upstream: up.URL(), Core: c})
				t.Cleanup(stop) // before the engine stops
				for i := range 2 {
					subscribe(t, r.Addr, fmt.Sprintf("subscriber %d", i))
				}
			})
		})
	}
}

// liveStream is an upstream whose response, with fields, is one event
// and then nothing, until the proxy closes the connection (its read's
// result goes to gone, when not nil) or stop is called.
func liveStream(t *testing.T, fields string, gone chan<- error) (up *rawUpstream, stop func()) {
	return liveStreamOf(t, fields, "data: 0\n\n", gone)
}

// liveStreamOf is liveStream with first as its first chunk.
func liveStreamOf(t *testing.T, fields, first string, gone chan<- error) (up *rawUpstream, stop func()) {
	stopped := make(chan struct{})
	up = startUpstream(t, func(_ *seenRequest, w *bufio.Writer, c net.Conn) {
		go func() { <-stopped; c.Close() }()
		fmt.Fprintf(w, "HTTP/1.1 200 OK\r\n%sTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n", fields, len(first), first)
		w.Flush()
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err := c.Read(make([]byte, 1))
		if gone != nil {
			gone <- err
		}
	})
	return up, sync.OnceFunc(func() { close(stopped) })
}

// subscribe asks addr for /events and reads its head and first event.
func subscribe(t *testing.T, addr, who string) net.Conn {
	t.Helper()
	conn, br := dial(t, addr)
	conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	resp := roundTripHead(t, conn, br, "GET /events HTTP/1.1\r\nHost: a\r\n\r\n")
	if line, err := bufio.NewReader(resp.Body).ReadString('\n'); line != "data: 0\n" {
		t.Fatalf("%s: first event %q, %v", who, line, err)
	}
	return conn
}

// The loop and net/http: a client that goes away mid-stream, while the
// upstream has nothing to send (an event stream between two events), has
// the upstream's connection closed at once, as nginx closes it, not at
// the next event or after upstream_timeout; so has one under a cache
// block whose stream will not be stored (nothing is read on for it).
// (fasthttp does not watch a connection while the upstream answers:
// README says so.)
func TestClientGoneMidStreamCutsTheUpstream(t *testing.T) {
	t.Parallel()
	for _, toml := range []string{"", "[[cache]]\npath = \"/events\"\n"} {
		t.Run(fmt.Sprintf("cache=%v", toml != ""), func(t *testing.T) {
			t.Parallel()
			eachEngine(t, watchingEngines(), func(t *testing.T, e storyEngine) {
				gone := make(chan error, 1)
				up, stop := liveStream(t, "Content-Type: text/event-stream\r\n", gone)
				lines := make(chan core.AccessEntry, 1)
				c := configCoreWith(t, toml, func(o *core.Options) {
					o.AccessLog = accessFunc(func(e *core.AccessEntry) { lines <- *e })
				})
				r := e.serve(t, storyOptions{Upstream: up.URL(), Core: c})
				t.Cleanup(stop) // before the engine stops
				conn := subscribe(t, r.Addr, "the subscriber")
				conn.(*net.TCPConn).SetLinger(0) // a reset
				conn.Close()
				if err := <-gone; err == nil || strings.Contains(err.Error(), "timeout") {
					t.Errorf("the upstream's connection: %v, want it closed", err)
				}
				select {
				case l := <-lines:
					if l.Status != 200 || l.Bytes != 9 {
						t.Errorf("logged %d with %d bytes, want 200 with the 9 sent", l.Status, l.Bytes)
					}
				case <-time.After(5 * time.Second):
					t.Error("not logged")
				}
			})
		})
	}
}

// A cacheable response of unknown length that outgrows its block's
// max_body lets the key's fill lock go then, not when it ends (it may
// never): a second request goes upstream at once, not after
// lock_timeout.
func TestOutgrownFillLetsItsLockGo(t *testing.T) {
	t.Parallel()
	eachEngine(t, withNetHTTP(), func(t *testing.T, e storyEngine) {
		big := strings.Repeat("x", 2000) + "\n"
		up, stop := liveStreamOf(t, "Content-Type: text/plain\r\nCache-Control: max-age=60\r\n", big, nil)
		c := configCore(t, "[[cache]]\npath = \"/events\"\nmax_body = \"1KiB\"\nlock_timeout = \"60s\"\n", nil)
		r := e.serve(t, storyOptions{Upstream: up.URL(), Core: c})
		t.Cleanup(stop) // before the engine stops
		for i := range 2 {
			conn, br := dial(t, r.Addr)
			conn.SetReadDeadline(time.Now().Add(5 * time.Second))
			resp := roundTripHead(t, conn, br, "GET /events HTTP/1.1\r\nHost: a\r\n\r\n")
			if line, err := bufio.NewReader(resp.Body).ReadString('\n'); line != big {
				t.Fatalf("request %d: %d bytes, %v", i, len(line), err)
			}
		}
	})
}

// upstream_timeout is the longest wait between two reads of a body, not a
// bound on the whole response: a stream whose events come closer together
// lives past it, and one that stops for longer is cut (the client's
// connection ends short of the body's end).
func TestUpstreamTimeoutIsBetweenReads(t *testing.T) {
	t.Parallel()
	const timeout = 400 * time.Millisecond
	eachEngine(t, withNetHTTP(), func(t *testing.T, e storyEngine) {
		t.Run("events within it", func(t *testing.T) {
			next := make(chan struct{})
			up := eventsUpstream(t, next)
			go func() {
				defer close(next)
				for range 8 { // twice the timeout in all
					time.Sleep(timeout / 4)
					next <- struct{}{}
				}
			}()
			r := e.serve(t, storyOptions{Upstream: up.URL(), Client: engine.Upstream{Timeout: timeout}})
			c, br := dial(t, r.Addr)
			resp, body := roundTrip(t, c, br, "GET /events HTTP/1.1\r\nHost: a\r\n\r\n")
			if resp.StatusCode != 200 || strings.Count(string(body), "data: x") != 8 {
				t.Errorf("status %d, body %q: want the 8 events", resp.StatusCode, body)
			}
		})
		t.Run("a silence past it", func(t *testing.T) {
			gone := make(chan error, 1)
			up, stop := liveStream(t, "Content-Type: text/event-stream\r\n", gone)
			c, region := configCoreIn(t, "", func(*core.Options) {})
			r := e.serve(t, storyOptions{Upstream: up.URL(), Core: c, Client: engine.Upstream{Timeout: timeout}})
			t.Cleanup(stop)
			conn := subscribe(t, r.Addr, "the subscriber")
			conn.SetReadDeadline(time.Now().Add(5 * time.Second))
			if _, err := io.ReadAll(conn); err != nil {
				t.Errorf("the client's connection: %v, want it closed", err)
			}
			if err := <-gone; err == nil || strings.Contains(err.Error(), "timeout") {
				t.Errorf("the upstream's connection: %v, want it closed", err)
			}
			if !waitfor.Cond(5*time.Second, func() bool { return metrics.Total(region, metrics.UpstreamErrors, metrics.UpstreamBroken) == 1 }) {
				t.Error("not counted as a broken upstream response")
			}
		})
	})
}

// A long stream is logged once, when it ends, with every byte sent and
// its whole duration (at least as long as the upstream held it open).
func TestLongStreamLogged(t *testing.T) {
	t.Parallel()
	eachEngine(t, withNetHTTP(), func(t *testing.T, e storyEngine) {
		next := make(chan struct{})
		up := eventsUpstream(t, next)
		lines := make(chan core.AccessEntry, 2)
		c := configCoreWith(t, "", func(o *core.Options) {
			o.AccessLog = accessFunc(func(e *core.AccessEntry) { lines <- *e })
		})
		r := e.serve(t, storyOptions{Upstream: up.URL(), Core: c})
		conn, br := dial(t, r.Addr)
		resp := roundTripHead(t, conn, br, "GET /events HTTP/1.1\r\nHost: a\r\n\r\n")
		// The exchange began before the client had the head, and ends
		// after the upstream took the last event's signal: it lasts at
		// least from began to then. (Not to when the client read the last
		// event: an engine ends the exchange as the end of the body is
		// queued, which can be a moment before the client reads it.)
		began, streamed := time.Now(), make(chan time.Duration, 1)
		go func() {
			defer close(next)
			for range 4 {
				time.Sleep(100 * time.Millisecond)
				next <- struct{}{}
			}
			streamed <- time.Since(began)
		}()
		events := bufio.NewReader(resp.Body)
		for range 4 {
			events.ReadString('\n')
			events.ReadString('\n')
		}
		rest, err := io.ReadAll(events)
		if len(rest) != 0 || err != nil {
			t.Errorf("after the events: %q, %v", rest, err)
		}
		held := <-streamed
		select {
		case l := <-lines:
			if l.Status != 200 || l.Bytes != 36 || l.Duration < held {
				t.Errorf("logged %d, %d bytes in %v; want 200, the 36 sent, in at least the %v the upstream held the stream", l.Status, l.Bytes, l.Duration, held)
			}
		case <-time.After(5 * time.Second):
			t.Error("not logged")
		}
		if len(lines) != 0 {
			t.Error("logged twice")
		}
	})
}

// eventsUpstream answers with an event stream that sends an event each
// time next gives one, and ends when next is closed.
func eventsUpstream(t *testing.T, next <-chan struct{}) *wiretest.Upstream {
	t.Helper()
	return startUpstream(t, func(_ *seenRequest, w *bufio.Writer, _ net.Conn) {
		w.WriteString("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
		w.Flush()
		for range next {
			w.WriteString("9\r\ndata: x\n\n\r\n")
			w.Flush()
		}
		w.WriteString("0\r\n\r\n")
	})
}
