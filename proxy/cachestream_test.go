package proxy_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/preforkd/preforkd/core"
	"github.com/preforkd/preforkd/engine"
	"github.com/preforkd/preforkd/internal/waitfor"
	"github.com/preforkd/preforkd/internal/wiretest"
	"github.com/preforkd/preforkd/metrics"
	"github.com/preforkd/preforkd/shm"
)

// A large cached body is sent from the shared memory as the client reads
// it: a worker holds a chunk of it per connection, never the whole, and an
// entry that changes while it is sent cuts the connection (a short body),
// never sends other bytes.

// bigCacheCore is a core with one cache block over every path that stores
// bodies of up to 8 MiB, in a block pool of poolMiB MiB.
func bigCacheCore(t *testing.T, poolMiB int) *core.Core {
	t.Helper()
	return configCore(t, fmt.Sprintf("[table]\ncounters = 64\nresponses = 64\nresponse_bytes = \"%dMiB\"\n[[cache]]\npath = \"/*\"\nmax_body = \"8MiB\"\n", poolMiB), nil)
}

// bigBody is the pattern body of size bytes that path's upstream sends.
func bigBody(path string, size int) []byte {
	b, _ := io.ReadAll(wiretest.Pattern(int64(size)))
	for i := range b {
		b[i] ^= path[len(path)-1] // one path's bytes are not another's
	}
	return b
}

// bigUpstream answers each path with its bigBody of size bytes, cacheable.
func bigUpstream(t *testing.T, size int) *wiretest.Upstream {
	return startUpstream(t, func(req *seenRequest, w *bufio.Writer, c net.Conn) {
		body := bigBody(req.Req.URL.Path, size)
		fmt.Fprintf(w, "HTTP/1.1 200 OK\r\nCache-Control: max-age=600\r\nContent-Length: %d\r\n\r\n", len(body))
		w.Write(body)
	})
}

// dialSlow connects to addr with a small receive buffer, so that what the
// kernel takes of a response it does not read stays small.
func dialSlow(t *testing.T, addr string) (net.Conn, *bufio.Reader) {
	t.Helper()
	d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		return rc.Control(func(fd uintptr) {
			syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 8<<10)
		})
	}}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(20 * time.Second))
	return c, bufio.NewReaderSize(c, 4<<10)
}

// fill fetches path once (a miss that stores it), checks its body, and
// waits until it is stored.
func fill(t *testing.T, addr, path string, want []byte) {
	t.Helper()
	c, br := dial(t, addr)
	defer c.Close()
	resp, body := roundTrip(t, c, br, "GET "+path+" HTTP/1.1\r\nHost: a\r\n\r\n")
	if resp.StatusCode != 200 || !bytes.Equal(body, want) {
		t.Fatalf("GET %s: %d, %d bytes (X-Cache %s), want 200 and its %d bytes", path, resp.StatusCode, len(body), resp.Header.Get("X-Cache"), len(want))
	}
	// Stored once the fill's exchange ended, which may be after its
	// client read the body.
	if !waitfor.Cond(5*time.Second, func() bool {
		resp, _ := roundTrip(t, c, br, "HEAD "+path+" HTTP/1.1\r\nHost: a\r\n\r\n")
		return resp.Header.Get("X-Cache") == "HIT"
	}) {
		t.Fatalf("%s was not stored", path)
	}
}

// Twenty clients that ask for a 6 MiB cached body and read nothing: the
// heap grows by a chunk or so each, not by the body each (a worker's
// memory was max_body × connections).
func TestCacheHitToSlowClientsIsBounded(t *testing.T) {
	// Not parallel: it measures the process's heap.
	for _, e := range withNetHTTP() {
		t.Run(e.name, func(t *testing.T) {
			const size, clients = 6 << 20, 20
			up := bigUpstream(t, size)
			r := e.serve(t, storyOptions{Upstream: up.URL(), Core: bigCacheCore(t, 16)})
			fill(t, r.Addr, "/big", bigBody("/big", size))
			runtime.GC()
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			var conns []net.Conn
			for range clients {
				c, br := dialSlow(t, r.Addr)
				io.WriteString(c, "GET /big HTTP/1.1\r\nHost: a\r\n\r\n")
				conns = append(conns, c)
				_ = br
			}
			time.Sleep(1500 * time.Millisecond)
			runtime.ReadMemStats(&after)
			for _, c := range conns {
				c.Close()
			}
			grew := int64(after.HeapInuse) - int64(before.HeapInuse)
			t.Logf("heap in use grew by %d KiB for %d clients reading nothing of a %d MiB hit", grew>>10, clients, size>>20)
			if grew > 16<<20 {
				t.Errorf("the heap grew by %d MiB for %d clients that read nothing of a %d MiB hit: the body is held per connection", grew>>20, clients, size>>20)
			}
		})
	}
}

// A large hit, and a range of it, arrive byte for byte; so does a HEAD's
// length.
func TestCacheLargeHitIsExact(t *testing.T) {
	t.Parallel()
	eachEngine(t, withNetHTTP(), func(t *testing.T, e storyEngine) {
		const size = 3<<20 + 12345
		up := bigUpstream(t, size)
		r := e.serve(t, storyOptions{Upstream: up.URL(), Core: bigCacheCore(t, 8)})
		want := bigBody("/x", size)
		fill(t, r.Addr, "/x", want)
		c, br := dial(t, r.Addr)
		resp, body := roundTrip(t, c, br, "GET /x HTTP/1.1\r\nHost: a\r\n\r\n")
		if resp.StatusCode != 200 || resp.Header.Get("X-Cache") != "HIT" || !bytes.Equal(body, want) {
			t.Fatalf("hit: %d %s, %d bytes, equal %v", resp.StatusCode, resp.Header.Get("X-Cache"), len(body), bytes.Equal(body, want))
		}
		for _, rg := range []struct {
			spec     string
			from, to int
		}{
			{"bytes=5-70000", 5, 70001},
			{"bytes=1000000-", 1000000, size},
			{"bytes=-100", size - 100, size},
			{"bytes=65530-65545", 65530, 65546},
		} {
			resp, body := roundTrip(t, c, br, "GET /x HTTP/1.1\r\nHost: a\r\nRange: "+rg.spec+"\r\n\r\n")
			wantCR := fmt.Sprintf("bytes %d-%d/%d", rg.from, rg.to-1, size)
			if resp.StatusCode != 206 || resp.Header.Get("Content-Range") != wantCR || !bytes.Equal(body, want[rg.from:rg.to]) {
				t.Errorf("%s: %d %q, %d bytes, equal %v", rg.spec, resp.StatusCode, resp.Header.Get("Content-Range"), len(body), bytes.Equal(body, want[rg.from:rg.to]))
			}
		}
		resp, body = roundTrip(t, c, br, "HEAD /x HTTP/1.1\r\nHost: a\r\n\r\n")
		if resp.StatusCode != 200 || resp.ContentLength != size || len(body) != 0 {
			t.Errorf("HEAD: %d, length %d, %d bytes", resp.StatusCode, resp.ContentLength, len(body))
		}
		// The connection goes on after them.
		resp, body = roundTrip(t, c, br, "GET /x HTTP/1.1\r\nHost: a\r\n\r\n")
		if resp.StatusCode != 200 || !bytes.Equal(body, want) {
			t.Errorf("hit again: %d, %d bytes", resp.StatusCode, len(body))
		}
	})
}

// An entry evicted while a slow client is in the middle of its body (its
// blocks taken by another entry's fill, as a refresh replaces one) does
// not change what that client gets: the whole entry as it was when its
// body began, from the worker's copy, as nginx's readers of a replaced
// cache file go on reading the file they opened.
func TestCacheEntryEvictedMidBodyIsSentWhole(t *testing.T) {
	t.Parallel()
	eachEngine(t, withNetHTTP(), func(t *testing.T, e storyEngine) {
		const size = 5 << 20
		up := bigUpstream(t, size)
		// Room for one entry: the second's fill evicts the first.
		r := e.serve(t, storyOptions{Upstream: up.URL(), Core: bigCacheCore(t, 8)})
		want := bigBody("/a", size)
		fill(t, r.Addr, "/a", want)
		c, br := dialSlow(t, r.Addr)
		io.WriteString(c, "GET /a HTTP/1.1\r\nHost: a\r\n\r\n")
		resp := readHead(t, br, "GET")
		if resp.StatusCode != 200 || resp.Header.Get("X-Cache") != "HIT" {
			t.Fatalf("hit: %d %s", resp.StatusCode, resp.Header.Get("X-Cache"))
		}
		got := make([]byte, 64<<10)
		if _, err := io.ReadFull(resp.Body, got); err != nil {
			t.Fatal(err)
		}
		fill(t, r.Addr, "/b", bigBody("/b", size)) // takes /a's blocks
		rest, err := io.ReadAll(resp.Body)
		got = append(got, rest...)
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("%d bytes (%v), the entry's whole %v: want it whole, as it was", len(got), err, bytes.Equal(got, want))
		}
	})
}

// A large stale entry that the application confirms (304) is served
// whole and stored again whole: the fill that revalidates it reads its
// body, which a hit streams.
func TestCacheLargeEntryRevalidated(t *testing.T) {
	t.Parallel()
	eachEngine(t, withNetHTTP(), func(t *testing.T, e storyEngine) {
		const size = 1<<20 + 3
		want := bigBody("/v", size)
		up := startUpstream(t, func(req *seenRequest, w *bufio.Writer, c net.Conn) {
			if len(req.Field("If-None-Match")) > 0 {
				w.WriteString("HTTP/1.1 304 Not Modified\r\nETag: \"v1\"\r\nCache-Control: max-age=60\r\n\r\n")
				return
			}
			fmt.Fprintf(w, "HTTP/1.1 200 OK\r\nETag: \"v1\"\r\nCache-Control: max-age=60\r\nContent-Length: %d\r\n\r\n", size)
			w.Write(want)
		})
		var clock atomic.Int64
		c := configCore(t, "[table]\ncounters = 64\nresponses = 64\nresponse_bytes = \"8MiB\"\n[[cache]]\npath = \"/*\"\nmax_body = \"8MiB\"\n",
			func() time.Duration { return time.Hour + time.Duration(clock.Load()) })
		r := e.serve(t, storyOptions{Upstream: up.URL(), Core: c})
		fill(t, r.Addr, "/v", want)
		clock.Add(int64(2 * time.Minute))
		for _, x := range []string{"REVALIDATED", "HIT"} {
			conn, br := dial(t, r.Addr)
			resp, body := roundTrip(t, conn, br, "GET /v HTTP/1.1\r\nHost: a\r\n\r\n")
			if resp.StatusCode != 200 || resp.Header.Get("X-Cache") != x || !bytes.Equal(body, want) {
				t.Errorf("want %s: %d %s, %d bytes, equal %v", x, resp.StatusCode, resp.Header.Get("X-Cache"), len(body), bytes.Equal(body, want))
			}
			conn.Close()
		}
	})
}

// bigCacheCoreLogged is bigCacheCore logging each request's access entry
// to lines, and the region it counts in. With sentAtLog, it also sends
// there preforkd_cache_sent_bytes_total as it was when each entry was
// logged, for each GET.
func bigCacheCoreLogged(t *testing.T, poolMiB int, lines chan<- core.AccessEntry, sentAtLog chan<- uint64) (*core.Core, *shm.Region) {
	t.Helper()
	var region *shm.Region // set before any request runs
	c, region := configCoreIn(t, fmt.Sprintf("[table]\ncounters = 64\nresponses = 64\nresponse_bytes = \"%dMiB\"\n[[cache]]\npath = \"/*\"\nmax_body = \"8MiB\"\n", poolMiB),
		func(o *core.Options) {
			o.AccessLog = accessFunc(func(e *core.AccessEntry) {
				if sentAtLog != nil && e.Method == "GET" {
					sentAtLog <- metrics.Total(region, metrics.CacheSentBytes, 0)
				}
				c := *e // its strings are the request's memory, reused after
				c.Method, c.Path = strings.Clone(e.Method), strings.Clone(e.Path)
				lines <- c
			})
		})
	return c, region
}

// nextEntry is the next access entry for path.
func nextEntry(t *testing.T, lines <-chan core.AccessEntry, path string) core.AccessEntry {
	t.Helper()
	for {
		select {
		case e := <-lines:
			if e.Path == path && e.Method == "GET" {
				return e
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("no access entry for GET %s", path)
		}
	}
}

// A large hit's access entry and preforkd_cache_sent_bytes_total say the
// bytes of the body that went, all of them when it was sent whole; one
// whose client went away mid-body is logged and counted with what went
// of it, not with the whole body.
func TestCacheLargeHitBytesLoggedAndCounted(t *testing.T) {
	t.Parallel()
	eachEngine(t, withNetHTTP(), func(t *testing.T, e storyEngine) {
		const size = 5 << 20
		up := bigUpstream(t, size)
		lines := make(chan core.AccessEntry, 64)
		sentAtLog := make(chan uint64, 64)
		c, region := bigCacheCoreLogged(t, 8, lines, sentAtLog)
		r := e.serve(t, storyOptions{Upstream: up.URL(), Core: c})
		want := bigBody("/a", size)
		fill(t, r.Addr, "/a", want)
		nextEntry(t, lines, "/a") // the fill's
		<-sentAtLog
		sentBefore := metrics.Total(region, metrics.CacheSentBytes, 0)

		conn, br := dial(t, r.Addr)
		resp, body := roundTrip(t, conn, br, "GET /a HTTP/1.1\r\nHost: a\r\n\r\n")
		if resp.StatusCode != 200 || resp.Header.Get("X-Cache") != "HIT" || !bytes.Equal(body, want) {
			t.Fatalf("hit: %d %s, %d bytes", resp.StatusCode, resp.Header.Get("X-Cache"), len(body))
		}
		if got := nextEntry(t, lines, "/a"); got.Status != 200 || got.Bytes != size {
			t.Errorf("a whole hit logged as %d with %d bytes, want 200 with %d", got.Status, got.Bytes, size)
		}
		// Counted before it is logged: a page scraped once the line is
		// written has it.
		if sent := <-sentAtLog - sentBefore; sent != size {
			t.Errorf("a whole hit counted %d bytes sent from the cache when logged, want %d", sent, size)
		}
		conn.Close()

		sentBefore = metrics.Total(region, metrics.CacheSentBytes, 0)
		slow, sbr := dialSlow(t, r.Addr)
		io.WriteString(slow, "GET /a HTTP/1.1\r\nHost: a\r\n\r\n")
		resp = readHead(t, sbr, "GET")
		if _, err := io.ReadFull(resp.Body, make([]byte, 64<<10)); err != nil {
			t.Fatal(err)
		}
		slow.Close() // gone mid-body
		cut := nextEntry(t, lines, "/a")
		if cut.Bytes <= 0 || cut.Bytes >= size {
			t.Errorf("a hit cut short logged as %d with %d bytes, want some of the %d bytes and not all", cut.Status, cut.Bytes, size)
		}
		if sent := <-sentAtLog - sentBefore; sent == 0 || sent >= size {
			t.Errorf("a hit cut short counted %d bytes sent from the cache when logged, want some of the %d bytes and not all", sent, size)
		}
		if n := metrics.Total(region, metrics.CacheCutSends, 0); n != 0 {
			t.Errorf("preforkd_cache_cut_sends_total %d, want 0: the entry did not change", n)
		}
	})
}

// A large hit's exchange ends once, whatever ends its body: a client
// that resets the connection mid-body, one that reads nothing past
// send_timeout, a request pipelined behind it (answered after it, whole),
// and a drain that outlasts its deadline with one still being sent. Each
// is logged once, and the server serves on after each.
func TestCacheLargeHitEndsOnce(t *testing.T) {
	t.Parallel()
	eachEngine(t, withNetHTTP(), func(t *testing.T, e storyEngine) {
		const size = 7 << 20 // more than the kernel's buffers take of it
		up := bigUpstream(t, size)
		lines := make(chan core.AccessEntry, 64)
		c, _ := bigCacheCoreLogged(t, 16, lines, nil)
		r := e.serve(t, storyOptions{Upstream: up.URL(), Core: c, Limits: engine.Limits{SendTimeout: time.Second}})
		want := bigBody("/a", size)
		fill(t, r.Addr, "/a", want)
		nextEntry(t, lines, "/a")
		noMore := func(what string) {
			t.Helper()
			select {
			case e := <-lines:
				if e.Method == "GET" {
					t.Errorf("%s: another entry, %s %s %d", what, e.Method, e.Path, e.Status)
				}
			case <-time.After(200 * time.Millisecond):
			}
		}
		hitOK := func(what string) {
			t.Helper()
			conn, br := dial(t, r.Addr)
			defer conn.Close()
			resp, body := roundTrip(t, conn, br, "GET /a HTTP/1.1\r\nHost: a\r\n\r\n")
			if resp.StatusCode != 200 || !bytes.Equal(body, want) {
				t.Fatalf("after %s: %d, %d bytes", what, resp.StatusCode, len(body))
			}
			if got := nextEntry(t, lines, "/a"); got.Bytes != size {
				t.Errorf("after %s: logged %d bytes, want %d", what, got.Bytes, size)
			}
		}

		// A reset mid-body.
		slow, sbr := dialSlow(t, r.Addr)
		io.WriteString(slow, "GET /a HTTP/1.1\r\nHost: a\r\n\r\n")
		resp := readHead(t, sbr, "GET")
		io.ReadFull(resp.Body, make([]byte, 100<<10))
		slow.(*net.TCPConn).SetLinger(0)
		slow.Close()
		if got := nextEntry(t, lines, "/a"); got.Bytes >= size {
			t.Errorf("reset: logged %d bytes, the whole body's", got.Bytes)
		}
		noMore("reset")
		hitOK("a reset")

		// Nothing read past send_timeout.
		stuck, sbr := dialSlow(t, r.Addr)
		io.WriteString(stuck, "GET /a HTTP/1.1\r\nHost: a\r\n\r\n")
		readHead(t, sbr, "GET")
		if got := nextEntry(t, lines, "/a"); got.Bytes >= size {
			t.Errorf("send_timeout: logged %d bytes, the whole body's", got.Bytes)
		}
		noMore("send_timeout")
		hitOK("a send timeout")

		// Pipelined behind a large hit: a small answer and another hit.
		conn, br := dial(t, r.Addr)
		io.WriteString(conn, "GET /a HTTP/1.1\r\nHost: a\r\n\r\nGET /a HTTP/1.1\r\nHost: a\r\n\r\nHEAD /a HTTP/1.1\r\nHost: a\r\n\r\n")
		for i, m := range []string{"GET", "GET", "HEAD"} {
			resp := readHead(t, br, m)
			body, err := io.ReadAll(resp.Body)
			if err != nil || resp.StatusCode != 200 || m == "GET" && !bytes.Equal(body, want) || resp.ContentLength != size {
				t.Fatalf("pipelined %d (%s): %d, %d bytes, %v", i, m, resp.StatusCode, len(body), err)
			}
		}
		nextEntry(t, lines, "/a")
		nextEntry(t, lines, "/a")
		conn.Close()

		// A drain whose deadline passes while a body is being sent.
		slow, sbr = dialSlow(t, r.Addr)
		io.WriteString(slow, "GET /a HTTP/1.1\r\nHost: a\r\n\r\n")
		readHead(t, sbr, "GET")
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		r.Shutdown(ctx)
		if got := nextEntry(t, lines, "/a"); got.Bytes >= size {
			t.Errorf("drain: logged %d bytes, the whole body's", got.Bytes)
		}
		noMore("drain")
	})
}

// The answers a large entry gives besides a plain hit, each exact: ranges
// at and across the 64 KiB pieces' edges, several ranges (the whole), a
// 304 to a conditional request, HEAD, a Vary'd entry's variants, and a
// stale entry served while it is refreshed (stale-while-revalidate) or
// for the application's failure (stale-if-error), whose fill reads the
// entry whole.
func TestCacheLargeEntryAnswers(t *testing.T) {
	t.Parallel()
	eachEngine(t, withNetHTTP(), func(t *testing.T, e storyEngine) {
		const size = 1<<20 + 7
		var failing atomic.Bool
		up := startUpstream(t, func(req *seenRequest, w *bufio.Writer, c net.Conn) {
			path := req.Req.URL.Path
			cc := "max-age=60"
			switch path {
			case "/swr":
				cc += ", stale-while-revalidate=600"
			case "/sie":
				cc += ", stale-if-error=600"
				if failing.Load() {
					w.WriteString("HTTP/1.1 500 Internal Server Error\r\nContent-Length: 4\r\n\r\nfail")
					return
				}
			}
			body := bigBody(path+req.Req.Header.Get("X-Variant"), size)
			fmt.Fprintf(w, "HTTP/1.1 200 OK\r\nCache-Control: %s\r\nETag: \"e1\"\r\nVary: X-Variant\r\nContent-Length: %d\r\n\r\n", cc, len(body))
			w.Write(body)
		})
		var clock atomic.Int64
		c := configCore(t, "[table]\ncounters = 64\nresponses = 64\nresponse_bytes = \"16MiB\"\n[[cache]]\npath = \"/*\"\nmax_body = \"8MiB\"\n",
			func() time.Duration { return time.Hour + time.Duration(clock.Load()) })
		r := e.serve(t, storyOptions{Upstream: up.URL(), Core: c})
		want := bigBody("/x", size)
		fill(t, r.Addr, "/x", want)
		conn, br := dial(t, r.Addr)
		defer conn.Close()
		for _, rg := range []struct {
			spec     string
			from, to int
		}{
			{"bytes=0-65535", 0, 65536},
			{"bytes=65536-131071", 65536, 131072},
			{"bytes=65535-65536", 65535, 65537},
			{"bytes=131071-131072", 131071, 131073},
			{"bytes=0-0", 0, 1},
			{"bytes=-65536", size - 65536, size},
			{"bytes=-65537", size - 65537, size},
			{"bytes=" + fmt.Sprint(size-1) + "-", size - 1, size},
			{"bytes=100-999999999", 100, size},
			{"bytes=0-", 0, size},
		} {
			resp, body := roundTrip(t, conn, br, "GET /x HTTP/1.1\r\nHost: a\r\nRange: "+rg.spec+"\r\n\r\n")
			wantCR := fmt.Sprintf("bytes %d-%d/%d", rg.from, rg.to-1, size)
			if resp.StatusCode != 206 || resp.Header.Get("Content-Range") != wantCR || !bytes.Equal(body, want[rg.from:rg.to]) {
				t.Errorf("%s: %d %q, %d bytes, equal %v", rg.spec, resp.StatusCode, resp.Header.Get("Content-Range"), len(body), bytes.Equal(body, want[rg.from:rg.to]))
			}
		}
		for _, spec := range []string{"bytes=0-1,65536-65537", "bytes=5-2", "items=0-1"} {
			resp, body := roundTrip(t, conn, br, "GET /x HTTP/1.1\r\nHost: a\r\nRange: "+spec+"\r\n\r\n")
			if resp.StatusCode != 200 || !bytes.Equal(body, want) {
				t.Errorf("%s: %d, %d bytes, want the whole 200", spec, resp.StatusCode, len(body))
			}
		}
		resp, body := roundTrip(t, conn, br, "GET /x HTTP/1.1\r\nHost: a\r\nRange: bytes="+fmt.Sprint(size)+"-\r\n\r\n")
		if resp.StatusCode != 416 || resp.Header.Get("Content-Range") != fmt.Sprintf("bytes */%d", size) || len(body) == size {
			t.Errorf("past the end: %d %q, %d bytes", resp.StatusCode, resp.Header.Get("Content-Range"), len(body))
		}
		resp, body = roundTrip(t, conn, br, "GET /x HTTP/1.1\r\nHost: a\r\nIf-None-Match: \"e1\"\r\n\r\n")
		if resp.StatusCode != 304 || len(body) != 0 || resp.Header.Get("X-Cache") != "HIT" {
			t.Errorf("If-None-Match: %d %s, %d bytes, want a 304 hit", resp.StatusCode, resp.Header.Get("X-Cache"), len(body))
		}
		resp, body = roundTrip(t, conn, br, "HEAD /x HTTP/1.1\r\nHost: a\r\nRange: bytes=0-9\r\n\r\n")
		if resp.StatusCode != 200 || len(body) != 0 || resp.ContentLength != size {
			t.Errorf("HEAD with a Range: %d, length %d, %d bytes", resp.StatusCode, resp.ContentLength, len(body))
		}

		// Variants.
		for _, v := range []string{"one", "two"} {
			roundTrip(t, conn, br, "GET /v HTTP/1.1\r\nHost: a\r\nX-Variant: "+v+"\r\n\r\n")
		}
		time.Sleep(100 * time.Millisecond) // stored
		for _, v := range []string{"one", "two", "one"} {
			resp, body := roundTrip(t, conn, br, "GET /v HTTP/1.1\r\nHost: a\r\nX-Variant: "+v+"\r\n\r\n")
			if resp.StatusCode != 200 || resp.Header.Get("X-Cache") != "HIT" || !bytes.Equal(body, bigBody("/v"+v, size)) {
				t.Errorf("variant %s: %d %s, %d bytes, its own %v", v, resp.StatusCode, resp.Header.Get("X-Cache"), len(body), bytes.Equal(body, bigBody("/v"+v, size)))
			}
		}

		// Stale.
		fill(t, r.Addr, "/swr", bigBody("/swr", size))
		fill(t, r.Addr, "/sie", bigBody("/sie", size))
		clock.Add(int64(2 * time.Minute))
		failing.Store(true)
		seen := len(up.Requests())
		resp, body = roundTrip(t, conn, br, "GET /swr HTTP/1.1\r\nHost: a\r\n\r\n")
		if resp.StatusCode != 200 || resp.Header.Get("X-Cache") != "STALE" || !bytes.Equal(body, bigBody("/swr", size)) {
			t.Errorf("stale-while-revalidate: %d %s, %d bytes", resp.StatusCode, resp.Header.Get("X-Cache"), len(body))
		}
		if !waitfor.Cond(5*time.Second, func() bool { return len(up.Requests()) > seen }) {
			t.Error("stale-while-revalidate: no refresh")
		}
		if !waitfor.Cond(5*time.Second, func() bool {
			resp, body := roundTrip(t, conn, br, "GET /swr HTTP/1.1\r\nHost: a\r\n\r\n")
			return resp.Header.Get("X-Cache") == "HIT" && bytes.Equal(body, bigBody("/swr", size))
		}) {
			t.Error("stale-while-revalidate: the refreshed entry is no hit")
		}
		resp, body = roundTrip(t, conn, br, "GET /sie HTTP/1.1\r\nHost: a\r\n\r\n")
		if resp.StatusCode != 200 || resp.Header.Get("X-Cache") != "STALE" || !bytes.Equal(body, bigBody("/sie", size)) {
			t.Errorf("stale-if-error: %d %s, %d bytes", resp.StatusCode, resp.Header.Get("X-Cache"), len(body))
		}
	})
}

// Clients that ask for a large cached entry at once each get it whole:
// those whose connection's goroutine (net/http's, fasthttp's) meets the
// worker's copy of it being made wait for that copy; those of an event
// loop make their own rather than stall the loop's other connections, and
// the copy done first is the one shared.
func TestCacheLargeHitBurstIsExact(t *testing.T) {
	t.Parallel()
	eachEngine(t, withNetHTTP(), func(t *testing.T, e storyEngine) {
		const size, clients = 2<<20 + 3, 8
		up := bigUpstream(t, size)
		r := e.serve(t, storyOptions{Upstream: up.URL(), Core: bigCacheCore(t, 8)})
		want := bigBody("/b", size)
		fill(t, r.Addr, "/b", want)
		for range 3 { // the copy goes with the last reader of each burst
			errs := make(chan string, clients)
			for range clients {
				go func() {
					c, err := net.Dial("tcp", r.Addr)
					if err != nil {
						errs <- err.Error()
						return
					}
					defer c.Close()
					c.SetDeadline(time.Now().Add(20 * time.Second))
					io.WriteString(c, "GET /b HTTP/1.1\r\nHost: a\r\n\r\n")
					resp, err := http.ReadResponse(bufio.NewReader(c), nil)
					if err != nil {
						errs <- err.Error()
						return
					}
					body, err := io.ReadAll(resp.Body)
					if resp.StatusCode != 200 || resp.Header.Get("X-Cache") != "HIT" || err != nil || !bytes.Equal(body, want) {
						errs <- fmt.Sprintf("%d %s, %d bytes (%v), equal %v", resp.StatusCode, resp.Header.Get("X-Cache"), len(body), err, bytes.Equal(body, want))
						return
					}
					errs <- ""
				}()
			}
			for range clients {
				if msg := <-errs; msg != "" {
					t.Error(msg)
				}
			}
		}
	})
}
