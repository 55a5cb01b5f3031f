package redisstore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/preforkd/preforkd/bucket"
	"github.com/preforkd/preforkd/redisstore"
)

// A decision cut in flight returns at once, and its call, which goes on,
// writes nothing of the caller's hits after (go test -race sees it).
func TestDecideCutInFlight(t *testing.T) {
	t.Parallel()
	srv, h, l := oneHost(t, redisstore.Options{Timeout: time.Second}, rule("cut", bucket.GCRA, 1000, time.Minute))
	if _, _, err := h.decide(t, "k", l); err != nil {
		t.Fatal(err)
	}
	thaw := srv.Freeze()
	ctx, cut := context.WithCancel(context.Background())
	k := l.Key([]byte("k"))
	hits := []redisstore.Hit{{Lim: l, Key: &k}}
	done := make(chan error, 1)
	go func() {
		_, err := h.store.Decide(ctx, hits, h.region.Now())
		done <- err
	}()
	time.Sleep(100 * time.Millisecond)
	start := time.Now()
	cut()
	var err error
	select {
	case err = <-done:
	case <-time.After(500 * time.Millisecond):
		t.Fatal("Decide did not return at the cut")
	}
	if !errors.Is(err, redisstore.ErrUnavailable) || !errors.Is(err, context.Canceled) {
		t.Fatalf("a cut decision: %v", err)
	}
	t.Logf("returned %v after the cut", time.Since(start))
	// The request's memory is reused: the call must not touch it.
	thaw()
	for i := 0; i < 50; i++ {
		hits[0].D = bucket.Decision{}
		k = redisstore.Key{}
		_ = hits[0].D.Allowed
		time.Sleep(20 * time.Millisecond)
	}
	if _, err := h.store.Decide(ctx, hits, h.region.Now()); !errors.Is(err, context.Canceled) {
		t.Fatalf("a decision after the cut: %v", err)
	}
	if st := h.store.Stats(h.region.Now()); st.Errors+st.Timeouts != 0 {
		t.Fatalf("the cut call counted as a failure: %+v", st)
	}
}

// With a timeout under a second, a decision runs on the caller's
// goroutine even when its context can end: it costs what one whose
// context cannot end costs (no goroutine, no copies), and a cut call
// ends by itself within the timeout, counted as no failure.
func TestDecideCutInline(t *testing.T) {
	// Not parallel: AllocsPerRun counts the whole process's.
	const timeout = 300 * time.Millisecond
	srv, h, l := oneHost(t, redisstore.Options{Timeout: timeout}, rule("inline", bucket.GCRA, 1<<20-1, time.Minute))
	ctx, cut := context.WithCancel(context.Background())
	defer cut()
	k := l.Key([]byte("k"))
	hits := []redisstore.Hit{{Lim: l, Key: &k}}
	allocs := func(ctx context.Context) float64 {
		return testing.AllocsPerRun(50, func() {
			if _, err := h.store.Decide(ctx, hits, h.region.Now()); err != nil {
				t.Fatal(err)
			}
		})
	}
	if a, b := allocs(ctx), allocs(context.Background()); a > b+1 {
		t.Errorf("a decision whose context can end allocates %.0f times, one whose cannot %.0f", a, b)
	}
	thaw := srv.Freeze()
	defer thaw()
	time.AfterFunc(50*time.Millisecond, cut)
	start := time.Now()
	_, err := h.store.Decide(ctx, hits, h.region.Now())
	if took := time.Since(start); !errors.Is(err, redisstore.ErrUnavailable) || took > 3*timeout {
		t.Fatalf("a decision cut in flight: %v after %v", err, took)
	}
	if st := h.store.Stats(h.region.Now()); st.Errors+st.Timeouts != 0 {
		t.Fatalf("the cut call counted as a failure: %+v", st)
	}
}
