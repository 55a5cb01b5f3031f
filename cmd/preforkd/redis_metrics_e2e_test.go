package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/preforkd/preforkd/internal/redistest"
)

// Redis's calls on /metrics, summed over two workers: each request decided
// in Redis is one call (ok), timed in the histogram; a refusal that still
// stands is a deny-cache hit, with no call; SCRIPT FLUSH costs one
// NOSCRIPT; sync-mode flushes are counted apart. Redis killed: every
// request is a failed call or a short circuit of the open breaker.
// promtool accepts the page.
func TestRedisMetrics(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	d := startDaemon(t, daemonOptions{admin: true, config: redisConfig(srv, "timeout = \"1s\"\nbreaker_failures = 3\nbreaker_backoff = \"1h\"", `
[[ratelimit]]
name = "api"
path = "/api"
limit = 100000
window = "1h"
store = "redis"
on_unavailable = "open"
[[ratelimit]]
name = "tight"
path = "/tight"
limit = 2
window = "1h"
store = "redis"
[[ratelimit]]
name = "synced"
path = "/synced"
limit = 1000
window = "1h"
algorithm = "fixed-window"
store = "redis"
sync = "50ms"
`)})
	admin := newClient(t, nil, false)
	scrape := func() page { return scrapeMetrics(t, admin, d.admin) }
	calls := func(p page, result string) float64 {
		return p.samples[fmt.Sprintf(`preforkd_redis_calls_total{result=%q}`, result)]
	}

	// Requests on /api, a new connection each, until both workers have
	// served some: n of them, each one call.
	n := 0
	for round := 0; ; round++ {
		var wg sync.WaitGroup
		for range 20 {
			wg.Go(func() {
				if r := get(newClient(t, freshClientIP(), false), d.url("/api")); r.status != 200 {
					t.Errorf("/api: %d %v", r.status, r.err)
				}
			})
		}
		wg.Wait()
		n += 20
		var st struct {
			Workers []struct {
				Requests uint64 `json:"requests"`
			} `json:"workers"`
		}
		if r := get(admin, "http://"+d.admin+"/status"); json.Unmarshal(r.body, &st) != nil {
			t.Fatalf("/status: %s", r.body)
		}
		if len(st.Workers) == 2 && st.Workers[0].Requests > 0 && st.Workers[1].Requests > 0 {
			break
		}
		if round == 20 {
			t.Fatalf("one worker served every request: %+v", st.Workers)
		}
	}
	// "tight": 2 served and a refusal decided in Redis (3 calls), then 5
	// refused from the host's deny cache, whichever worker they reach.
	c := newClient(t, freshClientIP(), false)
	for i := range 8 {
		if r := get(c, d.url("/tight")); r.status != map[bool]int{true: 200, false: 429}[i < 2] {
			t.Fatalf("/tight %d: %d %v", i+1, r.status, r.err)
		}
	}
	// A worker's first call can meet NOSCRIPT too, when it reaches Redis
	// before any worker's warm-up loaded the scripts (a loaded machine
	// once made it so): the flush's is counted from here.
	noscript := scrape().samples["preforkd_redis_noscript_total"]
	if err := srv.Client().ScriptFlush(t.Context()).Err(); err != nil {
		t.Fatal(err)
	}
	if r := get(newClient(t, freshClientIP(), false), d.url("/api")); r.status != 200 {
		t.Fatalf("/api after SCRIPT FLUSH: %d %v", r.status, r.err)
	}
	n++
	p := scrape()
	want := map[string]float64{
		`preforkd_redis_calls_total{result="ok"}`:      float64(n + 3),
		`preforkd_redis_calls_total{result="error"}`:   0,
		`preforkd_redis_calls_total{result="timeout"}`: 0,
		"preforkd_redis_call_duration_seconds_count":   float64(n + 3),
		"preforkd_redis_deny_cache_hits_total":         5,
		"preforkd_redis_noscript_total":                noscript + 1,
		"preforkd_redis_short_circuits_total":          0,
		`preforkd_redis_flushes_total{result="ok"}`:    0,
	}
	for s, v := range want {
		if got, ok := p.samples[s]; !ok || got != v {
			t.Errorf("%s = %v (present %v), want %v", s, got, ok, v)
		}
	}
	if p.types["preforkd_redis_call_duration_seconds"] != "histogram" || p.samples["preforkd_redis_call_duration_seconds_sum"] <= 0 {
		t.Errorf("the call durations: %s", p.raw)
	}
	promtoolCheck(t, p.raw)

	// A sync-mode rule's requests make no call; its flushes are counted.
	for range 3 {
		get(c, d.url("/synced"))
	}
	deadline := time.Now().Add(10 * time.Second)
	for scrape().samples[`preforkd_redis_flushes_total{result="ok"}`] == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no flush counted")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if got := calls(scrape(), "ok"); got != float64(n+3) {
		t.Errorf("after sync-mode requests and flushes: %v calls, want %d", got, n+3)
	}

	// Redis killed: each request on /api is a failed call or one the
	// open breaker kept from Redis. The failures that open it (3, the
	// sync-mode flushes' among them) are counted.
	srv.Kill()
	for i := range 10 {
		if r := get(newClient(t, freshClientIP(), false), d.url("/api")); r.status != 200 {
			t.Fatalf("/api %d with Redis dead: %d %v", i+1, r.status, r.err)
		}
	}
	p = scrape()
	failed := calls(p, "error") + calls(p, "timeout")
	flushFailed := p.samples[`preforkd_redis_flushes_total{result="error"}`] + p.samples[`preforkd_redis_flushes_total{result="timeout"}`]
	short := p.samples["preforkd_redis_short_circuits_total"]
	if failed+short != 10 || failed > 3 || failed+flushFailed < 3 || calls(p, "ok") != float64(n+3) {
		t.Errorf("10 requests with Redis dead: ok %v, failed %v, short circuits %v, failed flushes %v; want %d ok, failed + short circuits = 10, and at least 3 failures",
			calls(p, "ok"), failed, short, flushFailed, n+3)
	}
	if got := p.samples["preforkd_redis_call_duration_seconds_count"]; got != float64(n+3)+failed {
		t.Errorf("call durations counted %v, want %v", got, float64(n+3)+failed)
	}
	if !strings.Contains(string(p.raw), "preforkd_redis_breaker_state 1\n") {
		t.Errorf("the breaker is not open on the page")
	}
	promtoolCheck(t, p.raw)
}
