package redisstore_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/preforkd/preforkd/bucket"
	"github.com/preforkd/preforkd/internal/redistest"
	"github.com/preforkd/preforkd/redisstore"
	"github.com/preforkd/preforkd/shm"
)

// A Redis rule decides in Redis: its deny cache in the region is a cache,
// and a table too full to hold a refusal there answers no on_full.
// preforkd_table_full_total (Stats.Full) counts on_full decisions only, so
// refusals Redis made while the table was full must not be counted.
func TestDenyCacheOfAFullTableIsNoOnFull(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	r, err := shm.CreatePrivate(shm.Options{Counters: 8})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Join(0); err != nil {
		t.Fatal(err)
	}
	s, err := redisstore.New(r, redisstore.Options{URL: srv.URL(), Timeout: redistest.CallTimeout})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	<-s.Warmed()
	h := &host{region: r, store: s}
	l := h.limiter(t, rule("f", bucket.GCRA, 1, time.Hour))
	limited := 0
	for i := range 40 {
		id := fmt.Sprint("client-", i)
		for range 2 {
			refused, hits, err := h.decide(t, id, l)
			if err != nil {
				t.Fatal(err)
			}
			if hits[0].D.Full {
				t.Fatalf("%s: decided by on_full", id)
			}
			if refused {
				limited++
			}
		}
	}
	if limited != 40 {
		t.Fatalf("%d refused, want 40", limited)
	}
	if st := r.Counters().Stats(); st.Full != 0 || st.Quota != 0 {
		t.Fatalf("table full %d, capped %d with no on_full decision; want 0", st.Full, st.Quota)
	}
}
