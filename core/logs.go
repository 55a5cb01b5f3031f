package core

import (
	"math"
	"sync/atomic"
	"time"
)

// logGate lets one log line a second through (region time) and counts the
// lines it holds back, for the next one: lines an operator acts on, which
// a flood of requests could otherwise multiply.
type logGate struct {
	last       atomic.Int64 // region time of the last line; noLog before the first
	suppressed atomic.Uint64
}

const noLog = math.MinInt64

func (g *logGate) init() { g.last.Store(noLog) }

// allow reports whether a line may be written at now, and how many were
// held back since the last one.
func (g *logGate) allow(now time.Duration) (suppressed uint64, ok bool) {
	last := g.last.Load()
	if last != noLog && now-time.Duration(last) < time.Second || !g.last.CompareAndSwap(last, int64(now)) {
		g.suppressed.Add(1)
		return 0, false
	}
	return g.suppressed.Swap(0), true
}
