package core_test

import (
	"log/slog"
	"testing"
	"time"

	"github.com/preforkd/preforkd/bucket"
	"github.com/preforkd/preforkd/clientip"
	"github.com/preforkd/preforkd/core"
	"github.com/preforkd/preforkd/internal/shmtest"
	"github.com/preforkd/preforkd/metrics"
	"github.com/preforkd/preforkd/shm"
)

// An engine that must not block (an event loop) decides with NoWait: the
// core stops where it would wait and the engine goes on elsewhere. These
// are the stories of the two waits a region can impose; serve (the fake
// engine) decides every other test of this package the same way.

// A duplicate of an original in flight stops with Wait, holding nothing;
// resumed, it waits for the original and replays its response. It is
// counted once: one wait, one replay.
func TestNoWaitDuplicate(t *testing.T) {
	region := shmtest.Attach(t, statRegion(t, shm.Options{Counters: 64, Responses: 64, ResponseBytes: 64 << 10}), 0)
	c, err := core.New(region, core.Options{
		Idempotency: core.IdempotencyBlocks(core.Idempotency{Route: mustRoute(t, "/orders", "POST"), TTL: time.Minute, Wait: 5 * time.Second,
			MaxBody: 1 << 10, By: clientip.MustParseBy("ip")}),
	})
	if err != nil {
		t.Fatal(err)
	}
	req := func() *fakeReq {
		r := newReq("POST", "/orders", "192.0.2.1", "Idempotency-Key", `"k1"`)
		r.body = []byte("{}")
		return r
	}
	orig := c.Begin(req())
	orig.NoWait(true)
	if v := orig.DecideHead(); v != core.Pass {
		t.Fatalf("the original's head: %v", v)
	}
	if max, ok := orig.WantsBody(); !ok || max != 1<<20 {
		t.Fatalf("WantsBody of a keyed request: %d %v, want the core's MaxRequestBody", max, ok)
	}
	if v := orig.Decide(); v != core.Pass {
		t.Fatalf("the original: %v, want Pass (a new key reserves without waiting)", v)
	}

	dup := c.Begin(req())
	dup.NoWait(true)
	if v := dup.DecideHead(); v != core.Pass {
		t.Fatalf("a duplicate's head: %v, want Pass (its key is Decide's to look up)", v)
	}
	if v := dup.Decide(); v != core.Wait {
		t.Fatalf("a duplicate of an original in flight: %v, want Wait", v)
	}
	got := make(chan core.Verdict, 1)
	go func() {
		dup.NoWait(false)
		got <- dup.Decide()
	}()
	select {
	case v := <-got:
		t.Fatalf("the resumed duplicate did not wait for its original: %v", v)
	case <-time.After(100 * time.Millisecond):
	}
	if orig.Head(201, fakeHeader{{Name: "Content-Type", Value: []byte("application/json")}}) != nil {
		t.Fatal("Head replaced a 201")
	}
	orig.Body([]byte(`{"id":1}`))
	orig.Finish(nil)
	if v := <-got; v != core.Respond {
		t.Fatalf("the resumed duplicate: %v, want Respond (the replay)", v)
	}
	if a := answerOf(dup.Response()); a.status != 201 || string(a.body) != `{"id":1}` || a.get("Idempotent-Replayed") != "true" {
		t.Errorf("the replay: %d %q %v", a.status, a.body, a.header)
	}
	dup.Finish(nil)
	waits := metrics.Total(region, metrics.IdempotencyWaits, 0)
	replays := metrics.Total(region, metrics.IdempotencyRequests, metrics.IdemReplayed)
	if waits != 1 || replays != 1 {
		t.Errorf("counted %d waits and %d replays, want 1 and 1", waits, replays)
	}
}

// A miss while another request fills the entry stops with Wait before
// anything is counted; resumed, it waits for the fill and is a hit.
func TestNoWaitCacheFill(t *testing.T) {
	region := shmtest.Attach(t, statRegion(t, shm.Options{Counters: 64, Responses: 64, ResponseBytes: 64 << 10}), 0)
	c, err := core.New(region, core.Options{
		Caches: core.CacheBlocks(core.Cache{Route: mustRoute(t, "/*", "GET", "HEAD"), TTL: time.Minute, MaxBody: 1 << 10, LockTimeout: 5 * time.Second}),
	})
	if err != nil {
		t.Fatal(err)
	}
	get := func() *fakeReq { return newReq("GET", "/a", "192.0.2.1", "Host", "h") }
	fill := c.Begin(get())
	fill.NoWait(true)
	if v := fill.Decide(); v != core.Pass {
		t.Fatalf("the first miss: %v, want Pass", v)
	}
	if _, ok := fill.WantsBody(); ok {
		t.Error("WantsBody of a request no idempotency block applies to")
	}

	waiter := c.Begin(get())
	waiter.NoWait(true)
	if v := waiter.Decide(); v != core.Wait {
		t.Fatalf("a miss while another fills: %v, want Wait", v)
	}
	if n := metrics.Total(region, metrics.CacheWaits, metrics.CacheWaited); n != 0 {
		t.Errorf("a wait counted before it began: %d", n)
	}
	got := make(chan core.Verdict, 1)
	go func() {
		waiter.NoWait(false)
		got <- waiter.Decide()
	}()
	select {
	case v := <-got:
		t.Fatalf("the resumed miss did not wait for the fill: %v", v)
	case <-time.After(100 * time.Millisecond):
	}
	fill.Head(200, fakeHeader{{Name: "Cache-Control", Value: []byte("max-age=60")}})
	fill.Body([]byte("stored"))
	fill.Finish(nil)
	if v := <-got; v != core.Respond {
		t.Fatalf("the resumed miss: %v, want Respond (a hit)", v)
	}
	if a := answerOf(waiter.Response()); string(a.body) != "stored" || a.get("X-Cache") != "HIT" {
		t.Errorf("the resumed miss got %q %v", a.body, a.header)
	}
	waiter.Finish(nil)
	if n := metrics.Total(region, metrics.CacheWaits, metrics.CacheWaited); n != 1 {
		t.Errorf("%d waits counted, want 1", n)
	}
	if n := metrics.Total(region, metrics.CacheRequests, metrics.CacheHit); n != 1 {
		t.Errorf("%d hits counted, want 1", n)
	}
}

// A request no stage makes wait is decided at once with NoWait, the same
// as without.
func TestNoWaitDecidesAtOnce(t *testing.T) {
	region := joinedRegion(t, shm.Options{Counters: 64})
	c, err := core.New(region, core.Options{
		Logger:     slog.New(slog.DiscardHandler),
		RateLimits: []core.RateLimit{{Rule: bucket.Rule{Name: "api", Limit: 1, Window: time.Minute}, Route: mustRoute(t, "/api/*"), By: clientip.MustParseBy("ip")}},
	})
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []core.Verdict{core.Pass, core.Respond} {
		ex := c.Begin(newReq("GET", "/api/x", "192.0.2.1"))
		ex.NoWait(true)
		if v := ex.DecideHead(); v != want {
			t.Fatalf("request %d: DecideHead %v, want %v", i, v, want)
		}
		if want == core.Pass {
			if v := ex.Decide(); v != core.Pass {
				t.Fatalf("request %d: Decide %v", i, v)
			}
			ex.Head(200, nil)
		}
		ex.Finish(nil)
	}
}

// A long wait given up (no goroutine free to wait: GiveUpWait) ends at
// once as if its time had run out: a duplicate gets 409, a miss while
// another fills is fetched and not stored. Both are long waits; neither
// is counted as a wait made.
func TestGiveUpWait(t *testing.T) {
	region := shmtest.Attach(t, statRegion(t, shm.Options{Counters: 64, Responses: 64, ResponseBytes: 64 << 10}), 0)
	c, err := core.New(region, core.Options{
		Idempotency: core.IdempotencyBlocks(core.Idempotency{Route: mustRoute(t, "/orders", "POST"), TTL: time.Minute, Wait: 5 * time.Second,
			MaxBody: 1 << 10, By: clientip.MustParseBy("ip")}),
		Caches: core.CacheBlocks(core.Cache{Route: mustRoute(t, "/*", "GET", "HEAD"), TTL: time.Minute, MaxBody: 1 << 10, LockTimeout: 5 * time.Second}),
	})
	if err != nil {
		t.Fatal(err)
	}
	order := func() *fakeReq {
		r := newReq("POST", "/orders", "192.0.2.1", "Idempotency-Key", `"k1"`)
		r.body = []byte("{}")
		return r
	}
	get := func() *fakeReq { return newReq("GET", "/a", "192.0.2.1", "Host", "h") }
	for _, tc := range []struct {
		name string
		req  func() *fakeReq
		want func(*testing.T, core.Verdict, *core.Exchange)
	}{
		{"a duplicate", order, func(t *testing.T, v core.Verdict, ex *core.Exchange) {
			if a := answerOf(ex.Response()); v != core.Respond || a.status != 409 || a.get("Retry-After") == "" {
				t.Errorf("given up: %v %d %v; want Respond 409 with Retry-After", v, a.status, a.header)
			}
		}},
		{"a miss while another fills", get, func(t *testing.T, v core.Verdict, ex *core.Exchange) {
			if v != core.Pass {
				t.Errorf("given up: %v; want Pass (fetched itself)", v)
			}
			ex.Head(200, fakeHeader{{Name: "Cache-Control", Value: []byte("max-age=60")}})
			ex.Body([]byte("not stored"))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			first := c.Begin(tc.req())
			first.NoWait(true)
			if v := first.Decide(); v != core.Pass {
				t.Fatalf("the first: %v, want Pass", v)
			}
			second := c.Begin(tc.req())
			second.NoWait(true)
			if v := second.Decide(); v != core.Wait || !second.LongWait() {
				t.Fatalf("the second: %v (long %v), want a long Wait", v, second.LongWait())
			}
			second.GiveUpWait()
			done := make(chan core.Verdict, 1)
			go func() { done <- second.Decide() }()
			select {
			case v := <-done:
				tc.want(t, v, second)
			case <-time.After(2 * time.Second):
				t.Fatal("a given-up wait waited")
			}
			second.Finish(nil)
			first.Head(201, nil)
			first.Finish(nil)
		})
	}
	if n := metrics.Total(region, metrics.CacheWaits, metrics.CacheWaited) + metrics.Total(region, metrics.IdempotencyWaits, 0); n != 0 {
		t.Errorf("%d waits counted for waits given up, want 0", n)
	}
	if n := metrics.Total(region, metrics.CacheWaits, metrics.CacheLockTimeout); n != 1 {
		t.Errorf("%d cache waits ended by lock_timeout, want the one given up", n)
	}
}
