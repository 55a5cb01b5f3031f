package core_test

import (
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/preforkd/preforkd/bucket"
	"github.com/preforkd/preforkd/clientip"
	"github.com/preforkd/preforkd/core"
	"github.com/preforkd/preforkd/internal/logtest"
	"github.com/preforkd/preforkd/internal/shmtest"
	"github.com/preforkd/preforkd/metrics"
	"github.com/preforkd/preforkd/shm"
)

// statRegion is a memfd region with room for the statistics, as the
// supervisor makes it.
func statRegion(t *testing.T, o shm.Options) *shm.Region {
	t.Helper()
	metrics.Geometry(&o, 4)
	return shmtest.Create(t, o)
}

// Each rule counts each request it matched once, under what it did, in the
// region's statistics; responses are counted by status with their
// durations; two workers' counts add up.
func TestRequestsCountedInTheRegion(t *testing.T) {
	region := statRegion(t, shm.Options{Counters: 8, Probe: 8})
	now := time.Hour
	ip, _ := clientip.ParseBy("ip")
	opts := core.Options{
		Now:    func() time.Duration { return now },
		Logger: slog.New(slog.DiscardHandler),
		RateLimits: []core.RateLimit{
			{Rule: bucket.Rule{Name: "enf", Limit: 2, Window: time.Hour}, Route: mustRoute(t, "/e"), By: ip},
			{Rule: bucket.Rule{Name: "shd", Limit: 1, Window: time.Hour}, Route: mustRoute(t, "/s"), By: ip, Shadow: true},
			{Rule: bucket.Rule{Name: "open", Limit: 100, Window: time.Hour, MaxKeys: 8}, Route: mustRoute(t, "/o"), By: ip}, // room for the whole table
			{Rule: bucket.Rule{Name: "closed", Limit: 100, Window: time.Hour, OnFull: bucket.Closed}, Route: mustRoute(t, "/c"), By: ip},
		},
	}
	w1, err := core.New(shmtest.Attach(t, region, 1), opts)
	if err != nil {
		t.Fatal(err)
	}
	w2, err := core.New(shmtest.Attach(t, region, 2), opts)
	if err != nil {
		t.Fatal(err)
	}
	// serve takes took from Begin to Finish, refused or not.
	serve := func(c *core.Core, path, peer string, took time.Duration) int {
		ex := c.Begin(newReq("GET", path, peer))
		status := 200
		if ex.Decide() == core.Respond {
			status = ex.Response().Status
		} else {
			ex.Head(200, nil)
		}
		now += took
		ex.Finish(nil)
		return status
	}
	got := map[int]int{}
	for i, c := range []*core.Core{w1, w2, w1, w2, w1} { // enf: 2 allowed, 3 limited
		got[serve(c, "/e", "192.0.2.1", time.Duration(i)*time.Millisecond)]++
	}
	for _, c := range []*core.Core{w1, w2, w2} { // shd: 1 allowed, 2 over the limit, served
		got[serve(c, "/s", "192.0.2.1", 0)]++
	}
	// 8 slots: enf and shd hold one key each; open's six clients fill the
	// rest, then a seventh (open) and one of closed find no slot.
	for i := 0; i < 6; i++ {
		serve(w1, "/o", "198.51.100."+string(rune('1'+i)), 0)
	}
	serve(w2, "/o", "203.0.113.1", 0)
	got[serve(w2, "/c", "203.0.113.2", 0)]++
	if got[200] != 5 || got[429] != 3 || got[503] != 1 {
		t.Fatalf("statuses %v, want 5×200, 3×429, 1×503", got)
	}

	var s metrics.Snapshot
	metrics.Read(region, &s)
	rule := func(name string) [5]uint64 {
		i := metrics.RuleIndex(region, name)
		var out [5]uint64
		for res := range out {
			out[res] = s.RuleValue(metrics.RateLimitRequests, i, res)
		}
		return out
	}
	//                                  allowed limited shadow full_open full_closed
	for name, want := range map[string][5]uint64{
		"enf":    {2, 3, 0, 0, 0},
		"shd":    {1, 0, 2, 0, 0},
		"open":   {6, 0, 0, 1, 0},
		"closed": {0, 0, 0, 0, 1},
	} {
		if got := rule(name); got != want {
			t.Errorf("rule %s counted %v, want %v", name, got, want)
		}
	}
	// near_limit, besides allowed: enf's second request left 0 of 2,
	// shd's first 0 of 1; none of open's 100 came near.
	for name, want := range map[string]uint64{"enf": 1, "shd": 1, "open": 0, "closed": 0} {
		if got := s.RuleValue(metrics.RateLimitRequests, metrics.RuleIndex(region, name), metrics.NearLimit); got != want {
			t.Errorf("rule %s: near_limit %d, want %d", name, got, want)
		}
	}
	if n := s.Value(metrics.HTTPRequests, 200-100); n != 2+3+7 {
		t.Errorf("%d responses of 200, want 12", n)
	}
	if n := s.Value(metrics.HTTPRequests, 429-100); n != 3 {
		t.Errorf("%d responses of 429, want 3", n)
	}
	if s.Requests() != 16 || s.Errors5xx() != 1 {
		t.Errorf("%d requests, %d 5xx; want 16 and 1", s.Requests(), s.Errors5xx())
	}
	// The five /e requests took 0 to 4 ms, the others nothing: 13 within
	// 1ms, one within 2.5ms, two within 5ms; 10ms in all.
	var p metrics.Text
	s.AppendFamilies(&p, []metrics.Rule{{Name: "enf", Index: metrics.RuleIndex(region, "enf")}})
	page := string(p.Bytes())
	for _, want := range []string{
		`preforkd_ratelimit_requests_total{rule="enf",result="limited"} 3`,
		`preforkd_http_request_duration_seconds_bucket{le="0.001"} 13`,
		`preforkd_http_request_duration_seconds_bucket{le="0.0025"} 14`,
		`preforkd_http_request_duration_seconds_bucket{le="0.005"} 16`,
		`preforkd_http_request_duration_seconds_bucket{le="+Inf"} 16`,
		`preforkd_http_request_duration_seconds_sum 0.01`,
		`preforkd_http_request_duration_seconds_count 16`,
		`preforkd_http_requests_total{code="503"} 1`,
	} {
		if !strings.Contains(page, want+"\n") {
			t.Errorf("the page lacks %q:\n%s", want, page)
		}
	}

	// Worker 1 goes away: its counts stay in the totals.
	before := rule("enf")
	if _, err := region.Reap(1); err != nil {
		t.Fatal(err)
	}
	metrics.Read(region, &s)
	if got := rule("enf"); got != before {
		t.Errorf("after reaping worker 1: %v, before %v", got, before)
	}
	var w metrics.Snapshot
	metrics.ReadWorker(region, 1, &w)
	if w.Requests() != 0 {
		t.Errorf("the reaped worker's row: %d requests, want 0", w.Requests())
	}
}

// A flood of refusals from two workers writes one line a second of region
// time for the rule, whichever worker refuses, and each line says how many
// it stands for: the lines and their suppressed counts add up to the
// refusals.
func TestRefusalLogOncePerSecondAcrossWorkers(t *testing.T) {
	region := statRegion(t, shm.Options{Counters: 64})
	var now time.Duration = time.Hour
	var mu sync.Mutex
	clock := func() time.Duration { mu.Lock(); defer mu.Unlock(); return now }
	logs := &logtest.Buffer{}
	ip, _ := clientip.ParseBy("ip")
	opts := core.Options{
		Now:        clock,
		Logger:     slog.New(slog.NewTextHandler(logs, nil)),
		RateLimits: []core.RateLimit{{Rule: bucket.Rule{Name: "login", Limit: 1, Window: 24 * time.Hour}, Route: mustRoute(t, "/login"), By: ip}},
	}
	var cores []*core.Core
	for w := range 2 {
		c, err := core.New(shmtest.Attach(t, region, w), opts)
		if err != nil {
			t.Fatal(err)
		}
		cores = append(cores, c)
	}
	decide(cores[0], newReq("POST", "/login", "192.0.2.1")) // the one allowed
	const flood = 10000
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range flood / 4 {
				if i%500 == 0 && g == 0 {
					mu.Lock()
					now += 100 * time.Millisecond // 2,500 refusals span 2s of region time per goroutine 0
					mu.Unlock()
				}
				if s := decide(cores[g%2], newReq("POST", "/login", "192.0.2.1")); s != 429 {
					t.Errorf("status %d, want 429", s)
					return
				}
			}
		})
	}
	wg.Wait()
	lines := logs.Lines("request refused")
	for _, l := range lines {
		if !strings.Contains(l, "rule=login") || !strings.Contains(l, "client=192.0.2.1") ||
			!strings.Contains(l, "method=POST") || !strings.Contains(l, "path=/login") {
			t.Errorf("line %q does not name the rule, client, method and path", l)
		}
	}
	// The clock moved 5 times by 100ms during the flood: one second of
	// region time was never over, one line in all.
	if len(lines) != 1 {
		t.Fatalf("%d lines for a flood spanning under 1s of region time:\n%s", len(lines), strings.Join(lines, "\n"))
	}
	// The refusals after the last line are not in any line yet.
	if total := refusalsIn(lines); total > flood {
		t.Errorf("the lines stand for %d refusals, more than the %d made", total, flood)
	}
	mu.Lock()
	now += time.Second
	mu.Unlock()
	decide(cores[1], newReq("POST", "/login", "192.0.2.1"))
	lines = logs.Lines("request refused")
	_, last, _ := strings.Cut(lines[len(lines)-1], "suppressed=")
	if total := refusalsIn(lines); total != flood+1 {
		t.Errorf("after one more refusal a second later, the lines stand for %d refusals, want %d (last: suppressed=%s)", total, flood+1, last)
	}
}

// refusalsIn is how many refusals refusal log lines stand for: each line
// its own and the ones it says were suppressed before it.
func refusalsIn(lines []string) uint64 {
	var total uint64
	for _, l := range lines {
		_, n, _ := strings.Cut(l, "suppressed=")
		var k uint64
		for _, c := range n {
			if c < '0' || c > '9' {
				break
			}
			k = k*10 + uint64(c-'0')
		}
		total += k + 1
	}
	return total
}

// The upstream's response time is counted for every forwarded request,
// access log or none: from Forward to its head, or to its failure, or to
// Finish when the client went away first; the core's own answers and
// cache hits are not forwarded and not counted.
func TestUpstreamTimeCounted(t *testing.T) {
	o := shm.Options{Counters: 64, Responses: 64, ResponseBytes: 1 << 20}
	metrics.Geometry(&o, 4)
	region := shmtest.Joined(t, o)
	var clock time.Duration = time.Hour
	c, err := core.New(region, core.Options{
		RateLimits: []core.RateLimit{{Rule: bucket.Rule{Name: "once", Limit: 1, Window: time.Hour},
			Route: mustRoute(t, "/limited")}},
		Caches: core.CacheBlocks(core.Cache{Route: mustRoute(t, "/cached/*", "GET", "HEAD"), TTL: time.Hour, MaxBody: 1 << 20}),
		Now:    func() time.Duration { return clock },
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	app := func(took time.Duration, hdr ...core.Field) func(core.Forward) fakeResp {
		return func(core.Forward) fakeResp {
			clock += took
			return fakeResp{status: 200, body: []byte("body"), header: hdr}
		}
	}
	cacheable := core.Field{Name: "Cache-Control", Value: []byte("max-age=60")}
	serve(c, newReq("GET", "/p", "192.0.2.9"), app(3*time.Millisecond))              // 3ms
	serve(c, newReq("GET", "/limited", "192.0.2.9"), app(40*time.Millisecond))       // 40ms
	serve(c, newReq("GET", "/limited", "192.0.2.9"), app(time.Hour))                 // 429: not forwarded
	serve(c, newReq("GET", "/cached/a", "192.0.2.9"), app(2*time.Second, cacheable)) // a miss: 2s
	serve(c, newReq("GET", "/cached/a", "192.0.2.9"), app(time.Hour))                // a hit
	serve(c, newReq("GET", "/down", "192.0.2.9"), func(core.Forward) fakeResp {      // failed after 7s
		clock += 7 * time.Second
		return fakeResp{none: true}
	})
	// Forwarded, and the client went away before the head: until Finish.
	ex := c.Begin(newReq("GET", "/gone", "192.0.2.9"))
	if decideNow(ex) == core.Respond {
		t.Fatal("/gone was answered by the core")
	}
	ex.Forward()
	ex.Sending()
	clock += 20 * time.Second
	ex.Finish(errors.New("the client went away"))

	var s metrics.Snapshot
	metrics.Read(region, &s)
	// Buckets (not cumulative) of UpstreamDuration: ≤1ms, 2.5ms, 5ms,
	// 10ms, 25ms, 50ms, ..., 2.5s, 5s, 10s, 30s.
	want := map[int]uint64{2: 1, 5: 1, 10: 1, 12: 1, 13: 1}
	for b := range 16 { // 15 bounds and +Inf
		if got := s.Value(metrics.UpstreamDuration, b); got != want[b] {
			t.Errorf("bucket %d: %d, want %d", b, got, want[b])
		}
	}
	if sum, want := s.Value(metrics.UpstreamDuration, 16), uint64((3*time.Millisecond+40*time.Millisecond+2*time.Second+7*time.Second+20*time.Second)/time.Microsecond); sum != want {
		t.Errorf("sum %dµs, want %dµs", sum, want)
	}
}
