//go:build linux

package loop_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/preforkd/preforkd/engine"
	"github.com/preforkd/preforkd/engine/loop"
	"github.com/preforkd/preforkd/internal/wiretest"
)

// Stories of the event-loop engine that a table of exchanges cannot tell
// (the tables are in package proxy's conformance tests, which run every
// row on every engine): streaming, back-pressure, timeouts, limits,
// upgrades, pipelining, the drain.

func TestServerSentEventsArriveOneByOne(t *testing.T) {
	t.Parallel()
	next := make(chan struct{})
	up := wiretest.StartUpstream(t, func(req *wiretest.Seen, w *bufio.Writer, c net.Conn) {
		w.WriteString("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
		for i := range 3 {
			ev := fmt.Sprintf("data: %d\n\n", i)
			fmt.Fprintf(w, "%x\r\n%s\r\n", len(ev), ev)
			w.Flush()
			<-next // the client must have seen this event before the next is sent
		}
		w.WriteString("0\r\n\r\n")
	})
	addr, _ := serve(t, loop.Options{Upstream: up.URL()})
	c, br := dial(t, addr)
	resp := roundTripHead(t, c, br, "GET /events HTTP/1.1\r\nHost: a\r\n\r\n")
	if resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Errorf("Content-Type %q", resp.Header.Get("Content-Type"))
	}
	events := bufio.NewReader(resp.Body)
	for i := range 3 {
		c.SetReadDeadline(time.Now().Add(2 * time.Second))
		line, err := events.ReadString('\n')
		if err != nil {
			t.Fatalf("event %d did not arrive on its own: %v", i, err)
		}
		if want := fmt.Sprintf("data: %d\n", i); line != want {
			t.Fatalf("event %d: %q, want %q", i, line, want)
		}
		events.ReadString('\n')
		next <- struct{}{}
	}
	if rest, err := io.ReadAll(resp.Body); err != nil || len(rest) != 0 {
		t.Errorf("after the events: %q, %v", rest, err)
	}
}

func sum(r io.Reader) ([32]byte, int64) {
	h := sha256.New()
	n, _ := io.Copy(h, r)
	var out [32]byte
	copy(out[:], h.Sum(nil))
	return out, n
}

// TestLargeBodiesStream sends bodies far over the read-ahead both ways,
// with a length and chunked, and checks every byte arrives.
func TestLargeBodiesStream(t *testing.T) {
	t.Parallel()
	const size = 8 << 20
	want, _ := sum(wiretest.Pattern(size))
	up := wiretest.StartUpstream(t, func(req *wiretest.Seen, w *bufio.Writer, c net.Conn) {
		got, _ := sum(bytes.NewReader(req.Body))
		if req.Req.Method == "POST" {
			fmt.Fprintf(w, "HTTP/1.1 200 OK\r\nContent-Length: 64\r\n\r\n%x", got)
			return
		}
		if req.Req.URL.Query().Get("chunked") != "" {
			w.WriteString("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
			buf := make([]byte, 100<<10)
			r := wiretest.Pattern(size)
			for {
				n, err := io.ReadFull(r, buf)
				if n > 0 {
					fmt.Fprintf(w, "%x\r\n", n)
					w.Write(buf[:n])
					w.WriteString("\r\n")
				}
				if err != nil {
					break
				}
			}
			w.WriteString("0\r\n\r\n")
			return
		}
		fmt.Fprintf(w, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n", size)
		io.Copy(w, wiretest.Pattern(size))
	})
	addr, _ := serve(t, loop.Options{Upstream: up.URL()})
	for _, chunked := range []bool{false, true} {
		t.Run(fmt.Sprintf("upload chunked=%v", chunked), func(t *testing.T) {
			c, br := dial(t, addr)
			if chunked {
				io.WriteString(c, "POST /up HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n")
				cw := &chunkWriter{c}
				io.Copy(cw, wiretest.Pattern(size))
				cw.Close()
			} else {
				fmt.Fprintf(c, "POST /up HTTP/1.1\r\nHost: a\r\nContent-Length: %d\r\n\r\n", size)
				io.Copy(c, wiretest.Pattern(size))
			}
			resp, body := readResponse(t, br, "POST")
			if resp.StatusCode != 200 || string(body) != fmt.Sprintf("%x", want) {
				t.Errorf("upload: status %d, the upstream got sha256 %s, want %x", resp.StatusCode, body, want)
			}
			seen := up.Requests()
			last := seen[len(seen)-1]
			if chunked {
				if got := last.Field("Transfer-Encoding"); len(got) != 1 || got[0] != "chunked" {
					t.Errorf("a long chunked upload went upstream with Transfer-Encoding %q", got)
				}
			} else if got := last.Field("Content-Length"); fmt.Sprint(got) != fmt.Sprint([]string{strconv.Itoa(size)}) {
				t.Errorf("Content-Length upstream %q, want %d", got, size)
			}
		})
		t.Run(fmt.Sprintf("download chunked=%v", chunked), func(t *testing.T) {
			c, br := dial(t, addr)
			q := ""
			if chunked {
				q = "?chunked=1"
			}
			resp := roundTripHead(t, c, br, "GET /down"+q+" HTTP/1.1\r\nHost: a\r\n\r\n")
			got, n := sum(resp.Body)
			if got != want || n != size {
				t.Errorf("download: %d bytes, sha256 %x, want %d, %x", n, got, size, want)
			}
			if !chunked && resp.ContentLength != size {
				t.Errorf("download Content-Length %d, want %d", resp.ContentLength, size)
			}
		})
	}
}

type chunkWriter struct{ w io.Writer }

func (c *chunkWriter) Write(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	if _, err := fmt.Fprintf(c.w, "%x\r\n%s\r\n", len(p), p); err != nil {
		return 0, err
	}
	return len(p), nil
}

func (c *chunkWriter) Close() error {
	_, err := io.WriteString(c.w, "0\r\n\r\n")
	return err
}

// TestDownloadBackPressure: a client that reads nothing while a large
// body arrives stops the upstream (the engine stops reading it) instead
// of making the engine hold the body: the upstream's writes stall with
// the body far from sent, and the client still gets every byte once it
// reads.
func TestDownloadBackPressure(t *testing.T) {
	t.Parallel()
	const size = 64 << 20
	written := make(chan int64, 1)
	up := wiretest.StartUpstream(t, func(req *wiretest.Seen, w *bufio.Writer, c net.Conn) {
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
	addr, _ := serve(t, loop.Options{Upstream: up.URL()})
	c, br := dial(t, addr)
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
	resp := readHead(t, br, "GET")
	want, _ := sum(wiretest.Pattern(size))
	if got, m := sum(resp.Body); got != want || m != size {
		t.Errorf("download after the stall: %d bytes, want %d, the same", m, size)
	}
}

func TestUpstreamFailures(t *testing.T) {
	t.Parallel()
	ln := listen(t)
	closedPort := ln.Addr().String()
	ln.Close()
	full := fullBacklog(t)
	silent := wiretest.StartUpstream(t, func(req *wiretest.Seen, w *bufio.Writer, c net.Conn) {
		time.Sleep(2 * time.Second)
	})
	rude := wiretest.StartUpstream(t, func(req *wiretest.Seen, w *bufio.Writer, c net.Conn) {
		c.Close()
	})
	cases := []struct {
		name     string
		upstream string
		status   int
		within   time.Duration
		atLeast  time.Duration
	}{
		{"refused", "http://" + closedPort, 502, time.Second, 0},
		{"connect timeout", "http://" + full, 502, 2 * time.Second, 300 * time.Millisecond},
		{"no response header", silent.URL(), 504, 2 * time.Second, 300 * time.Millisecond},
		{"closed without a response", rude.URL(), 502, time.Second, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			addr, s := serve(t, loop.Options{Upstream: tc.upstream,
				Client: engine.Upstream{ConnectTimeout: 300 * time.Millisecond, Timeout: 300 * time.Millisecond}})
			c, br := dial(t, addr)
			start := time.Now()
			resp, body := roundTrip(t, c, br, "GET /x HTTP/1.1\r\nHost: a\r\n\r\n")
			took := time.Since(start)
			if resp.StatusCode != tc.status {
				t.Errorf("status %d, want %d: %s", resp.StatusCode, tc.status, body)
			}
			if resp.Header.Get("Content-Type") != "application/problem+json" {
				t.Errorf("Content-Type %q", resp.Header.Get("Content-Type"))
			}
			if took > tc.within || took < tc.atLeast {
				t.Errorf("answered after %v, want between %v and %v", took, tc.atLeast, tc.within)
			}
			st := s.Stats()
			if got := st.UpstreamErrors + st.UpstreamTimeouts; got != 1 || (tc.status == 504) != (st.UpstreamTimeouts == 1) {
				t.Errorf("stats %+v", st)
			}
			if resp, _ := roundTrip(t, c, br, "GET /x HTTP/1.1\r\nHost: a\r\n\r\n"); resp.StatusCode != tc.status {
				t.Errorf("second request: %d", resp.StatusCode)
			}
		})
	}
}

// fullBacklog returns the address of a loopback listener that accepts
// nothing and whose backlog is full: a connection attempt to it hangs.
func fullBacklog(t *testing.T) string {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Listen(fd, 0); err != nil {
		t.Fatal(err)
	}
	sa, _ := syscall.Getsockname(fd)
	addr := fmt.Sprintf("127.0.0.1:%d", sa.(*syscall.SockaddrInet4).Port)
	for range 4 {
		d := net.Dialer{Timeout: 100 * time.Millisecond}
		if c, err := d.Dial("tcp", addr); err == nil {
			t.Cleanup(func() { c.Close() })
		}
	}
	d := net.Dialer{Timeout: 200 * time.Millisecond}
	if c, err := d.Dial("tcp", addr); err == nil {
		c.Close()
		t.Fatal("this kernel accepts connections beyond a full backlog")
	}
	return addr
}

func TestSlowBodyIsCut(t *testing.T) {
	t.Parallel()
	up := wiretest.StartUpstream(t, nil)
	addr, s := serve(t, loop.Options{Upstream: up.URL(), Limits: engine.Limits{ClientBodyTimeout: 300 * time.Millisecond}})
	c, br := dial(t, addr)
	start := time.Now()
	io.WriteString(c, "POST /slow HTTP/1.1\r\nHost: a\r\nContent-Length: 10\r\n\r\n")
	go wiretest.Trickle(c, strings.Repeat("x", 10), time.Second)
	resp, _ := readResponse(t, br, "POST")
	if resp.StatusCode != http.StatusRequestTimeout {
		t.Errorf("status %d, want 408", resp.StatusCode)
	}
	if took := time.Since(start); took > 900*time.Millisecond {
		t.Errorf("cut after %v, want about 300ms", took)
	}
	if !isClosed(t, c, br) {
		t.Errorf("the connection stays open after a body timeout")
	}
	if n := len(up.Requests()); n != 0 {
		t.Errorf("the upstream saw %d requests", n)
	}
	if s.Stats().BadRequests != 1 {
		t.Errorf("stats %+v", s.Stats())
	}
}

func TestBodyTimeoutIsBetweenReads(t *testing.T) {
	t.Parallel()
	up := wiretest.StartUpstream(t, nil)
	addr, _ := serve(t, loop.Options{Upstream: up.URL(), Limits: engine.Limits{ClientBodyTimeout: 400 * time.Millisecond}})
	c, br := dial(t, addr)
	io.WriteString(c, "POST /slow HTTP/1.1\r\nHost: a\r\nContent-Length: 6\r\n\r\n")
	for range 6 {
		time.Sleep(150 * time.Millisecond)
		c.Write([]byte("y"))
	}
	resp, _ := readResponse(t, br, "POST")
	if resp.StatusCode != 200 {
		t.Errorf("status %d", resp.StatusCode)
	}
	if seen := up.Requests(); len(seen) != 1 || string(seen[0].Body) != "yyyyyy" {
		t.Errorf("upstream saw %v", seen)
	}
}

func TestHeaderAndIdleTimeouts(t *testing.T) {
	t.Parallel()
	up := wiretest.StartUpstream(t, nil)
	addr, _ := serve(t, loop.Options{Upstream: up.URL(),
		Limits: engine.Limits{ReadHeaderTimeout: 300 * time.Millisecond, IdleTimeout: 500 * time.Millisecond}})

	t.Run("a header that never ends: 408", func(t *testing.T) {
		t.Parallel()
		c, br := dial(t, addr)
		start := time.Now()
		resp, _ := roundTrip(t, c, br, "GET / HTTP/1.1\r\nHost: a\r\nX-Slow: ")
		if resp.StatusCode != http.StatusRequestTimeout {
			t.Errorf("status %d", resp.StatusCode)
		}
		if took := time.Since(start); took > time.Second {
			t.Errorf("answered after %v", took)
		}
	})
	t.Run("a connection that sends nothing is closed silently", func(t *testing.T) {
		t.Parallel()
		start := time.Now()
		c, _ := dial(t, addr)
		b, err := io.ReadAll(c)
		if err != nil || len(b) != 0 {
			t.Errorf("read %q, %v; want a quiet close", b, err)
		}
		if took := time.Since(start); took < 250*time.Millisecond || took > time.Second {
			t.Errorf("closed after %v, want about 300ms", took)
		}
	})
	t.Run("an idle keep-alive connection is closed at the idle timeout", func(t *testing.T) {
		t.Parallel()
		c, br := dial(t, addr)
		start := time.Now()
		roundTrip(t, c, br, "GET / HTTP/1.1\r\nHost: a\r\n\r\n")
		b, err := io.ReadAll(br)
		if err != nil || len(b) != 0 {
			t.Errorf("read %q, %v; want a quiet close", b, err)
		}
		if took := time.Since(start); took < 450*time.Millisecond || took > 1500*time.Millisecond {
			t.Errorf("closed after %v, want about 500ms", took)
		}
	})
	t.Run("a header ended by a bare LF: 400 at once", func(t *testing.T) {
		t.Parallel()
		c, br := dial(t, addr)
		start := time.Now()
		resp, _ := roundTrip(t, c, br, "GET / HTTP/1.1\nHost: a\n")
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("status %d", resp.StatusCode)
		}
		if took := time.Since(start); took > 200*time.Millisecond {
			t.Errorf("answered after %v, want at once", took)
		}
	})
}

func TestSendTimeout(t *testing.T) {
	t.Parallel()
	const size = 64 << 20
	up := wiretest.StartUpstream(t, func(req *wiretest.Seen, w *bufio.Writer, c net.Conn) {
		fmt.Fprintf(w, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n", size)
		io.Copy(w, wiretest.Pattern(size))
	})
	addr, s := serve(t, loop.Options{Upstream: up.URL(), Limits: engine.Limits{SendTimeout: 300 * time.Millisecond}})
	c, _ := dial(t, addr)
	c.(*net.TCPConn).SetReadBuffer(4 << 10)
	io.WriteString(c, "GET /big HTTP/1.1\r\nHost: a\r\n\r\n")
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) && s.Stats().Open > 0 {
		time.Sleep(20 * time.Millisecond)
	}
	if open := s.Stats().Open; open != 0 {
		t.Fatalf("a client that reads nothing still holds its connection after 5s")
	}
}

func TestMaxConnections(t *testing.T) {
	t.Parallel()
	up := wiretest.StartUpstream(t, nil)
	addr, s := serve(t, loop.Options{Upstream: up.URL(), Limits: engine.Limits{MaxConnections: 2}})
	c1, br1 := dial(t, addr)
	c2, _ := dial(t, addr)
	c3, br3 := dial(t, addr) // the kernel accepts it; the server does not yet
	_ = c2
	io.WriteString(c3, "GET /third HTTP/1.1\r\nHost: a\r\n\r\n")
	c3.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	if _, err := br3.Peek(1); err == nil {
		t.Fatal("a third connection was served with MaxConnections 2")
	}
	if open := s.Stats().Open; open != 2 {
		t.Errorf("%d connections open, want 2", open)
	}
	roundTrip(t, c1, br1, "GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
	c3.SetReadDeadline(time.Now().Add(5 * time.Second))
	if resp, _ := readResponse(t, br3, "GET"); resp.StatusCode != 200 {
		t.Errorf("the third connection, once a slot was free: %d", resp.StatusCode)
	}
}

// TestSlowloris opens many connections that send a partial header and
// nothing more: each is cut at the header timeout, and the server never
// holds more than MaxConnections.
func TestSlowloris(t *testing.T) {
	t.Parallel()
	const n, max = 200, 50
	up := wiretest.StartUpstream(t, nil)
	addr, s := serve(t, loop.Options{Upstream: up.URL(), Limits: engine.Limits{MaxConnections: max, ReadHeaderTimeout: 300 * time.Millisecond}})
	stopSampling := wiretest.SamplePeak(5*time.Millisecond, func() int64 { return s.Stats().Open })
	start := time.Now()
	wiretest.Slowloris(addr, n, "GET / HTTP/1.1\r\nHost: a\r\n", 10*time.Second)
	peak := stopSampling()
	took := time.Since(start)
	if peak > max {
		t.Errorf("%d connections open at once, over MaxConnections %d", peak, max)
	}
	if want := time.Duration(n/max+2) * 300 * time.Millisecond * 2; took > want {
		t.Errorf("%d slow connections took %v to be cut, want under %v", n, took, want)
	}
	c, br := dial(t, addr)
	if resp, _ := roundTrip(t, c, br, "GET / HTTP/1.1\r\nHost: a\r\n\r\n"); resp.StatusCode != 200 {
		t.Errorf("status %d", resp.StatusCode)
	}
}

func TestUpgradeIsTunnelled(t *testing.T) {
	t.Parallel()
	up := wiretest.StartUpstream(t, func(req *wiretest.Seen, w *bufio.Writer, c net.Conn) {
		if req.Req.Header.Get("Upgrade") != "echo" {
			w.WriteString("HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
			return
		}
		w.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: echo\r\nConnection: Upgrade\r\nX-Up: 1\r\n\r\nhello ")
		w.Flush()
		br := bufio.NewReader(c)
		io.Copy(c, br)
		io.WriteString(c, "bye")
		c.Close()
	})
	addr, s := serve(t, loop.Options{Upstream: up.URL()})
	c, br := dial(t, addr)
	resp := roundTripHead(t, c, br, "GET /ws HTTP/1.1\r\nHost: a\r\nConnection: keep-alive, Upgrade\r\nUpgrade: echo\r\n\r\n")
	if resp.StatusCode != 101 || resp.Header.Get("Upgrade") != "echo" || resp.Header.Get("X-Up") != "1" ||
		!strings.EqualFold(resp.Header.Get("Connection"), "upgrade") {
		t.Fatalf("response %d %v", resp.StatusCode, resp.Header)
	}
	io.WriteString(c, "ping 1, ")
	io.WriteString(c, "ping 2")
	c.(*net.TCPConn).CloseWrite()
	got, err := io.ReadAll(br)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != "hello ping 1, ping 2bye" {
		t.Errorf("through the tunnel: %q", got)
	}
	// Both ends were passed on: the tunnel is closed, not left to the
	// upstream timeout.
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) && s.Stats().Open > 0 {
		time.Sleep(10 * time.Millisecond)
	}
	if open := s.Stats().Open; open != 0 {
		t.Errorf("%d connections open after both sides ended", open)
	}
	seen := up.Requests()
	if len(seen) != 1 || fmt.Sprint(seen[0].Field("Connection")) != "[Upgrade]" || fmt.Sprint(seen[0].Field("Upgrade")) != "[echo]" {
		t.Errorf("the upstream saw %+v", seen[0].Lines)
	}
}

func TestUpgradeRefusedByUpstream(t *testing.T) {
	t.Parallel()
	up := wiretest.StartUpstream(t, nil)
	addr, _ := serve(t, loop.Options{Upstream: up.URL()})
	c, br := dial(t, addr)
	resp, body := roundTrip(t, c, br, "GET /ws HTTP/1.1\r\nHost: a\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n")
	if resp.StatusCode != 200 || string(body) != "ok" {
		t.Errorf("%d %q", resp.StatusCode, body)
	}
	if resp, _ := roundTrip(t, c, br, "GET /after HTTP/1.1\r\nHost: a\r\n\r\n"); resp.StatusCode != 200 {
		t.Errorf("the connection after a refused upgrade: %d", resp.StatusCode)
	}
}

// TestStaleUpstreamConnection: the upstream closes every keep-alive
// connection right after its response; requests sent on such a pooled
// connection are sent again on a new one, never answered 502.
func TestStaleUpstreamConnection(t *testing.T) {
	t.Parallel()
	up := wiretest.StartUpstream(t, func(req *wiretest.Seen, w *bufio.Writer, c net.Conn) {
		w.WriteString("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		w.Flush()
		time.Sleep(20 * time.Millisecond)
		c.Close()
	})
	addr, _ := serve(t, loop.Options{Upstream: up.URL()})
	c, br := dial(t, addr)
	for i := range 5 {
		if resp, body := roundTrip(t, c, br, "GET / HTTP/1.1\r\nHost: a\r\n\r\n"); resp.StatusCode != 200 {
			t.Fatalf("request %d: %d %s", i, resp.StatusCode, body)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestStaleConnectionRetried: a pooled connection the upstream closed
// in the same moment the request went on it (it was clean at the peek)
// is retried once on a new connection for an idempotent request, and
// never for a POST.
func TestStaleConnectionRetried(t *testing.T) {
	t.Parallel()
	ln := listen(t)
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
	addr, _ := serve(t, loop.Options{Upstream: "http://" + ln.Addr().String()})
	c, br := dial(t, addr)
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
}

// TestEarlyResponse: the upstream answers 413 after the head of a long
// upload, without reading it.
func TestEarlyResponse(t *testing.T) {
	t.Parallel()
	ln := listen(t)
	wiretest.AcceptEach(ln, func(c net.Conn) {
		br := bufio.NewReader(c)
		if _, err := http.ReadRequest(br); err != nil {
			return
		}
		io.WriteString(c, "HTTP/1.1 413 Content Too Large\r\nContent-Length: 3\r\nConnection: close\r\n\r\nbig")
		c.(*net.TCPConn).CloseWrite()
		io.Copy(io.Discard, br)
	})
	addr, _ := serve(t, loop.Options{Upstream: "http://" + ln.Addr().String()})
	c, br := dial(t, addr)
	const size = 4 << 20
	fmt.Fprintf(c, "POST /up HTTP/1.1\r\nHost: a\r\nContent-Length: %d\r\n\r\n", size)
	go io.Copy(c, wiretest.Pattern(size))
	resp, body := readResponse(t, br, "POST")
	if resp.StatusCode != 413 || string(body) != "big" {
		t.Errorf("%d %q", resp.StatusCode, body)
	}
}

// TestPipelining: requests sent at once on one connection are answered
// in order, each once, each forwarded once.
func TestPipelining(t *testing.T) {
	t.Parallel()
	up := wiretest.StartUpstream(t, func(req *wiretest.Seen, w *bufio.Writer, c net.Conn) {
		body := req.Req.URL.Path
		fmt.Fprintf(w, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	})
	var mu sync.Mutex
	var statuses []int
	addr, _ := serve(t, loop.Options{Upstream: up.URL(), OnResponse: func(st int) {
		mu.Lock()
		statuses = append(statuses, st)
		mu.Unlock()
	}})
	c, br := dial(t, addr)
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
	mu.Lock()
	defer mu.Unlock()
	if len(statuses) != n {
		t.Errorf("OnResponse called %d times for %d answers", len(statuses), n)
	}
}

// TestShutdownFailsNoRequest: a drain lets the request in flight finish,
// tells a busy keep-alive connection Connection: close, serves a request
// that arrives on an idle connection within the grace, and closes idle
// connections after it.
func TestShutdownFailsNoRequest(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	up := wiretest.StartUpstream(t, func(req *wiretest.Seen, w *bufio.Writer, c net.Conn) {
		if req.Req.URL.Path == "/slow" {
			<-release
		}
		w.WriteString("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
	})
	ln := listen(t)
	s, served := start(t, ln, loop.Options{Upstream: up.URL()})
	loop.SetDrainGraces(s, 400*time.Millisecond, 5*time.Second)
	addr := ln.Addr().String()

	busy, busyR := dial(t, addr)
	idle, idleR := dial(t, addr)
	roundTrip(t, idle, idleR, "GET / HTTP/1.1\r\nHost: a\r\n\r\n")
	io.WriteString(busy, "GET /slow HTTP/1.1\r\nHost: a\r\n\r\n")
	up.WaitRequests(2, 2*time.Second)

	shut := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		shut <- s.Shutdown(ctx)
	}()
	time.Sleep(100 * time.Millisecond)
	resp, _ := roundTrip(t, idle, idleR, "GET /late HTTP/1.1\r\nHost: a\r\n\r\n")
	if resp.StatusCode != 200 || !resp.Close {
		t.Errorf("a request on an idle connection during the drain: %d, close %v", resp.StatusCode, resp.Close)
	}
	if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		c.SetReadDeadline(time.Now().Add(time.Second))
		io.WriteString(c, "GET / HTTP/1.1\r\nHost: a\r\n\r\n")
		if b, _ := io.ReadAll(c); len(b) != 0 {
			t.Errorf("a connection made after Shutdown was served: %q", b)
		}
		c.Close()
	}
	close(release)
	resp, _ = readResponse(t, busyR, "GET")
	if resp.StatusCode != 200 || !resp.Close {
		t.Errorf("the request in flight: %d, close %v", resp.StatusCode, resp.Close)
	}
	select {
	case err := <-shut:
		if err != nil {
			t.Errorf("Shutdown: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Shutdown did not return")
	}
	if err := <-served; err != nil {
		t.Errorf("Serve: %v", err)
	}
}

// TestShutdownClosesIdleAfterGrace: an idle connection that sends nothing
// is closed once idle for the grace, quietly.
func TestShutdownClosesIdleAfterGrace(t *testing.T) {
	t.Parallel()
	up := wiretest.StartUpstream(t, nil)
	addr, s := serve(t, loop.Options{Upstream: up.URL()})
	loop.SetDrainGraces(s, 300*time.Millisecond, 300*time.Millisecond)
	idle, idleR := dial(t, addr)
	roundTrip(t, idle, idleR, "GET / HTTP/1.1\r\nHost: a\r\n\r\n")
	fresh, _ := dial(t, addr)
	time.Sleep(50 * time.Millisecond)
	start := time.Now()
	shutdown(t, s, 5*time.Second)
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("Shutdown took %v", took)
	}
	for _, c := range []io.Reader{idleR, fresh} {
		if b, err := io.ReadAll(c); len(b) != 0 || (err != nil && !errors.Is(err, syscall.ECONNRESET)) {
			t.Errorf("an idle connection at the drain read %q, %v; want a quiet close", b, err)
		}
	}
}

// OnResponse sees the status of every answer, the server's own ones too.
func TestOnResponse(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var seen []int
	addr, _ := serve(t, loop.Options{
		App: func(w *loop.AppResponse, r *loop.AppRequest) {
			if r.Path() == "/fail" {
				w.WriteHeader(503)
			}
		},
		OnResponse: func(status int) {
			mu.Lock()
			seen = append(seen, status)
			mu.Unlock()
		},
	})
	c, br := dial(t, addr)
	for _, tc := range []struct {
		req    string
		status int
	}{
		{"GET /ok HTTP/1.1\r\nHost: a\r\n\r\n", 200},
		{"GET /fail HTTP/1.1\r\nHost: a\r\n\r\n", 503},
		{"GET /a%2Fb HTTP/1.1\r\nHost: a\r\n\r\n", 400},
	} {
		resp, _ := roundTrip(t, c, br, tc.req)
		mu.Lock()
		got := slices.Clone(seen)
		mu.Unlock()
		if resp.StatusCode != tc.status || len(got) == 0 || got[len(got)-1] != tc.status {
			t.Fatalf("%q: status %d, OnResponse saw %v; want %d", tc.req, resp.StatusCode, got, tc.status)
		}
	}
	if len(seen) != 3 {
		t.Errorf("OnResponse called %d times for 3 answers", len(seen))
	}
}

// TestNotAListener: Serve needs a socket to accept from.
func TestNotAListener(t *testing.T) {
	s, err := loop.New(loop.Options{Upstream: "http://127.0.0.1:1", Core: configCore(t, ""), Logger: quietLog})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Serve(&fakeListener{}); err == nil || !strings.Contains(err.Error(), "descriptor") {
		t.Errorf("Serve on a listener without a descriptor: %v", err)
	}
}

type fakeListener struct{}

func (fakeListener) Accept() (net.Conn, error) { return nil, net.ErrClosed }
func (fakeListener) Close() error              { return nil }
func (fakeListener) Addr() net.Addr            { return &net.TCPAddr{} }

// A short body the answer did not need (a refusal) is read and dropped,
// and the connection serves the next request; one that never comes is
// cut at the body timeout.
func TestUnreadBodyDropped(t *testing.T) {
	t.Parallel()
	up := wiretest.StartUpstream(t, nil)
	addr, _ := serve(t, loop.Options{Upstream: up.URL(), Limits: engine.Limits{ClientBodyTimeout: 300 * time.Millisecond},
		Core: configCore(t, "[table]\ncounters = 1024\n[[ratelimit]]\nname = \"p\"\npath = \"/p\"\nlimit = 1\nwindow = \"1m\"\n")})
	c, br := dial(t, addr)
	roundTrip(t, c, br, "POST /p HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\nabc")
	io.WriteString(c, "POST /p HTTP/1.1\r\nHost: a\r\nContent-Length: 6\r\n\r\nab")
	if resp, _ := readResponse(t, br, "POST"); resp.StatusCode != 429 || resp.Close {
		t.Fatalf("a refused POST: %d, close %v", resp.StatusCode, resp.Close)
	}
	io.WriteString(c, "cdGET /after HTTP/1.1\r\nHost: a\r\n\r\n")
	if resp, body := readResponse(t, br, "GET"); resp.StatusCode != 200 || string(body) != "ok" {
		t.Fatalf("the request after the dropped body: %d %q", resp.StatusCode, body)
	}
	io.WriteString(c, "POST /p HTTP/1.1\r\nHost: a\r\nContent-Length: 6\r\n\r\n") // and nothing of the body
	readResponse(t, br, "POST")
	start := time.Now()
	if !isClosedWithin(c, br, 2*time.Second) || time.Since(start) > time.Second {
		t.Errorf("a body that never came still holds its connection after %v", time.Since(start))
	}
	if n := len(up.Requests()); n != 2 {
		t.Errorf("the upstream saw %d requests, want 2", n)
	}
}

// isClosedWithin waits up to d for the server to close c.
func isClosedWithin(c net.Conn, br *bufio.Reader, d time.Duration) bool {
	c.SetReadDeadline(time.Now().Add(d))
	_, err := br.ReadByte()
	return err != nil && !errors.Is(err, os.ErrDeadlineExceeded)
}
