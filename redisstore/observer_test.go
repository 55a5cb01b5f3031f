package redisstore_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/preforkd/preforkd/bucket"
	"github.com/preforkd/preforkd/internal/redistest"
	"github.com/preforkd/preforkd/redisstore"
)

// observed counts what a Store tells its Observer.
type observed struct {
	calls, flushes                    [3]atomic.Uint64
	callTime                          atomic.Int64
	shortCircuits, denyHits, noScript atomic.Uint64
}

func (o *observed) Call(r redisstore.Result, d time.Duration) {
	o.calls[r].Add(1)
	o.callTime.Add(int64(d))
}
func (o *observed) Flush(r redisstore.Result) { o.flushes[r].Add(1) }
func (o *observed) ShortCircuit()             { o.shortCircuits.Add(1) }
func (o *observed) DenyHit()                  { o.denyHits.Add(1) }
func (o *observed) NoScript()                 { o.noScript.Add(1) }

// counts are the calls' and the flushes' counts by result.
func (o *observed) counts() (calls, flushes [3]uint64) {
	for r := range 3 {
		calls[r], flushes[r] = o.calls[r].Load(), o.flushes[r].Load()
	}
	return calls, flushes
}

func (o *observed) failed() uint64 {
	return o.calls[redisstore.CallError].Load() + o.calls[redisstore.CallTimeout].Load()
}

// The Observer is told every call a request made (decisions, a reset on
// a request's path) with its result and duration, the deny cache's and
// the open breaker's answers, NOSCRIPT, and each sync-mode flush; the
// deny cache's answer allocates nothing for it.
func TestObserver(t *testing.T) {
	// Not parallel: AllocsPerRun.
	srv := redistest.Start(t)
	obs := new(observed)
	o := counting
	o.Observer = obs
	o.Breaker = redisstore.Breaker{Failures: 3, Backoff: time.Hour}
	h := newHost(t, srv, 0, o)
	l := h.limiter(t, rule("observed", bucket.GCRA, 3, time.Hour))
	for i := range 4 { // 3 allowed, the 4th refused by Redis: 4 calls
		if refused, _, err := h.decide(t, "k", l); err != nil || refused != (i == 3) {
			t.Fatalf("request %d: refused %v, %v", i+1, refused, err)
		}
	}
	k := l.Key([]byte("k"))
	if _, ok := l.Denied(&k, h.region.Now()); !ok {
		t.Fatal("the refusal is not in the deny cache")
	}
	if a := testing.AllocsPerRun(100, func() { l.Denied(&k, h.region.Now()) }); a != 0 {
		t.Errorf("a deny-cache hit allocates %v", a)
	}
	if !h.store.Available(h.region.Now()) {
		t.Fatal("not available with the breaker closed")
	}
	if err := srv.Client().ScriptFlush(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	if _, _, err := h.decide(t, "other", l); err != nil {
		t.Fatal(err)
	}
	if err := l.Reset(&k, h.region.Now(), true); err != nil {
		t.Fatal(err)
	}
	// Operator's resets are not a request's calls.
	if err := l.Reset(&k, h.region.Now(), false); err != nil {
		t.Fatal(err)
	}
	if got := [...]uint64{obs.calls[0].Load(), obs.failed(), obs.denyHits.Load(), obs.noScript.Load(), obs.shortCircuits.Load()}; got != [...]uint64{6, 0, 102, 1, 0} {
		t.Fatalf("calls ok, failed, deny hits, NOSCRIPT, short circuits: %v, want [6 0 102 1 0] (one hit, then AllocsPerRun's 101)", got)
	}
	if obs.callTime.Load() <= 0 {
		t.Fatalf("the calls took %v", time.Duration(obs.callTime.Load()))
	}

	// A sync-mode host: its flushes, the last one at Close.
	sobs := new(observed)
	so := redisstore.Options{Observer: sobs}
	sh := newHost(t, srv, 0, so)
	sl := sh.limiter(t, redisstore.Rule{Rule: bucket.Rule{Name: "observed-sync", Limit: 10, Window: time.Hour, Algorithm: bucket.FixedWindow}, Sync: time.Hour})
	sk := sl.Key([]byte("k"))
	sl.AllowKey(&sk, sh.region.Now())
	sh.store.Close()
	if st := sh.store.Stats(sh.region.Now()); sobs.flushes[redisstore.CallOK].Load() != st.Flushes || st.Flushes == 0 || st.FlushErrors != 0 || sobs.calls[0].Load() != 0 {
		calls, flushes := sobs.counts()
		t.Fatalf("sync host: flushes %v, calls %v; Stats %+v", flushes, calls, st)
	}

	// Redis gone: 3 failed calls open the breaker, which keeps from
	// Redis the next 7 decisions, a request's reset and a request the
	// core asked Available for.
	srv.Kill()
	for range 10 {
		if _, _, err := h.decide(t, "k", l); err == nil {
			t.Fatal("decided with Redis dead")
		}
	}
	if err := l.Reset(&k, h.region.Now(), true); err == nil {
		t.Fatal("reset with Redis dead")
	}
	if h.store.Available(h.region.Now()) { // the core asks before Decide
		t.Fatal("available with the breaker open")
	}
	st := h.store.Stats(h.region.Now())
	if obs.failed() != 3 || obs.shortCircuits.Load() != 9 || st.ShortCircuits != 9 || obs.calls[0].Load() != 6 || st.Errors+st.Timeouts != 3 {
		calls, _ := obs.counts()
		t.Fatalf("with Redis dead: calls %v, short circuits %d; Stats %+v", calls, obs.shortCircuits.Load(), st)
	}
}
