package shm

import (
	"slices"
	"sync"
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
	acct  uint64 // the account the slot is charged to, plus one; 0 = none (see accounts)
	_     [2]uint64
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
	acc   accounts
	fresh atomic.Pointer[FreshFunc]
	// uses are the meta words this process writes (Use), sorted; usesMu
	// serialises their changes.
	uses   atomic.Pointer[[]uint64]
	usesMu sync.Mutex
	// lockWait bounds how long Update waits for an insert lock held by a
	// live process before it answers ErrLockTimeout: defaultLockWait,
	// shortened by tests.
	lockWait time.Duration
}

func newCounters(r *Region, s []slot, accts []account) *Counters {
	c := &Counters{r: r, slots: s, mask: uint64(len(s) - 1), probe: r.geo.Probe, lockWait: defaultLockWait}
	c.acc = accounts{r: r, a: accts, n: len(s),
		word:   func(i int) *uint64 { return &s[i].acct },
		state:  func(i int) *uint64 { return &s[i].state },
		capped: ErrQuota,
	}
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

// Use records that this process writes entries under meta (a rule's
// definition: package bucket's limiters call it as they are made), and
// publishes the set of them in the process's worker entry. Once every
// live worker publishes the same set, an entry under a meta outside it is
// one no process can reach again (the state of a rule's definition before
// a reload that changed its window or algorithm): superseded, it is taken
// over like a fresh one by an account at its maximum (see Update). A
// claim uses its meta itself, but a process should call Use for each
// meta before it serves: until it has, it keeps every other from judging
// anything superseded.
func (c *Counters) Use(meta uint64) {
	if c.using(meta) {
		return
	}
	c.usesMu.Lock()
	defer c.usesMu.Unlock()
	if c.using(meta) {
		return
	}
	var old []uint64
	if p := c.uses.Load(); p != nil {
		old = *p
	}
	// A new slice, in order: readers hold the old one.
	i, _ := slices.BinarySearch(old, meta)
	next := append(append(append(make([]uint64, 0, len(old)+1), old[:i]...), meta), old[i:]...)
	c.uses.Store(&next)
	c.publishUses()
}

// using reports whether this process has recorded meta (Use).
func (c *Counters) using(meta uint64) bool {
	p := c.uses.Load()
	if p == nil {
		return false
	}
	_, ok := slices.BinarySearch(*p, meta)
	return ok
}

// usesWord is the word that stands for this process's set of metas in its
// worker entry: never 0, the word of an entry no process of this build
// has written.
func (c *Counters) usesWord() uint64 {
	h := uint64(0x9e3779b97f4a7c15)
	if p := c.uses.Load(); p != nil {
		for _, m := range *p {
			h = (h ^ m) * 0xbf58476d1ce4e5b9
			h ^= h >> 31
		}
	}
	return max(h, 1)
}

// publishUses writes this process's set of metas in its worker entry, if
// it has joined.
func (c *Counters) publishUses() {
	if o := c.r.owner.Load(); o != 0 {
		atomic.StoreUint64(&c.r.workers[o>>32].uses, c.usesWord())
	}
}

// settled reports whether every live worker process (joined and not
// reaped) has published this process's set of metas: then none writes a
// meta outside it.
func (c *Counters) settled() bool {
	mine := c.usesWord()
	for w := range c.r.workers {
		e := &c.r.workers[w]
		if atomic.LoadUint64(&e.pid) != 0 && atomic.LoadUint64(&e.uses) != mine {
			return false
		}
	}
	return true
}

// yields reports whether the LIVE slot sl, in state s, may be taken by a
// new key: its state is as fresh as none, or superseded (see Use). The
// slot's state and meta are read before the live workers' sets: a worker
// that wrote it under a meta of a new set had published that set first.
func (c *Counters) yields(sl *slot, s uint64, now time.Duration) bool {
	held := atomic.LoadUint64(&sl.meta)
	if c.isFresh(held, payloadOf(s), now) {
		return true
	}
	return !c.using(held) && c.settled()
}

// Len is the number of slots.
func (c *Counters) Len() int { return len(c.slots) }

// Held reports how many slots the keys of account a hold: one load, never
// a walk of the table.
func (c *Counters) Held(a uint16) int { return c.acc.held(a) }

// Test hooks: called at the protocol's crash points (nil in production).
// Stages: "locked" (insert lock held), "busy" (slot claimed, key not
// written), "charged" (an account's count raised, the element's charge
// not written, the account's lock held), "uncharged" (a charge cleared,
// the count not lowered, the lock held), "keyed" (key written, not
// published), "published" (LIVE, the insert lock still held).
var testHook func(stage string)

// Update applies op to k's payload with one CAS and returns the payload op
// was last applied to (the one its result was based on). A key seen for the
// first time is installed with meta, its payload starting at 0, and its
// slot charged to q's account. Errors: ErrFull, ErrQuota, ErrLockTimeout
// or ErrRetired (no slot could be had: the caller's on_full policy
// decides, and counts it with Refused) and ErrNotJoined.
//
// A new key of an account that holds q.Max slots already may take only a
// slot of its own account whose key is as fresh as a new one, or whose
// state is superseded (see Use): in its probe window, or found
// by a sweep of the account's slots (a bounded number of slots, at most
// once a millisecond per account), which frees every such slot of the
// account it meets. Otherwise it is refused with ErrQuota, and the other
// accounts keep their room.
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
func (c *Counters) Update(k Key, q Quota, meta uint64, now time.Duration, op Op) (uint64, error) {
	owner := c.r.owner.Load()
	if owner == 0 {
		return 0, ErrNotJoined
	}
	home := k.A & c.mask
	locked := false
	for {
		i, s, cand, found := c.scan(k, home, now, owner)
		if found {
			if locked {
				c.unlock(home, owner)
			}
			return c.apply(k, q, i, s, meta, now, op)
		}
		if cand < 0 {
			if locked {
				c.unlock(home, owner)
			}
			return 0, ErrFull
		}
		if cand = c.withinQuota(home, cand, q, now, owner); cand < 0 {
			if locked {
				c.unlock(home, owner)
			}
			return 0, ErrQuota
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
		ok, err := c.claim(cand, k, q, meta, owner, now, op)
		if ok {
			if testHook != nil {
				testHook("published")
			}
			c.unlock(home, owner)
			return 0, nil
		}
		if err != nil {
			c.unlock(home, owner)
			return 0, err
		}
		if c.r.stale(owner) {
			return 0, ErrRetired // our lock and claims are void: never spin on them
		}
	}
}

// withinQuota returns the slot a new key of q's account may take, given
// cand, the one the scan chose: cand while the account is under its
// maximum, else a fresh or superseded slot of the account's own (its
// count unchanged), or -1.
func (c *Counters) withinQuota(home uint64, cand int, q Quota, now time.Duration, owner uint64) int {
	if q.Max <= 0 || c.acc.held(q.Account) < q.Max {
		return cand
	}
	want := q.charge()
	for j := 0; j < c.probe; j++ {
		i := int((home + uint64(j)) & c.mask)
		sl := &c.slots[i]
		s := atomic.LoadUint64(&sl.state)
		if phaseOf(s) == phaseEmpty {
			break
		}
		if phaseOf(s) == phaseLive && atomic.LoadUint64(&sl.acct) == want && c.yields(sl, s, now) {
			return i
		}
	}
	if c.sweep(q.Account, now, owner) > 0 && c.acc.held(q.Account) < q.Max {
		return cand
	}
	return -1
}

// sweep frees the slots of account a whose keys are as fresh as new ones,
// or whose state is superseded (see Use), among the next slots of the
// account's sweep (see accounts.sweepRange), and returns how many it
// freed. A key's state is lost only when it is equivalent to no state or
// unreachable, as in a reclaim, which each step is: the reclaim watermark
// raised, LIVE → BUSY, the charge cleared, BUSY → TOMB.
func (c *Counters) sweep(a uint16, now time.Duration, owner uint64) (n int) {
	from, count, ok := c.acc.sweepRange(a)
	if !ok {
		return 0
	}
	want := uint64(a) + 1
	for j := 0; j < count; j++ {
		i := (from + j) & int(c.mask)
		sl := &c.slots[i]
		if atomic.LoadUint64(&sl.acct) != want {
			continue
		}
		s := atomic.LoadUint64(&sl.state)
		switch phaseOf(s) {
		case phaseLive:
			if !c.yields(sl, s, now) {
				continue
			}
			c.raiseReclaimMark(now)
		case phaseTomb: // a charge left behind by a lock timeout
		default:
			continue
		}
		gen := genOf(s) + 1
		busy := mkState(phaseBusy, gen, owner)
		if !atomic.CompareAndSwapUint64(&sl.state, s, busy) {
			continue
		}
		if phaseOf(s) == phaseLive {
			c.r.count(evEvictions, 1) // no longer LIVE: the live count follows
		}
		err := c.acc.uncharge(i, busy, owner, c.lockWait)
		// Even with the charge kept (a lock timeout), the slot is free:
		// a later claim or sweep clears the charge.
		atomic.CompareAndSwapUint64(&sl.state, busy, mkState(phaseTomb, gen, 0))
		if err == nil {
			n++
		}
	}
	if n > 0 {
		c.r.count(evSwept, uint64(n))
	}
	return n
}

// scan probes from home. It returns the slot holding k (found) with the
// state read before its key, or else the slot a claim should take (cand,
// -1 if none): the first EMPTY or TOMB slot, and only when there is none
// the first LIVE slot equivalent to a fresh key — evicting a live key,
// even one that carries no allowance, costs a lock and a claim later.
// Stale BUSY slots met on the way are released.
func (c *Counters) scan(k Key, home uint64, now time.Duration, owner uint64) (i int, s uint64, cand int, found bool) {
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
			if c.r.stale(payloadOf(s)) && c.releaseBusy(i, s, owner, 0) && free < 0 {
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
func (c *Counters) apply(k Key, q Quota, i int, s uint64, meta uint64, now time.Duration, op Op) (uint64, error) {
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
		return c.Update(k, q, meta, now, op)
	}
}

// claim installs k in slot i, which the caller found claimable while
// holding k's insert lock, and publishes op's first decision with it:
// BUSY → LIVE(op(0)). Publishing a LIVE payload 0 instead and applying op
// afterwards leaves a window in which the slot looks fresh: another
// installer can reclaim it (two installers can take one last slot from
// each other for ever), and a process with a stale `now` can apply to the
// fresh key in a window it has used up. The spin model found both.
//
// While the slot is BUSY its charge moves to q's account (when it is
// another's); a refusal (ErrQuota, ErrLockTimeout) leaves the slot free.
// It reports false with a nil error when the slot was taken meanwhile or
// this process was reaped.
func (c *Counters) claim(i int, k Key, q Quota, meta, owner uint64, now time.Duration, op Op) (bool, error) {
	c.Use(meta) // published before any slot holds it
	sl := &c.slots[i]
	s := atomic.LoadUint64(&sl.state)
	reclaim := false
	switch phaseOf(s) {
	case phaseEmpty, phaseTomb:
	case phaseLive:
		// A fresh slot (the scan's choice), or one withinQuota chose.
		if !c.yields(sl, s, now) {
			return false, nil
		}
		reclaim = true
	default:
		return false, nil
	}
	gen := genOf(s) + 1
	busy := mkState(phaseBusy, gen, owner)
	if reclaim {
		// Raised before the old key's state is gone, so that whoever
		// misses that key from now on starts it no earlier than now.
		c.raiseReclaimMark(now)
	}
	if !atomic.CompareAndSwapUint64(&sl.state, s, busy) {
		return false, nil
	}
	if reclaim {
		c.r.count(evEvictions, 1) // no longer LIVE: the live count follows
	}
	if testHook != nil {
		testHook("busy")
	}
	if err := c.recharge(i, busy, q, owner); err != nil {
		// Whatever the slot held is gone (an empty slot, or a fresh key's
		// state, no loss): leave it free.
		atomic.CompareAndSwapUint64(&sl.state, busy, mkState(phaseTomb, gen, 0))
		if err == errLost {
			return false, nil
		}
		return false, err
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
		return false, nil
	}
	if reclaim {
		c.r.count(evReclaims, 1)
	} else {
		c.r.count(evClaims, 1)
	}
	return true, nil
}

// recharge moves the charge of slot i, which owner holds BUSY in state
// busy, to q's account: nothing to do when it is charged to it already.
func (c *Counters) recharge(i int, busy uint64, q Quota, owner uint64) error {
	old := atomic.LoadUint64(&c.slots[i].acct)
	if old == q.charge() {
		return nil
	}
	if old != 0 {
		if err := c.acc.uncharge(i, busy, owner, c.lockWait); err != nil {
			return err
		}
	}
	return c.acc.charge(i, busy, q, owner, c.lockWait)
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
	return lockWord(c.r, &c.slots[h].ilock, owner, c.lockWait, nil)
}

// Refused counts a decision that err, from Update, left to a rule's
// on_full: no slot (ErrFull), its account at its maximum (ErrQuota) or an
// insert lock held too long (ErrLockTimeout). Update counts none itself:
// a caller that keeps a cache of state held elsewhere (a Redis rule's
// refusals) decides nothing when it finds no slot.
func (c *Counters) Refused(err error) {
	switch err {
	case ErrFull:
		c.r.count(evFull, 1)
	case ErrQuota:
		c.r.count(evQuota, 1)
	case ErrLockTimeout:
		c.r.count(evLockTimeout, 1)
	}
}

func (c *Counters) unlock(h, owner uint64) { unlockWord(&c.slots[h].ilock, owner) }

// releaseBusy turns slot i, BUSY in state s for a dead owner, into a
// tombstone, clearing its charge first (its account's lock taken for
// owner, waiting up to wait for a live holder: when it cannot be had,
// the slot is left for later). An owner of 0 (a process that never
// joined) releases only uncharged slots.
func (c *Counters) releaseBusy(i int, s, owner uint64, wait time.Duration) bool {
	sl := &c.slots[i]
	if atomic.LoadUint64(&sl.acct) != 0 {
		if owner == 0 || c.acc.uncharge(i, s, owner, wait) != nil {
			return false
		}
	}
	if atomic.CompareAndSwapUint64(&sl.state, s, mkState(phaseTomb, genOf(s), 0)) {
		c.r.count(evRecovered, 1)
		return true
	}
	return false
}

// releaseStale sweeps the table for BUSY slots, insert locks and account
// locks of dead owners and releases each (an account whose lock is taken
// from a dead owner is counted again). The supervisor calls it, holding
// account locks as sweeperID.
func (c *Counters) releaseStale() (n int) {
	for i := range c.slots {
		sl := &c.slots[i]
		if s := atomic.LoadUint64(&sl.state); phaseOf(s) == phaseBusy && c.r.stale(payloadOf(s)) && c.releaseBusy(i, s, sweeperID, c.lockWait) {
			n++
		}
		if l := atomic.LoadUint64(&sl.ilock); l != 0 && c.r.stale(l) && atomic.CompareAndSwapUint64(&sl.ilock, l, 0) {
			n++
		}
	}
	return n + c.acc.releaseStale()
}

// Peek returns k's payload without claiming a slot; ok is false when the
// key has no slot (it is as fresh).
func (c *Counters) Peek(k Key, now time.Duration) (payload uint64, ok bool) {
	_, s, _, found := c.scan(k, k.A&c.mask, now, c.r.owner.Load())
	if !found {
		return 0, false
	}
	return payloadOf(s), true
}

// Reset sets k's payload to 0 (as a fresh key) if it has a slot, which
// also makes the slot reclaimable.
func (c *Counters) Reset(k Key, now time.Duration) {
	for {
		i, s, _, found := c.scan(k, k.A&c.mask, now, c.r.owner.Load())
		if !found || payloadOf(s) == 0 {
			return
		}
		if atomic.CompareAndSwapUint64(&c.slots[i].state, s, mkState(phaseLive, genOf(s), 0)) {
			return
		}
	}
}
