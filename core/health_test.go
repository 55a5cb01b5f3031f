package core_test

import (
	"testing"
	"time"

	"github.com/preforkd/preforkd/bucket"
	"github.com/preforkd/preforkd/core"
	"github.com/preforkd/preforkd/shm"
)

// The health path is answered before any rule, never forwarded and never
// counted, by a rule or in the statistics (the canary's, recycling's);
// 503 once the core was told the worker drains; other methods and paths
// go on as usual.
func TestHealthPath(t *testing.T) {
	responded := 0
	c, err := core.New(joinedRegion(t, shm.Options{Counters: 64}), core.Options{
		OnResponse: func(int) { responded++ },
		HealthPath: "/healthz",
		RequestID:  "X-Request-Id",
		RateLimits: []core.RateLimit{{Rule: bucket.Rule{Name: "all", Limit: 1, Window: time.Hour}, Route: mustRoute(t, "/*")}},
	})
	if err != nil {
		t.Fatal(err)
	}
	forwarded := 0
	app := func(core.Forward) fakeResp { forwarded++; return fakeResp{status: 200} }
	for range 3 {
		a := serve(c, newReq("GET", "/healthz", "192.0.2.1"), app)
		if a.status != 200 || string(a.body) != "ok\n" || a.get("Cache-Control") != "no-store" || a.get("X-Request-Id") == "" ||
			a.get("X-Ratelimit-Limit") != "" {
			t.Fatalf("GET /healthz: %+v", a)
		}
	}
	if a := serve(c, newReq("HEAD", "/healthz?probe=1", "192.0.2.1"), app); a.status != 200 || len(a.body) != 0 || a.get("Content-Length") != "3" {
		t.Errorf("HEAD /healthz: %+v", a)
	}
	if forwarded != 0 || responded != 0 {
		t.Fatalf("the health check was forwarded %d times, and counted in the statistics %d times", forwarded, responded)
	}
	// The rule counted none of them: the client's one request is left.
	if a := serve(c, newReq("GET", "/other", "192.0.2.1"), app); a.status != 200 || responded != 1 {
		t.Errorf("after the health checks: %d, counted %d times; want the rule's one allowed request, counted", a.status, responded)
	}
	if st := decide(c, newReq("POST", "/healthz", "192.0.2.2")); st != 200 {
		t.Errorf("POST /healthz: %d", st)
	}
	if st := decide(c, newReq("GET", "/healthz/x", "192.0.2.3")); st != 200 {
		t.Errorf("GET /healthz/x: %d", st)
	}
	c.Drain()
	if a := serve(c, newReq("GET", "/healthz", "192.0.2.1"), app); a.status != 503 || string(a.body) != "draining\n" {
		t.Errorf("after Drain: %+v", a)
	}
	if st := decide(c, newReq("GET", "/other", "192.0.2.9")); st != 200 {
		t.Errorf("after Drain, a request: %d, want it served", st)
	}
	for _, p := range []string{"healthz", "/h?x", "/a b"} {
		if _, err := core.New(joinedRegion(t, shm.Options{Counters: 64}), core.Options{HealthPath: p}); err == nil {
			t.Errorf("HealthPath %q accepted", p)
		}
	}
}
