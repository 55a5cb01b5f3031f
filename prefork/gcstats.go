package prefork

import (
	runtimemetrics "runtime/metrics"
	"time"

	"github.com/preforkd/preforkd/metrics"
	"github.com/preforkd/preforkd/shm"
)

// gcEvery is how often a worker writes its GC cycles into its row of the
// region's statistics, where the supervisor's /metrics reads them
// (metrics.WorkerGCCycles): the supervisor reads a worker's memory, CPU
// and descriptors from /proc, but only the process knows its collections.
const gcEvery = time.Second

// gcCounter copies this process's count of garbage collections into its
// statistics row. runtime/metrics reads it without stopping the world.
type gcCounter struct {
	row    metrics.Row
	sample [1]runtimemetrics.Sample
	last   uint64
}

func newGCCounter(r *shm.Region) *gcCounter {
	g := &gcCounter{row: metrics.NewRow(r)}
	g.sample[0].Name = "/gc/cycles/total:gc-cycles"
	return g
}

// publish adds the collections since the last call.
func (g *gcCounter) publish() {
	runtimemetrics.Read(g.sample[:])
	if g.sample[0].Value.Kind() != runtimemetrics.KindUint64 {
		return // a runtime without the metric
	}
	n := g.sample[0].Value.Uint64()
	g.row.SetGCCycles(g.last, n)
	g.last = max(g.last, n)
}
