//go:build linux

package loop_test

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/preforkd/preforkd/engine"
	"github.com/preforkd/preforkd/engine/loop"
	"github.com/preforkd/preforkd/internal/wiretest"
)

const cacheRules = "[table]\ncounters = 1024\nresponses = 64\nresponse_bytes = \"64KiB\"\n[[cache]]\npath = \"/*\"\nmax_body = \"4KiB\"\n"

// A GET with a body waits for another request's cache fill (Wait in
// Decide, before its body is read); its client half-closes mid-body, or
// closes, meanwhile. Once the fill ends without an entry, the request is
// answered (its body failed) and the connection closed: it used to hang
// whatever client_body_timeout, and a closed client's descriptor stayed
// open for good (Stats().Open up).
func TestBodyEndsWhileWaiting(t *testing.T) {
	t.Parallel()
	for _, end := range []string{"half-close", "close"} {
		t.Run(end, func(t *testing.T) {
			t.Parallel()
			release := make(chan struct{})
			var n atomic.Int32
			up := wiretest.StartUpstream(t, func(req *wiretest.Seen, w *bufio.Writer, c net.Conn) {
				if n.Add(1) == 1 {
					<-release
				}
				w.WriteString("HTTP/1.1 200 OK\r\nCache-Control: no-store\r\nContent-Length: 2\r\n\r\nok")
			})
			addr, s := serve(t, loop.Options{Upstream: up.URL(), Loops: 1, Core: configCore(t, cacheRules),
				Limits: engine.Limits{ClientBodyTimeout: 500 * time.Millisecond}})
			first, firstR := dial(t, addr)
			io.WriteString(first, "GET /hot HTTP/1.1\r\nHost: a\r\n\r\n")
			time.Sleep(200 * time.Millisecond) // it holds the fill lock
			second, secondR := dial(t, addr)
			io.WriteString(second, "GET /hot HTTP/1.1\r\nHost: a\r\nContent-Length: 10\r\n\r\nabc")
			time.Sleep(200 * time.Millisecond) // it waits for the fill
			if end == "close" {
				second.Close()
			} else {
				second.(*net.TCPConn).CloseWrite()
			}
			time.Sleep(200 * time.Millisecond)
			close(release)
			if resp, _ := readResponse(t, firstR, "GET"); resp.StatusCode != 200 {
				t.Fatalf("first: %d", resp.StatusCode)
			}
			if end == "close" {
				first.Close()
				deadline := time.Now().Add(3 * time.Second)
				for s.Stats().Open != 0 && time.Now().Before(deadline) {
					time.Sleep(10 * time.Millisecond)
				}
				if open := s.Stats().Open; open != 0 {
					t.Errorf("both clients closed (client_body_timeout 500ms): %d connection(s) still open 3s on", open)
				}
				return
			}
			second.SetReadDeadline(time.Now().Add(3 * time.Second))
			b, err := io.ReadAll(secondR)
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				t.Errorf("the half-closed client waited 3s (client_body_timeout 500ms): got %q, nothing more, connection still open; open=%d", b, s.Stats().Open)
			}
		})
	}
}

type want struct {
	method string
	status int
	body   string
}

func pipelineUpstream(t *testing.T) *wiretest.Upstream {
	return wiretest.StartUpstream(t, func(req *wiretest.Seen, w *bufio.Writer, c net.Conn) {
		p := req.Req.URL.Path
		switch {
		case p == "/204":
			w.WriteString("HTTP/1.1 204 No Content\r\n\r\n")
		case p == "/304":
			w.WriteString("HTTP/1.1 304 Not Modified\r\nContent-Length: 7\r\n\r\n")
		case req.Req.Method == "HEAD":
			w.WriteString("HTTP/1.1 200 OK\r\nContent-Length: 7\r\n\r\n")
		case p == "/early":
			w.WriteString("HTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\n")
			b := p + ":" + string(req.Body)
			w.WriteString("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
			for i := range len(b) {
				w.WriteString("1\r\n" + b[i:i+1] + "\r\n")
			}
			w.WriteString("0\r\n\r\n")
		default:
			b := p + ":" + string(req.Body)
			cc := ""
			if len(p) > 6 && p[:6] == "/cache" {
				cc = "Cache-Control: max-age=60\r\n"
			}
			w.WriteString("HTTP/1.1 200 OK\r\n" + cc + "Content-Length: " + strconv.Itoa(len(b)) + "\r\n\r\n" + b)
		}
	})
}

// Pipelined requests of many kinds, the batch split in two at every byte.
func TestPipelineSplitEverywhere(t *testing.T) {
	t.Parallel()
	up := pipelineUpstream(t)
	addr, _ := serve(t, loop.Options{Upstream: up.URL(), Loops: 1, Core: configCore(t,
		"[table]\ncounters = 4096\nresponses = 64\nresponse_bytes = \"64KiB\"\n"+
			"[[ratelimit]]\nname = \"rl\"\npath = \"/rl\"\nby = \"header:X-K\"\nlimit = 1\nwindow = \"1m\"\n"+
			"[[cache]]\npath = \"/cached\"\nmax_body = \"4KiB\"\n")})
	// warm the cache
	c0, br0 := dial(t, addr)
	roundTrip(t, c0, br0, "GET /cached HTTP/1.1\r\nHost: a\r\n\r\n")
	for k := 0; ; k++ {
		key := "k" + strconv.Itoa(k)
		batch := "GET /a HTTP/1.1\r\nHost: a\r\n\r\n" +
			"POST /b HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\nxyz" +
			"POST /rl HTTP/1.1\r\nHost: a\r\nX-K: " + key + "\r\nContent-Length: 2\r\n\r\nr1" +
			"POST /rl HTTP/1.1\r\nHost: a\r\nX-K: " + key + "\r\nContent-Length: 2\r\n\r\nr2" +
			"GET /cached HTTP/1.1\r\nHost: a\r\n\r\n" +
			"HEAD /h HTTP/1.1\r\nHost: a\r\n\r\n" +
			"GET /204 HTTP/1.1\r\nHost: a\r\n\r\n" +
			"GET /304 HTTP/1.1\r\nHost: a\r\n\r\n" +
			"POST /c HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n2;e=1\r\nab\r\n1\r\nc\r\n0\r\nT: v\r\n\r\n" +
			"POST /early HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\n\r\nq" +
			"GET /last HTTP/1.1\r\nHost: a\r\n\r\n"
		if k > len(batch) {
			break
		}
		wants := []want{{"GET", 200, "/a:"}, {"POST", 200, "/b:xyz"}, {"POST", 200, "/rl:r1"}, {"POST", 429, ""},
			{"GET", 200, "/cached:"}, {"HEAD", 200, ""}, {"GET", 204, ""}, {"GET", 304, ""}, {"POST", 200, "/c:abc"},
			{"POST", 200, "/early:q"}, {"GET", 200, "/last:"}}
		c, br := dial(t, addr)
		c.SetDeadline(time.Now().Add(5 * time.Second))
		io.WriteString(c, batch[:k])
		time.Sleep(2 * time.Millisecond)
		io.WriteString(c, batch[k:])
		for i, w := range wants {
			resp, err := httpRead(br, w.method)
			if err != nil {
				t.Fatalf("split at %d (%q|%q): answer %d: %v", k, batch[max(0, k-10):k], batch[k:min(len(batch), k+10)], i, err)
			}
			b, err := io.ReadAll(resp.Body)
			if err != nil || resp.StatusCode != w.status || w.status != 429 && string(b) != w.body {
				t.Fatalf("split at %d: answer %d: %d %q %v, want %d %q", k, i, resp.StatusCode, b, err, w.status, w.body)
			}
		}
		c.Close()
	}
}

func httpRead(br *bufio.Reader, method string) (*http.Response, error) {
	for {
		resp, err := http.ReadResponse(br, &http.Request{Method: method})
		if err != nil || resp.StatusCode >= 200 {
			return resp, err
		}
	}
}

// RFC 9112 §2.2: a CRLF before a request line is ignored (skipEmptyLines),
// also when its CR and LF arrive in two reads.
func TestEmptyLineSplitBeforeRequest(t *testing.T) {
	t.Parallel()
	up := pipelineUpstream(t)
	addr, _ := serve(t, loop.Options{Upstream: up.URL(), Loops: 1})
	for _, parts := range [][]string{
		{"POST /b HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\n\r\nq\r\n", "GET /last HTTP/1.1\r\nHost: a\r\n\r\n"}, // passes
		{"POST /b HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\n\r\nq\r", "\nGET /last HTTP/1.1\r\nHost: a\r\n\r\n"}, // fails
	} {
		c, br := dial(t, addr)
		io.WriteString(c, parts[0])
		time.Sleep(50 * time.Millisecond)
		io.WriteString(c, parts[1])
		resp, body := readResponse(t, br, "POST")
		if resp.StatusCode != 200 || string(body) != "/b:q" {
			t.Fatalf("%q: first answer %d %q", parts, resp.StatusCode, body)
		}
		resp, body = readResponse(t, br, "GET")
		if resp.StatusCode != 200 || string(body) != "/last:" {
			t.Errorf("%q|%q: the request after the CRLF: %d %q", parts[0][len(parts[0])-3:], parts[1][:5], resp.StatusCode, body)
		}
	}
}

// A duplicate that waits (idempotency), pipelined before requests the
// core answers at once (a cache hit, a 429) and forwarded ones.
func TestWaitInPipelineKeepsOrder(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	up := wiretest.StartUpstream(t, func(req *wiretest.Seen, w *bufio.Writer, c net.Conn) {
		p := req.Req.URL.Path
		if p == "/orders" {
			<-release
			w.WriteString("HTTP/1.1 201 Created\r\nContent-Length: 5\r\n\r\norder")
			return
		}
		b := p + ":" + string(req.Body)
		cc := ""
		if p == "/cached" {
			cc = "Cache-Control: max-age=60\r\n"
		}
		w.WriteString("HTTP/1.1 200 OK\r\n" + cc + "Content-Length: " + strconv.Itoa(len(b)) + "\r\n\r\n" + b)
	})
	addr, _ := serve(t, loop.Options{Upstream: up.URL(), Loops: 1, Core: configCore(t, idemRules+
		"[[ratelimit]]\nname = \"rl\"\npath = \"/rl\"\nlimit = 1\nwindow = \"1m\"\n"+
		"[[cache]]\npath = \"/cached\"\nmax_body = \"4KiB\"\n")})
	c0, br0 := dial(t, addr)
	roundTrip(t, c0, br0, "GET /cached HTTP/1.1\r\nHost: a\r\n\r\n")
	roundTrip(t, c0, br0, "GET /rl HTTP/1.1\r\nHost: a\r\n\r\n")
	orig := "POST /orders HTTP/1.1\r\nHost: a\r\nIdempotency-Key: \"w1\"\r\nContent-Length: 2\r\n\r\n{}"
	a, ar := dial(t, addr)
	io.WriteString(a, orig)
	time.Sleep(150 * time.Millisecond)
	b, brd := dial(t, addr)
	io.WriteString(b, orig+"GET /x HTTP/1.1\r\nHost: a\r\n\r\nGET /cached HTTP/1.1\r\nHost: a\r\n\r\nGET /rl HTTP/1.1\r\nHost: a\r\n\r\n"+
		"POST /y HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\nabc"+orig)
	time.Sleep(200 * time.Millisecond)
	close(release)
	if resp, body := readResponse(t, ar, "POST"); resp.StatusCode != 201 || string(body) != "order" {
		t.Fatalf("original: %d %q", resp.StatusCode, body)
	}
	for i, w := range []want{{"POST", 201, "order"}, {"GET", 200, "/x:"}, {"GET", 200, "/cached:"}, {"GET", 429, ""}, {"POST", 200, "/y:abc"}, {"POST", 201, "order"}} {
		resp, err := httpRead(brd, w.method)
		if err != nil {
			t.Fatalf("answer %d: %v", i, err)
		}
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != w.status || w.status != 429 && string(body) != w.body {
			t.Errorf("answer %d: %d %q, want %d %q", i, resp.StatusCode, body, w.status, w.body)
		}
	}
}

// One client pipelines cache hits and reads nothing. The loop stops
// reading it once highWater of answers wait, as it does for forwarded
// ones: it used to go on answering into an output buffer grown by the
// exact size needed (a copy of the whole backlog per answer), and another
// client of the loop waited seconds.
func TestUnreadAnswersHoldTheInput(t *testing.T) {
	t.Parallel()
	body := strings.Repeat("x", 1000)
	up := wiretest.StartUpstream(t, func(req *wiretest.Seen, w *bufio.Writer, c net.Conn) {
		w.WriteString("HTTP/1.1 200 OK\r\nCache-Control: max-age=600\r\nContent-Length: 1000\r\n\r\n" + body)
	})
	addr, _ := serve(t, loop.Options{Upstream: up.URL(), Loops: 1, Core: configCore(t, cacheRules)})
	victim, vr := dial(t, addr)
	roundTrip(t, victim, vr, "GET /hot HTTP/1.1\r\nHost: a\r\n\r\n")
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	req := strings.Repeat("GET /hot HTTP/1.1\r\nHost: a\r\n\r\n", 1000)
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		c.SetWriteDeadline(time.Now().Add(20 * time.Second))
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := io.WriteString(c, req); err != nil {
				return
			}
		}
	}()
	time.Sleep(2 * time.Second)
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	for i := range 3 {
		t0 := time.Now()
		resp, _ := roundTrip(t, victim, vr, "GET /hot HTTP/1.1\r\nHost: a\r\n\r\n")
		d := time.Since(t0)
		t.Logf("victim request %d: %d in %v (heap in use %d MiB)", i, resp.StatusCode, d, m.HeapInuse>>20)
		if d > 500*time.Millisecond {
			t.Errorf("a cache hit on another connection of the loop took %v", d)
		}
	}
}

// A request the core answers (a cache hit) whose head came in two reads,
// then an idle connection: it waits idle_timeout, not read_header_timeout
// (endRequest ran inside process, before the input was trimmed, and took
// the head just read for the next one).
func TestIdleAfterSplitHeadIsIdle(t *testing.T) {
	t.Parallel()
	up := pipelineUpstream(t)
	addr, _ := serve(t, loop.Options{Upstream: up.URL(), Loops: 1, Core: configCore(t, cacheRules),
		Limits: engine.Limits{ReadHeaderTimeout: 500 * time.Millisecond, IdleTimeout: 5 * time.Second}})
	for _, batch := range []string{
		"GET /a HTTP/1.1\r\nHost: a\r\n\r\n",
		"GET /a HTTP/1.1\r\nHost: a\r\n\r\nGET /b HTTP/1.1\r\nHost: a\r\n\r\n",
		"GET /cached HTTP/1.1\r\nHost: a\r\n\r\n",                                        // warms the cache
		"GET /cached HTTP/1.1\r\nHost: a\r\n\r\nGET /cached HTTP/1.1\r\nHost: a\r\n\r\n", // two hits
		"splitGET /cached HTTP/1.1\r\nHost: a\r\n\r\n",                                   // one hit whose head came in two reads
	} {
		c, br := dial(t, addr)
		if strings.HasPrefix(batch, "split") {
			batch = batch[5:]
			io.WriteString(c, batch[:len(batch)-2])
			time.Sleep(50 * time.Millisecond)
			io.WriteString(c, "\r\n")
		} else {
			io.WriteString(c, batch)
		}
		for range strings.Count(batch, "GET") {
			readResponse(t, br, "GET")
		}
		time.Sleep(1500 * time.Millisecond) // idle: over read_header_timeout, under idle_timeout
		if _, err := io.WriteString(c, "GET /c HTTP/1.1\r\nHost: a\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		if resp, err := http.ReadResponse(br, &http.Request{Method: "GET"}); err != nil {
			t.Errorf("%d pipelined, then idle 1.5s (idle_timeout 5s): the next request: %v", strings.Count(batch, "GET"), err)
		} else {
			io.Copy(io.Discard, resp.Body)
		}
	}
}

// An empty line after a request (the CRLF some clients send after a body,
// RFC 9112 §2.2) begins no request: the connection stays idle for
// idle_timeout and then closes without a word. It used to start a head,
// and read_header_timeout later the client, idle, got a 408 it never asked
// for, which it would read as the answer to its next request. Whether the
// CRLF comes with the body, on its own once the answer was read, or waits
// in the input behind an answer over highWater (then the idle wait begins
// once that answer went), the same.
func TestEmptyLineAfterRequestLeavesItIdle(t *testing.T) {
	t.Parallel()
	big := strings.Repeat("x", 1<<20)
	ln := listen(t)
	rc, err := ln.(*net.TCPListener).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	// A small send buffer keeps most of the large answer in the server's output.
	rc.Control(func(fd uintptr) { syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_SNDBUF, 16<<10) })
	s, served := start(t, ln, loop.Options{Loops: 1,
		Limits: engine.Limits{ReadHeaderTimeout: 300 * time.Millisecond, IdleTimeout: 2 * time.Second},
		App: func(w *loop.AppResponse, r *loop.AppRequest) {
			if r.Path() == "/big" {
				w.WriteString(big)
				return
			}
			w.WriteString("ok")
		}})
	t.Cleanup(func() {
		s.Close()
		<-served
	})
	for _, tc := range []struct {
		name       string
		send, then string
		method     string
	}{
		{"with the body", "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\n\r\nq\r\n", "", "POST"},
		{"after the answer", "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\n\r\nq", "\r\n", "POST"},
		{"behind a large answer", "GET /big HTTP/1.1\r\nHost: a\r\n\r\n\r\n", "", "GET"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c, br := dial(t, ln.Addr().String())
			io.WriteString(c, tc.send)
			time.Sleep(100 * time.Millisecond) // the CRLF is read (before the answer, if it is large)
			if resp, _ := readResponse(t, br, tc.method); resp.StatusCode != 200 {
				t.Fatalf("%d", resp.StatusCode)
			}
			io.WriteString(c, tc.then)
			time.Sleep(time.Second) // over read_header_timeout, under idle_timeout
			if isClosed(t, c, br) {
				t.Fatal("closed after read_header_timeout, idle_timeout not over")
			}
			c.SetReadDeadline(time.Now().Add(4 * time.Second))
			if b, err := br.ReadByte(); err == nil {
				t.Errorf("idle after an empty line: got %q, want the close at idle_timeout", b)
			} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
				t.Error("idle after an empty line: still open 5s after the answer (idle_timeout 2s)")
			}
		})
	}
}

// A client slow to read a large answer (a cache hit of 12 MiB, queued in
// one write) reads it whole, then sends its next request on the same
// connection: it is read and answered. Reading stops while highWater of
// answers wait; it must start again once they went, input or not.
func TestNextRequestAfterLargeAnswer(t *testing.T) {
	t.Parallel()
	body := strings.Repeat("x", 12<<20)
	up := wiretest.StartUpstream(t, func(req *wiretest.Seen, w *bufio.Writer, c net.Conn) {
		w.WriteString("HTTP/1.1 200 OK\r\nCache-Control: max-age=600\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body)
	})
	rules := "[table]\ncounters = 1024\nresponses = 64\nresponse_bytes = \"64MiB\"\n[[cache]]\npath = \"/*\"\nmax_body = \"16MiB\"\n"
	addr, _ := serve(t, loop.Options{Upstream: up.URL(), Loops: 1, Core: configCore(t, rules),
		Limits: engine.Limits{IdleTimeout: 10 * time.Second}})
	c0, br0 := dial(t, addr)
	if resp, b := roundTrip(t, c0, br0, "GET /big HTTP/1.1\r\nHost: a\r\n\r\n"); resp.StatusCode != 200 || len(b) != len(body) {
		t.Fatalf("the fill: %d, %d bytes", resp.StatusCode, len(b))
	}
	// A small receive buffer: the answer waits in the server's output.
	d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		return rc.Control(func(fd uintptr) { syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) })
	}}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	br := bufio.NewReader(c)
	io.WriteString(c, "GET /big HTTP/1.1\r\nHost: a\r\n\r\n")
	time.Sleep(300 * time.Millisecond)
	if resp, b := readResponse(t, br, "GET"); resp.StatusCode != 200 || len(b) != len(body) {
		t.Fatalf("the hit: %d, %d bytes", resp.StatusCode, len(b))
	}
	c.SetDeadline(time.Now().Add(5 * time.Second))
	io.WriteString(c, "GET /big HTTP/1.1\r\nHost: a\r\n\r\n")
	resp, err := http.ReadResponse(br, &http.Request{Method: "GET"})
	if err != nil {
		t.Fatalf("the next request, after the large answer was read whole: %v (idle_timeout 10s)", err)
	}
	io.Copy(io.Discard, resp.Body)
}

// A response the core keeps (a cache fill within its max_body) whose
// client stopped reading, so that the upstream was held back, and then
// went away: the rest is read to its end (and stored), not left with the
// upstream's connection and its timer both stopped for good.
func TestKeptResponseOfAGoneClientIsReadToItsEnd(t *testing.T) {
	t.Parallel()
	const size = 16 << 20
	ln := listen(t)
	result := make(chan error, 1)
	wiretest.AcceptEach(ln, func(c net.Conn) {
		defer c.Close()
		br := bufio.NewReader(c)
		if _, err := http.ReadRequest(br); err != nil {
			result <- err
			return
		}
		fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nCache-Control: max-age=60\r\nContent-Length: %d\r\n\r\n", size)
		c.SetWriteDeadline(time.Now().Add(8 * time.Second))
		_, err := c.Write(bytes.Repeat([]byte("x"), size))
		result <- err
	})
	cache := "[table]\ncounters = 1024\nresponses = 64\nresponse_bytes = \"64MiB\"\n[[cache]]\npath = \"/big\"\nmax_body = \"32MiB\"\n"
	addr, _ := serve(t, loop.Options{Upstream: "http://" + ln.Addr().String(), Loops: 1, Core: configCore(t, cache),
		Client: engine.Upstream{Timeout: 20 * time.Second}})
	c, _ := dial(t, addr)
	c.(*net.TCPConn).SetReadBuffer(4096)
	io.WriteString(c, "GET /big HTTP/1.1\r\nHost: a\r\n\r\n")
	time.Sleep(300 * time.Millisecond) // the client's output passes highWater: the upstream is held back
	c.Close()
	if err := <-result; err != nil {
		t.Fatalf("the upstream's body after its client went away: %v; want it read to its end", err)
	}
}

// An upstream name of several addresses: the dials go round them, and
// one that refuses gives way to the next (localhost as ::1 and 127.0.0.1
// to an application on IPv4 only; a dead address among live ones).
func TestUpstreamAddressesTriedInTurn(t *testing.T) {
	t.Parallel()
	up := wiretest.Application(t, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
	live := netip.MustParseAddrPort(strings.TrimPrefix(up, "http://"))
	addr, s := serve(t, loop.Options{Upstream: up, Loops: 1, Client: engine.Upstream{MaxIdle: -1}})
	loop.SetUpstreamAddrs(s, []netip.AddrPort{
		netip.AddrPortFrom(netip.MustParseAddr("127.0.0.2"), live.Port()), // nothing listens there
		netip.AddrPortFrom(netip.IPv6Loopback(), live.Port()),
		live,
	})
	for i := range 6 {
		c, br := dial(t, addr)
		resp, body := roundTrip(t, c, br, "GET /x HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
		c.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("request %d: %d %s", i, resp.StatusCode, body)
		}
	}
}

// upstream_connect_timeout bounds the whole dial of a name of several
// addresses, as it does on the engines that dial with net.Dialer: three
// addresses that never answer give a 502 within the timeout, not after
// one timeout each.
func TestUpstreamAddressesShareTheConnectTimeout(t *testing.T) {
	t.Parallel()
	const timeout = 400 * time.Millisecond
	var addrs []netip.AddrPort
	for range 3 {
		addrs = append(addrs, netip.MustParseAddrPort(wiretest.FullBacklog(t)))
	}
	addr, s := serve(t, loop.Options{Upstream: "http://" + addrs[0].String(), Loops: 1,
		Client: engine.Upstream{ConnectTimeout: timeout}})
	loop.SetUpstreamAddrs(s, addrs)
	c, br := dial(t, addr)
	start := time.Now()
	resp, body := roundTrip(t, c, br, "GET /x HTTP/1.1\r\nHost: a\r\n\r\n")
	took := time.Since(start)
	if resp.StatusCode != 502 {
		t.Fatalf("status %d, want 502: %s", resp.StatusCode, body)
	}
	if took < timeout*3/4 || took > timeout*2 {
		t.Errorf("502 after %v; want it within the connect timeout, %v", took, timeout)
	}
}

// upstream_max_idle is the worker's, whatever its number of loops: 16
// requests at once over 4 loops leave at most one idle upstream
// connection for upstream_max_idle 1.
func TestMaxIdleIsTheWorkers(t *testing.T) {
	t.Parallel()
	ln := listen(t)
	var open atomic.Int32
	wiretest.AcceptEach(ln, func(c net.Conn) {
		open.Add(1)
		defer open.Add(-1)
		defer c.Close()
		c.SetDeadline(time.Now().Add(10 * time.Second))
		br := bufio.NewReader(c)
		for {
			if _, err := http.ReadRequest(br); err != nil {
				return
			}
			time.Sleep(100 * time.Millisecond) // so that the requests overlap
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		}
	})
	addr, _ := serve(t, loop.Options{Upstream: "http://" + ln.Addr().String(), Loops: 4, Client: engine.Upstream{MaxIdle: 1}})
	done := make(chan error, 16)
	for range 16 {
		go func() {
			c, err := net.DialTimeout("tcp", addr, 5*time.Second)
			if err != nil {
				done <- err
				return
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(5 * time.Second))
			io.WriteString(c, "GET /x HTTP/1.1\r\nHost: a\r\n\r\n")
			_, err = http.ReadResponse(bufio.NewReader(c), nil)
			done <- err
		}()
	}
	for range 16 {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	for end := time.Now().Add(5 * time.Second); open.Load() > 1 && time.Now().Before(end); {
		time.Sleep(10 * time.Millisecond)
	}
	if n := open.Load(); n > 1 {
		t.Errorf("upstream_max_idle 1: %d idle upstream connections kept", n)
	}
}

// A head the server refuses before a request exists (too large, too slow,
// malformed) is answered on a request object from the loop's pool: what
// the previous request that used it was (HEAD) must not shape the answer.
// It used to go out as an answer to HEAD, its Content-Length without the
// body, and the client read a response cut short.
func TestRefusedHeadAfterHEADHasItsBody(t *testing.T) {
	t.Parallel()
	up := wiretest.StartUpstream(t, func(req *wiretest.Seen, w *bufio.Writer, c net.Conn) {
		w.WriteString("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n")
		if req.Req.Method != "HEAD" {
			w.WriteString("ok")
		}
	})
	addr, _ := serve(t, loop.Options{Upstream: up.URL(), Loops: 1, Limits: engine.Limits{MaxHeaderBytes: 4 << 10}})
	c, br := dial(t, addr)
	if resp, _ := roundTrip(t, c, br, "HEAD / HTTP/1.1\r\nHost: a\r\n\r\n"); resp.StatusCode != 200 {
		t.Fatalf("HEAD: %d", resp.StatusCode)
	}
	c2, br2 := dial(t, addr)
	io.WriteString(c2, "GET /"+strings.Repeat("a", 5<<10))
	resp, body := readResponse(t, br2, "GET")
	if resp.StatusCode != 431 || int64(len(body)) != resp.ContentLength || len(body) == 0 {
		t.Errorf("a head too large after a HEAD: %d, Content-Length %d, body %q", resp.StatusCode, resp.ContentLength, body)
	}
}

// A client that half-closes after its request (shutdown(SHUT_WR), as a
// client sending a last request may) still gets the whole answer: an EOF
// read between requests, or in the middle of a head that will never end,
// used to close the connection at once, dropping what of the answer
// before it the socket had not taken yet. The listening socket's small
// send buffer (the accepted connections inherit it) leaves the answer
// there, under highWater (reading goes on).
func TestHalfCloseAfterRequestGetsTheWholeAnswer(t *testing.T) {
	t.Parallel()
	big := bytes.Repeat([]byte("0123456789abcdef"), 200<<10/16)
	for _, tc := range []struct{ name, after string }{
		{"between requests", ""},
		{"in a head", "GET /next HTTP/1.1\r\nHo"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ln := listen(t)
			rc, err := ln.(*net.TCPListener).SyscallConn()
			if err != nil {
				t.Fatal(err)
			}
			rc.Control(func(fd uintptr) { syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_SNDBUF, 16<<10) })
			s, served := start(t, ln, loop.Options{Loops: 1, App: func(w *loop.AppResponse, r *loop.AppRequest) { w.Write(big) }})
			t.Cleanup(func() {
				s.Close()
				<-served
			})
			c, br := dial(t, ln.Addr().String())
			io.WriteString(c, "GET / HTTP/1.1\r\nHost: a\r\n\r\n"+tc.after)
			time.Sleep(100 * time.Millisecond) // answered, and partly sent
			c.(*net.TCPConn).CloseWrite()
			time.Sleep(100 * time.Millisecond) // the EOF is read
			resp, body := readResponse(t, br, "GET")
			if resp.StatusCode != 200 || !bytes.Equal(body, big) {
				t.Errorf("%d, %d bytes of %d", resp.StatusCode, len(body), len(big))
			}
			if !isClosed(t, c, br) {
				t.Error("the connection stayed open after the answer")
			}
		})
	}
}
