package shm_test

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/preforkd/preforkd/bucket"
	"github.com/preforkd/preforkd/internal/shmtest"
	"github.com/preforkd/preforkd/shm"
)

// placeInto reseeds dst as src and places entries, a snapshot of src's
// counters, into it.
func placeInto(t testing.TB, dst, src *shm.Region, entries []shm.Entry) {
	t.Helper()
	if err := dst.SetSeeds(src.Seeds()); err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if err := dst.Counters().Place(e); err != nil {
			t.Fatalf("place: %v", err)
		}
	}
}

// Entries of a snapshot placed into empty tables (private or mapped;
// smaller, equal or larger) are found, decided and reclaimed as if they
// had been claimed.
func TestPlace(t *testing.T) {
	login := bucket.Rule{Name: "login", Limit: 1, Window: time.Hour}
	api := bucket.Rule{Name: "api", Limit: 2, Window: time.Minute, Algorithm: bucket.FixedWindow}
	limiter := func(r *shm.Region, rule bucket.Rule) *bucket.Limiter {
		l, err := bucket.NewLimiter(rule, r.Counters())
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	now := 10 * time.Minute
	src := shmtest.Private(t, shm.Options{Counters: 4096, MaxWorkers: 8})
	lg, la := limiter(src, login), limiter(src, api)
	for i := 0; i < 300; i++ {
		lg.Allow(fmt.Sprint("client", i), now)
		la.Allow(fmt.Sprint("client", i), now)
	}
	entries := slices.Collect(src.Counters().Snapshot())
	if len(entries) != 600 {
		t.Fatalf("only %d entries", len(entries))
	}
	memfd := shmtest.Create(t, shm.Options{Counters: 2048, MaxWorkers: 8})
	small, large := shmtest.Private(t, shm.Options{Counters: 2048, MaxWorkers: 8}), shmtest.Private(t, shm.Options{Counters: 8192, MaxWorkers: 8})
	for _, dst := range []*shm.Region{small, memfd, large} {
		t.Run(fmt.Sprintf("%d slots, mapped=%v", dst.Geometry().Counters, dst.File() != nil), func(t *testing.T) {
			placeInto(t, dst, src, entries)
			if err := dst.Counters().Place(entries[0]); !errors.Is(err, shm.ErrDuplicate) {
				t.Fatalf("a key placed twice: %v", err)
			}
			st := dst.Counters().Stats()
			if st.Live != len(entries) || st.Busy != 0 || st.Locked != 0 || st.MaxProbe > st.Probe {
				t.Fatalf("stats %+v for %d entries", st, len(entries))
			}
			got := map[shm.Entry]bool{}
			for e := range dst.Counters().Snapshot() {
				got[e] = true
			}
			for _, e := range entries {
				if !got[e] {
					t.Fatalf("entry %+v not in the snapshot", e)
				}
			}
			if err := dst.Join(1); err != nil {
				t.Fatal(err)
			}
			fg, fa := limiter(dst, login), limiter(dst, api)
			for i := 0; i < 300; i += 7 {
				c := fmt.Sprint("client", i)
				if fg.Peek(c, now) != lg.Peek(c, now) || fa.Peek(c, now) != la.Peek(c, now) {
					t.Fatalf("%s: %+v/%+v, was %+v/%+v", c, fg.Peek(c, now), fa.Peek(c, now), lg.Peek(c, now), la.Peek(c, now))
				}
			}
			// The placed slots take part in the protocol: updated, and
			// reclaimed once fresh.
			if d := fg.Allow("client1", now); d.Allowed {
				t.Fatal("a placed key was not limited")
			}
			if d := fg.Allow("client1", now+2*time.Hour); !d.Allowed {
				t.Fatal("a placed key was not updated")
			}
		})
	}
}

// Placing into a table with no room ends after one probe window (a loader
// must never spin at boot).
func TestPlaceFull(t *testing.T) {
	r := shmtest.Private(t, shm.Options{Counters: 16, MaxWorkers: 4})
	for i := 0; i < 17; i++ {
		err := r.Counters().Place(shm.Entry{Key: shm.Key{A: uint64(i), B: 1}, Meta: 1, Payload: 1})
		if (err != nil) != (i == 16) || (err != nil && !errors.Is(err, shm.ErrFull)) {
			t.Fatalf("entry %d: %v", i, err)
		}
	}
}

// A snapshot taken while workers write the table (a dump every
// persist.interval) has every key that lives throughout, exactly once,
// with a payload it held during the snapshot: a key updated between the
// reads of its slot is read again, never skipped. The keys are few and
// hot, so that many of them change while they are read.
func TestSnapshotWhileWritten(t *testing.T) {
	r := shmtest.Private(t, shm.Options{Counters: 4096, MaxWorkers: 8})
	rule := bucket.Rule{Name: "hot", Limit: 1_000_000, Window: 24 * time.Hour}
	lim, err := bucket.NewLimiter(rule, r.Counters())
	if err != nil {
		t.Fatal(err)
	}
	const nkeys = 16
	keys := make([]shm.Key, nkeys)
	index := map[shm.Key]int{}
	for i := range keys {
		keys[i] = lim.Key(fmt.Appendf(nil, "key-%d", i))
		index[keys[i]] = i
		lim.AllowKey(keys[i], r.Now())
	}
	var stop atomic.Bool
	var wg sync.WaitGroup
	for w := range 2 {
		wg.Go(func() {
			for i := w; !stop.Load(); i++ {
				lim.AllowKey(keys[i%nkeys], r.Now())
			}
		})
	}
	defer func() { stop.Store(true); wg.Wait() }()
	before := make([]uint64, nkeys)
	for round := range 20000 {
		for i, k := range keys {
			before[i], _ = r.Counters().Peek(k, r.Now())
		}
		seen := make([]bool, nkeys)
		for e := range r.Counters().Snapshot() {
			i, ok := index[e.Key]
			if !ok || seen[i] || e.Meta != rule.Meta() || e.Payload < before[i] {
				t.Fatalf("round %d: entry %+v (key %d, known %v, seen %v); payload before the snapshot %d", round, e, i, ok, seen[i], before[i])
			}
			if now, _ := r.Counters().Peek(e.Key, r.Now()); e.Payload > now {
				t.Fatalf("round %d: key %d snapshot at %d, later than its payload after, %d", round, i, e.Payload, now)
			}
			seen[i] = true
		}
		for i, s := range seen {
			if !s {
				t.Fatalf("round %d: key %d, updated throughout, is not in the snapshot", round, i)
			}
		}
	}
}
