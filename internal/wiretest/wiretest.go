package wiretest

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Dial connects to addr with timeout as the deadline of the whole
// exchange; the connection is closed when the test ends.
func Dial(t testing.TB, addr string, timeout time.Duration) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(timeout))
	return c, bufio.NewReader(c)
}

// Application serves h on a loopback listener with net/http until the
// test ends, and returns its URL ("http://127.0.0.1:port").
func Application(t testing.TB, h http.HandlerFunc) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return "http://" + ln.Addr().String()
}

// AcceptEach serves every connection ln accepts with handle, each on a
// goroutine of its own, until ln is closed; a connection is closed when
// handle returns. It is the other end for a client that writes by hand.
func AcceptEach(ln net.Listener, handle func(c net.Conn)) {
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				handle(c)
			}()
		}
	}()
}

// Pattern returns n bytes that are not all alike, the same ones on every
// call: a body to compare end to end. The bytes repeat every 16.
func Pattern(n int64) io.Reader { return io.LimitReader(&pattern{}, n) }

type pattern struct{ x byte }

func (p *pattern) Read(b []byte) (int, error) {
	for i := range b {
		b[i] = p.x
		p.x = p.x*31 + 7
	}
	return len(b), nil
}

// CutOff is an upstream's answer (a StartUpstream handler's) that sends
// a 200 of size bytes (Pattern) with the extra header lines given, and
// reports on result how the copy ended: nil when all of it went, an
// error when the server cut the connection, a timeout after 5 s when it
// neither read nor cut. For the tests of what is read for a client gone.
func CutOff(size int64, extra string, result chan<- error) func(*Seen, *bufio.Writer, net.Conn) {
	return func(_ *Seen, w *bufio.Writer, c net.Conn) {
		fmt.Fprintf(w, "HTTP/1.1 200 OK\r\n%sContent-Length: %d\r\n\r\n", extra, size)
		w.Flush()
		c.SetWriteDeadline(time.Now().Add(5 * time.Second))
		_, err := io.Copy(c, Pattern(size))
		result <- err
	}
}

// Trickle writes body to w one byte at a time, interval apart, and stops
// at the first error (the server closed the connection).
func Trickle(w io.Writer, body string, interval time.Duration) {
	for i := range len(body) {
		if i > 0 {
			time.Sleep(interval)
		}
		if _, err := io.WriteString(w, body[i:i+1]); err != nil {
			return
		}
	}
}

// Slowloris opens n connections to addr at once and writes head, a
// request that never ends, on each; it returns once the server has closed
// every one of them, or each has been open for timeout. A connection that
// cannot be opened is left out.
func Slowloris(addr string, n int, head string, timeout time.Duration) {
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			c, err := net.Dial("tcp", addr)
			if err != nil {
				return
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(timeout))
			io.WriteString(c, head)
			io.Copy(io.Discard, c) // until the server closes it
		})
	}
	wg.Wait()
}

// SamplePeak calls sample every interval, on a goroutine of its own,
// until stop is called; stop waits for that goroutine and returns the
// largest value sample returned, or 0 if none was larger.
func SamplePeak(interval time.Duration, sample func() int64) (stop func() int64) {
	quit, done := make(chan struct{}), make(chan struct{})
	var peak int64
	go func() {
		defer close(done)
		for {
			select {
			case <-quit:
				return
			case <-time.After(interval):
			}
			peak = max(peak, sample())
		}
	}()
	var once sync.Once
	return func() int64 {
		once.Do(func() { close(quit) })
		<-done
		return peak
	}
}

// Upstream is an upstream application for tests that records every
// request exactly as it arrived (request line and header lines as bytes,
// body decoded) and answers with what the test scripts.
type Upstream struct {
	ln    net.Listener
	reply func(req *Seen, w *bufio.Writer, c net.Conn) // nil: 200 "ok"

	mu   sync.Mutex
	seen []*Seen
	wake chan struct{}
	wg   sync.WaitGroup
}

// Seen is one request as the upstream saw it.
type Seen struct {
	Line   string   // request line
	Lines  []string // header lines, as sent
	Body   []byte   // decoded body
	BodyOK bool     // the body was read to its end
	Req    *http.Request
	Conn   int // which upstream connection it came on (1, 2, ...)
}

// Field returns the values of the header lines called name (any case).
func (r *Seen) Field(name string) []string {
	var out []string
	for _, l := range r.Lines {
		k, v, _ := strings.Cut(l, ":")
		if strings.EqualFold(k, name) {
			out = append(out, strings.Trim(v, " \t"))
		}
	}
	return out
}

// StartUpstream starts an Upstream on a loopback port, answering each
// request with reply (200 "ok" when nil); it stops when the test ends.
func StartUpstream(t testing.TB, reply func(req *Seen, w *bufio.Writer, c net.Conn)) *Upstream {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u := &Upstream{ln: ln, reply: reply, wake: make(chan struct{})}
	u.wg.Go(u.accept)
	t.Cleanup(func() {
		ln.Close()
		u.wg.Wait()
	})
	return u
}

// URL is the upstream's http:// URL.
func (u *Upstream) URL() string { return "http://" + u.ln.Addr().String() }

func (u *Upstream) accept() {
	var mu sync.Mutex
	var conns []net.Conn
	defer func() {
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
	}()
	for n := 1; ; n++ {
		c, err := u.ln.Accept()
		if err != nil {
			return
		}
		mu.Lock()
		conns = append(conns, c)
		mu.Unlock()
		u.wg.Go(func() { u.serve(c, n) })
	}
}

func (u *Upstream) serve(c net.Conn, n int) {
	defer c.Close()
	var raw bytes.Buffer
	br := bufio.NewReader(io.TeeReader(c, &raw))
	bw := bufio.NewWriter(c)
	for {
		raw.Reset()
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		// The head is what was read up to the blank line: the tee may
		// hold body bytes after it.
		head, _, _ := strings.Cut(raw.String(), "\r\n\r\n")
		lines := strings.Split(head, "\r\n")
		seen := &Seen{Line: lines[0], Lines: lines[1:], Req: req, Conn: n}
		seen.Body, err = io.ReadAll(req.Body)
		seen.BodyOK = err == nil
		u.mu.Lock()
		u.seen = append(u.seen, seen)
		close(u.wake)
		u.wake = make(chan struct{})
		u.mu.Unlock()
		if !seen.BodyOK {
			return
		}
		if u.reply == nil {
			bw.WriteString("HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nok")
		} else {
			u.reply(seen, bw, c)
		}
		if bw.Flush() != nil {
			return
		}
		if req.Close {
			return
		}
	}
}

// Requests returns what the upstream has seen so far.
func (u *Upstream) Requests() []*Seen {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]*Seen(nil), u.seen...)
}

// WaitRequests waits up to timeout for the upstream to have seen n
// requests, and returns what it has seen.
func (u *Upstream) WaitRequests(n int, timeout time.Duration) []*Seen {
	deadline := time.After(timeout)
	for {
		u.mu.Lock()
		seen, wake := append([]*Seen(nil), u.seen...), u.wake
		u.mu.Unlock()
		if len(seen) >= n {
			return seen
		}
		select {
		case <-wake:
		case <-deadline:
			return seen
		}
	}
}

// FullBacklog returns the address of a loopback listener that accepts
// nothing and whose backlog is full: a connection attempt to it hangs.
func FullBacklog(t testing.TB) string {
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
	// Fill the backlog: these connect at once, and the next ones hang.
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
