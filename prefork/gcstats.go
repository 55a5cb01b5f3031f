package prefork

import (
	"runtime/debug"
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
// statistics row. debug.ReadGCStats reads it without stopping the world,
// and links far less than runtime/metrics, whose table of every metric an
// embedding program would carry for this one number.
type gcCounter struct {
	row   metrics.Row
	stats debug.GCStats // kept: its Pause slice is reused
	last  uint64
}

func newGCCounter(r *shm.Region) *gcCounter {
	return &gcCounter{row: metrics.NewRow(r)}
}

// publish adds the collections since the last call.
func (g *gcCounter) publish() {
	debug.ReadGCStats(&g.stats)
	n := uint64(g.stats.NumGC)
	g.row.SetGCCycles(g.last, n)
	g.last = max(g.last, n)
}
