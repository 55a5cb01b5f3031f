package proxy_test

import (
	"io"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/preforkd/preforkd/core"
	"github.com/preforkd/preforkd/proxy"
)

// The access log entry says the scheme of the listener a request came
// on: http on every engine's cleartext listener (the TLS edge's is
// https, engine/nethttp/tlsedge), forwarded or answered by the core.
func TestAccessEntryScheme(t *testing.T) {
	t.Parallel()
	eachEngine(t, withNetHTTP(), func(t *testing.T, e storyEngine) {
		up := startUpstream(t, nil)
		lines := make(chan core.AccessEntry, 4)
		c := configCoreWith(t, "[[ratelimit]]\nname = \"r\"\npath = \"/r\"\nlimit = 1\nwindow = \"1m\"\nby = \"global\"\n", func(o *core.Options) {
			o.AccessLog = accessFunc(func(e *core.AccessEntry) { lines <- *e })
		})
		r := e.serve(t, storyOptions{Upstream: up.URL(), Core: c})
		conn, br := dial(t, r.Addr)
		for _, path := range []string{"/x", "/r", "/r"} { // forwarded, forwarded, refused
			io.WriteString(conn, "GET "+path+" HTTP/1.1\r\nHost: a\r\n\r\n")
			resp, _ := readResponse(t, br, "GET")
			select {
			case l := <-lines:
				if l.Scheme != "http" {
					t.Errorf("%s (%d): scheme %q, want http", path, resp.StatusCode, l.Scheme)
				}
			case <-time.After(5 * time.Second):
				t.Fatalf("%s: no access log entry within 5 s", path)
			}
		}
	})
}

// An App (fasthttp) gets the path the core passes on, rewritten in
// fasthttp's request buffer: the access log still says the path and
// query as sent, not bytes of the rewritten target.
func TestAccessEntryOfAnAppWithARewrittenPath(t *testing.T) {
	t.Parallel()
	lines := make(chan core.AccessEntry, 4)
	c := configCoreWith(t, "", func(o *core.Options) {
		o.AccessLog = accessFunc(func(e *core.AccessEntry) { lines <- *e })
	})
	addr, _ := serve(t, proxy.Options{Core: c, App: func(ctx *fasthttp.RequestCtx) { ctx.WriteString("ok") }})
	conn, br := dial(t, addr)
	for _, tc := range []struct{ target, path, query string }{
		{"/a/../b?abcdefgh", "/a/../b", "abcdefgh"},
		{"/x/./y/z?q=1", "/x/./y/z", "q=1"},
		{"//c", "//c", ""},
	} {
		io.WriteString(conn, "GET "+tc.target+" HTTP/1.1\r\nHost: a\r\n\r\n")
		readResponse(t, br, "GET")
		select {
		case l := <-lines:
			if l.Path != tc.path || l.Query != tc.query || l.Target != tc.target {
				t.Errorf("%s: logged path %q query %q target %q", tc.target, l.Path, l.Query, l.Target)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: no access log entry within 5 s", tc.target)
		}
	}
}
