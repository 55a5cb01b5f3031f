// Package looptest runs a test's background loops: goroutines that each
// call a step over and over until the test stops them.
package looptest

import (
	"context"
	"sync"
	"testing"
	"time"
)

// Loops are goroutines that each call a step over and over until they
// are stopped.
type Loops struct {
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// Start returns loops that stop when Stop is called, when limit has
// passed (no limit if it is 0), or when t ends at the latest: its cleanup
// stops them and waits for them.
func Start(t testing.TB, limit time.Duration) *Loops {
	var ctx context.Context
	var cancel context.CancelFunc
	if limit > 0 {
		ctx, cancel = context.WithTimeout(t.Context(), limit)
	} else {
		ctx, cancel = context.WithCancel(t.Context())
	}
	l := &Loops{ctx: ctx, cancel: cancel}
	t.Cleanup(l.Stop)
	return l
}

// Go calls step over and over, on a goroutine of its own, until the loops
// stop; a step under way is not interrupted.
func (l *Loops) Go(step func()) {
	l.wg.Go(func() {
		for l.ctx.Err() == nil {
			step()
		}
	})
}

// Stop stops the loops and waits for every step under way to return. It
// may be called more than once.
func (l *Loops) Stop() {
	l.cancel()
	l.wg.Wait()
}
