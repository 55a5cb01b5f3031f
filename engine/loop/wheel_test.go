//go:build linux

package loop

import (
	"math"
	"testing"
	"time"
)

// ticks rounds up, at least one, for every duration a file may give: the
// largest ("2562047h47m16.854775807s") overflowed the rounding and fired
// at the first tick.
func TestTicks(t *testing.T) {
	const most = time.Duration(math.MaxInt64)
	for d, want := range map[time.Duration]int64{
		0: 1, 1: 1, tick - 1: 1, tick: 1, tick + 1: 2, time.Hour: int64(time.Hour / tick),
		most - most%tick: int64(most / tick), most: int64(most/tick) + 1,
	} {
		if got := ticks(d); got != want {
			t.Errorf("ticks(%v) = %d, want %d", d, got, want)
		}
	}
}
