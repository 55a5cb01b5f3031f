package redisstore

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/preforkd/preforkd/bucket"
	"github.com/preforkd/preforkd/internal/redistest"
	"github.com/preforkd/preforkd/shm"
)

// A count admitted while the flusher learns Redis's clock is filed under
// the window it was decided in, or under "clock not known yet": never
// under an index mixed from both (a window long past, which the flush
// drops: the count would never reach Redis). The test learns and forgets
// the clock over and over beside a worker admitting, to hit that moment
// many times.
func TestSyncCountFiledUnderOneClock(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	r, err := shm.CreatePrivate(shm.Options{Counters: 4096})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Join(0); err != nil {
		t.Fatal(err)
	}
	s, err := New(r, Options{URL: srv.URL()})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	<-s.Warmed()
	l, err := s.NewLimiter(Rule{Rule: bucket.Rule{Name: "clock", Limit: 1<<20 - 1, Window: time.Hour, Algorithm: bucket.FixedWindow}, Sync: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	// Wait for the flusher's own measurement, so that it does not race the
	// test's below.
	for !s.clockKnown.Load() {
		time.Sleep(time.Millisecond)
	}
	redisUS := time.Now().UnixMicro()
	var stop atomic.Bool
	var wg sync.WaitGroup
	wg.Go(func() {
		for !stop.Load() {
			s.clockKnown.Store(false)
			s.setClock(redisUS, r.Now(), r.Now())
		}
	})
	k := l.Key([]byte("k"))
	for range 200000 {
		if !l.AllowKey(&k, r.Now()).Allowed {
			t.Fatal("refused under a limit of 2^20-1")
		}
	}
	stop.Store(true)
	wg.Wait()
	cur := l.window(r.Now())
	l.pending.mu.Lock()
	defer l.pending.mu.Unlock()
	for pk, v := range l.pending.m {
		if pk.widx != -1 && pk.widx != cur {
			t.Errorf("%d counts filed under window %d; the current one is %d", v.n, pk.widx, cur)
		}
	}
}
