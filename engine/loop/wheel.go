//go:build linux

package loop

import (
	"math"
	"time"
)

// The timeouts of a loop's connections, on a hashed timer wheel: a slot
// per tick, a timer in the slot of the tick it is due at (modulo the
// wheel's size). Moving a timer later — what every read and write of a
// connection does — only changes its due tick: the timer stays in its
// slot, and moves on when that slot comes round. So the busy path costs
// a store, and a timer is touched about once per timeout, not per event.

const wheelSlots = 1024 // a round: 25.6 s at a 25 ms tick

// timer is one connection's timeout, intrusive: a connection has one and
// arms it for whichever of its waits is current.
type timer struct {
	due        int64 // the tick it fires at; 0 when disarmed
	slot       int64 // the tick of the slot that holds it; 0 when in none
	prev, next *timer
	f          expirer
}

// expirer is what a timer tells when it fires.
type expirer interface{ expire() }

// wheel is a loop's timers. It is used by its loop only.
type wheel struct {
	now int64 // ticks since the loop started; 1 at the start
	// clock is the tick the loop read as its round of events began: its
	// ticks fire the timers in a task of their own, after the round's
	// events, so now trails it when the loop was held up (at).
	clock  int64
	slots  [wheelSlots]timer
	firing timer // the timers of the slot being fired
}

func (w *wheel) init() {
	w.now = 1
	for i := range w.slots {
		s := &w.slots[i]
		s.prev, s.next = s, s
	}
	w.firing.prev, w.firing.next = &w.firing, &w.firing
}

// ticks converts a duration to the ticks that cover it, at least one.
func ticks(d time.Duration) int64 {
	n := int64(d / tick) // rounded up below: d + tick - 1 could overflow
	if d%tick != 0 {
		n++
	}
	return max(n, 1)
}

// at is the tick the loop is at: the clock as its round began, or the
// wheel's now if that is later. Waits count from it.
func (w *wheel) at() int64 { return max(w.now, w.clock) }

// due is the tick at which d from now has passed: at is a tick read up
// to a tick ago, so one more is counted (a timeout fires between d and d
// plus two ticks, never before, however late the wheel's firing is).
func (w *wheel) due(d time.Duration) int64 { return w.at() + 1 + ticks(d) }

// arm makes t fire d from now.
func (w *wheel) arm(t *timer, d time.Duration) {
	w.armAt(t, w.due(d))
}

// armAt makes t fire at the tick due (the next, if due passed).
func (w *wheel) armAt(t *timer, due int64) {
	due = max(due, w.now+1)
	t.due = due
	if t.slot != 0 && t.slot <= due {
		return // it moves on when its slot comes round
	}
	w.unlink(t)
	w.link(t, due)
}

// disarm stops t. It stays linked until its slot comes round or it is
// armed again; unlink takes it out for good.
func (w *wheel) disarm(t *timer) { t.due = 0 }

func (w *wheel) link(t *timer, at int64) {
	s := &w.slots[at%wheelSlots]
	t.slot = at
	t.prev, t.next = s.prev, s
	s.prev.next = t
	s.prev = t
}

// unlink takes t out of the wheel, if it is in it.
func (w *wheel) unlink(t *timer) {
	if t.slot == 0 {
		return
	}
	t.prev.next, t.next.prev = t.next, t.prev
	t.prev, t.next, t.slot = nil, nil, 0
}

// advanceTo moves the wheel on to the tick to, firing the timers due by
// then tick by tick. A timer fired may arm or unlink timers, its own and
// the others of the slot included. A wheel that is more than a round
// behind (its loop slept, or was held up) has every slot come round: they
// are taken at once, and what is overdue fires together.
func (w *wheel) advanceTo(to int64) {
	if to-w.now > wheelSlots {
		w.now = to
		for i := range w.slots {
			w.take(&w.slots[i])
		}
		w.fire()
		return
	}
	for w.now < to {
		w.now++
		w.take(&w.slots[w.now%wheelSlots])
		w.fire()
	}
}

// take moves the timers of slot s to the firing list, a list like the
// others (unlink works on it): what firing arms goes into the slots
// afresh.
func (w *wheel) take(s *timer) {
	if s.next == s {
		return
	}
	f := &w.firing
	first, last := s.next, s.prev
	f.prev.next, first.prev = first, f.prev
	last.next, f.prev = f, last
	s.prev, s.next = s, s
}

// fire empties the firing list: each timer is due now and fires, is due
// later and goes to its slot, or was disarmed and goes.
func (w *wheel) fire() {
	f := &w.firing
	for f.next != f {
		t := f.next
		w.unlink(t)
		switch {
		case t.due == 0:
		case t.due > w.now:
			w.link(t, t.due)
		default:
			t.due = 0
			t.f.expire()
		}
	}
}

// never is the due tick of a wheel with no timer armed.
const never = math.MaxInt64

// next is the earliest tick a timer is due at, or never. Slots are looked
// at in the order they come round, and a timer is never due before its
// slot comes round (armAt moves it to an earlier slot, never a later
// one), so the look ends at the first slot that comes round after the
// earliest due found: at most a round of slots, and the timers of those
// slots. It is for a loop about to sleep, not for every tick.
func (w *wheel) next() int64 {
	best := int64(never)
	for at := w.now + 1; at <= w.now+wheelSlots && at < best; at++ {
		s := &w.slots[at%wheelSlots]
		for t := s.next; t != s; t = t.next {
			if t.due != 0 && t.due < best {
				best = t.due
			}
		}
	}
	return best
}
