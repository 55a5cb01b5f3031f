package engine

import (
	"sync"
	"time"
)

// WarnGate lets one warning line of a kind through a second, so that a
// client that makes an engine warn on every request cannot flood the log;
// the next line it lets through says how many it held back.
type WarnGate struct {
	mu   sync.Mutex
	last time.Time
	held int64
}

// Pass reports whether a warning may be written at now, and how many were
// held back since the last one written.
func (g *WarnGate) Pass(now time.Time) (held int64, ok bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.last.IsZero() && now.Sub(g.last) < time.Second {
		g.held++
		return 0, false
	}
	held = g.held
	g.last, g.held = now, 0
	return held, true
}

// Args is Pass for a line of attributes args: when the warning may be
// written at now, it returns args with "suppressed" and the number held
// back added, if any were.
func (g *WarnGate) Args(now time.Time, args ...any) ([]any, bool) {
	held, ok := g.Pass(now)
	if ok && held > 0 {
		args = append(args, "suppressed", held)
	}
	return args, ok
}
