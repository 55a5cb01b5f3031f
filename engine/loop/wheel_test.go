//go:build linux

package loop

import (
	"math"
	"slices"
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

type firing struct {
	at *int64
	w  *wheel
}

func (f firing) expire() { *f.at = f.w.now }

// A loop that sleeps until its earliest timer (next) and then catches up
// with the clock at once (advanceTo) fires every timer at the tick it is
// due, as ticking each tick does: one due in the next round, one rounds
// away, one moved later while in its slot, one disarmed; and a wheel more
// than a round behind fires what is overdue and keeps the rest.
func TestWheelSleepsToTheEarliestTimer(t *testing.T) {
	var w wheel
	w.init()
	if got := w.next(); got != never {
		t.Fatalf("next of an empty wheel = %d, want never", got)
	}
	fired := make([]int64, 4)
	ts := make([]timer, 4)
	for i := range ts {
		ts[i].f = firing{&fired[i], &w}
	}
	w.armAt(&ts[0], 100)
	w.armAt(&ts[1], 3*wheelSlots+7)
	w.armAt(&ts[2], 50)
	w.armAt(&ts[2], 60+wheelSlots) // later: it stays in slot 50
	w.armAt(&ts[3], 20)
	w.disarm(&ts[3])
	count := func() (n int) {
		for _, f := range fired {
			if f != 0 {
				n++
			}
		}
		return n
	}
	for i, want := range []int64{100, 60 + wheelSlots, 3*wheelSlots + 7} {
		at := w.next()
		if at != want {
			t.Fatalf("at %d: next = %d, want %d", w.now, at, want)
		}
		w.advanceTo(at - 1) // an event wakes the loop just before
		if n := count(); n != i {
			t.Fatalf("at %d: %d timers fired, want %d: %v", w.now, n, i, fired)
		}
		w.advanceTo(at)
		if n := count(); n != i+1 {
			t.Fatalf("at %d: %d timers fired, want %d: %v", w.now, n, i+1, fired)
		}
	}
	if want := []int64{100, 3*wheelSlots + 7, 60 + wheelSlots, 0}; !slices.Equal(fired, want) {
		t.Fatalf("fired at %v, want %v", fired, want)
	}
	if got := w.next(); got != never {
		t.Fatalf("next after all fired = %d", got)
	}

	// More than a round behind.
	clear(fired)
	now := w.now
	w.arm(&ts[0], tick)
	w.armAt(&ts[1], now+10*wheelSlots)
	w.advanceTo(now + 5*wheelSlots)
	if fired[0] != now+5*wheelSlots || fired[1] != 0 {
		t.Fatalf("after a jump: fired at %v, want the overdue one at %d and not the other", fired[:2], now+5*wheelSlots)
	}
	if got := w.next(); got != now+10*wheelSlots {
		t.Fatalf("next after a jump = %d, want %d", got, now+10*wheelSlots)
	}
	w.advanceTo(now + 10*wheelSlots)
	if fired[1] != now+10*wheelSlots {
		t.Fatalf("fired at %d after a jump, want %d", fired[1], now+10*wheelSlots)
	}
}
