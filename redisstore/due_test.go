package redisstore

import (
	"testing"
	"time"
)

// A rule is flushed at the last tick of the flusher before its interval
// would have passed, so it is never left unflushed longer than its
// interval: also when a tick comes a moment early, and when its interval
// is not a multiple of the tick.
func TestFlushDue(t *testing.T) {
	const ms = time.Millisecond
	for _, c := range []struct {
		since, sync, every time.Duration
		want               bool
	}{
		{20 * ms, 20 * ms, 20 * ms, true},
		{20*ms - time.Microsecond, 20 * ms, 20 * ms, true}, // an early tick
		{20 * ms, 30 * ms, 20 * ms, true},                  // the next tick (40) would be late
		{20 * ms, 60 * ms, 20 * ms, false},
		{40 * ms, 60 * ms, 20 * ms, false}, // the next tick (60) is in time
		{60*ms - time.Microsecond, 60 * ms, 20 * ms, true},
		{0, 20 * ms, 20 * ms, false}, // flushed at this very instant
	} {
		if got := due(c.since, c.sync, c.every); got != c.want {
			t.Errorf("due(since %v, sync %v, tick %v) = %v, want %v", c.since, c.sync, c.every, got, c.want)
		}
	}
	// Over a run of ticks, each a little early or late, the longest time
	// a rule waits for a flush is its interval plus a tick's lateness.
	for _, sync := range []time.Duration{20 * ms, 30 * ms, 50 * ms, 70 * ms, 1000 * ms} {
		every := 20 * ms
		var now, last, longest time.Duration
		for i := 1; i <= 200; i++ {
			jitter := time.Duration(i%7-3) * 100 * time.Microsecond // −0.3 .. +0.3 ms
			now = time.Duration(i)*every + jitter
			if due(now-last, sync, every) {
				longest = max(longest, now-last)
				last = now
			}
		}
		if longest > sync+600*time.Microsecond {
			t.Errorf("interval %v, tick %v: a flush waited %v", sync, every, longest)
		}
	}
}
