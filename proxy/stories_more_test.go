package proxy_test

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/preforkd/preforkd/engine"
	"github.com/preforkd/preforkd/internal/wiretest"
)

// TestPipelining: requests sent back to back on one connection, with
// and without bodies, are answered in order, each once.
func TestPipelining(t *testing.T) {
	t.Parallel()
	eachEngine(t, withNetHTTP(), func(t *testing.T, e storyEngine) {
		up := startUpstream(t, func(req *seenRequest, w *bufio.Writer, c net.Conn) {
			body := req.Req.URL.Path
			fmt.Fprintf(w, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
		})
		var mu sync.Mutex
		var statuses []int
		o := storyOptions{Upstream: up.URL()}
		if e.name != netHTTPStory.name { // it has no OnResponse hook
			o.OnResponse = func(st int) {
				mu.Lock()
				statuses = append(statuses, st)
				mu.Unlock()
			}
		}
		r := e.serve(t, o)
		c, br := dial(t, r.Addr)
		var batch strings.Builder
		const n = 20
		for i := range n {
			switch i % 3 {
			case 0:
				fmt.Fprintf(&batch, "GET /r%d HTTP/1.1\r\nHost: a\r\n\r\n", i)
			case 1:
				fmt.Fprintf(&batch, "POST /r%d HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\nabc", i)
			case 2:
				fmt.Fprintf(&batch, "POST /r%d HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n", i)
			}
		}
		io.WriteString(c, batch.String())
		for i := range n {
			resp, body := readResponse(t, br, "GET")
			if want := fmt.Sprintf("/r%d", i); resp.StatusCode != 200 || string(body) != want {
				t.Fatalf("answer %d: %d %q, want %q", i, resp.StatusCode, body, want)
			}
		}
		seen := up.WaitRequests(n, 2*time.Second)
		if len(seen) != n {
			t.Errorf("the upstream saw %d requests, want %d", len(seen), n)
		}
		for i, s := range seen {
			if want := fmt.Sprintf("/r%d", i); s.Req.URL.Path != want || i%3 != 0 && string(s.Body) != "abc" {
				t.Errorf("upstream request %d: %s %q", i, s.Line, s.Body)
			}
		}
		if o.OnResponse == nil {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		if len(statuses) != n {
			t.Errorf("OnResponse called %d times for %d answers", len(statuses), n)
		}
	})
}

// A short body the answer did not need (a refusal) is read and dropped,
// and the connection serves the next request; one that never comes is
// cut at the body timeout.
func TestUnreadBodyDropped(t *testing.T) {
	t.Parallel()
	eachEngine(t, withNetHTTP(), func(t *testing.T, e storyEngine) {
		up := startUpstream(t, nil)
		r := e.serve(t, storyOptions{Upstream: up.URL(), Limits: engine.Limits{ClientBodyTimeout: 300 * time.Millisecond},
			Core: configCore(t, "[table]\ncounters = 1024\n[[ratelimit]]\nname = \"p\"\npath = \"/p\"\nlimit = 1\nwindow = \"1m\"\n", nil)})
		c, br := dial(t, r.Addr)
		roundTrip(t, c, br, "POST /p HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\nabc")
		io.WriteString(c, "POST /p HTTP/1.1\r\nHost: a\r\nContent-Length: 6\r\n\r\nab")
		resp, _ := readResponse(t, br, "POST")
		if e.name == netHTTPStory.name {
			// net/http reads what is left of a body before it answers,
			// to keep the connection: the engine answers at once and
			// closes instead.
			if resp.StatusCode != 429 || !resp.Close {
				t.Fatalf("a refused POST: %d, close %v", resp.StatusCode, resp.Close)
			}
			return
		}
		if resp.StatusCode != 429 || resp.Close {
			t.Fatalf("a refused POST: %d, close %v", resp.StatusCode, resp.Close)
		}
		io.WriteString(c, "cdGET /after HTTP/1.1\r\nHost: a\r\n\r\n")
		if resp, body := readResponse(t, br, "GET"); resp.StatusCode != 200 || string(body) != "ok" {
			t.Fatalf("the request after the dropped body: %d %q", resp.StatusCode, body)
		}
		io.WriteString(c, "POST /p HTTP/1.1\r\nHost: a\r\nContent-Length: 6\r\n\r\n") // and nothing of the body
		readResponse(t, br, "POST")
		start := time.Now()
		c.SetReadDeadline(time.Now().Add(2 * time.Second))
		_, err := br.ReadByte()
		if err == nil || errors.Is(err, os.ErrDeadlineExceeded) || time.Since(start) > time.Second {
			t.Errorf("a body that never came still holds its connection after %v (%v)", time.Since(start), err)
		}
		if n := len(up.Requests()); n != 2 {
			t.Errorf("the upstream saw %d requests, want 2", n)
		}
	})
}

// TestStaleConnectionRetried: a pooled connection the upstream closed
// in the same moment the request went on it (it was clean at the peek)
// is retried once on a new connection for an idempotent request, and
// never for a POST.
func TestStaleConnectionRetried(t *testing.T) {
	t.Parallel()
	eachEngine(t, withNetHTTP(), func(t *testing.T, e storyEngine) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		var mu sync.Mutex
		served := 0
		wiretest.AcceptEach(ln, func(c net.Conn) {
			br := bufio.NewReader(c)
			for {
				req, err := http.ReadRequest(br)
				if err != nil {
					return
				}
				io.Copy(io.Discard, req.Body)
				mu.Lock()
				served++
				first := served == 1
				mu.Unlock()
				io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
				if !first {
					continue
				}
				// Read the next request and close without an answer: what a
				// keep-alive timeout racing the request looks like.
				if _, err := http.ReadRequest(br); err == nil {
					c.(*net.TCPConn).SetLinger(0)
				}
				return
			}
		})
		c, br := dial(t, e.serve(t, storyOptions{Upstream: "http://" + ln.Addr().String()}).Addr)
		if resp, _ := roundTrip(t, c, br, "GET /1 HTTP/1.1\r\nHost: a\r\n\r\n"); resp.StatusCode != 200 {
			t.Fatalf("first: %d", resp.StatusCode)
		}
		if resp, body := roundTrip(t, c, br, "GET /2 HTTP/1.1\r\nHost: a\r\n\r\n"); resp.StatusCode != 200 {
			t.Fatalf("a GET on a connection closed under it: %d %s, want it retried", resp.StatusCode, body)
		}
		mu.Lock()
		served = 0
		mu.Unlock()
		if resp, _ := roundTrip(t, c, br, "GET /3 HTTP/1.1\r\nHost: a\r\n\r\n"); resp.StatusCode != 200 {
			t.Fatalf("third: %d", resp.StatusCode)
		}
		if resp, _ := roundTrip(t, c, br, "POST /4 HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\n\r\nx"); resp.StatusCode != 502 {
			t.Fatalf("a POST on a connection closed under it: %d, want 502 (never sent twice)", resp.StatusCode)
		}
	})
}

// TestStaleRetryGoesOnANewConnection: the one retry of a request whose
// pooled connection the upstream had closed goes on a new connection, on
// every engine, not on the next idle one: connections that went idle
// together are closed together by the upstream's idle timeout, and a GET
// sent again on the second of them met the same close and got a 502.
func TestStaleRetryGoesOnANewConnection(t *testing.T) {
	t.Parallel()
	eachEngine(t, withNetHTTP(), func(t *testing.T, e storyEngine) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		var mu sync.Mutex
		conns, both := 0, make(chan struct{})
		wiretest.AcceptEach(ln, func(c net.Conn) {
			mu.Lock()
			conns++
			n := conns
			mu.Unlock()
			br := bufio.NewReader(c)
			for first := true; ; first = false {
				if _, err := http.ReadRequest(br); err != nil {
					return
				}
				switch {
				case n > 2:
				case first && n == 2:
					close(both)
				case first:
					select { // the two first connections serve at once
					case <-both:
					case <-time.After(5 * time.Second):
					}
				default:
					// Idle closes that raced the next request on each.
					c.(*net.TCPConn).SetLinger(0)
					return
				}
				io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
			}
		})
		r := e.serve(t, storyOptions{Upstream: "http://" + ln.Addr().String()})
		var wg sync.WaitGroup
		for i := range 2 {
			wg.Go(func() {
				c, br := dial(t, r.Addr)
				if resp, _ := roundTrip(t, c, br, fmt.Sprintf("GET /%d HTTP/1.1\r\nHost: a\r\n\r\n", i)); resp.StatusCode != 200 {
					t.Errorf("request %d: %d", i, resp.StatusCode)
				}
			})
		}
		wg.Wait()
		c, br := dial(t, r.Addr)
		if resp, body := roundTrip(t, c, br, "GET /3 HTTP/1.1\r\nHost: a\r\n\r\n"); resp.StatusCode != 200 {
			t.Errorf("a GET whose pooled connections were all closed under it: %d %s, want it sent again on a new one", resp.StatusCode, body)
		}
	})
}

// TestNoRetryOnceTheUpstreamAnswered: a request on a pooled connection
// that breaks after the upstream sent part of its response (a 103 Early
// Hints) was taken by the upstream: it is not sent again, even a GET.
// The client gets the interim response and a 502, and the upstream saw
// the request once.
func TestNoRetryOnceTheUpstreamAnswered(t *testing.T) {
	t.Parallel()
	eachEngine(t, withNetHTTP(), func(t *testing.T, e storyEngine) {
		up := startUpstream(t, func(req *seenRequest, w *bufio.Writer, c net.Conn) {
			if req.Req.URL.Path == "/2" {
				w.WriteString("HTTP/1.1 103 Early Hints\r\nLink: </s.css>; rel=preload\r\n\r\n")
				w.Flush()
				c.(*net.TCPConn).SetLinger(0)
				c.Close()
				return
			}
			w.WriteString("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		})
		c, br := dial(t, e.serve(t, storyOptions{Upstream: up.URL()}).Addr)
		if resp, _ := roundTrip(t, c, br, "GET /1 HTTP/1.1\r\nHost: a\r\n\r\n"); resp.StatusCode != 200 {
			t.Fatalf("first: %d", resp.StatusCode)
		}
		io.WriteString(c, "GET /2 HTTP/1.1\r\nHost: a\r\n\r\n")
		var statuses []int
		for {
			resp, body := readResponse(t, br, "GET")
			statuses = append(statuses, resp.StatusCode)
			if resp.StatusCode >= 200 {
				if resp.StatusCode != 502 {
					t.Errorf("final answer %d %s, want 502", resp.StatusCode, body)
				}
				break
			}
		}
		if len(statuses) != 2 || statuses[0] != 103 {
			t.Errorf("the client got %v, want [103 502]", statuses)
		}
		if n := len(up.WaitRequests(3, 200*time.Millisecond)); n != 2 {
			t.Errorf("the upstream saw %d requests, want 2: the second was sent again after it answered", n)
		}
	})
}

// TestDownloadBackPressure: a client that reads nothing while a large
// body arrives stops the upstream (the engine stops reading it) instead
// of making the engine hold the body: the upstream's writes stall with
// the body far from sent, and the client still gets every byte once it
// reads.
func TestDownloadBackPressure(t *testing.T) {
	t.Parallel()
	eachEngine(t, withNetHTTP(), func(t *testing.T, e storyEngine) {
		const size = 64 << 20
		written := make(chan int64, 1)
		// The kernel grows a socket's buffers up to tcp_rmem's and tcp_wmem's
		// maxima (32 and 4 MiB here, more on other machines): the two ends
		// outside the engine are pinned small, so that what the upstream got
		// to send is the engine's bound and its own sockets' buffers only.
		const pinned = 128 << 10
		up := startUpstream(t, func(req *seenRequest, w *bufio.Writer, c net.Conn) {
			if err := c.(*net.TCPConn).SetWriteBuffer(pinned); err != nil {
				t.Error(err)
			}
			fmt.Fprintf(w, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n", size)
			w.Flush()
			var n int64
			buf := make([]byte, 64<<10)
			r := wiretest.Pattern(size)
			for n < size {
				k, _ := io.ReadFull(r, buf)
				c.SetWriteDeadline(time.Now().Add(time.Second))
				m, err := c.Write(buf[:k])
				n += int64(m)
				if err != nil {
					written <- n
					c.SetWriteDeadline(time.Time{})
					c.Write(buf[m:k])
					io.Copy(c, r)
					return
				}
			}
			written <- n
		})
		c, br := dial(t, e.serve(t, storyOptions{Upstream: up.URL()}).Addr)
		if err := c.(*net.TCPConn).SetReadBuffer(pinned); err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(time.Minute)) // 64 MiB under the race detector
		io.WriteString(c, "GET /big HTTP/1.1\r\nHost: a\r\n\r\n")
		var n int64
		select {
		case n = <-written:
		case <-time.After(10 * time.Second):
			t.Fatal("the upstream's writes never stalled")
		}
		// What is held between the two sockets: both kernels' buffers and
		// the engine's bound; far from the 64 MiB body.
		if n > 24<<20 {
			t.Errorf("the upstream sent %d MiB to a client that read nothing", n>>20)
		}
		t.Logf("the upstream sent %.1f MiB before its writes stalled", float64(n)/(1<<20))
		resp := readHead(t, br, "GET")
		want, _ := sum(wiretest.Pattern(size))
		if got, m := sum(resp.Body); got != want || m != size {
			t.Errorf("download after the stall: %d bytes, want %d, the same", m, size)
		}
	})
}

// TestBrokenUpstreamBodies: an upstream whose head is right but whose
// body breaks its own framing, on every engine. The client gets the head
// and what came before the fault, then the connection ends without the
// body's end (no last chunk, or fewer bytes than the length said): it can
// tell the response from a whole one. The next connection is served.
func TestBrokenUpstreamBodies(t *testing.T) {
	t.Parallel()
	const head = "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n"
	cases := []struct{ name, reply string }{
		{"a chunk size that is not hex", head + "Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\nzz\r\nmore\r\n0\r\n\r\n"},
		{"a chunk size ended by a bare LF", head + "Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n4\nmore\r\n0\r\n\r\n"},
		{"a chunk size past 63 bits", head + "Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\nfffffffffffffffff\r\nmore\r\n0\r\n\r\n"},
		{"a chunk without its CRLF", head + "Transfer-Encoding: chunked\r\n\r\n3\r\nabcX\r\n0\r\n\r\n"},
		{"a chunk size with a sign", head + "Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n+4\r\nmore\r\n0\r\n\r\n"},
		{"a control character in a chunk extension", head + "Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n4;x=\x01\r\nmore\r\n0\r\n\r\n"},
		{"a trailer ended by a bare LF", head + "Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\nX-T: 1\r\n\n"},
		{"fewer bytes than Content-Length, then the close", head + "Content-Length: 100\r\n\r\nabc"},
	}
	eachEngine(t, withNetHTTP(), func(t *testing.T, e storyEngine) {
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel()
				up := startUpstream(t, func(req *seenRequest, w *bufio.Writer, c net.Conn) {
					if req.Line == "GET /fine HTTP/1.1" {
						w.WriteString("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
						return
					}
					w.WriteString(tc.reply)
					w.Flush()
					c.Close()
				})
				r := e.serve(t, storyOptions{Upstream: up.URL()})
				c, br := dial(t, r.Addr)
				io.WriteString(c, "GET /broken HTTP/1.1\r\nHost: a\r\n\r\n")
				resp, err := http.ReadResponse(br, nil)
				if err != nil {
					t.Fatalf("no head: %v", err)
				}
				body, err := io.ReadAll(resp.Body)
				if resp.StatusCode != 200 || err == nil {
					t.Errorf("status %d, body %q read whole (err %v): the client cannot tell it from a whole response", resp.StatusCode, body, err)
				}
				if strings.HasPrefix(tc.name, "fewer") && string(body) != "abc" {
					t.Errorf("body %q: want what the upstream sent before it closed, %q", body, "abc")
				}
				if !strings.HasPrefix("abc", string(body)) {
					t.Errorf("body %q: more than the upstream sent before the fault", body)
				}
				c2, br2 := dial(t, r.Addr)
				if resp, body := roundTrip(t, c2, br2, "GET /fine HTTP/1.1\r\nHost: a\r\n\r\n"); resp.StatusCode != 200 || string(body) != "ok" {
					t.Errorf("the next connection: %d %q", resp.StatusCode, body)
				}
			})
		}
	})
}

// TestInterimHidesTheCoresFields: an interim response (103 Early Hints)
// is passed on without the fields the core hides from every response
// (the reset header here), as the final one is.
func TestInterimHidesTheCoresFields(t *testing.T) {
	t.Parallel()
	eachEngine(t, withNetHTTP(), func(t *testing.T, e storyEngine) {
		ln := listen(t)
		acceptEach(ln, func(c net.Conn) {
			br := bufio.NewReader(c)
			for {
				if _, err := http.ReadRequest(br); err != nil {
					return
				}
				io.WriteString(c, "HTTP/1.1 103 Early Hints\r\nLink: </s.css>; rel=preload\r\nPreforkd-Reset: login\r\n\r\n"+
					"HTTP/1.1 200 OK\r\nPreforkd-Reset: login\r\nContent-Length: 2\r\n\r\nok")
			}
		})
		c := configCore(t, "[server]\nreset_header = \"Preforkd-Reset\"\n", nil)
		r := e.serve(t, storyOptions{Upstream: "http://" + ln.Addr().String(), Core: c})
		conn, _ := dial(t, r.Addr)
		io.WriteString(conn, "GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
		conn.SetReadDeadline(time.Now().Add(10 * time.Second))
		all, err := io.ReadAll(conn)
		if err != nil {
			t.Fatal(err)
		}
		got := string(all)
		if !strings.Contains(got, "HTTP/1.1 103 Early Hints\r\n") || !strings.Contains(got, "Link: </s.css>; rel=preload\r\n") {
			t.Fatalf("no 103 with its Link passed on:\n%s", got)
		}
		if strings.Contains(strings.ToLower(got), "preforkd-reset") {
			t.Errorf("the reset header reached the client:\n%s", got)
		}
	})
}
