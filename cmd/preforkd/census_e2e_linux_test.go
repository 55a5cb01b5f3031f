package main

// The census: a fixed mix of requests, each kind a known number of times,
// sent to the built daemon on every engine that serves clients (the event
// loop, fasthttp, and net/http behind TLS over HTTP/1.1 and HTTP/2). The
// access log must have one line per request that README "Access log" gives
// one, with the status the client got; preforkd_http_requests_total must
// count every response once; the upstream must see what was forwarded.

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/preforkd/preforkd/internal/tlstest"
)

// censusUpstream answers by path and counts what reached it.
type censusUpstream struct {
	mu   sync.Mutex
	seen map[string]int // method and path → requests
}

func (u *censusUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	u.mu.Lock()
	u.seen[r.Method+" "+r.URL.Path]++
	u.mu.Unlock()
	io.Copy(io.Discard, r.Body)
	switch r.URL.Path {
	case "/missing":
		http.NotFound(w, r)
	case "/cached":
		w.Header().Set("Cache-Control", "max-age=60")
		w.Header().Set("ETag", `"v1"`)
		io.WriteString(w, "cached")
	case "/upgrade":
		c, bw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		bw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: census\r\n\r\n")
		bw.Flush()
		time.AfterFunc(200*time.Millisecond, func() { c.Close() })
	case "/bad":
		c, bw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		bw.WriteString("not http at all\r\n\r\n")
		bw.Flush()
		c.Close()
	case "/streamed":
		for range 10 {
			io.WriteString(w, "chunk\n")
			http.NewResponseController(w).Flush()
			select {
			case <-r.Context().Done():
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
	case "/trunc":
		w.Header().Set("Content-Length", "10")
		io.WriteString(w, "ab")
		http.NewResponseController(w).Flush()
		select {
		case <-r.Context().Done():
		case <-time.After(3 * time.Second):
		}
	case "/slow", "/hang":
		select {
		case <-r.Context().Done():
		case <-time.After(3 * time.Second):
		}
		io.WriteString(w, "late")
	default:
		io.WriteString(w, "ok")
	}
}

func (u *censusUpstream) snapshot() map[string]int {
	u.mu.Lock()
	defer u.mu.Unlock()
	out := map[string]int{}
	for k, v := range u.seen {
		out[k] = v
	}
	return out
}

// censusCase is one kind of request in the mix: what the client must get,
// whether the access log has a line for it, and what the upstream sees.
type censusCase struct {
	name    string
	n       int    // times sent
	status  int    // what the client gets each time (0: no response)
	counted int    // the status counted and logged (defaults to status)
	logged  bool   // a line per request
	target  string // the logged target
	up      string // "METHOD /path" the upstream sees, "" for none
	upN     int    // times it sees it (defaults to n)
	// send sends one and returns the status the client got (0: none).
	send func(t *testing.T, cl *censusClient) int
	// seq, instead of status: the statuses of a connection's requests,
	// and lines the "target status" of each one logged.
	seq   []int
	lines []string
	raw   string
	// asGot: the status counted and logged is the one the client got,
	// or 499 when it got none (a race README allows).
	asGot bool
	// uncounted: logged but never in preforkd_http_requests_total (the
	// health check).
	uncounted bool
}

// censusClient opens connections to the daemon: cleartext or TLS.
type censusClient struct {
	addr string
	tls  *tls.Config // nil: cleartext
}

// dial returns the connection to write to and the TCP connection under it.
func (cl *censusClient) dial(t *testing.T) (net.Conn, *net.TCPConn) {
	t.Helper()
	raw, err := net.DialTimeout("tcp", cl.addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { raw.Close() })
	raw.SetDeadline(time.Now().Add(10 * time.Second))
	if cl.tls == nil {
		return raw, raw.(*net.TCPConn)
	}
	c := tls.Client(raw, cl.tls)
	if err := c.Handshake(); err != nil {
		t.Fatal(err)
	}
	return c, raw.(*net.TCPConn)
}

// exchange writes raw on a new connection and reads n responses to method.
func (cl *censusClient) exchange(t *testing.T, raw, method string, n int) []int {
	t.Helper()
	c, _ := cl.dial(t)
	defer c.Close()
	if _, err := io.WriteString(c, raw); err != nil {
		t.Fatal(err)
	}
	return readStatuses(c, method, n)
}

func readStatuses(c net.Conn, method string, n int) []int {
	br := bufio.NewReader(c)
	var out []int
	for range n {
		resp, err := http.ReadResponse(br, &http.Request{Method: method})
		if err != nil {
			out = append(out, 0)
			continue
		}
		if resp.StatusCode == 100 {
			resp, err = http.ReadResponse(br, &http.Request{Method: method})
			if err != nil {
				out = append(out, 0)
				continue
			}
		}
		if resp.StatusCode != 101 {
			io.Copy(io.Discard, resp.Body)
		}
		resp.Body.Close()
		out = append(out, resp.StatusCode)
	}
	return out
}

// resetAfter sends raw on a new connection, waits for before, then
// resets the connection (and gives the engine a moment to see it); the
// client reads no answer.
func resetAfter(raw string, before time.Duration) func(*testing.T, *censusClient) int {
	return func(t *testing.T, cl *censusClient) int {
		c, tc := cl.dial(t)
		io.WriteString(c, raw)
		time.Sleep(before)
		tc.SetLinger(0)
		tc.Close()
		time.Sleep(100 * time.Millisecond)
		return 0
	}
}

func one(t *testing.T, cl *censusClient, raw, method string) int {
	return cl.exchange(t, raw, method, 1)[0]
}

// http1Mix is the mix sent over HTTP/1.1, cleartext or TLS.
func http1Mix(scheme string) []censusCase {
	get := func(path string) func(*testing.T, *censusClient) int {
		return func(t *testing.T, cl *censusClient) int {
			return one(t, cl, "GET "+path+" HTTP/1.1\r\nHost: census\r\nConnection: close\r\n\r\n", "GET")
		}
	}
	big := strings.Repeat("a", 5000)
	return []censusCase{
		{name: "ok", n: 3, status: 200, logged: true, target: "/ok", up: "GET /ok", send: get("/ok")},
		{name: "missing", n: 2, status: 404, logged: true, target: "/missing", up: "GET /missing", send: get("/missing")},
		{name: "limited", n: 3, status: 0, logged: true, target: "/limited", up: "GET /limited", upN: 1, send: get("/limited")},
		{name: "head", n: 1, status: 200, logged: true, target: "/ok?head", up: "HEAD /ok", send: func(t *testing.T, cl *censusClient) int {
			return one(t, cl, "HEAD /ok?head HTTP/1.1\r\nHost: census\r\nConnection: close\r\n\r\n", "HEAD")
		}},
		{name: "bad header", n: 1, status: 400, send: func(t *testing.T, cl *censusClient) int {
			return one(t, cl, "GET /ok HTTP/1.1\r\nHost: census\r\nBad Name: x\r\n\r\n", "GET")
		}},
		{name: "bare LF", n: 1, status: 400, send: func(t *testing.T, cl *censusClient) int {
			return one(t, cl, "GET /ok HTTP/1.1\r\nHost: census\nX-A: b\r\n\r\n", "GET")
		}},
		{name: "CL+TE", n: 1, status: 400, send: func(t *testing.T, cl *censusClient) int {
			return one(t, cl, "POST /ok HTTP/1.1\r\nHost: census\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", "POST")
		}},
		{name: "head too large", n: 1, status: 431, send: func(t *testing.T, cl *censusClient) int {
			return one(t, cl, "GET /ok HTTP/1.1\r\nHost: census\r\nX-Big: "+big+"\r\n\r\n", "GET")
		}},
		{name: "head stalls", n: 1, status: 408, send: func(t *testing.T, cl *censusClient) int {
			return one(t, cl, "GET /ok HTTP/1.1\r\nHost: census\r\n", "GET")
		}},
		{name: "body stalls", n: 1, status: 408, logged: true, target: "/stall", send: func(t *testing.T, cl *censusClient) int {
			return one(t, cl, "POST /stall HTTP/1.1\r\nHost: census\r\nContent-Length: 10\r\n\r\nabc", "POST")
		}},
		{name: "body never starts", n: 1, status: 408, logged: true, target: "/stall0", send: func(t *testing.T, cl *censusClient) int {
			return one(t, cl, "POST /stall0 HTTP/1.1\r\nHost: census\r\nContent-Length: 10\r\n\r\n", "POST")
		}},
		{name: "body stalls after 100-continue", n: 1, status: 408, logged: true, target: "/stall100", send: func(t *testing.T, cl *censusClient) int {
			c, _ := cl.dial(t)
			defer c.Close()
			io.WriteString(c, "POST /stall100 HTTP/1.1\r\nHost: census\r\nContent-Length: 10\r\nExpect: 100-continue\r\n\r\n")
			br := bufio.NewReader(c)
			resp, err := http.ReadResponse(br, &http.Request{Method: "POST"})
			if err != nil {
				return 0
			}
			if resp.StatusCode != 100 {
				io.Copy(io.Discard, resp.Body)
				return resp.StatusCode
			}
			io.WriteString(c, "abc")
			resp, err = http.ReadResponse(br, &http.Request{Method: "POST"})
			if err != nil {
				return 0
			}
			io.Copy(io.Discard, resp.Body)
			return resp.StatusCode
		}},
		{name: "too large for a fingerprint", n: 1, status: 413, logged: true, target: "/idem", send: func(t *testing.T, cl *censusClient) int {
			return one(t, cl, fmt.Sprintf("POST /idem HTTP/1.1\r\nHost: census\r\nIdempotency-Key: big\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", len(big), big), "POST")
		}},
		{name: "idempotent, then its replay", n: 2, status: 200, logged: true, target: "/idem", up: "POST /idem", upN: 1, send: func(t *testing.T, cl *censusClient) int {
			return one(t, cl, "POST /idem HTTP/1.1\r\nHost: census\r\nIdempotency-Key: k1\r\nContent-Length: 3\r\nConnection: close\r\n\r\nabc", "POST")
		}},
		{name: "cache miss, then hits", n: 3, status: 200, logged: true, target: "/cached", up: "GET /cached", upN: 1, send: get("/cached")},
		{name: "upgrade", n: 1, status: 101, logged: true, target: "/upgrade", up: "GET /upgrade", send: func(t *testing.T, cl *censusClient) int {
			return one(t, cl, "GET /upgrade HTTP/1.1\r\nHost: census\r\nConnection: Upgrade\r\nUpgrade: census\r\n\r\n", "GET")
		}},
		{name: "client resets", n: 1, status: 0, counted: 499, logged: true, target: "/hang", up: "GET /hang", send: resetAfter("GET /hang HTTP/1.1\r\nHost: census\r\n\r\n", 200*time.Millisecond)},
		{name: "client resets after an Expect head", n: 1, status: 0, counted: 499, logged: true, target: "/rst100", send: resetAfter("POST /rst100 HTTP/1.1\r\nHost: census\r\nContent-Length: 10\r\nExpect: 100-continue\r\n\r\n", 0)},
		{name: "client resets mid-body", n: 1, status: 0, counted: 499, logged: true, target: "/rstbody", send: resetAfter("POST /rstbody HTTP/1.1\r\nHost: census\r\nContent-Length: 10\r\n\r\nabc", 100*time.Millisecond)},
		{name: "client resets mid-body of an idempotent request", n: 1, status: 0, counted: 499, logged: true, target: "/idem", send: resetAfter("POST /idem HTTP/1.1\r\nHost: census\r\nIdempotency-Key: r\r\nContent-Length: 10\r\n\r\nabc", 100*time.Millisecond)},
		{name: "upstream garbage", n: 1, status: 502, logged: true, target: "/bad", up: "GET /bad", send: get("/bad")},
		{name: "upstream slow", n: 1, status: 504, logged: true, target: "/slow", up: "GET /slow", send: get("/slow")},
		{name: "OPTIONS *", n: 1, status: 200, send: func(t *testing.T, cl *censusClient) int {
			return one(t, cl, "OPTIONS * HTTP/1.1\r\nHost: census\r\nConnection: close\r\n\r\n", "OPTIONS")
		}},
		{name: "body stalls after 100-continue, none sent", n: 1, status: 408, logged: true, target: "/stall100z", send: func(t *testing.T, cl *censusClient) int {
			return one(t, cl, "POST /stall100z HTTP/1.1\r\nHost: census\r\nContent-Length: 10\r\nExpect: 100-continue\r\n\r\n", "POST")
		}},
		{name: "chunked body stalls", n: 1, status: 408, logged: true, target: "/stallc", send: func(t *testing.T, cl *censusClient) int {
			return one(t, cl, "POST /stallc HTTP/1.1\r\nHost: census\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n", "POST")
		}},
		{name: "half-close after the request", n: 1, status: 200, logged: true, target: "/half", up: "GET /half", send: func(t *testing.T, cl *censusClient) int {
			c, tc := cl.dial(t)
			defer c.Close()
			io.WriteString(c, "GET /half HTTP/1.1\r\nHost: census\r\nConnection: close\r\n\r\n")
			if tlc, ok := c.(*tls.Conn); ok {
				tlc.CloseWrite()
			} else {
				tc.CloseWrite()
			}
			return readStatuses(c, "GET", 1)[0]
		}},
		{name: "a good request, then a bad header", raw: "GET /seq1 HTTP/1.1\r\nHost: census\r\n\r\nGET /seq1 HTTP/1.1\r\nHost: census\r\nBad Name: x\r\n\r\n",
			seq: []int{200, 400}, lines: []string{"/seq1 200"}, up: "GET /seq1", upN: 1},
		{name: "a good request, then a head too large", raw: "GET /seq2 HTTP/1.1\r\nHost: census\r\n\r\nGET /seq2 HTTP/1.1\r\nHost: census\r\nX-Big: " + big + "\r\n\r\n",
			seq: []int{200, 431}, lines: []string{"/seq2 200"}, up: "GET /seq2", upN: 1},
		{name: "a refused body, then a request", raw: "POST /limited HTTP/1.1\r\nHost: census\r\nContent-Length: 3\r\n\r\nabcGET /seq3 HTTP/1.1\r\nHost: census\r\n\r\n",
			seq: []int{429, 200}, lines: []string{"/limited 429", "/seq3 200"}, up: "GET /seq3", upN: 1},
		{name: "a request, then a head that stalls", raw: "GET /seq4 HTTP/1.1\r\nHost: census\r\n\r\nGET /seq4 HTTP/1.1\r\nHost: census\r\n",
			seq: []int{200, 408}, lines: []string{"/seq4 200"}, up: "GET /seq4", upN: 1},
		{name: "a request, then a body that stalls", raw: "GET /seq5 HTTP/1.1\r\nHost: census\r\n\r\nPOST /seq5b HTTP/1.1\r\nHost: census\r\nContent-Length: 10\r\n\r\n",
			seq: []int{200, 408}, lines: []string{"/seq5 200", "/seq5b 408"}, up: "GET /seq5", upN: 1},
		{name: "refused before its 100-continue", raw: "POST /limited HTTP/1.1\r\nHost: census\r\nContent-Length: 10\r\nExpect: 100-continue\r\nConnection: close\r\n\r\n",
			seq: []int{429}, lines: []string{"/limited 429"}},
		{name: "too large before its 100-continue", raw: "POST /idem HTTP/1.1\r\nHost: census\r\nIdempotency-Key: e\r\nContent-Length: 5000\r\nExpect: 100-continue\r\nConnection: close\r\n\r\n",
			seq: []int{413}, lines: []string{"/idem 413"}},
		{name: "a bad Content-Length", raw: "POST /ok HTTP/1.1\r\nHost: census\r\nContent-Length: abc\r\n\r\n", seq: []int{400}},
		{name: "HEAD of a cached response", raw: "HEAD /cached HTTP/1.1\r\nHost: census\r\nConnection: close\r\n\r\n", seq: []int{200}, lines: []string{"/cached 200"}},
		{name: "HTTP/1.0", raw: "GET /old HTTP/1.0\r\n\r\n", seq: []int{200}, lines: []string{"/old 200"}, up: "GET /old", upN: 1},
		{name: "absolute form", raw: "GET " + scheme + "://census/abs HTTP/1.1\r\nHost: census\r\nConnection: close\r\n\r\n", seq: []int{200}, lines: []string{scheme + "://census/abs 200"}, up: "GET /abs", upN: 1},
		{name: "upstream stops mid-body", raw: "GET /trunc HTTP/1.1\r\nHost: census\r\nConnection: close\r\n\r\n", seq: []int{200}, lines: []string{"/trunc 200"}, up: "GET /trunc", upN: 1},
		{name: "health check", n: 2, status: 200, logged: true, target: "/healthz", uncounted: true, send: get("/healthz")},
		{name: "conditional hit", raw: "GET /cached HTTP/1.1\r\nHost: census\r\nIf-None-Match: \"v1\"\r\nConnection: close\r\n\r\n", seq: []int{304}, lines: []string{"/cached 304"}},
		{name: "a request after Connection: close", raw: "GET /seq6 HTTP/1.1\r\nHost: census\r\nConnection: close\r\n\r\nGET /seq6b HTTP/1.1\r\nHost: census\r\n\r\n",
			seq: []int{200, 0}, lines: []string{"/seq6 200"}, up: "GET /seq6", upN: 1},
		{name: "an unknown coding", raw: "POST /ok HTTP/1.1\r\nHost: census\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n", seq: []int{501}},
		{name: "HTTP/2.0 on HTTP/1", raw: "GET /ok HTTP/2.0\r\nHost: census\r\n\r\n", seq: []int{505}},
		{name: "an upgrade refused by a rule", raw: "GET /limited HTTP/1.1\r\nHost: census\r\nConnection: Upgrade\r\nUpgrade: census\r\n\r\n", seq: []int{429}, lines: []string{"/limited 429"}},
		{name: "client resets mid-response", n: 1, status: 200, logged: true, target: "/streamed", up: "GET /streamed", send: func(t *testing.T, cl *censusClient) int {
			c, tc := cl.dial(t)
			io.WriteString(c, "GET /streamed HTTP/1.1\r\nHost: census\r\n\r\n")
			resp, err := http.ReadResponse(bufio.NewReader(c), &http.Request{Method: "GET"})
			if err != nil {
				return 0
			}
			tc.SetLinger(0)
			tc.Close()
			time.Sleep(300 * time.Millisecond)
			return resp.StatusCode
		}},
		{name: "pipelined", n: 1, status: 200, logged: true, target: "/pipe", up: "GET /pipe", upN: 3, send: func(t *testing.T, cl *censusClient) int {
			req := "GET /pipe HTTP/1.1\r\nHost: census\r\n\r\n"
			got := cl.exchange(t, req+req+req, "GET", 3)
			for _, s := range got {
				if s != 200 {
					return s
				}
			}
			return 200
		}},
	}
}

// h2Mix is the mix sent over HTTP/2.
func h2Mix(tr *http.Transport, base string) []censusCase {
	c := &http.Client{Transport: tr}
	req := func(method, path string, h http.Header, body string) func(*testing.T, *censusClient) int {
		return func(t *testing.T, _ *censusClient) int {
			r, _ := http.NewRequest(method, base+path, strings.NewReader(body))
			if body == "" {
				r.Body = nil
			}
			for k, v := range h {
				r.Header[k] = v
			}
			resp, err := c.Do(r)
			if err != nil {
				return 0
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			return resp.StatusCode
		}
	}
	big := strings.Repeat("a", 5000)
	return []censusCase{
		{name: "ok", n: 3, status: 200, logged: true, target: "/ok", up: "GET /ok", send: req("GET", "/ok", nil, "")},
		{name: "missing", n: 2, status: 404, logged: true, target: "/missing", up: "GET /missing", send: req("GET", "/missing", nil, "")},
		{name: "limited", n: 3, status: 0, logged: true, target: "/limited", up: "GET /limited", upN: 1, send: req("GET", "/limited", nil, "")},
		{name: "head", n: 1, status: 200, logged: true, target: "/ok?head", up: "HEAD /ok", send: req("HEAD", "/ok?head", nil, "")},
		{name: "too large for a fingerprint", n: 1, status: 413, logged: true, target: "/idem", send: req("POST", "/idem", http.Header{"Idempotency-Key": {"big"}}, big)},
		{name: "idempotent, then its replay", n: 2, status: 200, logged: true, target: "/idem", up: "POST /idem", upN: 1, send: req("POST", "/idem", http.Header{"Idempotency-Key": {"k1"}}, "abc")},
		{name: "cache miss, then hits", n: 3, status: 200, logged: true, target: "/cached", up: "GET /cached", upN: 1, send: req("GET", "/cached", nil, "")},
		{name: "client resets its stream mid-body", n: 1, status: 0, counted: 499, logged: true, target: "/rstbody", send: func(t *testing.T, _ *censusClient) int {
			ctx, cancel := context.WithCancel(context.Background())
			pr, pw := io.Pipe()
			defer pw.Close()
			r, _ := http.NewRequestWithContext(ctx, "POST", base+"/rstbody", pr)
			r.ContentLength = 10
			go pw.Write([]byte("abc"))
			time.AfterFunc(100*time.Millisecond, cancel)
			if resp, err := c.Do(r); err == nil {
				resp.Body.Close()
				return resp.StatusCode
			}
			time.Sleep(100 * time.Millisecond)
			return 0
		}},
		{name: "client resets its stream mid-body of an idempotent request", n: 1, status: 0, counted: 499, logged: true, target: "/idem", send: func(t *testing.T, _ *censusClient) int {
			ctx, cancel := context.WithCancel(context.Background())
			pr, pw := io.Pipe()
			defer pw.Close()
			r, _ := http.NewRequestWithContext(ctx, "POST", base+"/idem", pr)
			r.ContentLength = 10
			r.Header.Set("Idempotency-Key", "r")
			go pw.Write([]byte("abc"))
			time.AfterFunc(100*time.Millisecond, cancel)
			if resp, err := c.Do(r); err == nil {
				resp.Body.Close()
				return resp.StatusCode
			}
			time.Sleep(100 * time.Millisecond)
			return 0
		}},
		{name: "upstream garbage", n: 1, status: 502, logged: true, target: "/bad", up: "GET /bad", send: req("GET", "/bad", nil, "")},
		{name: "upstream slow", n: 1, status: 504, logged: true, target: "/slow", up: "GET /slow", send: req("GET", "/slow", nil, "")},
		{name: "client resets", n: 1, status: 0, counted: 499, logged: true, target: "/hang", up: "GET /hang", send: func(t *testing.T, _ *censusClient) int {
			ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
			defer cancel()
			r, _ := http.NewRequestWithContext(ctx, "GET", base+"/hang", nil)
			if resp, err := c.Do(r); err == nil {
				resp.Body.Close()
				return resp.StatusCode
			}
			return 0
		}},
		{name: "health check", n: 2, status: 200, logged: true, target: "/healthz", uncounted: true, send: req("GET", "/healthz", nil, "")},
		{name: "conditional hit", n: 1, status: 304, logged: true, target: "/cached", send: req("GET", "/cached", http.Header{"If-None-Match": {`"v1"`}}, "")},
		{name: "client resets its stream mid-response", n: 1, status: 200, logged: true, target: "/streamed", up: "GET /streamed", send: func(t *testing.T, _ *censusClient) int {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			r, _ := http.NewRequestWithContext(ctx, "GET", base+"/streamed", nil)
			resp, err := c.Do(r)
			if err != nil {
				return 0
			}
			cancel()
			resp.Body.Close()
			time.Sleep(300 * time.Millisecond)
			return resp.StatusCode
		}},
		{name: "stream body stalls", n: 1, status: 408, logged: true, target: "/stall", send: func(t *testing.T, _ *censusClient) int {
			pr, pw := io.Pipe()
			defer pw.Close()
			r, _ := http.NewRequest("POST", base+"/stall", pr)
			r.ContentLength = 10
			go pw.Write([]byte("abc"))
			resp, err := c.Do(r)
			if err != nil {
				return 0
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			return resp.StatusCode
		}},
	}
}

// documented changes the mix's expectations where README "Access log"
// and "TLS and HTTP/2" say an engine differs.
func documented(engine string, mix []censusCase) []censusCase {
	for i := range mix {
		k := &mix[i]
		switch {
		case engine == "fasthttp" && k.name == "client resets":
			// fasthttp does not watch the connection while the upstream
			// answers: the 504 it was not sent.
			k.counted = 504
		case engine == "fasthttp" && k.name == "body never starts":
			// fasthttp drops the head of a request with a Content-Length
			// whose body never began: counted, no line.
			k.logged = false
		case engine == "fasthttp" && k.name == "a request, then a body that stalls":
			k.lines = k.lines[:1]
		case engine == "fasthttp" && k.name == "an unknown coding":
			// The event loop (and net/http) refuse it with 501.
			k.seq = []int{400}
		case engine == "tls-h1" && k.name == "half-close after the request":
			// net/http takes the FIN for the client gone (499) when it
			// sees it before the response is sent.
			k.asGot = true
		case engine == "tls-h1" && k.name == "a refused body, then a request":
			// net/http closes a connection whose body is left unread.
			k.seq, k.lines, k.up = []int{429, 0}, k.lines[:1], ""
		}
	}
	return mix
}

// The census on the event loop, fasthttp, and net/http behind TLS over
// HTTP/1.1 and HTTP/2, each its own daemon, in parallel.
func TestCensusE2E(t *testing.T) {
	t.Parallel()
	for _, engine := range []string{"loop", "fasthttp", "tls-h1", "tls-h2"} {
		t.Run(engine, parallel(func(t *testing.T) {
			census(t, engine)
		}))
	}
}

func census(t *testing.T, engine string) {
	u := &censusUpstream{seen: map[string]int{}}
	up := httptest.NewServer(u)
	t.Cleanup(up.Close)
	access := filepath.Join(t.TempDir(), "access.log")
	extra := fmt.Sprintf(`upstream = %q
read_header_timeout = "300ms"
client_body_timeout = "300ms"
upstream_timeout = "500ms"
max_header_bytes = "4KiB"
max_request_body = "1KiB"
health_path = "/healthz"
`, up.URL)
	if engine == "fasthttp" {
		extra += "engine = \"fasthttp\"\n"
	}
	cfg := baseServer(2, extra) + rule("one", "/limited", "gcra", 1, "1h") + adminSection + fmt.Sprintf(`
[[idempotency]]
path = "/idem"
max_body = "1KiB"

[[cache]]
path = "/cached"
max_body = "1KiB"

[log]
access = %q
access_format = "json"
`, access)
	cl := &censusClient{}
	var mix []censusCase
	if strings.HasPrefix(engine, "tls") {
		ca := tlstest.NewCA(t)
		cert, key := ca.Files(t, t.TempDir(), "a", "a.example")
		cfg += fmt.Sprintf("\n[tls]\n[[tls.certificate]]\ncert = %q\nkey = %q\n", cert, key)
		cl.tls = &tls.Config{ServerName: "a.example", RootCAs: ca.Pool, NextProtos: []string{"http/1.1"}}
	}
	d := startDaemon(t, daemonOptions{config: noCanary(cfg), admin: true})
	cl.addr = d.addr
	switch engine {
	case "tls-h2":
		tr := &http.Transport{TLSClientConfig: &tls.Config{ServerName: "a.example", RootCAs: cl.tls.RootCAs}, Protocols: new(http.Protocols)}
		tr.Protocols.SetHTTP2(true) // HTTP/2 only
		t.Cleanup(tr.CloseIdleConnections)
		mix = h2Mix(tr, "https://"+d.addr)
	case "tls-h1":
		mix = documented(engine, http1Mix("https"))
	default:
		mix = documented(engine, http1Mix("http"))
	}

	wantLines := map[string]int{} // "target status" → lines
	wantCodes := map[int]int{}
	wantUp := map[string]int{}
	for _, k := range mix {
		if k.seq != nil {
			got := cl.exchange(t, k.raw, "GET", len(k.seq))
			if fmt.Sprint(got) != fmt.Sprint(k.seq) {
				t.Errorf("%s: %s got %v, want %v", engine, k.name, got, k.seq)
			}
			for _, s := range k.seq {
				if s != 0 {
					wantCodes[s]++
				}
			}
			for _, l := range k.lines {
				wantLines[l]++
			}
			if k.up != "" {
				wantUp[k.up] += k.upN
			}
			continue
		}
		got := map[int]int{}
		for range k.n {
			got[k.send(t, cl)]++
		}
		if k.asGot {
			for s, n := range got {
				if s == 0 {
					s = 499
				}
				wantLines[fmt.Sprintf("%s %d", k.target, s)] += n
				wantCodes[s] += n
			}
			wantUp[k.up] += k.n
			continue
		}
		want := k.status
		if k.name == "limited" {
			// The first is allowed, the others refused.
			if got[200] != 1 || got[429] != k.n-1 {
				t.Errorf("%s: %s got %v, want one 200 and %d 429", engine, k.name, got, k.n-1)
			}
			wantLines[k.target+" 200"]++
			wantLines[k.target+" 429"] += k.n - 1
			wantCodes[200]++
			wantCodes[429] += k.n - 1
		} else {
			if got[want] != k.n {
				t.Errorf("%s: %s got %v, want %d × %d", engine, k.name, got, k.n, want)
			}
			counted := k.counted
			if counted == 0 {
				counted = want
			}
			times := k.n
			if k.name == "pipelined" {
				times = 3
			}
			if k.logged {
				wantLines[fmt.Sprintf("%s %d", k.target, counted)] += times
			}
			if !k.uncounted {
				wantCodes[counted] += times
			}
		}
		if k.up != "" {
			n := k.upN
			if n == 0 {
				n = k.n
			}
			wantUp[k.up] += n
		}
	}

	total := 0
	for _, n := range wantLines {
		total += n
	}
	// Lines are written within a second; wait for them, then a moment more
	// for any extra.
	accessLines(t, access, total, 5*time.Second)
	time.Sleep(1200 * time.Millisecond)
	lines := accessLines(t, access, 0, 0)
	gotLines := map[string]int{}
	for _, l := range lines {
		var e struct {
			Target   string `json:"target"`
			Status   int    `json:"status"`
			Protocol string `json:"protocol"`
		}
		if err := json.Unmarshal([]byte(l), &e); err != nil {
			t.Fatalf("%s: access line %q: %v", engine, l, err)
		}
		gotLines[fmt.Sprintf("%s %d", e.Target, e.Status)]++
		if engine == "tls-h2" && e.Protocol != "HTTP/2.0" {
			t.Errorf("%s: a line of %s", engine, e.Protocol)
		}
	}
	diff(t, engine+": access log (target status → lines)", wantLines, gotLines)

	admin := newClient(t, nil, true)
	p := scrapeMetrics(t, admin, d.admin)
	gotCodes := map[int]int{}
	for s, v := range p.samples {
		var code int
		if _, err := fmt.Sscanf(s, `preforkd_http_requests_total{code="%d"}`, &code); err == nil {
			gotCodes[code] = int(v)
		}
	}
	diff(t, engine+": preforkd_http_requests_total", wantCodes, gotCodes)
	diff(t, engine+": upstream", wantUp, u.snapshot())
	if t.Failed() {
		t.Logf("access log:\n%s", strings.Join(lines, "\n"))
	}
}

func diff[K comparable](t *testing.T, what string, want, got map[K]int) {
	t.Helper()
	var bad []string
	keys := map[K]bool{}
	for k := range want {
		keys[k] = true
	}
	for k := range got {
		keys[k] = true
	}
	for k := range keys {
		if want[k] != got[k] {
			bad = append(bad, fmt.Sprintf("%v: got %d, want %d", k, got[k], want[k]))
		}
	}
	sort.Strings(bad)
	if len(bad) > 0 {
		t.Errorf("%s:\n  %s", what, strings.Join(bad, "\n  "))
	}
}
