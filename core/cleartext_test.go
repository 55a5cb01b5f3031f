package core_test

import (
	"testing"
	"time"

	"github.com/preforkd/preforkd/bucket"
	"github.com/preforkd/preforkd/core"
	"github.com/preforkd/preforkd/shm"
)

// The cleartext listener beside a TLS one, in redirect mode: every
// request but the health check gets 308 to https, before any rule, and
// one whose Host is no authority gets 400.
func TestCleartextRedirect(t *testing.T) {
	t.Parallel()
	responded := 0
	c, err := core.New(joinedRegion(t, shm.Options{Counters: 64}), core.Options{
		OnResponse: func(int) { responded++ },
		HealthPath: "/healthz",
		RateLimits: []core.RateLimit{{Rule: bucket.Rule{Name: "all", Limit: 1, Window: time.Hour}, Route: mustRoute(t, "/*")}},
	})
	if err != nil {
		t.Fatal(err)
	}
	app := func(core.Forward) fakeResp {
		t.Error("a redirected request was forwarded")
		return fakeResp{status: 200}
	}
	for _, tc := range []struct {
		port           int
		method, target string
		host           string
		status         int
		location       string
	}{
		{443, "GET", "/a/b?x=1&y=%20", "example.com", 308, "https://example.com/a/b?x=1&y=%20"},
		{443, "POST", "/login", "example.com:80", 308, "https://example.com/login"},
		{8443, "GET", "/", "example.com:8080", 308, "https://example.com:8443/"},
		{8443, "GET", "/p", "[2001:db8::1]:80", 308, "https://[2001:db8::1]:8443/p"},
		// The name as nginx's $host has it: in lower case, without the
		// trailing dot of a fully qualified name.
		{443, "GET", "/p", "WWW.Example.COM.:80", 308, "https://www.example.com/p"},
		{443, "GET", "/p", "[2001:DB8::A]", 308, "https://[2001:db8::a]/p"},
		// Bytes a URL cannot hold as they are, percent-encoded as a
		// browser would (RFC 3987 §3.1), never decoded: the target the
		// TLS listener would serve, not a 400.
		{443, "GET", "/caf\xc3\xa9/%2F?q=\xc3\xa9&r=%41", "example.com", 308, "https://example.com/caf%C3%A9/%2F?q=%C3%A9&r=%41"},
		{443, "GET", "/p", "", 400, ""},
		{443, "GET", "/p", "bad host", 400, ""},
		{443, "GET", "/p", "evil.com/x", 400, ""},
		{443, "GET", "/p\r\nSet-Cookie:a", "example.com", 400, ""},
	} {
		v := c.Cleartext(core.CleartextOptions{Redirect: true, TLSPort: tc.port})
		r := newReq(tc.method, tc.target, "192.0.2.1")
		if tc.host != "" {
			r.header["Host"] = []string{tc.host}
		}
		a := serve(v, r, app)
		if a.status != tc.status || a.get("Location") != tc.location {
			t.Errorf("%s %s Host %q (TLS port %d): %d Location %q; want %d %q", tc.method, tc.target, tc.host, tc.port, a.status, a.get("Location"), tc.status, tc.location)
		}
		if tc.status == 308 && (a.get("Content-Length") == "" || len(a.body) == 0) {
			t.Errorf("%s: a redirect with Content-Length %q and body %q", tc.target, a.get("Content-Length"), a.body)
		}
	}
	v := c.Cleartext(core.CleartextOptions{Redirect: true, TLSPort: 443})
	if a := serve(v, newReq("GET", "/healthz", "192.0.2.1", "Host", "example.com"), app); a.status != 200 {
		t.Errorf("the health check on the cleartext listener: %d, want 200", a.status)
	}
	if responded != 11 {
		t.Errorf("%d responses counted, want the 11 redirects and 400s of the core", responded)
	}
	// The rule counted none of the redirects: its one request is left,
	// on the TLS listener (the Core itself), and the drain is shared.
	ok := func(core.Forward) fakeResp { return fakeResp{status: 200} }
	if a := serve(c, newReq("GET", "/x", "192.0.2.1", "Host", "example.com"), ok); a.status != 200 {
		t.Errorf("after the redirects: %d, want the rule's one request", a.status)
	}
	c.Drain()
	if a := serve(v, newReq("GET", "/healthz", "192.0.2.1", "Host", "example.com"), app); a.status != 503 {
		t.Errorf("the health check on the cleartext listener once drained: %d, want 503", a.status)
	}
}

// In serve mode the cleartext listener is served as the TLS one, over
// the same counts: a limit of 2 lets 2 through across both.
func TestCleartextServeSharesTheRules(t *testing.T) {
	t.Parallel()
	c, err := core.New(joinedRegion(t, shm.Options{Counters: 64}), core.Options{
		RateLimits: []core.RateLimit{{Rule: bucket.Rule{Name: "all", Limit: 2, Window: time.Hour}, Route: mustRoute(t, "/*")}},
	})
	if err != nil {
		t.Fatal(err)
	}
	v := c.Cleartext(core.CleartextOptions{})
	ok := func(core.Forward) fakeResp { return fakeResp{status: 200} }
	got := []int{
		serve(c, newReq("GET", "/x", "192.0.2.1", "Host", "example.com"), ok).status,
		serve(v, newReq("GET", "/x", "192.0.2.1", "Host", "example.com"), ok).status,
		serve(v, newReq("GET", "/x", "192.0.2.1", "Host", "example.com"), ok).status,
		serve(c, newReq("GET", "/x", "192.0.2.1", "Host", "example.com"), ok).status,
	}
	if got[0] != 200 || got[1] != 200 || got[2] != 429 || got[3] != 429 {
		t.Errorf("statuses %v, want 200 200 429 429", got)
	}
	if err := v.Close(); err != nil {
		t.Error(err)
	}
}

// The cache keeps the cleartext listener's responses apart from the TLS
// one's: an application's answer made for http (an http:// link) is
// never served over https, nor the other way.
func TestCleartextCacheIsApart(t *testing.T) {
	t.Parallel()
	c, _ := storyCore(t, "")
	v := c.Cleartext(core.CleartextOptions{})
	a := &app{t: t}
	a.resps = []fakeResp{
		{status: 200, body: []byte("https"), header: hdr("Cache-Control", "max-age=60")},
		{status: 200, body: []byte("http"), header: hdr("Cache-Control", "max-age=60")},
	}
	get := func(c *core.Core) answer { return serve(c, newReq("GET", "/p", "192.0.2.1", "Host", "h"), a.serve) }
	wantAnswer(t, "TLS fill", get(c), 200, "MISS", "https")
	wantAnswer(t, "cleartext fill", get(v), 200, "MISS", "http")
	wantAnswer(t, "TLS hit", get(c), 200, "HIT", "https")
	wantAnswer(t, "cleartext hit", get(v), 200, "HIT", "http")
}

// An idempotency key is one key on both listeners: a retry over the
// other scheme gets the stored response and does not run again (the
// operation is the client's, whichever port it reached), unlike the
// cache, whose answers are kept apart.
func TestCleartextIdempotencyKeyIsShared(t *testing.T) {
	t.Parallel()
	c, err := core.New(joinedRegion(t, shm.Options{Counters: 64, Responses: 64, ResponseBytes: 1 << 20}), core.Options{
		Idempotency: core.IdempotencyBlocks(core.Idempotency{Route: mustRoute(t, "/orders", "POST"), TTL: time.Hour, MaxBody: 1 << 10}),
	})
	if err != nil {
		t.Fatal(err)
	}
	v := c.Cleartext(core.CleartextOptions{})
	order := func() *fakeReq {
		return newReq("POST", "/orders", "192.0.2.1", "Host", "example.com", "Idempotency-Key", "k1")
	}
	if a := runKeyed(t, v, order()); a.status != 200 {
		t.Fatalf("the first request, over http: %d, want it run", a.status)
	}
	if a := runKeyed(t, c, order()); a.status != 201 || a.fields["Idempotent-Replayed"] != "true" {
		t.Errorf("its retry over https: %d %v, want the stored 201 replayed", a.status, a.fields)
	}
}
