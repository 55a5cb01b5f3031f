// Package waitfor waits, within a bound, for a condition that other
// goroutines make true: what a server's Close uses to wait for the
// goroutines that serve its connections to let them go.
package waitfor

import (
	"context"
	"time"
)

// Cond checks cond every millisecond until it holds or d has passed, and
// reports whether it held.
func Cond(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(time.Millisecond)
	}
	return true
}

// Until checks cond every millisecond until it holds (true) or ctx is
// done (false, unless cond holds at that moment).
func Until(ctx context.Context, cond func() bool) bool {
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-ctx.Done():
			return cond()
		case <-tick.C:
		}
	}
	return true
}
