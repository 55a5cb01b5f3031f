package shm

import (
	"sync/atomic"
	"time"
	"unsafe"
)

// The state word: phase (2 bits) · generation (14 bits) · payload (48 bits).
const (
	phaseShift  = 62
	genShift    = 48
	genMask     = 1<<14 - 1
	PayloadMask = 1<<48 - 1 // the bits a payload may use

	phaseEmpty = 0
	phaseBusy  = 1
	phaseLive  = 2
	phaseTomb  = 3
)

func phaseOf(s uint64) uint64   { return s >> phaseShift }
func genOf(s uint64) uint64     { return s >> genShift & genMask }
func payloadOf(s uint64) uint64 { return s & PayloadMask }
func mkState(phase, gen, payload uint64) uint64 {
	return phase<<phaseShift | (gen&genMask)<<genShift | payload&PayloadMask
}

// slot is one 64-byte line: one key per cache line, so two keys never share
// a line (false sharing costs as much as true sharing).
type slot struct {
	state uint64 // phase · gen · payload; CASed
	keyA  uint64 // key identity, first seeded hash
	keyB  uint64 // key identity, second seeded hash
	meta  uint64 // caller's description of the key (what a stranger needs to judge freshness)
	ilock uint64 // insert lock for keys whose home this slot is: owner id, 0 = free
	_     [3]uint64
}

// FreshFunc reports whether a LIVE slot's payload, described by its meta,
// is equivalent at `now` to a key never seen (window over, bucket full):
// only such a slot may be reclaimed for another key. It must be pure.
type FreshFunc func(meta, payload uint64, now time.Duration) bool

// Op computes a key's next payload from its current one (0 for a new key)
// at now. write=false leaves the slot untouched (a refusal writes nothing).
// Update may call it more than once, so it must be pure. now is the
// caller's, except on payload 0 (a new or reset key): then it is at least
// the reclaim watermark (see Update).
type Op func(payload uint64, now time.Duration) (next uint64, write bool)

// Counters is the open-addressed table of counter slots in a region.
type Counters struct {
	r     *Region
	slots []slot
	mask  uint64
	probe int
	fresh atomic.Pointer[FreshFunc]
	// lockWait bounds how long Update waits for an insert lock held by a
	// live process before it answers ErrLockTimeout: defaultLockWait,
	// shortened by tests.
	lockWait time.Duration
}

func newCounters(r *Region, s []slot) *Counters {
	c := &Counters{r: r, slots: s, mask: uint64(len(s) - 1), probe: r.geo.Probe, lockWait: defaultLockWait}
	c.SetFresh(zeroIsFresh)
	return c
}

func zeroIsFresh(_, payload uint64, _ time.Duration) bool { return payload == 0 }

// SetFresh installs the freshness judgement for reclaims; until then only
// payload 0 counts as fresh. Every process must judge alike: install it
// before the table is used.
func (c *Counters) SetFresh(f FreshFunc) { c.fresh.Store(&f) }

func (c *Counters) isFresh(meta, payload uint64, now time.Duration) bool {
	return (*c.fresh.Load())(meta, payload, now)
}

// Len is the number of slots.
func (c *Counters) Len() int { return len(c.slots) }

// Test hooks: called at the protocol's crash points (nil in production).
// Stages: "locked" (insert lock held), "busy" (slot claimed, key not
// written), "keyed" (key written, not published), "published" (LIVE, the
// insert lock still held).
var testHook func(stage string)

// Update applies op to k's payload with one CAS and returns the payload op
// was last applied to (the one its result was based on). A key seen for the
// first time is installed with meta, its payload starting at 0. Errors:
// ErrFull, ErrLockTimeout or ErrRetired (no slot could be had: the
// caller's on_full policy decides) and ErrNotJoined.
//
// A key without a slot may be one whose slot was reclaimed, judged fresh at
// another process's later `now`. Starting it afresh at an earlier `now`
// (a caller that read the clock and was then descheduled) would grant it a
// second allowance in a window it had used up. So op runs on a new key —
// and on any payload 0 — no earlier than the reclaim watermark, the latest
// `now` at which any slot was reclaimed, where the lost state was
// certainly fresh: the same rule as for a clock that went backwards (the
// later time counts). A new key's first decision is published together
// with the key, so a just-installed key never shows a fresh payload.
func (c *Counters) Update(k Key, meta uint64, now time.Duration, op Op) (uint64, error) {
	owner := c.r.owner.Load()
	if owner == 0 {
		return 0, ErrNotJoined
	}
	home := k.A & c.mask
	locked := false
	for {
		i, s, cand, found := c.scan(k, home, now)
		if found {
			if locked {
				c.unlock(home, owner)
			}
			return c.apply(k, i, s, meta, now, op)
		}
		if cand < 0 {
			if locked {
				c.unlock(home, owner)
			}
			c.r.count(evFull, 1)
			return 0, ErrFull
		}
		if !locked {
			if c.r.stale(owner) {
				return 0, ErrRetired // a retired process claims nothing
			}
			// Claims take the home slot's insert lock and rescan under it:
			// without it two processes can install one key in two slots.
			if err := c.lock(home, owner); err != nil {
				return 0, err
			}
			locked = true
			if testHook != nil {
				testHook("locked")
			}
			continue
		}
		if ok := c.claim(cand, k, meta, owner, now, op); ok {
			if testHook != nil {
				testHook("published")
			}
			c.unlock(home, owner)
			return 0, nil
		}
		if c.r.stale(owner) {
			return 0, ErrRetired // our lock and claims are void: never spin on them
		}
	}
}

// scan probes from home. It returns the slot holding k (found) with the
// state read before its key, or else the slot a claim should take (cand,
// -1 if none): the first EMPTY or TOMB slot, and only when there is none
// the first LIVE slot equivalent to a fresh key — evicting a live key,
// even one that carries no allowance, costs a lock and a claim later.
// Stale BUSY slots met on the way are released.
func (c *Counters) scan(k Key, home uint64, now time.Duration) (i int, s uint64, cand int, found bool) {
	free, fresh := -1, -1
	for j := 0; j < c.probe; j++ {
		i = int((home + uint64(j)) & c.mask)
		sl := &c.slots[i]
		// State before key: the other order lets a CAS from a stale
		// snapshot land on a slot that another key has taken since.
		s = atomic.LoadUint64(&sl.state)
		switch phaseOf(s) {
		case phaseEmpty:
			// Slots never return to EMPTY, so no key lies beyond one.
			if free < 0 {
				free = i
			}
			return i, s, free, false
		case phaseTomb:
			if free < 0 {
				free = i
			}
		case phaseBusy:
			if c.r.stale(payloadOf(s)) && c.releaseBusy(sl, s) && free < 0 {
				free = i // a tombstone now
			}
		case phaseLive:
			if atomic.LoadUint64(&sl.keyA) == k.A && atomic.LoadUint64(&sl.keyB) == k.B {
				return i, s, -1, true
			}
			if free < 0 && fresh < 0 && c.isFresh(atomic.LoadUint64(&sl.meta), payloadOf(s), now) {
				fresh = i
			}
		}
	}
	if free >= 0 {
		return -1, 0, free, false
	}
	return -1, 0, fresh, false
}

// apply runs op on the LIVE slot i, snapshot s, and CASes the result in.
// On contention it retries on the same slot while its generation holds,
// and rescans when the slot was taken over.
func (c *Counters) apply(k Key, i int, s uint64, meta uint64, now time.Duration, op Op) (uint64, error) {
	sl := &c.slots[i]
	for {
		p := payloadOf(s)
		at := now
		if p == 0 {
			// As fresh as a new key, and perhaps one whose state was
			// reclaimed at a later `now`: the same rule as in claim.
			at = max(now, c.reclaimMark())
		}
		next, write := op(p, at)
		if !write {
			return p, nil
		}
		if atomic.CompareAndSwapUint64(&sl.state, s, mkState(phaseLive, genOf(s), next)) {
			return p, nil
		}
		s2 := atomic.LoadUint64(&sl.state)
		if phaseOf(s2) == phaseLive && genOf(s2) == genOf(s) {
			s = s2 // same key, newer payload: recompute
			continue
		}
		// The slot was reclaimed (our key had turned fresh): start over.
		return c.Update(k, meta, now, op)
	}
}

// claim installs k in slot i, which the caller found claimable while
// holding k's insert lock, and publishes op's first decision with it:
// BUSY → LIVE(op(0)). Publishing a LIVE payload 0 instead and applying op
// afterwards leaves a window in which the slot looks fresh: another
// installer can reclaim it (two installers can take one last slot from
// each other forever), and a process with a stale `now` can apply to the
// fresh key in a window it has used up. The spin model found both.
func (c *Counters) claim(i int, k Key, meta, owner uint64, now time.Duration, op Op) bool {
	sl := &c.slots[i]
	s := atomic.LoadUint64(&sl.state)
	reclaim := false
	switch phaseOf(s) {
	case phaseEmpty, phaseTomb:
	case phaseLive:
		if !c.isFresh(atomic.LoadUint64(&sl.meta), payloadOf(s), now) {
			return false
		}
		reclaim = true
	default:
		return false
	}
	gen := genOf(s) + 1
	busy := mkState(phaseBusy, gen, owner)
	if reclaim {
		// Raised before the old key's state is gone, so that whoever
		// misses that key from now on starts it no earlier than now.
		c.raiseReclaimMark(now)
	}
	if !atomic.CompareAndSwapUint64(&sl.state, s, busy) {
		return false
	}
	if reclaim {
		c.r.count(evEvictions, 1) // no longer LIVE: the live count follows
	}
	if testHook != nil {
		testHook("busy")
	}
	atomic.StoreUint64(&sl.keyA, k.A)
	atomic.StoreUint64(&sl.keyB, k.B)
	atomic.StoreUint64(&sl.meta, meta)
	if testHook != nil {
		testHook("keyed")
	}
	// The key may be one whose slot was reclaimed, judged fresh at another
	// process's later `now`: decide no earlier than the reclaim watermark.
	next, write := op(0, max(now, c.reclaimMark()))
	if !write {
		next = 0
	}
	if !atomic.CompareAndSwapUint64(&sl.state, busy, mkState(phaseLive, gen, next)) {
		// Only a sweep that judged us dead can have moved it: we were
		// reaped and are a zombie; nothing we write may count.
		return false
	}
	if reclaim {
		c.r.count(evReclaims, 1)
	} else {
		c.r.count(evClaims, 1)
	}
	return true
}

func (c *Counters) markWord() *uint64 {
	return (*uint64)(unsafe.Pointer(&c.r.data[hReclaimed]))
}

func (c *Counters) reclaimMark() time.Duration {
	return time.Duration(atomic.LoadUint64(c.markWord()))
}

func (c *Counters) raiseReclaimMark(now time.Duration) {
	w := c.markWord()
	for {
		old := atomic.LoadUint64(w)
		if int64(old) >= int64(now) || atomic.CompareAndSwapUint64(w, old, uint64(now)) {
			return
		}
	}
}

// lock takes the insert lock of home slot h, releasing it from a dead
// holder, and waits a bounded time for a live one.
func (c *Counters) lock(h, owner uint64) error {
	err := lockWord(c.r, &c.slots[h].ilock, owner, c.lockWait)
	if err != nil {
		c.r.count(evLockTimeout, 1)
	}
	return err
}

func (c *Counters) unlock(h, owner uint64) { unlockWord(&c.slots[h].ilock, owner) }

// releaseBusy turns a BUSY slot of a dead owner into a tombstone.
func (c *Counters) releaseBusy(sl *slot, s uint64) bool {
	if atomic.CompareAndSwapUint64(&sl.state, s, mkState(phaseTomb, genOf(s), 0)) {
		c.r.count(evRecovered, 1)
		return true
	}
	return false
}

// releaseStale sweeps the table for BUSY slots and insert locks of dead
// owners and releases each with one CAS.
func (c *Counters) releaseStale() (n int) {
	for i := range c.slots {
		sl := &c.slots[i]
		if s := atomic.LoadUint64(&sl.state); phaseOf(s) == phaseBusy && c.r.stale(payloadOf(s)) && c.releaseBusy(sl, s) {
			n++
		}
		if l := atomic.LoadUint64(&sl.ilock); l != 0 && c.r.stale(l) && atomic.CompareAndSwapUint64(&sl.ilock, l, 0) {
			n++
		}
	}
	return n
}

// Peek returns k's payload without claiming a slot; ok is false when the
// key has no slot (it is as fresh).
func (c *Counters) Peek(k Key, now time.Duration) (payload uint64, ok bool) {
	_, s, _, found := c.scan(k, k.A&c.mask, now)
	if !found {
		return 0, false
	}
	return payloadOf(s), true
}

// Reset sets k's payload to 0 (as a fresh key) if it has a slot, which
// also makes the slot reclaimable.
func (c *Counters) Reset(k Key, now time.Duration) {
	for {
		i, s, _, found := c.scan(k, k.A&c.mask, now)
		if !found || payloadOf(s) == 0 {
			return
		}
		if atomic.CompareAndSwapUint64(&c.slots[i].state, s, mkState(phaseLive, genOf(s), 0)) {
			return
		}
	}
}
