package proxy_test

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// rawUpstream is an upstream application for tests that records every
// request exactly as it arrived (request line and header lines as bytes,
// body decoded) and answers with what the test scripts.
type rawUpstream struct {
	t     testing.TB
	ln    net.Listener
	reply func(req *seenRequest, w *bufio.Writer, c net.Conn) // nil: 200 "ok"

	mu   sync.Mutex
	seen []*seenRequest
	wake chan struct{}
	wg   sync.WaitGroup
}

// seenRequest is one request as the upstream saw it.
type seenRequest struct {
	Line   string   // request line
	Lines  []string // header lines, as sent
	Body   []byte   // decoded body
	BodyOK bool     // the body was read to its end
	Req    *http.Request
	Conn   int // which upstream connection it came on (1, 2, ...)
}

// field returns the values of the header lines called name (any case).
func (r *seenRequest) field(name string) []string {
	var out []string
	for _, l := range r.Lines {
		k, v, _ := strings.Cut(l, ":")
		if strings.EqualFold(k, name) {
			out = append(out, strings.Trim(v, " \t"))
		}
	}
	return out
}

func startUpstream(t testing.TB, reply func(req *seenRequest, w *bufio.Writer, c net.Conn)) *rawUpstream {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u := &rawUpstream{t: t, ln: ln, reply: reply, wake: make(chan struct{})}
	u.wg.Go(u.accept)
	t.Cleanup(func() {
		ln.Close()
		u.wg.Wait()
	})
	return u
}

func (u *rawUpstream) url() string { return "http://" + u.ln.Addr().String() }

func (u *rawUpstream) accept() {
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

func (u *rawUpstream) serve(c net.Conn, n int) {
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
		seen := &seenRequest{Line: lines[0], Lines: lines[1:], Req: req, Conn: n}
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

// requests returns what the upstream has seen so far.
func (u *rawUpstream) requests() []*seenRequest {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]*seenRequest(nil), u.seen...)
}

// waitRequests waits up to timeout for the upstream to have seen n
// requests.
func (u *rawUpstream) waitRequests(n int, timeout time.Duration) []*seenRequest {
	deadline := time.After(timeout)
	for {
		u.mu.Lock()
		seen, wake := append([]*seenRequest(nil), u.seen...), u.wake
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
