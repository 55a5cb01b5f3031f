package proxy_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/preforkd/preforkd/config"
	"github.com/preforkd/preforkd/core"
	"github.com/preforkd/preforkd/engine"
	"github.com/preforkd/preforkd/engine/nethttp"
	"github.com/preforkd/preforkd/internal/waitfor"
	"github.com/preforkd/preforkd/proxy"
	"github.com/preforkd/preforkd/shm"
)

// The decision core behind each engine: the same requests, through the
// fast engine and through the net/http adapter (core/nethttp, in front of
// a reverse proxy as the embedding API would serve one), must get the
// same answers byte for byte and reach the upstream the same way.

// coreEngine serves ln with c in front, forwarding to upstream.
type coreEngine struct {
	name  string
	start func(t *testing.T, ln net.Listener, upstream string, c *core.Core)
}

var coreEngines = []coreEngine{
	{"fasthttp", func(t *testing.T, ln net.Listener, upstream string, c *core.Core) {
		s, _ := start(t, ln, proxy.Options{Upstream: upstream, Core: c})
		t.Cleanup(func() { s.Close() })
	}},
	{"nethttp", func(t *testing.T, ln net.Listener, upstream string, c *core.Core) {
		u, err := url.Parse(upstream)
		if err != nil {
			t.Fatal(err)
		}
		var conns dialed
		rp := &httputil.ReverseProxy{
			Rewrite: func(pr *httputil.ProxyRequest) {
				pr.SetURL(u)
				pr.Out.Host = pr.In.Host
				pr.Out.Header["X-Forwarded-For"] = pr.In.Header["X-Forwarded-For"]
				pr.SetXForwarded()
			},
			// A connection each: net/http's Transport reuses a connection
			// it found clean, and bytes an upstream sends late (the
			// stray-bytes rows) may come after that, as the next
			// request's answer, when the machine is loaded. The
			// forwarders' own reuse is nethttp-forward's to show.
			// Its connections are closed when the test ends: a response
			// the core keeps is read on whatever the client does
			// (nethttp.New), as long as the upstream sends it.
			Transport: &http.Transport{DisableKeepAlives: true, DialContext: conns.dial},
		}
		// net/http's Close does not wait for the handlers: they are
		// counted, and waited for before the core's region goes, and
		// so are the core's background refreshes (Handler.Wait).
		h := nethttp.New(c, rp, nethttp.Options{})
		var running atomic.Int64
		srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			running.Add(1)
			defer running.Add(-1)
			h.ServeHTTP(w, r)
		})}
		go srv.Serve(ln)
		t.Cleanup(func() {
			srv.Close()
			conns.close()
			if !waitfor.Cond(engine.CloseWait, func() bool { return running.Load() == 0 }) {
				leftRunning(t, fmt.Sprintf("%d handlers", running.Load()))
			}
			refreshed := make(chan struct{})
			go func() { h.Wait(); close(refreshed) }()
			select {
			case <-refreshed:
			case <-time.After(engine.CloseWait):
				leftRunning(t, "a background refresh")
			}
		})
	}},
	{"nethttp-forward", func(t *testing.T, ln net.Listener, upstream string, c *core.Core) {
		// The net/http engine forwarding by itself, as the daemon's TLS
		// listeners do.
		s := netHTTPForwarder(t, c, upstream, engine.Limits{})
		go s.Serve(ln)
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			s.Shutdown(ctx)
		})
	}},
}

var quietLog = slog.New(slog.DiscardHandler)

// dialed are the connections its dial opened, to close at once.
type dialed struct {
	mu    sync.Mutex
	conns []net.Conn
}

func (d *dialed) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	var dialer net.Dialer
	c, err := dialer.DialContext(ctx, network, addr)
	if err == nil {
		d.mu.Lock()
		d.conns = append(d.conns, c)
		d.mu.Unlock()
	}
	return c, err
}

func (d *dialed) close() {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, c := range d.conns {
		c.Close()
	}
}

// stillRunning holds the tests whose engine left goroutines running when
// it was stopped (leftRunning): their core's region is not unmapped,
// which such a goroutine would touch, a fault that ends the whole test
// binary. The process's exit unmaps it.
var stillRunning sync.Map // testing.TB → struct{}

// leftRunning fails t, whose engine still runs what (goroutines that may
// touch its core's region) once it was stopped, and keeps the region
// mapped. An engine's cleanup calls it before the region's runs (cleanups
// run last first).
func leftRunning(t testing.TB, what string) {
	t.Errorf("%s still running once the engine was stopped: its core's region is left mapped", what)
	stillRunning.Store(t, struct{}{})
}

// configCore is the decision core a worker builds from the configuration
// text toml, over a region of its own, logging to quietLog, on the clock
// now (the region's when nil).
func configCore(t testing.TB, toml string, now func() time.Duration) *core.Core {
	t.Helper()
	return configCoreWith(t, toml, func(o *core.Options) { o.Now = now })
}

// configCoreWith is configCore with the options set by mod (after the
// logger).
func configCoreWith(t testing.TB, toml string, mod func(*core.Options)) *core.Core {
	t.Helper()
	c, _ := configCoreIn(t, toml, mod)
	return c
}

// configCoreIn is configCoreWith and the region the core is over, whose
// statistics a test reads.
func configCoreIn(t testing.TB, toml string, mod func(*core.Options)) (*core.Core, *shm.Region) {
	t.Helper()
	cfg, err := config.Parse([]byte(toml), "test.toml")
	if err != nil {
		t.Fatal(err)
	}
	o, err := cfg.CoreOptions()
	if err != nil {
		t.Fatal(err)
	}
	region, err := shm.Create(cfg.RegionOptions())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, ok := stillRunning.Load(t); !ok {
			region.Close()
		}
	})
	if err := region.Join(0); err != nil {
		t.Fatal(err)
	}
	o.Logger = quietLog
	mod(&o)
	c, err := core.New(region, o)
	if err != nil {
		t.Fatal(err)
	}
	return c, region
}

// coreCase is a story of requests on one keep-alive connection, with the
// configuration the core is built from.
type coreCase struct {
	name   string
	rules  string // TOML appended to a [table] with a response table
	steps  []coreStep
	upSeen []string // the request lines the upstream saw, in order
}

type coreStep struct {
	send   string // CRLF as "\n"
	status int
	has    []string // "Name: value" lines the response has
	hasNot []string
	body   string // the body has this in it, when not ""
	// hasCodings is the response's Content-Encoding lines as one list,
	// when not "": one line or several say the same (RFC 9110 §5.3).
	hasCodings string
	pause      time.Duration // waited before the step is sent
}

var coreCases = []coreCase{
	{
		name:  "a rule's headers, then its refusal",
		rules: `[[ratelimit]]` + "\nname = \"api\"\npath = \"/api/*\"\nlimit = 2\nwindow = \"1m\"\n",
		steps: []coreStep{
			{send: "GET /api/a HTTP/1.1\nHost: h\n\n", status: 200,
				has: []string{`Ratelimit-Policy: "api";q=2;w=60`, "X-Ratelimit-Limit: 2", "X-Ratelimit-Remaining: 1"}},
			{send: "GET /api/b HTTP/1.1\nHost: h\n\n", status: 200, has: []string{"X-Ratelimit-Remaining: 0"}},
			{send: "GET /api/c HTTP/1.1\nHost: h\n\n", status: 429,
				has: []string{"Content-Type: application/problem+json", "Cache-Control: no-store", "X-Ratelimit-Remaining: 0"}},
			{send: "GET /other HTTP/1.1\nHost: h\n\n", status: 200, hasNot: []string{"Ratelimit-Policy", "X-Ratelimit-Limit"}},
		},
		upSeen: []string{"GET /api/a HTTP/1.1", "GET /api/b HTTP/1.1", "GET /other HTTP/1.1"},
	},
	{
		name: "a path no application should see is refused; the others are forwarded normalized",
		steps: []coreStep{
			{send: "GET /a/./b//c/../d HTTP/1.1\nHost: h\n\n", status: 200},
			{send: "GET /a%2fb HTTP/1.1\nHost: h\n\n", status: 400, has: []string{"Content-Type: application/problem+json"}}, // and the connection closes
		},
		upSeen: []string{"GET /a/b/d HTTP/1.1"},
	},
	{
		name:  "an idempotent request is replayed, a changed one refused",
		rules: "[[idempotency]]\npath = \"/orders\"\nmax_body = \"4KiB\"\n",
		steps: []coreStep{
			{send: "POST /orders HTTP/1.1\nHost: h\nIdempotency-Key: \"k1\"\nContent-Type: application/json\nContent-Length: 7\n\n{\"n\":1}", status: 201,
				has: []string{"Location: /orders/1"}, hasNot: []string{"Idempotent-Replayed"}},
			{send: "POST /orders HTTP/1.1\nHost: h\nIdempotency-Key: \"k1\"\nContent-Type: application/json\nContent-Length: 7\n\n{\"n\":1}", status: 201,
				has: []string{"Location: /orders/1", "Idempotent-Replayed: true"}},
			{send: "POST /orders HTTP/1.1\nHost: h\nIdempotency-Key: \"k1\"\nContent-Type: application/json\nContent-Length: 7\n\n{\"n\":2}", status: 422,
				has: []string{"Content-Type: application/problem+json"}},
			// A second Content-Type line reaches the application, which
			// may read it (Puma and gunicorn join the lines): another
			// request.
			{send: "POST /orders HTTP/1.1\nHost: h\nIdempotency-Key: \"k1\"\nContent-Type: application/json\nContent-Type: text/plain\nContent-Length: 7\n\n{\"n\":1}", status: 422,
				has: []string{"Content-Type: application/problem+json"}},
			{send: "POST /orders HTTP/1.1\nHost: h\nIdempotency-Key: \"k1\"\nContent-Type: application/json\nContent-Length: 7\n\n{\"n\":1}", status: 201,
				has: []string{"Location: /orders/1", "Idempotent-Replayed: true"}},
		},
		upSeen: []string{"POST /orders HTTP/1.1"},
	},
	{
		// An application runs a POST that names another method in an
		// override field (or another path in X-Original-URL) as that
		// method (path): the same key and body with another override is
		// another request, refused as any other change is.
		name:  "an idempotent request whose override fields differ is refused, not replayed",
		rules: "[[idempotency]]\npath = \"/orders/*\"\nmax_body = \"4KiB\"\n",
		steps: []coreStep{
			{send: "POST /orders/1 HTTP/1.1\nHost: h\nIdempotency-Key: o1\nContent-Length: 1\n\nx", status: 201, hasNot: []string{"Idempotent-Replayed"}},
			{send: "POST /orders/1 HTTP/1.1\nHost: h\nIdempotency-Key: o1\nX-HTTP-Method-Override: PATCH\nContent-Length: 1\n\nx", status: 422},
			{send: "POST /orders/1 HTTP/1.1\nHost: h\nIdempotency-Key: o1\nX-Original-URL: /orders/2\nContent-Length: 1\n\nx", status: 422},
			{send: "POST /orders/1 HTTP/1.1\nHost: h\nIdempotency-Key: o2\nX-Method-Override: PATCH\nContent-Length: 1\n\nx", status: 201, hasNot: []string{"Idempotent-Replayed"}},
			{send: "POST /orders/1 HTTP/1.1\nHost: h\nIdempotency-Key: o2\nx-method-override: PATCH\nContent-Length: 1\n\nx", status: 201, has: []string{"Idempotent-Replayed: true"}},
			{send: "POST /orders/1 HTTP/1.1\nHost: h\nIdempotency-Key: o2\nContent-Length: 1\n\nx", status: 422},
			{send: "POST /orders/1 HTTP/1.1\nHost: h\nIdempotency-Key: o1\nContent-Length: 1\n\nx", status: 201, has: []string{"Idempotent-Replayed: true"}},
		},
		upSeen: []string{"POST /orders/1 HTTP/1.1", "POST /orders/1 HTTP/1.1"},
	},
	{
		name:  "a body coded twice keeps both codings: sent as the application sent them, replayed as one list",
		rules: "[[idempotency]]\npath = \"/orders/*\"\nmax_body = \"4KiB\"\n",
		steps: []coreStep{
			{send: "POST /orders/coded HTTP/1.1\nHost: h\nIdempotency-Key: \"c1\"\nContent-Length: 0\n\n", status: 201, body: "coded",
				hasCodings: "br, zstd"},
			{send: "POST /orders/coded HTTP/1.1\nHost: h\nIdempotency-Key: \"c1\"\nContent-Length: 0\n\n", status: 201, body: "coded",
				hasCodings: "br, zstd", has: []string{"Idempotent-Replayed: true"}},
		},
		upSeen: []string{"POST /orders/coded HTTP/1.1"},
	},
	{
		name:  "HEAD runs the GET handler, and a GET rule counts it",
		rules: `[[ratelimit]]` + "\nname = \"search\"\npath = \"/search\"\nmethods = [\"GET\"]\nlimit = 2\nwindow = \"1m\"\n",
		steps: []coreStep{
			{send: "HEAD /search HTTP/1.1\nHost: h\n\n", status: 200, has: []string{"X-Ratelimit-Remaining: 1"}},
			{send: "head /search HTTP/1.1\nHost: h\n\n", status: 200, has: []string{"X-Ratelimit-Remaining: 0"}},
			{send: "GET /search HTTP/1.1\nHost: h\n\n", status: 429},
		},
		upSeen: []string{"HEAD /search HTTP/1.1", "head /search HTTP/1.1"},
	},
	{
		// Symfony (so Laravel), Express's method-override, Rack and
		// ASP.NET Core run a POST that says X-HTTP-Method-Override:
		// DELETE with their DELETE handler, OData and SharePoint one
		// that says X-HTTP-Method: DELETE, Google's APIs one that says
		// X-Method-Override: DELETE: a rule for DELETE counts each.
		name: "a method override counts under the method the application runs",
		rules: `[[ratelimit]]` + "\nname = \"del\"\npath = \"/items/*\"\nmethods = [\"DELETE\"]\nlimit = 1\nwindow = \"1m\"\n" +
			`[[idempotency]]` + "\npath = \"/orders/*\"\nmethods = [\"PUT\"]\nrequired = true\nmax_body = \"4KiB\"\n",
		steps: []coreStep{
			{send: "DELETE /items/1 HTTP/1.1\nHost: h\n\n", status: 200, has: []string{"X-Ratelimit-Remaining: 0"}},
			{send: "POST /items/2 HTTP/1.1\nHost: h\nX-HTTP-Method-Override: DELETE\nContent-Length: 0\n\n", status: 429},
			{send: "POST /items/3 HTTP/1.1\nHost: h\nx-http-method-override: delete\nContent-Length: 0\n\n", status: 429},
			{send: "POST /items/4 HTTP/1.1\nHost: h\nContent-Length: 0\n\n", status: 201, hasNot: []string{"Ratelimit-Policy"}},
			{send: "POST /orders/1 HTTP/1.1\nHost: h\nX-HTTP-Method-Override: PUT\nContent-Length: 0\n\n", status: 400},
			{send: "POST /items/5 HTTP/1.1\nHost: h\nX-HTTP-Method: DELETE\nContent-Length: 0\n\n", status: 429},
			{send: "POST /items/6 HTTP/1.1\nHost: h\nx-method-override: delete\nContent-Length: 0\n\n", status: 429},
			{send: "POST /other HTTP/1.1\nHost: h\nX-HTTP-Method-Override: GET\nX-HTTP-Method-Override: DELETE\nX-Original-URL: /other\nX-Original-URL: http://h/items/6\nContent-Length: 0\n\n", status: 429},
			{send: "POST /orders/2 HTTP/1.1\nHost: h\nX-HTTP-Method: PUT\nContent-Length: 0\n\n", status: 400},
			{send: "POST /orders/3 HTTP/1.1\nHost: h\nX-Method-Override: GET, PUT\nContent-Length: 0\n\n", status: 400},
			// Symfony and Laravel read _method from the query of a POST.
			{send: "POST /items/7?_method=DELETE HTTP/1.1\nHost: h\nContent-Length: 0\n\n", status: 429},
			{send: "POST /orders/4?a=1&_method=put HTTP/1.1\nHost: h\nContent-Length: 0\n\n", status: 400},
			{send: "POST /items/9?_method=GET&_m%65thod=DELETE HTTP/1.1\nHost: h\nContent-Length: 0\n\n", status: 429}, // PHP keeps the last
			{send: "GET /items/8?_method=DELETE HTTP/1.1\nHost: h\n\n", status: 200, hasNot: []string{"Ratelimit-Policy"}},
		},
		upSeen: []string{"DELETE /items/1 HTTP/1.1", "POST /items/4 HTTP/1.1", "GET /items/8?_method=DELETE HTTP/1.1"},
	},
	{
		// Laminas and Zend before 2018, and applications behind IIS URL
		// Rewrite, route by X-Original-URL or X-Rewrite-URL when present
		// (the cache keys on them): a rule and a block count the path
		// they name too.
		name: "a path override counts under the path the application runs",
		rules: `[[ratelimit]]` + "\nname = \"admin\"\npath = \"/admin/*\"\nlimit = 1\nwindow = \"1m\"\n" +
			`[[idempotency]]` + "\npath = \"/orders/*\"\nrequired = true\nmax_body = \"4KiB\"\n",
		steps: []coreStep{
			{send: "GET /admin/x HTTP/1.1\nHost: h\n\n", status: 200, has: []string{"X-Ratelimit-Remaining: 0"}},
			{send: "GET /public HTTP/1.1\nHost: h\nX-Original-URL: /admin/y\n\n", status: 429},
			{send: "GET /public HTTP/1.1\nHost: h\nx-rewrite-url: /ADMIN/./z?q=1\n\n", status: 429},
			// Zend and Diactoros drop a "scheme://authority" before the
			// path and split off a fragment; of a field sent twice, PHP
			// may get the last line (FastCGI): each line counts.
			{send: "GET /public HTTP/1.1\nHost: h\nX-Original-URL: http://h/admin/y\n\n", status: 429},
			{send: "GET /public HTTP/1.1\nHost: h\nX-Rewrite-URL: /admin/y#f\n\n", status: 429},
			{send: "GET /public HTTP/1.1\nHost: h\nX-Original-URL: /public\nX-Original-URL: /admin/y\n\n", status: 429},
			{send: "GET /public HTTP/1.1\nHost: h\nX-Original-URL: http:///admin/y\n\n", status: 200, hasNot: []string{"Ratelimit-Policy"}},
			{send: "GET /public HTTP/1.1\nHost: h\n\n", status: 200, hasNot: []string{"Ratelimit-Policy"}},
			{send: "POST /x HTTP/1.1\nHost: h\nX-Original-URL: /orders/1\nContent-Length: 0\n\n", status: 400},
			{send: "POST /x HTTP/1.1\nHost: h\nX-Original-URL: /orders/1\nX-HTTP-Method-Override: PATCH\nContent-Length: 0\n\n", status: 400},
			{send: "POST /x HTTP/1.1\nHost: h\nX-Original-URL: https://h:8443/orders/1?a#b\nContent-Length: 0\n\n", status: 400},
		},
		upSeen: []string{"GET /admin/x HTTP/1.1", "GET /public HTTP/1.1", "GET /public HTTP/1.1"},
	},
	{
		name:  "a key header sent twice is refused",
		rules: `[[ratelimit]]` + "\nname = \"key\"\npath = \"/k\"\nlimit = 5\nwindow = \"1m\"\nby = \"header:X-Api-Key\"\n",
		steps: []coreStep{
			{send: "GET /k HTTP/1.1\nHost: h\nX-Api-Key: a\nX-Api-Key: b\n\n", status: 400, has: []string{"Content-Type: application/problem+json"}},
			{send: "GET /k HTTP/1.1\nHost: h\nX-Api-Key: a\n\n", status: 200, has: []string{"X-Ratelimit-Remaining: 4"}},
		},
		upSeen: []string{"GET /k HTTP/1.1"},
	},
	{
		// PHP reads api.key, api+key and api[key as api_key (and keeps
		// the last); Rack before 3 and Python before 3.9.2 split pairs at
		// ';' too: each is a copy of the key parameter the rule would not
		// read, so refused as a repeat is.
		name:  "a query key parameter another parser reads otherwise is refused",
		rules: `[[ratelimit]]` + "\nname = \"key\"\npath = \"/q\"\nlimit = 5\nwindow = \"1m\"\nby = \"query:api_key\"\n",
		steps: []coreStep{
			{send: "GET /q?api_key=r1&api.key=k1 HTTP/1.1\nHost: h\n\n", status: 400, has: []string{"Content-Type: application/problem+json"}},
			{send: "GET /q?api_key=r2&api+key=k1 HTTP/1.1\nHost: h\n\n", status: 400},
			{send: "GET /q?api_key=r3&api[key=k1 HTTP/1.1\nHost: h\n\n", status: 400},
			{send: "GET /q?x=1;api_key=k1 HTTP/1.1\nHost: h\n\n", status: 400},
			{send: "GET /q?api_key=k1;r4 HTTP/1.1\nHost: h\n\n", status: 400},
			{send: "GET /q?api_key=k1&api[key]=x&api_keys=y HTTP/1.1\nHost: h\n\n", status: 200, has: []string{"X-Ratelimit-Remaining: 4"}},
		},
		upSeen: []string{"GET /q?api_key=k1&api[key]=x&api_keys=y HTTP/1.1"},
	},
	{
		name: "the application's reset header resets the rule for the request's key, and reaches no client",
		rules: "[server]\nreset_header = \"Preforkd-Reset\"\n[[ratelimit]]\nname = \"login\"\npath = \"/signin\"\nlimit = 2\nwindow = \"1m\"\n" +
			"[[cache]]\npath = \"/cached/*\"\nmax_body = \"8KiB\"\n",
		steps: []coreStep{
			{send: "GET /signin HTTP/1.1\nHost: h\n\n", status: 200, has: []string{"X-Ratelimit-Remaining: 1"}},
			// The application says the login succeeded: the next requests
			// find the whole allowance again.
			{send: "GET /signin?ok=1 HTTP/1.1\nHost: h\n\n", status: 200, has: []string{"X-Ratelimit-Remaining: 0"}, hasNot: []string{"Preforkd-Reset"}},
			{send: "GET /signin HTTP/1.1\nHost: h\n\n", status: 200, has: []string{"X-Ratelimit-Remaining: 1"}},
			// A client's own field is not forwarded, and resets nothing.
			{send: "GET /signin HTTP/1.1\nHost: h\nPreforkd-Reset: login\n\n", status: 200, has: []string{"X-Ratelimit-Remaining: 0", "X-Seen-Reset: none"}},
			{send: "GET /signin HTTP/1.1\nHost: h\n\n", status: 429},
			// Nor is it stored: a cache hit does not carry it either.
			{send: "GET /cached/reset HTTP/1.1\nHost: h\n\n", status: 200, has: []string{"X-Cache: MISS"}, hasNot: []string{"Preforkd-Reset"}},
			{send: "GET /cached/reset HTTP/1.1\nHost: h\n\n", status: 200, has: []string{"X-Cache: HIT"}, hasNot: []string{"Preforkd-Reset"}},
		},
		upSeen: []string{"GET /signin HTTP/1.1", "GET /signin?ok=1 HTTP/1.1", "GET /signin HTTP/1.1", "GET /signin HTTP/1.1", "GET /cached/reset HTTP/1.1"},
	},
}

// One view of a request (SPEC "One request, one truth"): what the core
// keys, varies and fingerprints on is what the upstream gets, and an
// upstream connection carries a request only when it is clean.
var oneViewCases = []coreCase{
	{
		name:  "a key field that Connection names keys nothing: the request counts under the next key",
		rules: `[[ratelimit]]` + "\nname = \"api\"\npath = \"/api/*\"\nlimit = 2\nwindow = \"1m\"\nby = \"header:X-Api-Key|ip\"\n",
		steps: []coreStep{
			{send: "GET /api/1 HTTP/1.1\nHost: h\nX-Api-Key: k1\nConnection: X-Api-Key\n\n", status: 200, has: []string{"X-Ratelimit-Remaining: 1"}},
			{send: "GET /api/2 HTTP/1.1\nHost: h\nX-Api-Key: k2\nConnection: X-Api-Key\n\n", status: 200, has: []string{"X-Ratelimit-Remaining: 0"}},
			{send: "GET /api/3 HTTP/1.1\nHost: h\nX-Api-Key: k3\nConnection: X-Api-Key\n\n", status: 429},
			{send: "GET /api/4 HTTP/1.1\nHost: h\nX-Api-Key: k4\n\n", status: 200, has: []string{"X-Ratelimit-Remaining: 1"}},
		},
		upSeen: []string{"GET /api/1 HTTP/1.1", "GET /api/2 HTTP/1.1", "GET /api/4 HTTP/1.1"},
	},
	{
		name:  "a Vary field that Connection names varies nothing: the answer to its absence is not served for it",
		rules: "[[cache]]\npath = \"/cached/*\"\nmax_body = \"8KiB\"\n",
		steps: []coreStep{
			{send: "GET /cached/lang HTTP/1.1\nHost: h\nAccept-Language: fr\nOrigin: https://app.site\nConnection: Accept-Language, Origin\n\n",
				status: 200, has: []string{"X-Cache: MISS"}, body: "lang=[] origin=[]"},
			{send: "GET /cached/lang HTTP/1.1\nHost: h\nAccept-Language: fr\nOrigin: https://app.site\n\n",
				status: 200, has: []string{"X-Cache: MISS"}, body: "lang=[fr] origin=[https://app.site]"},
			{send: "GET /cached/lang HTTP/1.1\nHost: h\nAccept-Language: fr\nOrigin: https://app.site\n\n",
				status: 200, has: []string{"X-Cache: HIT"}, body: "lang=[fr] origin=[https://app.site]"},
			{send: "GET /cached/lang HTTP/1.1\nHost: h\n\n", status: 200, has: []string{"X-Cache: HIT"}, body: "lang=[] origin=[]"},
		},
		upSeen: []string{"GET /cached/lang HTTP/1.1", "GET /cached/lang HTTP/1.1"},
	},
	{
		name:  "an absolute-form target's authority is the host: forwarded, cached and keyed as one",
		rules: "[[cache]]\npath = \"/cached/*\"\nmax_body = \"8KiB\"\n",
		steps: []coreStep{
			{send: "GET http://evil.example/cached/host HTTP/1.1\nHost: victim.example\n\n", status: 200,
				has: []string{"X-Cache: MISS"}, body: "host=evil.example"},
			{send: "GET /cached/host HTTP/1.1\nHost: victim.example\n\n", status: 200,
				has: []string{"X-Cache: MISS"}, body: "host=victim.example"},
			{send: "GET /cached/host HTTP/1.1\nHost: evil.example\n\n", status: 200,
				has: []string{"X-Cache: HIT"}, body: "host=evil.example"},
			{send: "GET http://u:p@evil.example/cached/host HTTP/1.1\nHost: victim.example\n\n", status: 400,
				has: []string{"Content-Type: application/problem+json"}},
		},
		upSeen: []string{"GET /cached/host HTTP/1.1", "GET /cached/host HTTP/1.1"},
	},
	{
		name:  "the first variant of a Vary response is found again, whatever the order of the Vary names",
		rules: "[[cache]]\npath = \"/cached/*\"\nmax_body = \"8KiB\"\n",
		steps: varySteps("X-Foo", "X-Foo,%20Origin", "Origin,%20X-Foo", "Accept-Language,%20X-Foo,%20Origin"),
		upSeen: []string{
			"GET /cached/slow?vary=X-Foo HTTP/1.1", "GET /cached/slow?vary=X-Foo HTTP/1.1",
			"GET /cached/slow?vary=X-Foo,%20Origin HTTP/1.1", "GET /cached/slow?vary=X-Foo,%20Origin HTTP/1.1",
			"GET /cached/slow?vary=Origin,%20X-Foo HTTP/1.1", "GET /cached/slow?vary=Origin,%20X-Foo HTTP/1.1",
			"GET /cached/slow?vary=Accept-Language,%20X-Foo,%20Origin HTTP/1.1", "GET /cached/slow?vary=Accept-Language,%20X-Foo,%20Origin HTTP/1.1",
		},
	},
	{
		name:  "bytes an upstream sends past a response never answer another request, nor fill the cache",
		rules: "[[cache]]\npath = \"/*\"\nmax_body = \"8KiB\"\n",
		steps: []coreStep{
			// A body to HEAD, 20 ms after its head.
			{send: "HEAD /stray/head HTTP/1.1\nHost: h\n\n", status: 200},
			{send: "GET /cached/victim1 HTTP/1.1\nHost: h\n\n", status: 200, body: "call", pause: 60 * time.Millisecond},
			// A body to a 204, 20 ms after its head.
			{send: "GET /stray/204 HTTP/1.1\nHost: h\n\n", status: 204},
			{send: "GET /cached/victim2 HTTP/1.1\nHost: h\n\n", status: 200, body: "call", pause: 60 * time.Millisecond},
			// A whole response past the declared length, in the same write.
			// (That the response itself is not stored is the engine's to
			// know: TestStrayBytesNotStored.)
			{send: "GET /stray/long HTTP/1.1\nHost: h\n\n", status: 200, body: "ok"},
			{send: "GET /cached/victim3 HTTP/1.1\nHost: h\n\n", status: 200, body: "call"},
			// The same, 20 ms after the response.
			{send: "GET /stray/late HTTP/1.1\nHost: h\n\n", status: 200, body: "ok"},
			{send: "GET /cached/victim4 HTTP/1.1\nHost: h\n\n", status: 200, body: "call", pause: 60 * time.Millisecond},
			{send: "GET /cached/victim1 HTTP/1.1\nHost: h\n\n", status: 200, body: "call", has: []string{"X-Cache: HIT"}},
		},
		upSeen: []string{"HEAD /stray/head HTTP/1.1", "GET /cached/victim1 HTTP/1.1", "GET /stray/204 HTTP/1.1", "GET /cached/victim2 HTTP/1.1",
			"GET /stray/long HTTP/1.1", "GET /cached/victim3 HTTP/1.1", "GET /stray/late HTTP/1.1", "GET /cached/victim4 HTTP/1.1"},
	},
}

// varySteps asks each path /cached/slow?vary=V (its response varies on V,
// and its body comes 20 ms after its head) with X-Foo a, b, a, b, a and c:
// two fetches, three hits, and the third value fetched again.
func varySteps(vary ...string) []coreStep {
	var steps []coreStep
	for _, v := range vary {
		for i, x := range []string{"a", "b", "a", "b", "a"} {
			cache := "X-Cache: HIT"
			if i < 2 {
				cache = "X-Cache: MISS"
			}
			steps = append(steps, coreStep{send: "GET /cached/slow?vary=" + v + " HTTP/1.1\nHost: h\nX-Foo: " + x + "\n\n",
				status: 200, has: []string{cache}, body: "foo=[" + x + "]"})
		}
	}
	return steps
}

// The response cache through both engines: the upstream answers /cached/
// paths with a cacheable response naming its call.
var cacheCases = []coreCase{
	{
		name:  "a response is stored once, served with Age, 304 to its ETag, HEAD from GET; a POST invalidates it",
		rules: "[[cache]]\npath = \"/cached/*\"\nmax_body = \"8KiB\"\n",
		steps: []coreStep{
			{send: "GET /cached/a HTTP/1.1\nHost: h\nIf-None-Match: \"e1\"\n\n", status: 200, has: []string{"X-Cache: MISS", "Etag: \"e1\""}},
			{send: "GET /cached/a HTTP/1.1\nHost: h\n\n", status: 200, has: []string{"X-Cache: HIT", "Age: 0", "Etag: \"e1\"", "Cache-Control: max-age=60"}, hasNot: []string{"Set-Cookie"}},
			{send: "GET /cached/a HTTP/1.1\nHost: h\nIf-None-Match: W/\"e1\"\n\n", status: 304, has: []string{"X-Cache: HIT", "Etag: \"e1\""}, hasNot: []string{"Content-Type"}},
			{send: "HEAD /cached/a HTTP/1.1\nHost: h\n\n", status: 200, has: []string{"X-Cache: HIT", "Content-Length: 9"}},
			{send: "POST /cached/a HTTP/1.1\nHost: h\nContent-Length: 0\n\n", status: 201, has: []string{"X-Cache: BYPASS"}},
			{send: "GET /cached/a HTTP/1.1\nHost: h\n\n", status: 200, has: []string{"X-Cache: MISS"}},
			{send: "GET /cached/a HTTP/1.1\nHost: h\n\n", status: 200, has: []string{"X-Cache: HIT"}},
		},
		// The fill's conditional field is not forwarded (checked in
		// runCoreCase); the hits never reach the upstream.
		upSeen: []string{"GET /cached/a HTTP/1.1", "POST /cached/a HTTP/1.1", "GET /cached/a HTTP/1.1"},
	},
	{
		name:  "Vary keeps two variants; Vary: * and Set-Cookie are never stored",
		rules: "[[cache]]\npath = \"/cached/*\"\nmax_body = \"8KiB\"\n",
		steps: []coreStep{
			{send: "GET /cached/v HTTP/1.1\nHost: h\nAccept-Encoding: gzip\n\n", status: 200, has: []string{"X-Cache: MISS"}},
			{send: "GET /cached/v HTTP/1.1\nHost: h\nAccept-Encoding: br\n\n", status: 200, has: []string{"X-Cache: MISS"}},
			{send: "GET /cached/v HTTP/1.1\nHost: h\nAccept-Encoding: gzip\n\n", status: 200, has: []string{"X-Cache: HIT", "Vary: Accept-Encoding"}},
			{send: "GET /cached/v HTTP/1.1\nHost: h\nAccept-Encoding: br\n\n", status: 200, has: []string{"X-Cache: HIT"}},
			{send: "GET /cached/star HTTP/1.1\nHost: h\n\n", status: 200, has: []string{"X-Cache: MISS"}},
			{send: "GET /cached/star HTTP/1.1\nHost: h\n\n", status: 200, has: []string{"X-Cache: MISS"}},
			{send: "GET /cached/cookie HTTP/1.1\nHost: h\n\n", status: 200, has: []string{"X-Cache: MISS", "Set-Cookie: s=1"}},
			{send: "GET /cached/cookie HTTP/1.1\nHost: h\n\n", status: 200, has: []string{"X-Cache: MISS"}},
		},
		upSeen: []string{"GET /cached/v HTTP/1.1", "GET /cached/v HTTP/1.1", "GET /cached/star HTTP/1.1", "GET /cached/star HTTP/1.1",
			"GET /cached/cookie HTTP/1.1", "GET /cached/cookie HTTP/1.1"},
	},
	{
		name:  "a stale response is revalidated with its ETag; the 304 refreshes its fields and its Date, served on hits",
		rules: "[[cache]]\npath = \"/cached/*\"\nmax_body = \"8KiB\"\n",
		steps: []coreStep{
			{send: "GET /cached/reval HTTP/1.1\nHost: h\n\n", status: 200, body: "reval call 0001",
				has: []string{"X-Cache: MISS", "X-A: 1", "Date: Fri, 01 Jan 2100 00:00:00 GMT"}},
			{send: "GET /cached/reval HTTP/1.1\nHost: h\n\n", status: 200, body: "reval call 0001",
				has: []string{"X-Cache: HIT", "X-A: 1", "Date: Fri, 01 Jan 2100 00:00:00 GMT"}},
			{send: "GET /cached/reval HTTP/1.1\nHost: h\nIf-None-Match: \"other\"\n\n", status: 200, body: "reval call 0001", pause: 1100 * time.Millisecond,
				has: []string{"X-Cache: REVALIDATED", "X-A: 2", "Cache-Control: max-age=60", "Content-Length: 15", "Date: Sat, 02 Jan 2100 00:00:00 GMT"}},
			{send: "GET /cached/reval HTTP/1.1\nHost: h\n\n", status: 200, body: "reval call 0001",
				has: []string{"X-Cache: HIT", "X-A: 2", "Date: Sat, 02 Jan 2100 00:00:00 GMT"}},
			{send: "GET /cached/reval HTTP/1.1\nHost: h\nIf-None-Match: \"r1\"\n\n", status: 304, has: []string{"X-Cache: HIT"}},
		},
		upSeen: []string{"GET /cached/reval HTTP/1.1", "GET /cached/reval HTTP/1.1"},
	},
	{
		name:  "a revalidation for a client that asked no condition answers it 200: the cache's validators are not the client's",
		rules: "[[cache]]\npath = \"/cached/*\"\nmax_body = \"8KiB\"\n",
		steps: []coreStep{
			{send: "GET /cached/reval?plain HTTP/1.1\nHost: h\n\n", status: 200, body: "reval call 0001", has: []string{"X-Cache: MISS"}},
			{send: "GET /cached/reval?plain HTTP/1.1\nHost: h\n\n", status: 200, body: "reval call 0001", pause: 1100 * time.Millisecond,
				has: []string{"X-Cache: REVALIDATED", "X-A: 2", "Content-Length: 15"}},
		},
		upSeen: []string{"GET /cached/reval?plain HTTP/1.1", "GET /cached/reval?plain HTTP/1.1"},
	},
	{
		name:  "a 304 whose ETag is not the stale entry's serves the entry as stored, never a 304 to an unconditional request",
		rules: "[[cache]]\npath = \"/cached/*\"\nmax_body = \"8KiB\"\n",
		steps: []coreStep{
			{send: "GET /cached/reval-other HTTP/1.1\nHost: h\n\n", status: 200, body: "reval call 0001", has: []string{"X-Cache: MISS", "Etag: \"r1\""}},
			{send: "GET /cached/reval-other HTTP/1.1\nHost: h\n\n", status: 200, body: "reval call 0001", pause: 1100 * time.Millisecond,
				has: []string{"X-Cache: REVALIDATED", "Etag: \"r1\"", "X-A: 1", "Cache-Control: max-age=1"}, hasNot: []string{"X-A: 2"}},
			// Not refreshed by it: the next request validates again.
			{send: "GET /cached/reval-other HTTP/1.1\nHost: h\nIf-None-Match: \"r1\"\n\n", status: 304, has: []string{"X-Cache: REVALIDATED", "Etag: \"r1\""}},
		},
		upSeen: []string{"GET /cached/reval-other HTTP/1.1", "GET /cached/reval-other HTTP/1.1", "GET /cached/reval-other HTTP/1.1"},
	},
	{
		name:  "a byte range of a stored response is served from it: 206, 416 past its end; several ranges get it whole",
		rules: "[[cache]]\npath = \"/cached/*\"\nmax_body = \"8KiB\"\n",
		steps: []coreStep{
			{send: "GET /cached/range HTTP/1.1\nHost: h\nRange: bytes=0-3\n\n", status: 200, body: "call 0001", has: []string{"X-Cache: MISS"}},
			{send: "GET /cached/range HTTP/1.1\nHost: h\nRange: bytes=0-3\n\n", status: 206, body: "call",
				has: []string{"X-Cache: HIT", "Content-Range: bytes 0-3/9", "Content-Length: 4", "Etag: \"e1\""}},
			{send: "GET /cached/range HTTP/1.1\nHost: h\nRange: bytes=-4\nIf-Range: \"e1\"\n\n", status: 206, body: "0001", has: []string{"Content-Range: bytes 5-8/9"}},
			{send: "GET /cached/range HTTP/1.1\nHost: h\nRange: bytes=20-\n\n", status: 416, has: []string{"Content-Range: bytes */9"}},
			{send: "GET /cached/range HTTP/1.1\nHost: h\nRange: bytes=0-1,4-5\n\n", status: 200, body: "call 0001", hasNot: []string{"Content-Range"}},
		},
		upSeen: []string{"GET /cached/range HTTP/1.1"},
	},
	{
		name:  "targeted fields decide before Cache-Control; preforkd's own is never sent on, CDN-Cache-Control is",
		rules: "[[cache]]\npath = \"/cached/*\"\nmax_body = \"8KiB\"\n",
		steps: []coreStep{
			{send: "GET /cached/cdn HTTP/1.1\nHost: h\n\n", status: 200, has: []string{"X-Cache: MISS", "Cdn-Cache-Control: max-age=60"}},
			{send: "GET /cached/cdn HTTP/1.1\nHost: h\n\n", status: 200, body: "targeted call 0001", has: []string{"X-Cache: HIT", "Cdn-Cache-Control: max-age=60"}},
			{send: "GET /cached/own HTTP/1.1\nHost: h\n\n", status: 200, has: []string{"X-Cache: MISS", "Cache-Control: no-store"}, hasNot: []string{"Preforkd-Cache-Control"}},
			{send: "GET /cached/own HTTP/1.1\nHost: h\n\n", status: 200, body: "targeted call 0002", has: []string{"X-Cache: HIT"}, hasNot: []string{"Preforkd-Cache-Control"}},
		},
		upSeen: []string{"GET /cached/cdn HTTP/1.1", "GET /cached/own HTTP/1.1"},
	},
	{
		name:  "Vary names run together with a blank are each varied on: one cookie's page is never another's",
		rules: "[[cache]]\npath = \"/cached/*\"\nmax_body = \"8KiB\"\n",
		steps: []coreStep{
			{send: "GET /cached/vblank HTTP/1.1\nHost: h\nCookie: session=alice\n\n", status: 200, body: "call 0001", has: []string{"X-Cache: MISS", "X-Cookie: session=alice"}},
			{send: "GET /cached/vblank HTTP/1.1\nHost: h\n\n", status: 200, body: "call 0002", has: []string{"X-Cache: MISS"}, hasNot: []string{"X-Cookie"}},
			{send: "GET /cached/vblank HTTP/1.1\nHost: h\nCookie: session=alice\n\n", status: 200, body: "call 0001", has: []string{"X-Cache: HIT", "X-Cookie: session=alice"}},
		},
		upSeen: []string{"GET /cached/vblank HTTP/1.1", "GET /cached/vblank HTTP/1.1"},
	},
	{
		name:  "private run into max-age with a blank is private: one client's page is never another's",
		rules: "[[cache]]\npath = \"/cached/*\"\nmax_body = \"8KiB\"\n",
		steps: []coreStep{
			{send: "GET /cached/blank HTTP/1.1\nHost: h\nCookie: session=alice\n\n", status: 200, body: "page for [session=alice] call 0001", has: []string{"X-Cache: MISS"}},
			{send: "GET /cached/blank HTTP/1.1\nHost: h\n\n", status: 200, body: "page for [] call 0002", has: []string{"X-Cache: MISS"}},
		},
		upSeen: []string{"GET /cached/blank HTTP/1.1", "GET /cached/blank HTTP/1.1"},
	},
}

// answer is what a client got, for comparing engines.
type answer struct {
	status int
	header string // the fields the core owns, in a fixed order
	body   string
}

func TestCoreConformance(t *testing.T) {
	for _, cc := range slices.Concat(coreCases, cacheCases, oneViewCases) {
		t.Run(cc.name, func(t *testing.T) {
			t.Parallel()
			got := map[string][]answer{}
			for _, e := range coreEngines {
				got[e.name] = runCoreCase(t, e, cc)
			}
			first := coreEngines[0].name
			for _, e := range coreEngines[1:] {
				for i := range cc.steps {
					if a, b := got[first][i], got[e.name][i]; a != b {
						t.Errorf("step %d: %s and %s differ:\n%s: %+v\n%s: %+v", i, first, e.name, first, a, e.name, b)
					}
				}
			}
		})
	}
}

func runCoreCase(t *testing.T, e coreEngine, cc coreCase) []answer {
	t.Helper()
	var n atomic.Int32
	up := startUpstream(t, func(req *seenRequest, w *bufio.Writer, c net.Conn) {
		const evil = "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nCache-Control: max-age=60\r\nContent-Length: 4\r\n\r\nEVIL"
		const ok = "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nCache-Control: max-age=60\r\nContent-Length: "
		values := func(name string) string { return strings.Join(req.Field(name), ",") }
		late := func(head, stray string) {
			w.WriteString(head)
			w.Flush()
			time.Sleep(20 * time.Millisecond)
			w.WriteString(stray)
		}
		switch p := req.Req.URL.Path; p {
		case "/signin":
			reset, seen := "", values("Preforkd-Reset")
			if req.Req.URL.Query().Get("ok") != "" {
				reset = "Preforkd-Reset: login\r\n"
			}
			if seen == "" {
				seen = "none"
			}
			fmt.Fprintf(w, "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n%sX-Seen-Reset: %s\r\nContent-Length: 2\r\n\r\nok", reset, seen)
			return
		case "/orders/coded":
			// A body coded twice, the codings in two lines (RFC 9110 §8.4).
			w.WriteString("HTTP/1.1 201 Created\r\nContent-Type: application/json\r\nContent-Encoding: br\r\nContent-Encoding: zstd\r\nContent-Length: 5\r\n\r\ncoded")
			return
		case "/cached/reset":
			fmt.Fprintf(w, ok+"2\r\nPreforkd-Reset: login\r\n\r\nok")
			return
		case "/stray/head":
			late("HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 4\r\n\r\n", "BODY"+evil)
			return
		case "/stray/204":
			late("HTTP/1.1 204 No Content\r\n\r\n", evil)
			return
		case "/stray/long":
			w.WriteString(ok + "2\r\n\r\nok" + evil)
			return
		case "/stray/late":
			late(ok+"2\r\n\r\nok", evil)
			return
		case "/cached/slow":
			body := fmt.Sprintf("foo=[%s] call %04d", values("X-Foo"), n.Add(1))
			late(fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nCache-Control: max-age=60\r\nVary: %s\r\nContent-Length: %d\r\n\r\n", req.Req.URL.Query().Get("vary"), len(body)), body)
			return
		case "/cached/lang":
			body := fmt.Sprintf("lang=[%s] origin=[%s] call %04d", values("Accept-Language"), values("Origin"), n.Add(1))
			fmt.Fprintf(w, ok+"%d\r\nVary: Accept-Language, Origin\r\n\r\n%s", len(body), body)
			return
		case "/cached/host":
			body := fmt.Sprintf("host=%s call %04d", req.Req.Host, n.Add(1))
			fmt.Fprintf(w, ok+"%d\r\n\r\n%s", len(body), body)
			return
		}
		switch p := req.Req.URL.Path; p {
		case "/cached/reval":
			// max-age=1 with a validator; a 304 to it says more fields.
			// Its Dates are ones no server would make now.
			if values("If-None-Match") == `"r1"` {
				w.WriteString("HTTP/1.1 304 Not Modified\r\nCache-Control: max-age=60\r\nEtag: \"r1\"\r\nX-A: 2\r\nDate: Sat, 02 Jan 2100 00:00:00 GMT\r\n\r\n")
				return
			}
			body := fmt.Sprintf("reval call %04d", n.Add(1))
			fmt.Fprintf(w, "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nCache-Control: max-age=1\r\nEtag: \"r1\"\r\nX-A: 1\r\nDate: Fri, 01 Jan 2100 00:00:00 GMT\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
			return
		case "/cached/reval-other":
			// As /cached/reval, but its 304 names another ETag than the
			// one it validated.
			if values("If-None-Match") == `"r1"` {
				w.WriteString("HTTP/1.1 304 Not Modified\r\nCache-Control: max-age=60\r\nEtag: \"r2\"\r\nX-A: 2\r\n\r\n")
				return
			}
			body := fmt.Sprintf("reval call %04d", n.Add(1))
			fmt.Fprintf(w, "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nCache-Control: max-age=1\r\nEtag: \"r1\"\r\nX-A: 1\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
			return
		case "/cached/blank":
			// private run into max-age with a blank, and an Expires that
			// would make the response fresh for everyone.
			body := fmt.Sprintf("page for [%s] call %04d", values("Cookie"), n.Add(1))
			fmt.Fprintf(w, "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nCache-Control: private max-age=600\r\nExpires: Fri, 01 Jan 2100 00:00:00 GMT\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
			return
		case "/cached/cdn", "/cached/own":
			// Cache-Control says no-store to every other cache; the
			// targeted field says max-age to this one.
			field := "CDN-Cache-Control"
			if p == "/cached/own" {
				field = "Preforkd-Cache-Control"
			}
			body := fmt.Sprintf("targeted call %04d", n.Add(1))
			fmt.Fprintf(w, "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nCache-Control: no-store\r\n%s: max-age=60\r\nContent-Length: %d\r\n\r\n%s", field, len(body), body)
			return
		}
		if p := req.Req.URL.Path; strings.HasPrefix(p, "/cached/") && req.Req.Method == "GET" {
			if len(req.Field("If-None-Match")) > 0 {
				w.WriteString("HTTP/1.1 500 Internal Server Error\r\nContent-Length: 36\r\n\r\na fill forwarded a conditional field")
				return
			}
			extra := ""
			switch p {
			case "/cached/v":
				extra = "Vary: Accept-Encoding\r\n"
			case "/cached/star":
				extra = "Vary: *\r\n"
			case "/cached/vblank":
				// Accept-Encoding and Cookie, the comma left out.
				extra = "Vary: Accept-Encoding Cookie\r\n"
				if c := values("Cookie"); c != "" {
					extra += "X-Cookie: " + c + "\r\n"
				}
			case "/cached/cookie":
				extra = "Set-Cookie: s=1\r\n"
			}
			body := fmt.Sprintf("call %04d", n.Add(1))
			fmt.Fprintf(w, "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nCache-Control: max-age=60\r\nEtag: \"e1\"\r\nConnection: keep-alive\r\n%sContent-Length: %d\r\n\r\n%s", extra, len(body), body)
			return
		}
		if req.Req.Method == "POST" {
			id := n.Add(1)
			fmt.Fprintf(w, "HTTP/1.1 201 Created\r\nContent-Type: application/json\r\nLocation: /orders/%d\r\nContent-Length: 9\r\n\r\n{\"id\":%d}\n", id, id)
			return
		}
		w.WriteString("HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nok")
	})
	c := configCore(t, "[table]\ncounters = 1024\nresponses = 16\nresponse_bytes = \"64KiB\"\n"+cc.rules, nil)
	ln := listen(t)
	e.start(t, ln, up.URL(), c)

	conn, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(conn)
	var out []answer
	for i, st := range cc.steps {
		time.Sleep(st.pause) // let an upstream's stray bytes arrive
		// The same request id for every engine: one made at random would
		// differ in the header and in a problem's body.
		line, rest, _ := strings.Cut(st.send, "\n")
		send := fmt.Sprintf("%s\nX-Request-Id: step-%d\n%s", line, i, rest)
		if _, err := io.WriteString(conn, crlf(send)); err != nil {
			t.Fatalf("%s step %d: %v", e.name, i, err)
		}
		method, _, _ := strings.Cut(st.send, " ")
		resp, err := http.ReadResponse(br, &http.Request{Method: method})
		if err != nil {
			t.Fatalf("%s step %d: %v", e.name, i, err)
		}
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != st.status {
			t.Errorf("%s step %d: status %d, want %d: %s", e.name, i, resp.StatusCode, st.status, body)
		}
		checkHeader(t, fmt.Sprintf("%s step %d", e.name, i), resp.Header, st.has, st.hasNot)
		if got := strings.Join(resp.Header.Values("Content-Encoding"), ", "); st.hasCodings != "" && got != st.hasCodings {
			t.Errorf("%s step %d: Content-Encoding %q, want %q", e.name, i, got, st.hasCodings)
		}
		if !strings.Contains(string(body), st.body) {
			t.Errorf("%s step %d: body %q, want it to have %q", e.name, i, body, st.body)
		}
		var h strings.Builder
		for _, k := range []string{"Content-Type", "Cache-Control", "Location", "Retry-After", "Idempotent-Replayed",
			"Ratelimit-Policy", "X-Ratelimit-Limit", "X-Ratelimit-Remaining", "X-Content-Type-Options", "Content-Length",
			"X-Cache", "Age", "Etag", "Vary", "Set-Cookie", "Preforkd-Reset", "X-Seen-Reset", "X-A", "Cdn-Cache-Control", "Preforkd-Cache-Control", "Content-Range", "X-Request-Id", "Content-Encoding"} {
			v := resp.Header.Values(k)
			if k == "Content-Encoding" && len(v) > 1 {
				v = []string{strings.Join(v, ", ")} // one list, in one line or several
			}
			fmt.Fprintf(&h, "%s=%q ", k, v)
		}
		out = append(out, answer{resp.StatusCode, h.String(), string(body)})
	}
	seen := up.WaitRequests(len(cc.upSeen), 2*time.Second)
	var lines []string
	for _, s := range seen {
		lines = append(lines, s.Line)
	}
	if fmt.Sprint(lines) != fmt.Sprint(cc.upSeen) {
		t.Errorf("%s: the upstream saw %q, want %q", e.name, lines, cc.upSeen)
	}
	return out
}

// TestRefusedUnreadBodyCloses: a request the core refuses before its body
// is read (429 here) is answered at once and its connection closed,
// though the client never sends the body: with Expect: 100-continue (in
// any case) on every engine, without it on net/http (README "TLS and HTTP/2": the fast
// engines read and drop a short body and keep the connection). Nothing
// waits for the body: net/http's drain of an unread one has no deadline
// of its own.
func TestRefusedUnreadBodyCloses(t *testing.T) {
	t.Parallel()
	for _, expect := range []string{"", "Expect: 100-continue\r\n", "expect: 100-continue\r\n"} {
		for _, e := range coreEngines {
			if expect == "" && !strings.HasPrefix(e.name, "nethttp") {
				continue
			}
			t.Run(fmt.Sprintf("%s/expect=%q", e.name, strings.TrimSpace(expect)), func(t *testing.T) {
				t.Parallel()
				up := startUpstream(t, nil)
				c := configCore(t, "[table]\ncounters = 1024\n[[ratelimit]]\nname = \"one\"\npath = \"/u\"\nlimit = 1\nwindow = \"1h\"\n", nil)
				ln := listen(t)
				e.start(t, ln, up.URL(), c)
				for i, want := range []int{200, 429} {
					conn, err := net.Dial("tcp", ln.Addr().String())
					if err != nil {
						t.Fatal(err)
					}
					defer conn.Close()
					conn.SetDeadline(time.Now().Add(10 * time.Second))
					head := "POST /u HTTP/1.1\r\nHost: h\r\n" + expect + "Content-Length: 3\r\n\r\n"
					if i == 0 {
						head += "abc" // the first is served: its body comes
					}
					io.WriteString(conn, head)
					br := bufio.NewReader(conn)
					interim, resp, err := readFinal(br, "POST")
					if err != nil {
						t.Fatalf("request %d: %v", i, err)
					}
					io.Copy(io.Discard, resp.Body)
					if resp.StatusCode != want || i == 1 && len(interim) > 0 {
						t.Fatalf("request %d: %d after %q, want %d (and no 100 before a refusal)", i, resp.StatusCode, interim, want)
					}
					if i == 1 {
						// Closed at once: well before the 10 s deadline.
						conn.SetReadDeadline(time.Now().Add(5 * time.Second))
						if b, err := br.ReadByte(); err != io.EOF {
							t.Errorf("after the refusal: %q, %v; want the connection closed", b, err)
						}
					}
				}
			})
		}
	}
}

// TestRefusedUnreadBodyLingers: a request the core refuses while its long
// body is still coming is answered, and its connection closed with the
// body unread; the close lingers (a half-close, then what the client
// still sends is read for a moment), as after the engines' own error
// answers: a socket closed with unread bytes is reset, and a reset can
// destroy the answer before the client read it. The client reads the
// end of the connection after the answer, not a reset.
func TestRefusedUnreadBodyLingers(t *testing.T) {
	t.Parallel()
	for _, e := range coreEngines {
		t.Run(e.name, func(t *testing.T) {
			t.Parallel()
			up := startUpstream(t, nil)
			c := configCore(t, "[table]\ncounters = 1024\n[[ratelimit]]\nname = \"one\"\npath = \"/u\"\nlimit = 1\nwindow = \"1h\"\n", nil)
			ln := listen(t)
			e.start(t, ln, up.URL(), c)
			c0, br0 := dial(t, ln.Addr().String())
			roundTrip(t, c0, br0, "GET /u HTTP/1.1\r\nHost: h\r\n\r\n") // the limit's one
			conn, br := dial(t, ln.Addr().String())
			io.WriteString(conn, "POST /u HTTP/1.1\r\nHost: h\r\nContent-Length: 1048576\r\n\r\n")
			conn.Write(make([]byte, 100<<10)) // then the client pauses
			resp, _ := readResponse(t, br, "POST")
			if resp.StatusCode != 429 {
				t.Fatalf("status %d, want 429", resp.StatusCode)
			}
			time.Sleep(100 * time.Millisecond) // the close has happened
			if b, err := br.ReadByte(); err != io.EOF {
				t.Errorf("after the answer: %q, %v; want the end of the connection", b, err)
			}
		})
	}
}

// TestPipelinedSectionSplitAtCRLF: a pipelined request whose header line
// ends in two reads, its CR in the one that carried the request before it
// and its LF in the next, is served: the engines read ahead, and the
// fast one checks for bare LFs in what it reads.
func TestPipelinedSectionSplitAtCRLF(t *testing.T) {
	t.Parallel()
	eachEngine(t, readers, func(t *testing.T, e storyEngine) {
		up := startUpstream(t, nil)
		r := e.serve(t, storyOptions{Upstream: up.URL()})
		c, br := dial(t, r.Addr)
		io.WriteString(c, "GET /a HTTP/1.1\r\nHost: a\r\n\r\nGET /b HTTP/1.1\r")
		for i, more := range []string{"\nHost: a\r\n\r\n", ""} {
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatalf("response %d: %v", i+1, err)
			}
			body, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != 200 {
				t.Fatalf("response %d: %d %s", i+1, resp.StatusCode, body)
			}
			time.Sleep(100 * time.Millisecond) // the LF comes in a read of its own
			io.WriteString(c, more)
		}
	})
}

// TestKeptConnectionBareLFRefused: a request on a kept connection, sent
// after the response to the one before it, whose header section has a
// line ended by a bare LF gets 400 like a first request does, never a
// silent close (fasthttp took a read that returned nothing for the
// client leaving).
func TestKeptConnectionBareLFRefused(t *testing.T) {
	t.Parallel()
	eachEngine(t, withNetHTTP(), func(t *testing.T, e storyEngine) {
		up := startUpstream(t, nil)
		r := e.serve(t, storyOptions{Upstream: up.URL()})
		c, br := dial(t, r.Addr)
		c.SetDeadline(time.Now().Add(10 * time.Second))
		for i, tc := range []struct {
			send string
			want int
		}{{"GET /a HTTP/1.1\r\nHost: a\r\n\r\n", 200}, {"GET /b HTTP/1.1\nHost: a\n\n", 400}} {
			io.WriteString(c, tc.send)
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatalf("response %d: %v", i+1, err)
			}
			io.Copy(io.Discard, resp.Body)
			if resp.StatusCode != tc.want {
				t.Fatalf("response %d: %d, want %d", i+1, resp.StatusCode, tc.want)
			}
		}
		if n := len(up.Requests()); n != 1 {
			t.Errorf("the upstream saw %d requests, want 1", n)
		}
	})
}

// TestPipelinedBareLFRefusedAtOnce: a pipelined request whose header
// section has a line ended by a bare LF, sent whole with the request
// before it, is refused 400 at once, never left to read_header_timeout:
// fasthttp, which has it in its buffer already, waits for a CRLF CRLF
// that never comes.
func TestPipelinedBareLFRefusedAtOnce(t *testing.T) {
	t.Parallel()
	const ok = "GET /a HTTP/1.1\r\nHost: a\r\n\r\n"
	for _, tc := range []struct {
		send  string
		wants []int
	}{
		{ok + "GET /b HTTP/1.1\r\nHost: a\n\n", []int{200, 400}},
		{ok + "GET /b HTTP/1.1\r\nHost: a\nX: y\r\n\r\n", []int{200, 400}},
		{ok + ok + "GET /b HTTP/1.1\r\nHost: a\nX: y\r\n\r\n", []int{200, 200, 400}}, // the third section read ahead
	} {
		second := tc.send
		eachEngine(t, withNetHTTP(), func(t *testing.T, e storyEngine) {
			up := startUpstream(t, nil)
			r := e.serve(t, storyOptions{Upstream: up.URL(), Limits: engine.Limits{ReadHeaderTimeout: 20 * time.Second}})
			c, br := dial(t, r.Addr)
			c.SetDeadline(time.Now().Add(15 * time.Second))
			io.WriteString(c, second)
			for i, want := range tc.wants {
				resp, err := http.ReadResponse(br, nil)
				if err != nil {
					t.Fatalf("%q: response %d: %v", second, i+1, err)
				}
				body, _ := io.ReadAll(resp.Body)
				if resp.StatusCode != want {
					t.Fatalf("%q: response %d: %d %s, want %d", second, i+1, resp.StatusCode, body, want)
				}
			}
			if n := len(up.Requests()); n != len(tc.wants)-1 {
				t.Errorf("%q: the upstream saw %d requests, want %d", second, n, len(tc.wants)-1)
			}
		})
	}
}
