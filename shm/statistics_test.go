package shm_test

import (
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/preforkd/preforkd/bucket"
	"github.com/preforkd/preforkd/internal/shmtest"
	"github.com/preforkd/preforkd/shm"
)

// A worker's row holds its own counts; reaping it folds them into the
// totals, which never drop, and the next process of that index starts
// from zero.
func TestStatRowsFold(t *testing.T) {
	r := shmtest.Create(t, shm.Options{Counters: 64, MaxWorkers: 4, StatWords: 3})
	if n := len(r.StatRow()); n != 3 {
		t.Fatalf("StatRow has %d words, want 3", n)
	}
	w1 := shmtest.Attach(t, r, 1)
	w2 := shmtest.Attach(t, r, 2)
	atomic.AddUint64(&w1.StatRow()[0], 5)
	atomic.AddUint64(&w1.StatRow()[2], 1)
	atomic.AddUint64(&w2.StatRow()[0], 7)

	var s shm.StatSum
	r.SumStats(&s)
	if s.Words[0] != 12 || s.Words[1] != 0 || s.Words[2] != 1 || !s.Consistent {
		t.Fatalf("sum %v, want [12 0 1]", s.Words)
	}
	r.WorkerStats(1, &s)
	if s.Words[0] != 5 || s.Words[2] != 1 {
		t.Fatalf("worker 1's row %v, want [5 0 1]", s.Words)
	}

	if _, err := r.Reap(1); err != nil {
		t.Fatal(err)
	}
	r.WorkerStats(1, &s)
	if s.Words[0] != 0 || s.Words[2] != 0 {
		t.Fatalf("worker 1's row after the reap: %v, want zeros", s.Words)
	}
	r.SumStats(&s)
	if s.Words[0] != 12 || s.Words[2] != 1 {
		t.Fatalf("sum after the reap: %v, want [12 0 1]: folded, not lost", s.Words)
	}
	next := shmtest.Attach(t, r, 1) // the replacement
	atomic.AddUint64(&next.StatRow()[0], 1)
	r.SumStats(&s)
	if s.Words[0] != 13 {
		t.Fatalf("sum after the replacement counted: %v, want 13", s.Words[0])
	}
	r.WorkerStats(1, &s)
	if s.Words[0] != 1 {
		t.Fatalf("the replacement's row: %v, want its own count only", s.Words[0])
	}
	r.ReapAll()
	r.SumStats(&s)
	if s.Words[0] != 13 || s.Words[2] != 1 {
		t.Fatalf("sum after ReapAll: %v", s.Words)
	}
}

// A gauge word (Options.StatGauges) is what its process has now: a reap
// drops it where it folds a counter, so that a worker that died with
// connections open leaves none behind in the sum; the geometry travels
// with the region, so that a process that attaches folds alike.
func TestStatGaugesDroppedOnReap(t *testing.T) {
	r := shmtest.Create(t, shm.Options{Counters: 64, MaxWorkers: 4, StatWords: 3, StatGauges: 2})
	w1 := shmtest.Attach(t, r, 1)
	w2 := shmtest.Attach(t, r, 2)
	if g := w1.Geometry().StatGauges; g != 2 {
		t.Fatalf("attached region's StatGauges %d, want 2", g)
	}
	for _, w := range []*shm.Region{w1, w2} {
		atomic.AddUint64(&w.StatRow()[0], 3) // gauges
		atomic.AddUint64(&w.StatRow()[1], 1)
		atomic.AddUint64(&w.StatRow()[2], 10) // a counter
	}
	var s shm.StatSum
	r.SumStats(&s)
	if !slices.Equal(s.Words, []uint64{6, 2, 20}) {
		t.Fatalf("sum %v, want [6 2 20]", s.Words)
	}
	if _, err := w2.Reap(1); err != nil { // any process of the region may reap
		t.Fatal(err)
	}
	r.SumStats(&s)
	if !slices.Equal(s.Words, []uint64{3, 1, 20}) {
		t.Fatalf("sum after reaping worker 1: %v, want [3 1 20]: its gauges dropped, its counter kept", s.Words)
	}
	r.ReapAll()
	r.SumStats(&s)
	if !slices.Equal(s.Words, []uint64{0, 0, 20}) {
		t.Fatalf("sum after ReapAll: %v, want [0 0 20]", s.Words)
	}
	if _, err := (shm.Options{Counters: 64, StatWords: 1, StatGauges: 2}).Size(); err == nil {
		t.Fatal("more gauges than words: no error")
	}
}

// While workers add and the supervisor folds their rows again and again,
// every sum is at least the one before (nothing seen twice, then lost) and
// at most what was added (nothing seen twice); at the end it is exact.
func TestStatSumNeverGoesBack(t *testing.T) {
	r := shmtest.Create(t, shm.Options{Counters: 64, MaxWorkers: 4, StatWords: 1})
	var added atomic.Uint64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := 1; w <= 3; w++ {
		row := shmtest.Attach(t, r, w).StatRow()
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				// Counted before it is added: a sum may never exceed it.
				added.Add(1)
				atomic.AddUint64(&row[0], 1)
			}
		})
	}
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			r.Reap(1 + i%3) // the worker goes on adding: an orphan's counts must not be lost either
		}
	})
	var s shm.StatSum
	var last uint64
	sums := 0
	for deadline := time.Now().Add(300 * time.Millisecond); time.Now().Before(deadline); sums++ {
		r.SumStats(&s)
		got, bound := s.Words[0], added.Load()
		if got < last || got > bound {
			close(stop)
			wg.Wait()
			t.Fatalf("sum %d after sum %d, with %d added: a count was lost or seen twice", got, last, bound)
		}
		last = got
	}
	close(stop)
	wg.Wait()
	r.SumStats(&s)
	if s.Words[0] != added.Load() {
		t.Fatalf("final sum %d, %d added", s.Words[0], added.Load())
	}
	t.Logf("%d sums, %d adds", sums, added.Load())
}

func TestStatName(t *testing.T) {
	r, err := shm.CreatePrivate(shm.Options{Counters: 8, StatNames: 4})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := r.StatName("login", false); ok {
		t.Fatal("an absent name was found")
	}
	seen := map[int]string{}
	for _, n := range []string{"login", "api", "search", "upload"} {
		i, ok := r.StatName(n, true)
		if !ok || seen[i] != "" {
			t.Fatalf("StatName(%q) = %d, %v; taken by %q", n, i, ok, seen[i])
		}
		seen[i] = n
		if j, ok := r.StatName(n, false); !ok || j != i {
			t.Fatalf("StatName(%q) again = %d, %v; want %d", n, j, ok, i)
		}
	}
	if _, ok := r.StatName("fifth", true); ok {
		t.Fatal("a full table took a fifth name")
	}
	if i, ok := r.StatName("api", true); !ok || seen[i] != "api" {
		t.Fatalf("a known name in a full table: %d %v", i, ok)
	}
	none, _ := shm.CreatePrivate(shm.Options{Counters: 8})
	if _, ok := none.StatName("login", true); ok {
		t.Fatal("a region without a name table took a name")
	}
}

func TestGate(t *testing.T) {
	r, err := shm.CreatePrivate(shm.Options{Counters: 8, StatGates: 2})
	if err != nil {
		t.Fatal(err)
	}
	g, other := r.Gate(0), r.Gate(1)
	var passed []int
	for i := range 25 {
		now := time.Duration(i) * 100 * time.Millisecond
		if g.Pass(now, time.Second) {
			passed = append(passed, i)
		}
	}
	if len(passed) != 3 || passed[0] != 0 || passed[1] != 10 || passed[2] != 20 {
		t.Fatalf("passed at %v (×100ms), want 0, 10, 20", passed)
	}
	if !other.Pass(0, time.Second) {
		t.Fatal("a gate is held by another's line")
	}
	if g.SwapMark(7) != 0 || g.SwapMark(9) != 7 {
		t.Fatal("SwapMark does not hand on the mark")
	}
	if !r.Gate(99).Pass(0, time.Second) || r.Gate(99).Pass(time.Millisecond, time.Second) {
		t.Fatal("a gate out of range does not gate within the process")
	}
}

// The occupancies counted as slots and records change hands equal what a
// scan finds, through claims, reclaims, reservations, completions,
// releases, reuse of expired records and loads.
func TestTableStatsMatchScan(t *testing.T) {
	r := respRegion(t, 16, 16*256)
	lim, err := bucket.NewLimiter(bucket.Rule{Name: "short", Limit: 1, Window: time.Second}, r.Counters())
	if err != nil {
		t.Fatal(err)
	}
	check := func(when string, r *shm.Region) {
		t.Helper()
		var s shm.StatSum
		r.SumStats(&s)
		cs, rs := r.Counters().Stats(), r.Responses().Stats()
		if s.Table.Live != cs.Live || s.Table.RecordsInUse != rs.Reserved+rs.Complete || s.Table.BlocksUsed != rs.BlocksUsed {
			t.Fatalf("%s: counted live %d, records %d, blocks %d; the scan finds %d, %d (%d reserved + %d complete), %d",
				when, s.Table.Live, s.Table.RecordsInUse, s.Table.BlocksUsed, cs.Live, rs.Reserved+rs.Complete, rs.Reserved, rs.Complete, rs.BlocksUsed)
		}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	tab := r.Responses()
	now := time.Minute
	var held []shm.Ticket
	var dst shm.Response
	for i := range 3000 {
		now += time.Duration(rng.IntN(50)) * time.Millisecond
		switch op := rng.IntN(5); {
		case op == 0: // a key of a 1-per-second rule: the 8 slots are reclaimed over and over
			lim.Allow("k"+strconv.Itoa(rng.IntN(40)), now)
		case op == 1 && len(held) > 0: // a release (5xx)
			j := rng.IntN(len(held))
			tab.Release(held[j])
			held = slices.Delete(held, j, j+1)
		case op == 2 && len(held) > 0: // a completion with a body of 0 to 3 blocks
			j := rng.IntN(len(held))
			body := make([]byte, rng.IntN(700))
			tab.Complete(held[j], &shm.Response{Status: 200, Body: body}, now, time.Duration(rng.IntN(2000))*time.Millisecond)
			held = slices.Delete(held, j, j+1)
		default: // a reservation, of a key that may be completed and expired
			k := r.Counters().KeyOf(9, []byte("order-"+strconv.Itoa(rng.IntN(64))))
			if out, tk, err := tab.Begin(k, shm.Quota{}, shm.Quota{}, fpOf("x"), now, &dst); err == nil && out == shm.Reserved {
				held = append(held, tk)
			}
		}
		check("op "+strconv.Itoa(i), r)
	}
	var s shm.StatSum
	r.SumStats(&s)
	if s.Table.Reclaims == 0 || s.Table.BlocksUsed == 0 {
		t.Fatalf("the story did not exercise reclaims and blocks: %+v", s.Table)
	}

	// A load into an empty region is counted too.
	dst2, err := shm.CreatePrivate(shm.Options{Counters: 8, Responses: 16, ResponseBytes: 16 * 256, BlockSize: 256})
	if err != nil {
		t.Fatal(err)
	}
	for e := range r.Counters().Snapshot() {
		if err := dst2.Counters().Place(e); err != nil {
			t.Fatal(err)
		}
	}
	for e := range tab.Snapshot(now) {
		if err := dst2.Responses().Place(e, now); err != nil {
			t.Fatal(err)
		}
	}
	check("after a load", dst2)
}
