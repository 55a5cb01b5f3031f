package core

import (
	"time"

	"github.com/preforkd/preforkd/shm"
)

// lineGate lets one log line a second through, across every worker of the
// region (shm.Gate), and says how many it held back: the total of the
// events it gates, over all workers, less the total at the last line
// (which that line's writer left as the gate's mark). The lines are the
// ones an operator acts on, which a flood of requests in many workers
// would otherwise multiply.
type lineGate struct {
	g     shm.Gate
	total func() uint64 // the events counted so far, every worker's
}

// allow reports whether a line may be written at now (region time), and
// how many events since the last line went without one.
func (g *lineGate) allow(now time.Duration) (suppressed uint64, ok bool) {
	if !g.g.Pass(now, time.Second) {
		return 0, false
	}
	t := g.total()
	if prev := g.g.SwapMark(t); t > prev {
		return t - prev - 1, true
	}
	return 0, true
}
