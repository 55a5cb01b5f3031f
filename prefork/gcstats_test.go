package prefork

import (
	"runtime"
	"testing"

	"github.com/preforkd/preforkd/internal/shmtest"
	"github.com/preforkd/preforkd/metrics"
	"github.com/preforkd/preforkd/shm"
)

// A worker's collections land in its row, where the supervisor reads them
// per worker; publishing again adds only the new ones.
func TestGCCounter(t *testing.T) {
	o := shm.Options{Counters: 8, MaxWorkers: 4}
	metrics.Geometry(&o, 1)
	region := shmtest.Create(t, o)
	w := shmtest.Attach(t, region, 2)
	read := func() uint64 {
		var s metrics.Snapshot
		metrics.ReadWorker(region, 2, &s)
		return s.Value(metrics.WorkerGCCycles, 0)
	}
	g := newGCCounter(w)
	// The runtime's count before the publish is a floor of what it
	// publishes: a collection may come in between (other tests run).
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	g.publish()
	if got := read(); got < uint64(ms.NumGC) || got == 0 && ms.NumGC > 0 {
		t.Fatalf("after the first publish the row holds %d, the runtime says %d", got, ms.NumGC)
	}
	before := read()
	runtime.GC()
	runtime.GC()
	g.publish()
	g.publish()
	if got := read(); got < before+2 || got > before+2+4 {
		t.Fatalf("two collections later the row holds %d, was %d", got, before)
	}
	var others metrics.Snapshot
	metrics.ReadWorker(region, 1, &others)
	if n := others.Value(metrics.WorkerGCCycles, 0); n != 0 {
		t.Errorf("worker 1's row holds %d cycles of worker 2's", n)
	}
}
