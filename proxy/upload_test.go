package proxy_test

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/preforkd/preforkd/engine"
	"github.com/preforkd/preforkd/internal/wiretest"
)

// The upstream answers a long POST
// (keep-alive, with a Content-Length) before it has read the body — as
// nginx or Node may — and reads the rest afterwards (RFC 9112 §9.3: the
// connection stays usable). Then another client's GET comes. Its request
// must reach the upstream as a request of its own, never inside the first
// client's body. (The event loop once pooled the connection with the
// body's tail still queued, and sent the next head behind it: a body the
// socket buffers nearly hold, here 4 MiB, leaves such a tail.)
func TestUpstreamConnWithUnsentBodyNotReused(t *testing.T) {
	t.Parallel()
	const size = 4 << 20
	eachEngine(t, withNetHTTP(), func(t *testing.T, e storyEngine) {
		ln := listen(t)
		var mu sync.Mutex
		var log []string
		note := func(f string, a ...any) { mu.Lock(); log = append(log, fmt.Sprintf(f, a...)); mu.Unlock() }
		acceptEach(ln, func(c net.Conn) {
			id := c.RemoteAddr().String()
			br := bufio.NewReader(c)
			for {
				req, err := http.ReadRequest(br)
				if err != nil {
					if err != io.EOF {
						note("%s malformed request: %v", id, err)
					}
					return
				}
				note("%s request %s %s", id, req.Method, req.URL.Path)
				if req.Method == "POST" {
					time.Sleep(2 * time.Second) // the body waits meanwhile
					io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
					body, err := io.ReadAll(req.Body) // the rest, before the next request
					note("%s body of %d bytes (err %v); another request inside it: %v", id, len(body), err,
						bytes.Contains(body, []byte("GET /next HTTP/1.1")))
					continue
				}
				io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\ng")
			}
		})
		r := e.serve(t, storyOptions{Upstream: "http://" + ln.Addr().String(),
			Client: engine.Upstream{Timeout: 3 * time.Second}})
		c, br := dial(t, r.Addr)
		fmt.Fprintf(c, "POST /up HTTP/1.1\r\nHost: a\r\nContent-Length: %d\r\n\r\n", size)
		go io.Copy(c, wiretest.Pattern(size))
		if resp, body := readResponse(t, br, "POST"); resp.StatusCode != 200 || string(body) != "ok" {
			t.Fatalf("POST: %d %q", resp.StatusCode, body)
		}
		time.Sleep(100 * time.Millisecond)
		c2, br2 := dial(t, r.Addr) // another client
		resp2, body2 := roundTrip(t, c2, br2, "GET /next HTTP/1.1\r\nHost: a\r\nCookie: session=second-client\r\n\r\n")
		time.Sleep(300 * time.Millisecond)
		mu.Lock()
		defer mu.Unlock()
		t.Logf("the upstream saw %q", log)
		if resp2.StatusCode != 200 || string(body2) != "g" {
			t.Errorf("the second client's GET: %d %q", resp2.StatusCode, body2)
		}
		for _, l := range log {
			if strings.Contains(l, "inside it: true") || strings.Contains(l, "malformed") {
				t.Errorf("desync on the upstream connection: %s", l)
			}
		}
	})
}

// README "Neither side is read while more than
// 256 KiB wait to be written to the other: ... a slow application the
// client's upload"; "a 100 MB ... upload moves in about a MiB of the
// worker's memory". An upstream that reads nothing for a while; a client
// that uploads 64 MiB: the worker's heap must not grow by megabytes.
func TestUploadToASlowUpstreamIsBounded(t *testing.T) {
	// Not parallel: it measures the process's heap.
	for _, e := range withNetHTTP() {
		t.Run(e.name, func(t *testing.T) {
			const size = 64 << 20
			ln := listen(t)
			release := make(chan struct{})
			acceptEach(ln, func(c net.Conn) {
				br := bufio.NewReader(c)
				req, err := http.ReadRequest(br)
				if err != nil {
					return
				}
				<-release
				io.Copy(io.Discard, req.Body)
				io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
			})
			r := e.serve(t, storyOptions{Upstream: "http://" + ln.Addr().String(),
				Client: engine.Upstream{Timeout: 10 * time.Second},
				// The wait is the upstream's, not the client's: a client
				// held back meanwhile is not timed out for it.
				Limits: engine.Limits{ClientBodyTimeout: 500 * time.Millisecond}})
			runtime.GC()
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			c, br := dial(t, r.Addr)
			fmt.Fprintf(c, "POST /up HTTP/1.1\r\nHost: a\r\nContent-Length: %d\r\n\r\n", size)
			go io.Copy(c, wiretest.Pattern(size))
			time.Sleep(1500 * time.Millisecond)
			runtime.ReadMemStats(&after)
			close(release)
			grew := int64(after.HeapInuse) - int64(before.HeapInuse)
			if resp, body := readResponse(t, br, "POST"); resp.StatusCode != 200 {
				t.Errorf("POST: %d %q", resp.StatusCode, body)
			}
			t.Logf("heap in use grew by %d KiB while the upstream read nothing", grew>>10)
			if grew > 8<<20 {
				t.Errorf("the heap grew by %d MiB while the upstream read nothing: the upload is buffered without bound", grew>>20)
			}
		})
	}
}

// upstream_timeout bounds the wait for the response head (README: 504),
// however the head comes: an upstream that sends it a line every 150 ms,
// 1.8 s in all, is cut off at 300 ms on every engine. (The blocking
// engines once moved the deadline at each read of the head, and served
// it whole.)
func TestUpstreamHeadTrickleTimesOut(t *testing.T) {
	t.Parallel()
	eachEngine(t, withNetHTTP(), func(t *testing.T, e storyEngine) {
		up := startUpstream(t, func(req *seenRequest, w *bufio.Writer, c net.Conn) {
			w.WriteString("HTTP/1.1 200 OK\r\n")
			w.Flush()
			for i := range 12 {
				time.Sleep(150 * time.Millisecond)
				fmt.Fprintf(w, "X-Slow-%d: 1\r\n", i)
				w.Flush()
			}
			w.WriteString("Content-Length: 2\r\n\r\nok")
		})
		r := e.serve(t, storyOptions{Upstream: up.URL(),
			Client: engine.Upstream{ConnectTimeout: 300 * time.Millisecond, Timeout: 300 * time.Millisecond}})
		c, br := dial(t, r.Addr)
		if resp, _ := roundTrip(t, c, br, "GET / HTTP/1.1\r\nHost: a\r\n\r\n"); resp.StatusCode != 504 {
			t.Errorf("status %d, want 504: the head took 1.8 s against a 300 ms upstream_timeout", resp.StatusCode)
		}
	})
}
