package main

// End-to-end tests of the rate-limit features against the built
// daemon with 4 workers: exempt clients, cookie, query and path keys,
// overrides, cost, refusal status and the global dry run.

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"
)

const featuresConfig = `[server]
workers = 4
trusted_proxies = ["127.0.0.1"]
exempt = ["127.200.9.0/24"]
shutdown_timeout = "5s"

[table]
counters = 4096

[reload]
canary_window = "300ms"

[[ratelimit]]
name = "exempt-rule"
path = "/exempt"
limit = 5
window = "1h"
exempt = ["127.200.8.0/24"]

[[ratelimit]]
name = "session"
path = "/session"
limit = 3
window = "1h"
by = "cookie:session|ip"

[[ratelimit]]
name = "apikey"
path = "/query"
limit = 3
window = "1h"
by = "query:key|ip"

[[ratelimit]]
name = "per-url"
path = "/pages/*"
limit = 2
window = "1h"
by = "path"

[[ratelimit]]
name = "tiers"
path = "/tiers"
limit = 5
window = "1h"
by = "header:X-Api-Key|ip"
[[ratelimit.override]]
key = "gold"
limit = OVERRIDE_LIMIT

[[ratelimit]]
name = "expensive"
path = "/report"
limit = 10
window = "1h"
cost = 3

[[ratelimit]]
name = "busy"
path = "/busy"
limit = 1
window = "1h"
status = 503
`

func featuresDaemon(t *testing.T, overrideLimit int, env []string) *daemon {
	cfg := strings.Replace(featuresConfig, "OVERRIDE_LIMIT", fmt.Sprint(overrideLimit), 1)
	return startDaemon(t, daemonOptions{config: cfg, env: env})
}

// statusesOf sends n GETs to url from c (each on its own connection, so
// they spread over the workers) and counts them by status.
func statusesOf(c *http.Client, url string, n int, header http.Header) map[int]int {
	var mu sync.Mutex
	got := map[int]int{}
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	for range n {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			r := do(c, http.MethodGet, url, header)
			mu.Lock()
			defer mu.Unlock()
			if r.err != nil {
				got[0]++
			} else {
				got[r.status]++
			}
		})
	}
	wg.Wait()
	return got
}

func TestFeaturesE2E(t *testing.T) {
	t.Parallel()
	d := featuresDaemon(t, 50, nil)

	t.Run("Exempt", func(t *testing.T) {
		t.Parallel()
		// Globally exempt (127.200.9.0/24) and exempt by the rule
		// (127.200.8.0/24): 1,000 requests, all served, no headers.
		for _, ip := range []string{"127.200.9.5", "127.200.8.5"} {
			c := newClient(t, net.ParseIP(ip), false)
			for i := range 500 {
				r := get(c, d.url("/exempt"))
				if r.status != http.StatusOK || r.header.Get("RateLimit") != "" || r.header.Get("X-RateLimit-Limit") != "" {
					t.Fatalf("exempt %s request %d: %d %v", ip, i, r.status, r.header)
				}
			}
		}
		// A non-exempt client in the same run: exactly 5.
		if got := statusesOf(newClient(t, freshClientIP(), false), d.url("/exempt"), 12, nil); got[200] != 5 || got[429] != 7 {
			t.Fatalf("non-exempt client: %v, want exactly 5 allowed", got)
		}
		// Behind the trusted proxy (127.0.0.1) the forwarded client is
		// judged: exempt; a direct client cannot claim it.
		proxy := newClient(t, nil, false)
		if got := statusesOf(proxy, d.url("/exempt"), 20, http.Header{"X-Forwarded-For": {"127.200.9.77"}}); got[200] != 20 {
			t.Fatalf("exempt client behind the proxy: %v", got)
		}
		direct := newClient(t, freshClientIP(), false)
		if got := statusesOf(direct, d.url("/exempt"), 8, http.Header{"X-Forwarded-For": {"127.200.9.77"}}); got[200] != 5 {
			t.Fatalf("direct client claiming an exempt address: %v, want 5 allowed", got)
		}
	})

	t.Run("CookieKeys", func(t *testing.T) {
		t.Parallel()
		c := newClient(t, freshClientIP(), false) // one address for all three
		for _, h := range []http.Header{{"Cookie": {"session=A"}}, {"Cookie": {"theme=x; session=B"}}, nil} {
			if got := statusesOf(c, d.url("/session"), 5, h); got[200] != 3 || got[429] != 2 {
				t.Fatalf("cookie %v: %v, want 3 allowed", h, got)
			}
		}
	})

	t.Run("QueryKeys", func(t *testing.T) {
		t.Parallel()
		c := newClient(t, freshClientIP(), false)
		for _, q := range []string{"?key=A", "?x=1&key=B", ""} {
			if got := statusesOf(c, d.url("/query"+q), 5, nil); got[200] != 3 || got[429] != 2 {
				t.Fatalf("query %q: %v, want 3 allowed", q, got)
			}
		}
	})

	t.Run("PathKeys", func(t *testing.T) {
		t.Parallel()
		c := newClient(t, freshClientIP(), false)
		if got := statusesOf(c, d.url("/pages/a"), 3, nil); got[200] != 2 {
			t.Fatalf("/pages/a: %v", got)
		}
		if got := statusesOf(c, d.url("/pages/b"), 3, nil); got[200] != 2 {
			t.Fatalf("/pages/b: %v", got)
		}
		if r := get(newClient(t, freshClientIP(), false), d.url("/pages/a?x=1")); r.status != http.StatusTooManyRequests {
			t.Fatalf("/pages/a?x=1 is /pages/a: %d", r.status)
		}
	})

	t.Run("CostAndStatus", func(t *testing.T) {
		t.Parallel()
		c := newClient(t, freshClientIP(), false)
		for i := 1; i <= 4; i++ {
			want := map[bool]int{true: 200, false: 429}[i <= 3]
			if r := get(c, d.url("/report")); r.status != want {
				t.Fatalf("cost 3, request %d: %d, want %d", i, r.status, want)
			}
		}
		get(c, d.url("/busy"))
		r := get(c, d.url("/busy"))
		if r.status != http.StatusServiceUnavailable || r.header.Get("Retry-After") == "" ||
			r.header.Get("Content-Type") != "application/problem+json" || !strings.Contains(string(r.body), `"violated-policies":["busy"]`) {
			t.Fatalf("status = 503: %d %v %s", r.status, r.header, r.body)
		}
	})
}

// An override key = "gold" with limit 50 beside the rule's 5: exactly 50
// and 5 in one run. A HUP that changes the override's limit keeps the
// counts of the rule's other keys.
func TestOverridesE2E(t *testing.T) {
	t.Parallel()
	d := featuresDaemon(t, 50, nil)
	c := newClient(t, freshClientIP(), false)
	if got := statusesOf(c, d.url("/tiers"), 60, http.Header{"X-Api-Key": {"gold"}}); got[200] != 50 || got[429] != 10 {
		t.Fatalf("gold: %v, want exactly 50 allowed", got)
	}
	if got := statusesOf(c, d.url("/tiers"), 4, http.Header{"X-Api-Key": {"silver"}}); got[200] != 4 {
		t.Fatalf("silver before the reload: %v", got)
	}
	// The override's limit changes at HUP: silver's 4 stay counted.
	from := reloadTo(d, strings.Replace(featuresConfig, "OVERRIDE_LIMIT", "80", 1))
	waitReloaded(t, d, from, 20*time.Second)
	// A retiring worker still answers on the keep-alive connection it holds:
	// the new limit is certain once every old worker is gone.
	waitRetired(t, d, from)
	if got := statusesOf(c, d.url("/tiers"), 3, http.Header{"X-Api-Key": {"silver"}}); got[200] != 1 || got[429] != 2 {
		t.Fatalf("silver after the reload: %v, want 1 left of 5", got)
	}
	if r := do(c, http.MethodGet, d.url("/tiers"), http.Header{"X-Api-Key": {"gold"}}); r.header.Get("RateLimit-Policy") != `"tiers";q=80;w=3600` {
		t.Fatalf("gold after the reload: %d %q", r.status, r.header.Get("RateLimit-Policy"))
	}
}

// -shadow: nothing is refused, would-be refusals are logged, headers are
// sent; check says so.
func TestShadowFlagE2E(t *testing.T) {
	t.Parallel()
	cfg := strings.Replace(featuresConfig, "OVERRIDE_LIMIT", "50", 1)
	d := startDaemon(t, daemonOptions{config: cfg, args: []string{"-shadow"}})
	c := newClient(t, freshClientIP(), false)
	if got := statusesOf(c, d.url("/busy"), 20, nil); got[200] != 20 {
		t.Fatalf("a dry run refused: %v", got)
	}
	if r := get(c, d.url("/busy")); r.header.Get("RateLimit") != `"busy";r=0;t=3600` {
		t.Fatalf("headers in a dry run: %v", r.header)
	}
	if _, _, ok := d.logs.waitFor(0, 5*time.Second, msgIs("shadow rule would refuse")); !ok {
		t.Fatalf("no shadow log line:\n%s", d.logs.text())
	}
	path := t.TempDir() + "/shadow.toml"
	os.WriteFile(path, []byte("[server]\nshadow = true\n"), 0o600)
	if code, out, _ := runBinary(t, "check", "-config", path); code != 0 || !strings.Contains(out, "shadow: every rule is in shadow mode") {
		t.Fatalf("check: %d %q", code, out)
	}
}
