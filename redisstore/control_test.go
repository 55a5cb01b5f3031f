package redisstore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/preforkd/preforkd/bucket"
	"github.com/preforkd/preforkd/internal/redistest"
	"github.com/preforkd/preforkd/internal/shmtest"
	"github.com/preforkd/preforkd/redisstore"
	"github.com/preforkd/preforkd/shm"
)

// supervised is a host as a supervisor's workers have it (a region of a
// memory file, joined by the host's Store as worker 0) and a Store over
// the supervisor's own mapping of it, which it has not joined: what the
// admin endpoint looks up and resets keys with.
func supervised(t *testing.T, srv *redistest.Server, o redisstore.Options) (h *host, ctl *redisstore.Store) {
	t.Helper()
	sup := shmtest.Create(t, shm.Options{Counters: 4096})
	worker := shmtest.Attach(t, sup, 0)
	if o.URL == "" {
		o.URL = srv.URL()
	}
	s, err := redisstore.New(worker, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	<-s.Warmed()
	if ctl, err = redisstore.New(sup, redisstore.Options{URL: srv.URL()}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ctl.Close() })
	return &host{region: worker, store: s}, ctl
}

// An operator's look at a key and its reset, from a process that has not
// joined the region, for either algorithm: State reads Redis without
// charging, Reset deletes the key in Redis and the host's deny-cache
// entry, and the next request finds the whole allowance.
func TestStateAndReset(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	for _, algo := range []bucket.Algorithm{bucket.GCRA, bucket.FixedWindow} {
		r := rule("ctl-"+algo.String(), algo, 3, time.Hour)
		h, cs := supervised(t, srv, counting)
		l := h.limiter(t, r)
		ctl, err := cs.NewLimiter(r)
		if err != nil {
			t.Fatal(err)
		}
		k := ctl.Key([]byte("client"))
		now := h.region.Now()
		if d, stored, err := ctl.State(&k, now); err != nil || stored || !d.Allowed || d.Remaining != 3 || d.Limit != 3 {
			t.Fatalf("%v: a fresh key: %+v stored %v, %v", algo, d, stored, err)
		}
		for range 4 {
			h.decide(t, "client", l)
		}
		before := srv.Calls("set")
		d, stored, err := ctl.State(&k, now)
		if err != nil || !stored || d.Allowed || d.Remaining != 0 || d.RetryAfter <= 0 || d.ResetAfter <= 0 {
			t.Fatalf("%v: after 3 allowed and 1 refused: %+v stored %v, %v", algo, d, stored, err)
		}
		if n := srv.Calls("set") - before; n != 0 {
			t.Fatalf("%v: State wrote %d keys", algo, n)
		}
		wk := l.Key([]byte("client"))
		if _, ok := l.Denied(&wk, h.region.Now()); !ok {
			t.Fatalf("%v: the refusal is not in the deny cache", algo)
		}
		if err := ctl.Reset(&k, h.region.Now(), false); err != nil {
			t.Fatal(err)
		}
		if _, ok := l.Denied(&wk, h.region.Now()); ok {
			t.Fatalf("%v: the deny cache still refuses after a reset", algo)
		}
		if d, stored, err := ctl.State(&k, h.region.Now()); err != nil || stored || d.Remaining != 3 {
			t.Fatalf("%v: after a reset: %+v stored %v, %v", algo, d, stored, err)
		}
		if refused, hits, err := h.decide(t, "client", l); err != nil || refused || hits[0].D.Remaining != 2 {
			t.Fatalf("%v: the next request after a reset: refused %v %+v, %v", algo, refused, hits, err)
		}
		// Another key is untouched.
		h.decide(t, "other", l)
		ko := ctl.Key([]byte("other"))
		if d, stored, _ := ctl.State(&ko, h.region.Now()); !stored || d.Remaining != 2 {
			t.Fatalf("%v: another key: %+v stored %v", algo, d, stored)
		}
	}
}

// A sync-mode key: State counts what the hosts flushed to Redis and this
// host's own count; Reset deletes the window in Redis and this host's
// counts. A Store that has not joined its region decides nothing.
func TestSyncStateAndReset(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	r := redisstore.Rule{Rule: bucket.Rule{Name: "ctl-sync", Limit: 10, Window: time.Hour, Algorithm: bucket.FixedWindow}, Sync: time.Hour}
	h0, ctlStore := supervised(t, srv, redisstore.Options{})
	h1 := newHost(t, srv, 0, redisstore.Options{})
	hs := []*host{h0, h1}
	ls := []*redisstore.Limiter{h0.limiter(t, r), h1.limiter(t, r)}
	for i := range 7 {
		h, l := hs[i%2], ls[i%2]
		k := l.Key([]byte("k"))
		if !l.AllowKey(&k, h.region.Now()).Allowed {
			t.Fatalf("request %d refused", i+1)
		}
	}
	hs[1].store.Close() // flushes its 3 to Redis
	ctl, err := ctlStore.NewLimiter(r)
	if err != nil {
		t.Fatal(err)
	}
	k := ctl.Key([]byte("k"))
	// Host 0 counted 4 and has not flushed; host 1's 3 are in Redis.
	d, stored, err := ctl.State(&k, hs[0].region.Now())
	if err != nil || !stored || d.Remaining != 3 || !d.Allowed {
		t.Fatalf("state: %+v stored %v, %v; want 3 remaining of 10", d, stored, err)
	}
	if err := ctl.Reset(&k, hs[0].region.Now(), false); err != nil {
		t.Fatal(err)
	}
	if d, stored, err := ctl.State(&k, hs[0].region.Now()); err != nil || stored || d.Remaining != 10 {
		t.Fatalf("after a reset: %+v stored %v, %v", d, stored, err)
	}
	k0 := ls[0].Key([]byte("k"))
	if d := ls[0].AllowKey(&k0, hs[0].region.Now()); !d.Allowed || d.Remaining != 9 {
		t.Fatalf("the next request on host 0: %+v, want 9 remaining", d)
	}
	if _, err := ctlStore.Decide(context.Background(), []redisstore.Hit{{Lim: ctl, Key: &k}}, hs[0].region.Now()); !errors.Is(err, redisstore.ErrUnavailable) || !errors.Is(err, shm.ErrNotJoined) {
		t.Fatalf("Decide on a region not joined: %v", err)
	}
}

// When Redis does not answer, State and Reset say so (ErrUnavailable).
func TestStateUnavailable(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	h, cs := supervised(t, srv, counting)
	ctl, err := cs.NewLimiter(rule("ctl-down", bucket.GCRA, 3, time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	k := ctl.Key([]byte("client"))
	if _, _, err := ctl.State(&k, h.region.Now()); err != nil {
		t.Fatal(err)
	}
	srv.Kill()
	if _, _, err := ctl.State(&k, h.region.Now()); !errors.Is(err, redisstore.ErrUnavailable) {
		t.Fatalf("State with Redis down: %v", err)
	}
	if err := ctl.Reset(&k, h.region.Now(), false); !errors.Is(err, redisstore.ErrUnavailable) {
		t.Fatalf("Reset with Redis down: %v", err)
	}
}

// busyFor keeps srv busy for d with a script that runs until Redis's
// clock moved on (a slow script, a KEYS on a large database), and returns
// once it has begun; its result comes on the channel when it ends.
func busyFor(srv *redistest.Server, d time.Duration) <-chan error {
	done := make(chan error, 1)
	go func() {
		done <- srv.Client().Eval(context.Background(), `
local t = redis.call('TIME')
local stop = tonumber(t[1]) * 1000000 + tonumber(t[2]) + tonumber(ARGV[1])
repeat
  t = redis.call('TIME')
until tonumber(t[1]) * 1000000 + tonumber(t[2]) >= stop
return 1`, nil, d.Microseconds()).Err()
	}()
	time.Sleep(50 * time.Millisecond) // the script has begun
	return done
}

// A call off the request path has its own budget, however short a
// request's is: with Redis busy for longer than Timeout (a script
// running), a request is cut at Timeout but an operator's State waits.
func TestOffRequestCallsOutwaitTimeout(t *testing.T) {
	t.Parallel()
	srv, h, l := oneHost(t, redisstore.Options{Timeout: 25 * time.Millisecond},
		redisstore.Rule{Rule: bucket.Rule{Name: "busy", Limit: 5, Window: time.Minute}})
	k := l.Key([]byte("k"))
	done := busyFor(srv, 300*time.Millisecond)
	if _, _, err := h.decide(t, "k", l); err == nil {
		t.Error("a request waited for a Redis busy for longer than its Timeout")
	}
	<-done
	done = busyFor(srv, 300*time.Millisecond)
	start := time.Now()
	if _, _, err := l.State(&k, h.region.Now()); err != nil {
		t.Errorf("State, with Redis busy %v: %v", time.Since(start), err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
