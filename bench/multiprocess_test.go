package bench

import (
	"fmt"
	"os"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/preforkd/preforkd/bucket"
	"github.com/preforkd/preforkd/internal/proctest"
	"github.com/preforkd/preforkd/shm"
)

// The child role "decide" (internal/proctest): the region is fd 3; the
// spec says which worker index to join, how many decisions to make and
// where in the keys to start.
func TestMain(m *testing.M) {
	proctest.Main(map[string]proctest.Role{"decide": decideChild})
	os.Exit(m.Run())
}

type childSpec struct {
	Worker, Decisions, Offset int
}

// childReport is what a child reports when it is done.
type childReport struct {
	Decisions, Allowed, Mallocs uint64
}

// decideChild attaches the inherited region, joins its worker index,
// reports ready, waits for the release, makes its decisions and reports.
func decideChild(c *proctest.Child) error {
	var spec childSpec
	if err := c.Spec(&spec); err != nil {
		return err
	}
	r, err := shm.Attach(c.File(0))
	if err != nil {
		return err
	}
	defer r.Close()
	if err := r.Join(spec.Worker); err != nil {
		return err
	}
	lim, err := bucket.NewLimiter(benchRule, r.Counters())
	if err != nil {
		return err
	}
	keys := visitOrder(makeKeys(numKeys)) // the parent warmed them in makeKeys order
	if err := c.Ready(); err != nil {
		return err
	}

	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	before := ms.Mallocs
	var allowed uint64
	for i := range spec.Decisions {
		if lim.Allow(keys[(spec.Offset+i)%len(keys)], r.Now()).Allowed {
			allowed++
		}
	}
	runtime.ReadMemStats(&ms)
	return c.Report(childReport{Decisions: uint64(spec.Decisions), Allowed: allowed, Mallocs: ms.Mallocs - before})
}

// fleet is a set of started children waiting for the start signal.
type fleet struct {
	tb      testing.TB
	procs   []*proctest.Proc
	barrier *proctest.Barrier
}

// launch starts procs children on r, splitting decisions between them, and
// returns once every one of them is ready (attached, joined, keys built).
// Each child's GOMAXPROCS is its share of the machine, as the supervisor
// sizes workers.
func launch(tb testing.TB, r *shm.Region, procs, decisions int) *fleet {
	tb.Helper()
	f := &fleet{tb: tb, barrier: proctest.NewBarrier(tb)}
	gomaxprocs := max(1, runtime.NumCPU()/procs)
	for w := range procs {
		n := decisions / procs
		if w < decisions%procs {
			n++
		}
		f.procs = append(f.procs, proctest.Start(tb, proctest.Options{
			Role:    "decide",
			Spec:    childSpec{Worker: w, Decisions: n, Offset: w * numKeys / procs},
			Files:   []*os.File{r.File()},
			Barrier: f.barrier,
			Env:     []string{"GOMAXPROCS=" + strconv.Itoa(gomaxprocs)},
		}))
	}
	for _, p := range f.procs {
		p.WaitReady(time.Minute)
	}
	return f
}

// release starts every child at once.
func (f *fleet) release() { f.barrier.Release(0) }

// wait waits for every child and sums their reports.
func (f *fleet) wait() childReport {
	f.tb.Helper()
	var sum childReport
	for w, p := range f.procs {
		var rep childReport
		p.Decode(&rep, 10*time.Minute) // a benchmark's b.N decisions
		if err := p.Wait(10 * time.Second); err != nil {
			f.tb.Fatalf("child %d: %v", w, err)
		}
		sum.Decisions += rep.Decisions
		sum.Allowed += rep.Allowed
		sum.Mallocs += rep.Mallocs
	}
	return sum
}

// warmRegion makes a region and installs every key in it from this process,
// joined as the last worker index (the children take 0, 1, …).
func warmRegion(tb testing.TB) *shm.Region {
	r, err := shm.Create(shm.Options{Counters: numSlots})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { r.Close() })
	if err := r.Join(r.Geometry().MaxWorkers - 1); err != nil {
		tb.Fatal(err)
	}
	lim, err := bucket.NewLimiter(benchRule, r.Counters())
	if err != nil {
		tb.Fatal(err)
	}
	for _, k := range makeKeys(numKeys) {
		lim.Allow(k, r.Now())
	}
	return r
}

// BenchmarkMultiProcess measures the aggregate rate of procs processes
// deciding on one region: b.N decisions split between them, timed from the
// start signal to the last exit, so ns/op is wall time per decision of the
// whole fleet (procs=2 at half of procs=1 is perfect scaling). The process
// start-up is not timed; their exit is. allocs/op counts this process only;
// child-allocs/op is what the children allocated between start and finish.
func BenchmarkMultiProcess(b *testing.B) {
	for _, procs := range []int{1, 2} {
		b.Run(fmt.Sprintf("procs=%d", procs), func(b *testing.B) {
			r := warmRegion(b)
			f := launch(b, r, procs, b.N)
			b.ReportAllocs()
			b.ResetTimer()
			f.release()
			rep := f.wait()
			b.StopTimer()
			if rep.Decisions != uint64(b.N) {
				b.Fatalf("children made %d decisions, want %d", rep.Decisions, b.N)
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "decisions/s")
			b.ReportMetric(float64(rep.Mallocs)/float64(b.N), "child-allocs/op")
			b.ReportMetric(float64(rep.Allowed)/float64(b.N), "allowed/op")
		})
	}
}

// TestMultiProcess runs the benchmark's machinery once, small: two children
// on one region make every decision they were given, all allowed (the bench
// rule never refuses at this rate), without allocating per decision.
func TestMultiProcess(t *testing.T) {
	r := warmRegion(t)
	f := launch(t, r, 2, 2*numKeys+1)
	f.release()
	rep := f.wait()
	if want := uint64(2*numKeys + 1); rep.Decisions != want || rep.Allowed != want {
		t.Errorf("children made %d decisions, %d allowed; want %d, all allowed", rep.Decisions, rep.Allowed, want)
	}
	// A handful of one-time runtime allocations may happen (a goroutine's
	// first time.Sleep allocates its timer, and shm sleeps when it waits
	// for an insert lock); one per decision may not.
	if rep.Mallocs > 4 {
		t.Errorf("children allocated %d times in %d decisions, want none per decision", rep.Mallocs, rep.Decisions)
	}
}
