package main

// End-to-end tests of SPEC "One request, one truth" on the built daemon:
// an upstream that sends more than its response, Expect: 100-continue on
// a refused request, header sections that end in a bare LF, header names
// nginx refuses or drops, and upstream heads that cannot be parsed. The
// rows of proxy's conformance table cover the same defects on every
// engine; these prove them on the binary, timing included.

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// rawOrigin is an upstream in the test process that answers by path with
// bytes written as they are, misbehaving on purpose.
type rawOrigin struct {
	ln   net.Listener
	mu   sync.Mutex
	seen []string // request lines
	hdrs []http.Header
}

// strayResponse is what a misbehaving upstream sends past a response: a
// whole response of its own, cacheable.
const strayResponse = "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nCache-Control: max-age=60\r\nContent-Length: 4\r\n\r\nEVIL"

func startRawOrigin(t *testing.T) *rawOrigin {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	o := &rawOrigin{ln: ln}
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() { o.serve(c) })
		}
	})
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	return o
}

func (o *rawOrigin) addr() string { return o.ln.Addr().String() }

func (o *rawOrigin) lines() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]string(nil), o.seen...)
}

func (o *rawOrigin) serve(c net.Conn) {
	defer c.Close()
	br := bufio.NewReader(c)
	for {
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		io.Copy(io.Discard, req.Body)
		o.mu.Lock()
		o.seen = append(o.seen, req.Method+" "+req.RequestURI)
		o.hdrs = append(o.hdrs, req.Header)
		o.mu.Unlock()
		late := func(head, rest string) {
			io.WriteString(c, head)
			time.Sleep(20 * time.Millisecond)
			io.WriteString(c, rest)
		}
		switch p := req.URL.Path; {
		case p == "/stray/head":
			late("HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 4\r\n\r\n", "BODY"+strayResponse)
		case p == "/stray/long":
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nCache-Control: max-age=60\r\nContent-Length: 2\r\n\r\nok"+strayResponse)
		case p == "/bad/barelf":
			io.WriteString(c, "HTTP/1.1 200 OK\nContent-Length: 2\n\nok")
		case p == "/bad/status":
			io.WriteString(c, "HTTP/1.1 099 Odd\r\nContent-Length: 2\r\n\r\nok")
		case p == "/bad/short":
			late("HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 100\r\n\r\n", "partial")
			return // the body is cut short
		default:
			cookie := req.Header.Get("Cookie")
			body := fmt.Sprintf("page %s for %q", req.URL.Path, cookie)
			fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nCache-Control: private\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
		}
	}
}

func TestOneViewE2E(t *testing.T) {
	t.Parallel()
	o := startRawOrigin(t)
	cfg := baseServer(1, fmt.Sprintf("upstream = %q\nread_header_timeout = \"20s\"\nupstream_timeout = \"20s\"", "http://"+o.addr())) + `
[[ratelimit]]
name = "upload"
path = "/upload"
limit = 1
window = "1h"

[[cache]]
path = "/*"
max_body = "8KiB"
`
	d := startDaemon(t, daemonOptions{config: cfg})

	t.Run("bytes past a response reach no other client and are never stored", func(t *testing.T) {
		t.Parallel()
		// The body to HEAD comes 20 ms after its head; the next requests
		// go out at once, each from another client, and each must get its
		// own page, never the stray response.
		for round := range 3 {
			c := newClient(t, nil, false)
			if r := do(c, http.MethodHead, d.url("/stray/head"), nil); r.status != 200 {
				t.Fatalf("HEAD: %d", r.status)
			}
			var wg sync.WaitGroup
			for i := range 10 {
				wg.Go(func() {
					h := http.Header{"Cookie": {fmt.Sprintf("user=%d", i)}}
					r := do(newClient(t, nil, false), http.MethodGet, d.url(fmt.Sprintf("/page/%d-%d", round, i)), h)
					want := fmt.Sprintf("page /page/%d-%d for \"user=%d\"", round, i, i)
					if r.status != 200 || string(r.body) != want {
						t.Errorf("client %d after a HEAD: %d %q, want %q", i, r.status, r.body, want)
					}
				})
			}
			wg.Wait()
		}
		// A whole response past the declared length, in the same write: the
		// client gets the response, and neither it nor the stray one is
		// stored.
		c := newClient(t, nil, true)
		for i := range 2 {
			r := get(c, d.url("/stray/long"))
			if r.status != 200 || string(r.body) != "ok" || r.header.Get("X-Cache") != "MISS" {
				t.Errorf("/stray/long #%d: %d %q X-Cache %q, want 200 \"ok\" MISS", i, r.status, r.body, r.header.Get("X-Cache"))
			}
		}
	})

	t.Run("Expect: 100-continue on a refused request: the final status, and no body read", func(t *testing.T) {
		t.Parallel()
		post := func(expect bool) (status string, interim bool, elapsed time.Duration) {
			c, br := dialRaw(t, d.addr)
			defer c.Close()
			start := time.Now()
			head := "POST /upload HTTP/1.1\r\nHost: app\r\nContent-Length: 3000000\r\n"
			if expect {
				head += "Expect: 100-continue\r\n"
			}
			io.WriteString(c, head+"\r\n")
			if !expect {
				io.WriteString(c, strings.Repeat("x", 3000000))
			}
			c.SetReadDeadline(time.Now().Add(5 * time.Second))
			line, err := br.ReadString('\n')
			if err != nil {
				t.Fatalf("no answer: %v", err)
			}
			if strings.HasPrefix(line, "HTTP/1.1 100") {
				return line, true, time.Since(start)
			}
			return strings.TrimSpace(line), false, time.Since(start)
		}
		if st, _, _ := post(false); !strings.HasPrefix(st, "HTTP/1.1 200") {
			t.Fatalf("the first upload: %q", st)
		}
		// The rule is exhausted: the answer comes without 100 Continue and
		// without the body having been sent (nothing was).
		st, interim, took := post(true)
		if interim || !strings.HasPrefix(st, "HTTP/1.1 429") {
			t.Errorf("Expect on an exhausted rule: %q (interim %v), want 429 at once", st, interim)
		}
		if took > 2*time.Second {
			t.Errorf("the 429 took %v: decided only once a body came", took)
		}
	})

	t.Run("a header section ended by bare LF gets 400 at once", func(t *testing.T) {
		t.Parallel()
		for _, send := range []string{
			"GET /lf-section HTTP/1.1\nHost: app\n\n",
			"GET /lf-section HTTP/1.1\r\nHost: app\nX-A: b\r\n\r\n",
		} {
			c, br := dialRaw(t, d.addr)
			start := time.Now()
			io.WriteString(c, send)
			c.SetReadDeadline(time.Now().Add(5 * time.Second))
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatalf("%q: %v", send, err)
			}
			resp.Body.Close()
			if resp.StatusCode != 400 || time.Since(start) > 2*time.Second {
				t.Errorf("%q: %d after %v, want 400 at once", send, resp.StatusCode, time.Since(start))
			}
			c.Close()
		}
		for _, l := range o.lines() {
			if strings.Contains(l, "/lf-section") {
				t.Errorf("the upstream saw %s", l)
			}
		}
	})

	t.Run("header names: a space is refused, an underscore is not forwarded", func(t *testing.T) {
		t.Parallel()
		c, br := dialRaw(t, d.addr)
		io.WriteString(c, "GET /names-space HTTP/1.1\r\nHost: app\r\nX Forwarded For: 1.2.3.4\r\n\r\n")
		resp, err := http.ReadResponse(br, nil)
		if err != nil || resp.StatusCode != 400 {
			t.Errorf("a name with a space: %v %v, want 400", resp, err)
		}
		c.Close()
		r := do(newClient(t, nil, false), http.MethodGet, d.url("/names-underscore"), http.Header{"X_forwarded_for": {"1.2.3.4"}})
		if r.status != 200 {
			t.Fatalf("a name with an underscore: %d", r.status)
		}
		o.mu.Lock()
		defer o.mu.Unlock()
		for i, l := range o.seen {
			if strings.Contains(l, "/names-space") {
				t.Errorf("the upstream saw %s", l)
			}
			if strings.Contains(l, "/names-underscore") && o.hdrs[i].Get("X_forwarded_for") != "" {
				t.Errorf("the upstream got X_forwarded_for")
			}
		}
	})

	t.Run("an upstream head that cannot be parsed is a 502 at once", func(t *testing.T) {
		t.Parallel()
		for _, p := range []string{"/bad/barelf", "/bad/status"} {
			start := time.Now()
			r := get(newClient(t, nil, false), d.url(p))
			if r.status != 502 || time.Since(start) > 2*time.Second {
				t.Errorf("%s: %d after %v, want 502 at once", p, r.status, time.Since(start))
			}
		}
	})

	// Every engine passes a body on as it comes: of a body cut short, the
	// client gets all that came, then the close.
	t.Run("an upstream body cut short: the head, then the close", func(t *testing.T) {
		t.Parallel()
		c, br := dialRaw(t, d.addr)
		defer c.Close()
		io.WriteString(c, "GET /bad/short HTTP/1.1\r\nHost: app\r\n\r\n")
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("no status line: %v", err)
		}
		body, err := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 || string(body) != "partial" || err != io.ErrUnexpectedEOF {
			t.Errorf("%d %q %v, want 200, \"partial\", then the connection closed", resp.StatusCode, body, err)
		}
	})
}
