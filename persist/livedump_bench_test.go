//go:build linux

package persist

import (
	"encoding/binary"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/preforkd/preforkd/bucket"
	"github.com/preforkd/preforkd/internal/proctest"
	"github.com/preforkd/preforkd/shm"
)

// BenchmarkDecideDuringDump measures what a dump of a full 1M-slot table
// (persist.interval) costs the workers: two worker processes (one CPU
// each, as the supervisor sizes them) make b.N decisions between them on
// the table, timing each one, while this process, as the supervisor,
// does nothing (dump=none) or dumps the region back to back
// (dump=continuous: every decision is made during a dump). Each decision
// writes (the rule admits a million a day per key). Reported: each
// decision's latency, p50, p99, p99.9 and max over both workers (ns),
// and with dumps the dumps made and their mean duration.
func BenchmarkDecideDuringDump(b *testing.B) {
	lr := liveRegionFor(b)
	for _, dump := range []string{"none", "continuous", "continuous-nice0"} {
		name := "dump=" + dump
		b.Run(name, func(b *testing.B) {
			lat, dumps, took := decideWhile(b, lr, dump)
			b.ReportMetric(100*lr.occ, "%occupied")
			b.ReportMetric(float64(quantile(lat, 0.50)), "p50-ns")
			b.ReportMetric(float64(quantile(lat, 0.99)), "p99-ns")
			b.ReportMetric(float64(quantile(lat, 0.999)), "p99.9-ns")
			b.ReportMetric(float64(quantile(lat, 1)), "max-ns")
			if dump != "none" {
				b.ReportMetric(float64(dumps), "dumps")
				if dumps > 0 {
					b.ReportMetric(float64(took.Milliseconds())/float64(dumps), "ms/dump")
				}
			}
		})
	}
}

// liveRegion is a 1M-slot region offered 1.5M keys of a rule that admits a
// million requests a day per key (so that every decision writes, and no
// entry is as fresh as a new key: a dump writes them all); the first
// hotKeys keys, offered to an empty table, all hold a slot.
type liveRegion struct {
	r   *shm.Region
	o   Options
	occ float64
}

const hotKeys = 10000

var liveRule = bucket.Rule{Name: "live", Limit: 1_000_000, Window: 24 * time.Hour}

var (
	liveOnce sync.Once
	liveReg  *liveRegion
	liveErr  error
)

func liveRegionFor(b *testing.B) *liveRegion {
	liveOnce.Do(func() {
		r, err := shm.Create(shm.Options{Counters: benchSlots})
		if err != nil {
			liveErr = err
			return
		}
		if err := r.Join(r.Geometry().MaxWorkers - 1); err != nil {
			liveErr = err
			return
		}
		lim, err := bucket.NewLimiter(liveRule, r.Counters())
		if err != nil {
			liveErr = err
			return
		}
		now := r.Now()
		var id [8]byte
		for i := range benchSlots * 3 / 2 {
			binary.LittleEndian.PutUint64(id[:], uint64(i))
			lim.AllowKey(lim.Key(id[:]), now)
		}
		dir, err := os.MkdirTemp("", "persist-live-bench-")
		if err != nil {
			liveErr = err
			return
		}
		benchCleanups = append(benchCleanups, func() { r.Close(); os.RemoveAll(dir) })
		liveReg = &liveRegion{r: r, o: Options{Path: filepath.Join(dir, "dump"), Rules: []bucket.Rule{liveRule}},
			occ: r.Counters().Stats().Occupancy()}
	})
	if liveErr != nil {
		b.Fatal(liveErr)
	}
	return liveReg
}

// decideSpec is what a "decide" child is told.
type decideSpec struct {
	Worker, Decisions int
	Seed              uint64
}

// decideReport is each decision's latency in ns, and how many were
// allowed.
type decideReport struct {
	Latencies []uint32
	Allowed   int
}

// decideWhile runs b.N decisions in two children on lr's region, dumping
// it back to back meanwhile when dump is set; it returns every decision's
// latency, and the dumps made and their total duration.
func decideWhile(b *testing.B, lr *liveRegion, dump string) (lat []uint32, dumps int, took time.Duration) {
	const procs = 2
	barrier := proctest.NewBarrier(b)
	var ps []*proctest.Proc
	for w := range procs {
		n := b.N / procs
		if w < b.N%procs {
			n++
		}
		ps = append(ps, proctest.Start(b, proctest.Options{
			Role:    "decide",
			Spec:    decideSpec{Worker: w, Decisions: n, Seed: uint64(w + 1)},
			Files:   []*os.File{lr.r.File()},
			Barrier: barrier,
			Env:     []string{"GOMAXPROCS=" + strconv.Itoa(max(1, runtime.NumCPU()/procs))},
		}))
	}
	for _, p := range ps {
		p.WaitReady(time.Minute)
	}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		if dump == "none" {
			return
		}
		for {
			select {
			case <-stop:
				return
			default:
			}
			start := time.Now()
			var err error
			if dump == "continuous" {
				err = lowPriority(func() error { _, err := Dump(lr.r, lr.o); return err })
			} else {
				_, err = Dump(lr.r, lr.o)
			}
			if err != nil {
				b.Error(err)
				return
			}
			took += time.Since(start)
			dumps++
		}
	}()
	if dump != "none" {
		// The first dump is under way before the workers begin.
		time.Sleep(5 * time.Millisecond)
	}
	b.ResetTimer()
	barrier.Release(0)
	for w, p := range ps {
		var rep decideReport
		p.Decode(&rep, 10*time.Minute)
		if err := p.Wait(10 * time.Second); err != nil {
			b.Fatalf("child %d: %v", w, err)
		}
		if rep.Allowed != len(rep.Latencies) {
			b.Fatalf("child %d: %d of %d decisions allowed, want all", w, rep.Allowed, len(rep.Latencies))
		}
		lat = append(lat, rep.Latencies...)
	}
	b.StopTimer()
	close(stop)
	<-done
	slices.Sort(lat)
	return lat, dumps, took
}

// decideChild attaches the region (fd 3), joins its worker index and
// makes its decisions on the hot keys in a random order, timing each.
func decideChild(c *proctest.Child) error {
	var spec decideSpec
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
	lim, err := bucket.NewLimiter(liveRule, r.Counters())
	if err != nil {
		return err
	}
	keys := make([]shm.Key, hotKeys)
	var id [8]byte
	for i := range keys {
		binary.LittleEndian.PutUint64(id[:], uint64(i))
		keys[i] = lim.Key(id[:])
	}
	rng := rand.New(rand.NewPCG(spec.Seed, 0))
	rng.Shuffle(len(keys), func(i, j int) { keys[i], keys[j] = keys[j], keys[i] })
	rep := decideReport{Latencies: make([]uint32, spec.Decisions)}
	if err := c.Ready(); err != nil {
		return err
	}
	for i := range spec.Decisions {
		start := r.Now()
		d := lim.AllowKey(keys[i%len(keys)], start)
		rep.Latencies[i] = uint32(min(r.Now()-start, time.Duration(^uint32(0))))
		if d.Allowed {
			rep.Allowed++
		}
	}
	return c.Report(rep)
}

// quantile is the q-quantile of sorted (q = 1: the largest).
func quantile(sorted []uint32, q float64) uint32 {
	if len(sorted) == 0 {
		return 0
	}
	i := min(int(q*float64(len(sorted))), len(sorted)-1)
	return sorted[i]
}
