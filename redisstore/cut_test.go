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
