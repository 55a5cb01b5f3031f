package proxy_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/preforkd/preforkd/core"
	"github.com/preforkd/preforkd/engine"
	"github.com/preforkd/preforkd/internal/waitfor"
	"github.com/preforkd/preforkd/internal/wiretest"
	"github.com/preforkd/preforkd/proxy"
)

// cacheProxy is the fast engine for o (its upstream or App) with one cache
// block over every path, on a clock the test moves. It returns the
// server's base URL.
func cacheProxy(t *testing.T, o proxy.Options, clock *atomic.Int64) string {
	t.Helper()
	o.Core = cacheCore(t, clock)
	addr, _ := serve(t, o)
	return "http://" + addr
}

// cacheCore is a core with one cache block over every path, on a clock
// the test moves.
func cacheCore(t *testing.T, clock *atomic.Int64) *core.Core {
	t.Helper()
	return configCore(t, "[table]\ncounters = 64\nresponses = 64\nresponse_bytes = \"256KiB\"\n[[cache]]\npath = \"/*\"\nmax_body = \"64KiB\"\n",
		func() time.Duration { return time.Hour + time.Duration(clock.Load()) })
}

func fetch(t *testing.T, url string) (status int, xcache, body string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header.Get("X-Cache"), string(b)
}

// Within stale-while-revalidate an engine serves the stale response and
// refreshes it once, in the background, unconditionally; a drain after it
// ends in time.
func TestCacheRefreshInTheBackground(t *testing.T) {
	t.Parallel()
	eachEngine(t, withNetHTTP(), func(t *testing.T, e storyEngine) {
		var calls atomic.Int32
		release := make(chan struct{})
		up := startUpstream(t, func(req *seenRequest, w *bufio.Writer, c net.Conn) {
			n := calls.Add(1)
			if n == 2 {
				<-release // the refresh waits until the stale answers are in
			}
			body := fmt.Sprintf("version %d", n)
			fmt.Fprintf(w, "HTTP/1.1 200 OK\r\nCache-Control: max-age=10, stale-while-revalidate=60\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n", len(body), body)
		})
		var clock atomic.Int64
		r := e.serve(t, storyOptions{Upstream: up.URL(), Core: cacheCore(t, &clock)})
		get := func() (int, string, string) {
			c, br := dial(t, r.Addr) // a connection each: the refresh is no connection's
			defer c.Close()
			resp, body := roundTrip(t, c, br, "GET /r HTTP/1.1\r\nHost: a\r\n\r\n")
			return resp.StatusCode, resp.Header.Get("X-Cache"), string(body)
		}
		if st, x, b := get(); st != 200 || x != "MISS" || b != "version 1" {
			t.Fatalf("first: %d %s %q", st, x, b)
		}
		clock.Add(int64(20 * time.Second))
		for range 5 {
			if st, x, b := get(); st != 200 || x != "STALE" || b != "version 1" {
				t.Fatalf("stale: %d %s %q", st, x, b)
			}
		}
		close(release)
		var last string
		if !waitfor.Cond(5*time.Second, func() bool {
			st, x, b := get()
			last = fmt.Sprintf("%d %s %q", st, x, b)
			return x == "HIT" && b == "version 2"
		}) {
			// What was seen says which way it failed: a refresh that never
			// ended (STALE), or one that failed and was made again.
			t.Fatalf("the refresh never landed: last answer %s, %d upstream calls", last, calls.Load())
		}
		if n := calls.Load(); n != 2 {
			t.Fatalf("%d upstream calls, want 2 (one refresh)", n)
		}
		if l := up.Requests()[1].Field("If-None-Match"); len(l) != 0 {
			t.Fatal("the refresh was conditional")
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := r.Shutdown(ctx); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
	})
}

// A background refresh of a response with a validator is conditional,
// and its 304 makes the stored response fresh again, on every engine: the
// core no longer reads the request view then (the loop has reused it; it
// once read it, and the worker crashed).
func TestCacheRefreshRevalidatedInTheBackground(t *testing.T) {
	t.Parallel()
	eachEngine(t, withNetHTTP(), func(t *testing.T, e storyEngine) {
		var calls atomic.Int32
		up := startUpstream(t, func(req *seenRequest, w *bufio.Writer, c net.Conn) {
			if calls.Add(1) > 1 && len(req.Field("If-None-Match")) == 1 {
				w.WriteString("HTTP/1.1 304 Not Modified\r\nCache-Control: max-age=600\r\nEtag: \"v1\"\r\n\r\n")
				return
			}
			w.WriteString("HTTP/1.1 200 OK\r\nCache-Control: max-age=10, stale-while-revalidate=60\r\nEtag: \"v1\"\r\nContent-Length: 9\r\n\r\nversion 1")
		})
		var clock atomic.Int64
		r := e.serve(t, storyOptions{Upstream: up.URL(), Core: cacheCore(t, &clock)})
		get := func() (string, string) {
			c, br := dial(t, r.Addr)
			defer c.Close()
			resp, body := roundTrip(t, c, br, "GET /v HTTP/1.1\r\nHost: a\r\nIf-None-Match: \"other\"\r\nRange: bytes=0-3\r\n\r\n")
			return resp.Header.Get("X-Cache"), string(body)
		}
		if x, _ := get(); x != "MISS" {
			t.Fatalf("first: %s", x)
		}
		clock.Add(int64(20 * time.Second))
		if x, b := get(); x != "STALE" || b != "vers" {
			t.Fatalf("stale: %s %q", x, b)
		}
		if !waitfor.Cond(5*time.Second, func() bool { x, b := get(); return x == "HIT" && b == "vers" }) {
			t.Fatal("the refresh's 304 never made the response fresh")
		}
		if n := calls.Load(); n != 2 {
			t.Fatalf("%d upstream calls, want 2 (one refresh)", n)
		}
		if l := up.Requests()[1].Field("If-None-Match"); len(l) != 1 || l[0] != `"v1"` {
			t.Fatalf("the refresh carried If-None-Match %q, want the stored ETag", l)
		}
	})
}

// With stale-if-error the fast engine sends the stale response when the
// upstream answers 503, and when it cannot be reached at all.
func TestCacheStaleIfErrorFast(t *testing.T) {
	var fail atomic.Bool
	up := startUpstream(t, func(req *seenRequest, w *bufio.Writer, c net.Conn) {
		if fail.Load() {
			w.WriteString("HTTP/1.1 503 Service Unavailable\r\nContent-Length: 4\r\n\r\ndown")
			return
		}
		w.WriteString("HTTP/1.1 200 OK\r\nCache-Control: max-age=10, stale-if-error=600\r\nContent-Length: 5\r\n\r\nfresh")
	})
	var clock atomic.Int64
	base := cacheProxy(t, proxy.Options{Upstream: up.URL()}, &clock)
	fetch(t, base+"/e")
	clock.Add(int64(20 * time.Second))
	fail.Store(true)
	if st, x, b := fetch(t, base+"/e"); st != 200 || x != "STALE" || b != "fresh" {
		t.Fatalf("503 upstream: %d %s %q", st, x, b)
	}
	if st, x, b := fetch(t, base+"/other"); st != 503 || x != "MISS" || b != "down" {
		t.Fatalf("503 without a stored response: %d %s %q", st, x, b)
	}

	// An upstream that is gone.
	ln := listen(t)
	addr := ln.Addr().String()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		br := bufio.NewReader(c)
		http.ReadRequest(br)
		io.WriteString(c, "HTTP/1.1 200 OK\r\nCache-Control: max-age=10, stale-if-error=600\r\nContent-Length: 5\r\nConnection: close\r\n\r\nfresh")
		c.Close()
	}()
	var clock2 atomic.Int64
	base2 := cacheProxy(t, proxy.Options{Upstream: "http://" + addr, Client: engine.Upstream{ConnectTimeout: time.Second}}, &clock2)
	fetch(t, base2+"/gone")
	ln.Close()
	clock2.Add(int64(20 * time.Second))
	if st, x, b := fetch(t, base2+"/gone"); st != 200 || x != "STALE" || b != "fresh" {
		t.Fatalf("unreachable upstream: %d %s %q", st, x, b)
	}
	if st, x, _ := fetch(t, base2+"/never"); st != 502 || x != "MISS" {
		t.Fatalf("unreachable upstream, nothing stored: %d %s", st, x)
	}
}

// Options.App (a fasthttp handler in place of an upstream) fills the
// cache, gets no conditional field on a fill, and is replaced by a stale
// response when it fails.
func TestCacheApp(t *testing.T) {
	var calls atomic.Int32
	var fail atomic.Bool
	app := func(ctx *fasthttp.RequestCtx) {
		n := calls.Add(1)
		if len(ctx.Request.Header.Peek("If-None-Match")) > 0 {
			ctx.Error("a conditional fill", 500)
			return
		}
		if fail.Load() {
			ctx.Error("down", 503)
			return
		}
		ctx.Response.Header.Set("Cache-Control", "max-age=10, stale-if-error=60")
		ctx.Response.Header.Set("Etag", `"x"`)
		fmt.Fprintf(ctx, "call %d", n)
	}
	var clock atomic.Int64
	base := cacheProxy(t, proxy.Options{App: app}, &clock)
	req, _ := http.NewRequest("GET", base+"/a", nil)
	req.Header.Set("If-None-Match", `"x"`)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("X-Cache") != "MISS" {
		t.Fatalf("fill: %d %v", resp.StatusCode, resp.Header)
	}
	if st, x, b := fetch(t, base+"/a"); st != 200 || x != "HIT" || b != "call 1" {
		t.Fatalf("hit: %d %s %q", st, x, b)
	}
	clock.Add(int64(20 * time.Second))
	fail.Store(true)
	if st, x, b := fetch(t, base+"/a"); st != 200 || x != "STALE" || b != "call 1" {
		t.Fatalf("stale-if-error: %d %s %q", st, x, b)
	}
}

// The App gets X-Forwarded-Host and X-Forwarded-Proto as an upstream
// does, written by the server whatever the client sent, as the core reads
// them: a client's values never reach it, to make an answer (a redirect,
// absolute links) the cache keeps for every client.
func TestCacheAppGetsTheForwardedHostAndProto(t *testing.T) {
	app := func(ctx *fasthttp.RequestCtx) {
		h := &ctx.Request.Header
		ctx.Response.Header.Set("Cache-Control", "max-age=60")
		fmt.Fprintf(ctx, "%q://%q", h.Peek("X-Forwarded-Proto"), h.Peek("X-Forwarded-Host"))
	}
	var clock atomic.Int64
	base := cacheProxy(t, proxy.Options{App: app}, &clock)
	addr := strings.TrimPrefix(base, "http://")
	c, br := dial(t, addr)
	defer c.Close()
	for i, tt := range []struct{ fields, xcache string }{
		{"X-Forwarded-Host: evil.example\r\nX-Forwarded-Proto: https\r\n", "MISS"},
		{"", "HIT"},
	} {
		resp, b := roundTrip(t, c, br, "GET /r HTTP/1.1\r\nHost: a\r\n"+tt.fields+"\r\n")
		if x := resp.Header.Get("X-Cache"); x != tt.xcache || string(b) != `"http"://"a"` {
			t.Errorf("%d: X-Cache %q, %s; want %s, \"http\"://\"a\"", i, x, b, tt.xcache)
		}
	}
}

// An absolute-form target's authority is the request's host (RFC 9112
// §3.2.2): the core keys it, a forward sends it as Host, and the App gets
// it as Host too, not the client's Host line, with its path normalized
// or not. Otherwise "GET http://a/p" with "Host: evil.example" stored an
// answer made for evil.example as a's.
func TestCacheAppGetsTheAbsoluteFormAuthority(t *testing.T) {
	app := func(ctx *fasthttp.RequestCtx) {
		ctx.Response.Header.Set("Cache-Control", "max-age=60")
		fmt.Fprintf(ctx, "%s %s %s", ctx.Request.Header.Host(), ctx.Host(), ctx.Request.Header.Peek("X-Forwarded-Host"))
	}
	var clock atomic.Int64
	base := cacheProxy(t, proxy.Options{App: app}, &clock)
	c, br := dial(t, strings.TrimPrefix(base, "http://"))
	defer c.Close()
	for i, tt := range []struct{ target, host, xcache string }{
		{"http://a/p", "evil.example", "MISS"},
		{"/p", "a", "HIT"},
		{"http://a//x/../q", "evil.example", "MISS"},
		{"/q", "a", "HIT"},
		{"http://a/x/./a/much/longer/path", "evil.example", "MISS"},
	} {
		resp, b := roundTrip(t, c, br, "GET "+tt.target+" HTTP/1.1\r\nHost: "+tt.host+"\r\n\r\n")
		if x := resp.Header.Get("X-Cache"); x != tt.xcache || string(b) != "a a a" {
			t.Errorf("%d (GET %s, Host: %s): X-Cache %q, %q; want %s, \"a a a\"", i, tt.target, tt.host, x, b, tt.xcache)
		}
	}
}

// A GET with content ("fat GET": a length, or a chunked body) is the
// application's to answer: its key has no body, so its response is never
// stored, nor is it answered from the cache; on every engine. Stored, the
// answer to one client's body was every other client's answer.
func TestCacheRequestWithBodyNotStored(t *testing.T) {
	t.Parallel()
	eachEngine(t, withNetHTTP(), func(t *testing.T, e storyEngine) {
		up := startUpstream(t, func(req *seenRequest, w *bufio.Writer, c net.Conn) {
			body := fmt.Sprintf("body=[%s]", req.Body)
			fmt.Fprintf(w, "HTTP/1.1 200 OK\r\nCache-Control: max-age=60\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
		})
		var clock atomic.Int64
		r := e.serve(t, storyOptions{Upstream: up.URL(), Core: cacheCore(t, &clock)})
		c, br := dial(t, r.Addr)
		defer c.Close()
		for _, tt := range []struct{ path, framing, body string }{
			{"/length", "Content-Length: 4", "evil"},
			{"/chunked", "Transfer-Encoding: chunked", "4\r\nevil\r\n0\r\n\r\n"},
		} {
			resp, b := roundTrip(t, c, br, "GET "+tt.path+" HTTP/1.1\r\nHost: a\r\n"+tt.framing+"\r\n\r\n"+tt.body)
			if x := resp.Header.Get("X-Cache"); x != "BYPASS" || string(b) != "body=[evil]" {
				t.Errorf("%s with a body: X-Cache %q, %q; want BYPASS and the application's answer", tt.path, x, b)
			}
			for i, want := range []string{"MISS", "HIT"} {
				resp, b = roundTrip(t, c, br, "GET "+tt.path+" HTTP/1.1\r\nHost: a\r\n\r\n")
				if x := resp.Header.Get("X-Cache"); x != want || string(b) != "body=[]" {
					t.Errorf("%s without, %d: X-Cache %q, %q; want %s and body=[]", tt.path, i+1, x, b, want)
				}
			}
			// Nor is a stored response the answer to a body.
			resp, b = roundTrip(t, c, br, "GET "+tt.path+" HTTP/1.1\r\nHost: a\r\n"+tt.framing+"\r\n\r\n"+tt.body)
			if x := resp.Header.Get("X-Cache"); x != "BYPASS" || string(b) != "body=[evil]" {
				t.Errorf("%s with a body, once stored: X-Cache %q, %q", tt.path, x, b)
			}
		}
	})
}

// X-Forwarded-For reaches the application with the peer appended: a
// response that varies on it is the answer for that peer, and is never
// served to a client at another address that sends the same (or no)
// X-Forwarded-For; on every engine.
func TestCacheVaryOnForwardedForKeysThePeer(t *testing.T) {
	t.Parallel()
	eachEngine(t, withNetHTTP(), func(t *testing.T, e storyEngine) {
		up := startUpstream(t, func(req *seenRequest, w *bufio.Writer, c net.Conn) {
			body := fmt.Sprintf("xff=[%s]", req.Req.Header.Get("X-Forwarded-For"))
			fmt.Fprintf(w, "HTTP/1.1 200 OK\r\nCache-Control: max-age=60\r\nVary: X-Forwarded-For\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
		})
		var clock atomic.Int64
		r := e.serve(t, storyOptions{Upstream: up.URL(), Core: cacheCore(t, &clock)})
		get := func(from string) (string, string) {
			d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 5 * time.Second}
			c, err := d.Dial("tcp", r.Addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			resp, b := roundTrip(t, c, bufio.NewReader(c), "GET /who HTTP/1.1\r\nHost: a\r\n\r\n")
			return resp.Header.Get("X-Cache"), string(b)
		}
		for _, tt := range []struct{ from, xcache, body string }{
			{"127.0.0.1", "MISS", "xff=[127.0.0.1]"},
			{"127.0.0.2", "MISS", "xff=[127.0.0.2]"},
			{"127.0.0.1", "HIT", "xff=[127.0.0.1]"},
			{"127.0.0.2", "HIT", "xff=[127.0.0.2]"},
		} {
			if x, b := get(tt.from); x != tt.xcache || b != tt.body {
				t.Errorf("from %s: X-Cache %q, %q; want %s, %q", tt.from, x, b, tt.xcache, tt.body)
			}
		}
	})
}

// What tells an application behind proxies another scheme, host, port,
// URL or method than the request line and Host (Forwarded's host= and
// proto=, X-Forwarded-Port, X-Original-URL, X-HTTP-Method, X-Scheme,
// X-Script-Name, ...) is in the
// key: the links and
// redirects a client made the application write with them are never
// another client's answer. Forwarded's for= is not (it tells clients
// apart, not URLs): a proxy in front that adds it does not split the
// cache by client. On every engine.
func TestCacheKeysTheFieldsThatNameTheURL(t *testing.T) {
	t.Parallel()
	eachEngine(t, withNetHTTP(), func(t *testing.T, e storyEngine) {
		var calls atomic.Int32
		up := startUpstream(t, func(req *seenRequest, w *bufio.Writer, c net.Conn) {
			h := req.Req.Header
			body := fmt.Sprintf("call %d: fwd=[%s] port=[%s] url=[%s]", calls.Add(1), h.Get("Forwarded"), h.Get("X-Forwarded-Port"), h.Get("X-Original-Url"))
			if s, p := h.Get("X-Scheme"), h.Get("X-Script-Name"); s != "" || p != "" {
				body += fmt.Sprintf(" scheme=[%s] script=[%s]", s, p)
			}
			fmt.Fprintf(w, "HTTP/1.1 200 OK\r\nCache-Control: max-age=60\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
		})
		var clock atomic.Int64
		r := e.serve(t, storyOptions{Upstream: up.URL(), Core: cacheCore(t, &clock)})
		c, br := dial(t, r.Addr)
		defer c.Close()
		for i, tt := range []struct{ field, xcache, body string }{
			{"Forwarded: for=192.0.2.1;host=evil.example;proto=https", "MISS", "call 1: fwd=[for=192.0.2.1;host=evil.example;proto=https] port=[] url=[]"},
			{"X-Forwarded-Port: 8443", "MISS", "call 2: fwd=[] port=[8443] url=[]"},
			{"X-Original-URL: /admin", "MISS", "call 3: fwd=[] port=[] url=[/admin]"},
			{"", "MISS", "call 4: fwd=[] port=[] url=[]"},
			{"", "HIT", "call 4: fwd=[] port=[] url=[]"},
			{"Forwarded: for=192.0.2.2;host=evil.example;proto=https", "HIT", "call 1: fwd=[for=192.0.2.1;host=evil.example;proto=https] port=[] url=[]"},
			{"Forwarded: for=192.0.2.2", "HIT", "call 4: fwd=[] port=[] url=[]"},
			{"X-Forwarded-Port: 8443", "HIT", "call 2: fwd=[] port=[8443] url=[]"},
			// An unbalanced quote hides nothing from the key.
			{`Forwarded: for="x;host=evil.example`, "MISS", `call 5: fwd=[for="x;host=evil.example] port=[] url=[]`},
			// Each field that may make the application run another
			// method's handler.
			{"X-HTTP-Method-Override: PUT", "MISS", "call 6: fwd=[] port=[] url=[]"},
			{"X-HTTP-Method: PUT", "MISS", "call 7: fwd=[] port=[] url=[]"},
			{"X-Method-Override: PUT", "MISS", "call 8: fwd=[] port=[] url=[]"},
			{"X-HTTP-Method: PUT", "HIT", "call 7: fwd=[] port=[] url=[]"},
			// The scheme and path prefix that Tornado (X-Scheme before
			// X-Forwarded-Proto) and the WSGI ReverseProxied middleware
			// Flask applications copy (X-Scheme, X-Script-Name) read.
			{"X-Scheme: https", "MISS", "call 9: fwd=[] port=[] url=[] scheme=[https] script=[]"},
			{"X-Script-Name: /evil", "MISS", "call 10: fwd=[] port=[] url=[] scheme=[] script=[/evil]"},
			{"", "HIT", "call 4: fwd=[] port=[] url=[]"},
			{"X-Scheme: https", "HIT", "call 9: fwd=[] port=[] url=[] scheme=[https] script=[]"},
		} {
			field := ""
			if tt.field != "" {
				field = tt.field + "\r\n"
			}
			resp, b := roundTrip(t, c, br, "GET /page HTTP/1.1\r\nHost: a\r\n"+field+"\r\n")
			if x := resp.Header.Get("X-Cache"); x != tt.xcache || string(b) != tt.body {
				t.Errorf("%d (%s): X-Cache %q, %q; want %s, %q", i, tt.field, x, b, tt.xcache, tt.body)
			}
		}
	})
}

// The Host is keyed as the application gets it, case and all: an
// application that answers "Host: WWW.EXAMPLE" otherwise (a redirect to
// its canonical name, a 404 for an unknown virtual host) never has that
// answer served for "Host: www.example". On every engine.
func TestCacheKeysTheHostAsSent(t *testing.T) {
	t.Parallel()
	eachEngine(t, withNetHTTP(), func(t *testing.T, e storyEngine) {
		var calls atomic.Int32
		up := startUpstream(t, func(req *seenRequest, w *bufio.Writer, c net.Conn) {
			n := calls.Add(1)
			if req.Req.Host != "www.example" {
				fmt.Fprintf(w, "HTTP/1.1 301 Moved Permanently\r\nLocation: http://www.example/\r\nCache-Control: max-age=3600\r\nContent-Length: 0\r\n\r\n")
				return
			}
			body := fmt.Sprintf("call %d", n)
			fmt.Fprintf(w, "HTTP/1.1 200 OK\r\nCache-Control: max-age=60\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
		})
		var clock atomic.Int64
		r := e.serve(t, storyOptions{Upstream: up.URL(), Core: cacheCore(t, &clock)})
		c, br := dial(t, r.Addr)
		defer c.Close()
		for i, tt := range []struct {
			host, xcache string
			status       int
		}{
			{"WWW.EXAMPLE", "MISS", 301},
			{"www.example", "MISS", 200},
			{"WWW.EXAMPLE", "HIT", 301},
			{"www.example", "HIT", 200},
		} {
			resp, _ := roundTrip(t, c, br, "GET / HTTP/1.1\r\nHost: "+tt.host+"\r\n\r\n")
			if x := resp.Header.Get("X-Cache"); x != tt.xcache || resp.StatusCode != tt.status {
				t.Errorf("%d (Host: %s): %d, X-Cache %q; want %d, %s", i, tt.host, resp.StatusCode, x, tt.status, tt.xcache)
			}
		}
	})
}

// A target with an empty query ("/a?") reaches the application as sent,
// and the application may answer it otherwise than "/a" (a redirect to
// its canonical URL): that answer is keyed apart, never served for "/a"
// (where it would redirect to itself), nor "/a"'s for it. On every engine.
func TestCacheKeysAnEmptyQueryApart(t *testing.T) {
	t.Parallel()
	eachEngine(t, withNetHTTP(), func(t *testing.T, e storyEngine) {
		up := startUpstream(t, func(req *seenRequest, w *bufio.Writer, c net.Conn) {
			if strings.HasSuffix(req.Req.RequestURI, "?") {
				w.WriteString("HTTP/1.1 301 Moved Permanently\r\nLocation: /a\r\nCache-Control: max-age=3600\r\nContent-Length: 0\r\n\r\n")
				return
			}
			w.WriteString("HTTP/1.1 200 OK\r\nCache-Control: max-age=60\r\nContent-Length: 2\r\n\r\nok")
		})
		var clock atomic.Int64
		r := e.serve(t, storyOptions{Upstream: up.URL(), Core: cacheCore(t, &clock)})
		c, br := dial(t, r.Addr)
		defer c.Close()
		for i, tt := range []struct {
			target, xcache string
			status         int
		}{
			{"/a?", "MISS", 301},
			{"/a", "MISS", 200},
			{"/a?", "HIT", 301},
			{"/a", "HIT", 200},
		} {
			resp, _ := roundTrip(t, c, br, "GET "+tt.target+" HTTP/1.1\r\nHost: a\r\n\r\n")
			if x := resp.Header.Get("X-Cache"); x != tt.xcache || resp.StatusCode != tt.status {
				t.Errorf("%d (GET %s): %d, X-Cache %q; want %d, %s", i, tt.target, resp.StatusCode, x, tt.status, tt.xcache)
			}
		}
	})
}

// A 206 served from a stored 200 has one Content-Range, the cache's: one
// the application sent with its 200 (which means nothing there) is not
// sent beside it, to contradict it. On every engine.
func TestCacheRangeHasOneContentRange(t *testing.T) {
	t.Parallel()
	eachEngine(t, withNetHTTP(), func(t *testing.T, e storyEngine) {
		up := startUpstream(t, func(req *seenRequest, w *bufio.Writer, c net.Conn) {
			w.WriteString("HTTP/1.1 200 OK\r\nCache-Control: max-age=60\r\nContent-Range: bytes 0-9/10\r\nContent-Length: 10\r\n\r\n0123456789")
		})
		var clock atomic.Int64
		r := e.serve(t, storyOptions{Upstream: up.URL(), Core: cacheCore(t, &clock)})
		c, br := dial(t, r.Addr)
		defer c.Close()
		roundTrip(t, c, br, "GET /r HTTP/1.1\r\nHost: a\r\n\r\n")
		resp, b := roundTrip(t, c, br, "GET /r HTTP/1.1\r\nHost: a\r\nRange: bytes=2-3\r\n\r\n")
		if cr := resp.Header.Values("Content-Range"); resp.StatusCode != 206 || len(cr) != 1 || cr[0] != "bytes 2-3/10" || string(b) != "23" {
			t.Errorf("a range of it: %d, Content-Range %q, %q; want 206, [bytes 2-3/10], 23", resp.StatusCode, cr, b)
		}
	})
}

// A response the cache can no longer store, once it outgrew max_body, is
// not read on for nobody, on every engine: the fill of a client that went
// away, and a background refresh (stale-while-revalidate), which has no
// client, have their upstream connection cut. Without that, a GET for a
// large download on a cached path and a reset made the worker pull the
// whole of it, and so did every request for a stale entry that grew.
func TestCacheFillOverMaxBodyIsCut(t *testing.T) {
	t.Parallel()
	const size = 256 << 20
	eachEngine(t, withNetHTTP(), func(t *testing.T, e storyEngine) {
		t.Run("a gone client's fill", func(t *testing.T) {
			result := make(chan error, 1)
			up := startUpstream(t, wiretest.CutOff(size, "Cache-Control: max-age=60\r\n", result))
			var clock atomic.Int64
			r := e.serve(t, storyOptions{Upstream: up.URL(), Core: cacheCore(t, &clock)})
			c, br := dial(t, r.Addr)
			io.WriteString(c, "GET /big HTTP/1.1\r\nHost: a\r\n\r\n")
			if _, err := http.ReadResponse(br, nil); err != nil {
				t.Fatal(err)
			}
			c.(*net.TCPConn).SetLinger(0)
			c.Close() // a reset: the client is gone
			if err := <-result; !cut(err) {
				t.Errorf("the upstream's %d MiB to a gone client, over the cache's max_body: %v; want its connection cut", size>>20, err)
			}
		})
		t.Run("a refresh", func(t *testing.T) {
			result := make(chan error, 1)
			var n atomic.Int32
			grown := wiretest.CutOff(size, "Cache-Control: max-age=60\r\n", result)
			up := startUpstream(t, func(req *seenRequest, w *bufio.Writer, c net.Conn) {
				if n.Add(1) == 1 {
					w.WriteString("HTTP/1.1 200 OK\r\nCache-Control: max-age=10, stale-while-revalidate=60\r\nContent-Length: 3\r\n\r\nold")
					return
				}
				grown(req, w, c)
			})
			var clock atomic.Int64
			r := e.serve(t, storyOptions{Upstream: up.URL(), Core: cacheCore(t, &clock)})
			if st, x, b := fetch(t, "http://"+r.Addr+"/grows"); st != 200 || x != "MISS" || b != "old" {
				t.Fatalf("first: %d %s %q", st, x, b)
			}
			clock.Add(int64(20 * time.Second))
			if st, x, b := fetch(t, "http://"+r.Addr+"/grows"); st != 200 || x != "STALE" || b != "old" {
				t.Fatalf("stale: %d %s %q", st, x, b)
			}
			if err := <-result; !cut(err) {
				t.Errorf("the refresh's %d MiB, over the cache's max_body: %v; want its connection cut", size>>20, err)
			}
		})
	})
}

// cut reports whether err, what wiretest.CutOff reported, is the
// server's cut: not the whole body sent, nor a write that timed out.
func cut(err error) bool {
	ne, ok := err.(net.Error)
	return err != nil && !(ok && ne.Timeout())
}

// TestIdempotentResponseOverMaxBodyIsCut: a keyed request's response that
// outgrew its block's max_body cannot be replayed; once its client is
// gone nothing needs the rest of it, and it is cut, as a cache fill is.
// The key stays executed (the application ran the request): a retry gets
// 409, and the upstream sees the request once.
func TestIdempotentResponseOverMaxBodyIsCut(t *testing.T) {
	t.Parallel()
	const size = 256 << 20
	eachEngine(t, withNetHTTP(), func(t *testing.T, e storyEngine) {
		result := make(chan error, 1)
		up := startUpstream(t, wiretest.CutOff(size, "", result))
		c := configCore(t, "[[idempotency]]\npath = \"/orders\"\nmax_body = \"4KiB\"\nwait = \"1s\"\n", nil)
		r := e.serve(t, storyOptions{Upstream: up.URL(), Core: c})
		const post = "POST /orders HTTP/1.1\r\nHost: a\r\nIdempotency-Key: k1\r\nContent-Length: 0\r\n\r\n"
		conn, br := dial(t, r.Addr)
		io.WriteString(conn, post)
		if _, err := http.ReadResponse(br, nil); err != nil {
			t.Fatal(err)
		}
		conn.(*net.TCPConn).SetLinger(0)
		conn.Close() // a reset: the client is gone
		if err := <-result; !cut(err) {
			t.Errorf("the upstream's %d MiB to a gone client, over the block's max_body: %v; want its connection cut", size>>20, err)
		}
		conn, br = dial(t, r.Addr)
		if resp, body := roundTrip(t, conn, br, post); resp.StatusCode != 409 {
			t.Errorf("the retry: %d %q; want 409: the request ran", resp.StatusCode, body)
		}
		if n := len(up.Requests()); n != 1 {
			t.Errorf("the upstream saw the keyed request %d times", n)
		}
	})
}
