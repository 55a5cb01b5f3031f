package shm

import (
	"encoding/binary"
	"errors"
	"iter"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/cespare/xxhash/v2"
)

// The response table: a fixed index of records, each one key's stored
// response (or reservation), and a pool of equal-size blocks holding the
// stored bytes, allocated through a free bitmap.
//
// A record's state word: phase (3 bits) · generation (13 bits) · owner
// (48 bits, while BUSY or RESERVED). Its life:
//
//	EMPTY/TOMB/expired COMPLETE ─claim─▶ BUSY ─key, fingerprint─▶ RESERVED
//	RESERVED ─Complete─▶ COMPLETE      RESERVED ─Release/owner reaped─▶ TOMB
//	COMPLETE ─drop/retire/Forget─▶ BUSY, its chain freed ─▶ TOMB
//
// (and, loading a dump before any worker exists, EMPTY ─Place─▶ COMPLETE).
// Claims follow the counter table's protocol (insert lock on the home
// record, rescan under it, BUSY while the key is written), so a key is never
// reserved twice. Key, fingerprint and stored fields are written only while
// the record is BUSY or RESERVED by its owner (or by Place, alone with the
// region) and are stable while it is RESERVED or COMPLETE; readers read the state first, copy, and check the
// state again (and the checksum), so a torn read is a miss, never a wrong
// replay.
const (
	recEmpty    = 0
	recBusy     = 1
	recReserved = 2
	recComplete = 3
	recTomb     = 4

	recPhaseShift = 61
	recGenShift   = 48
	recGenMask    = 1<<13 - 1
	ownerMask     = 1<<48 - 1

	flagUnreplayable = 1 // completed, but its response was not stored
)

func recPhase(s uint64) uint64 { return s >> recPhaseShift }
func recGen(s uint64) uint64   { return s >> recGenShift & recGenMask }
func recOwner(s uint64) uint64 { return s & ownerMask }
func mkRec(phase, gen, owner uint64) uint64 {
	return phase<<recPhaseShift | (gen&recGenMask)<<recGenShift | owner&ownerMask
}

type record struct {
	state   uint64 // phase · gen · owner
	keyA    uint64
	keyB    uint64
	ilock   uint64 // insert lock, for keys whose home this record is
	seq     uint32 // futex word: bumped whenever a RESERVED record leaves that state
	waiters uint32 // processes parked on seq
	expiry  uint64 // region time (ns) until which a COMPLETE record replays
	fp      [4]uint64
	length  uint64 // stored bytes (low 32) · flags (high 32)
	chain   uint64 // first block (low 32) · block count (high 32)
	sum     uint64 // xxhash64 of the stored bytes
	acct    uint64 // the account the record is charged to, plus one; 0 = none (see accounts)
	kind    uint64 // Kind of the key; written with the key
	addr    uint64 // the client-address account the record is charged to, plus one; 0 = none
}

// Kind says what stored a record. A lookup of one kind never sees a
// record of another, so idempotency keys and cache keys never mix; and a
// cache entry may be evicted where an idempotency record may not.
type Kind uint8

const (
	// KindIdempotency records hold a reservation or a stored response for
	// an idempotency key; a completed one lives until its expiry. It is
	// charged to its client's account and to its client address's (see
	// Begin).
	KindIdempotency Kind = iota
	// KindCache records hold a response cache entry (completed) or a fill
	// lock (reserved). An entry may be evicted to make room. It is charged
	// to no account.
	KindCache
)

// Fingerprint identifies a request's content (SHA-256 of method, path,
// query and body): the same key with another fingerprint is a misuse.
type Fingerprint [32]byte

// Response is what a completed request stores and a retry replays.
type Response struct {
	Status      int
	ContentType string
	Location    string
	// ContentEncoding is the body's content coding ("gzip"): without it
	// the stored bytes cannot be read.
	ContentEncoding string
	Body            []byte
}

// Outcome is what Begin found for a key.
type Outcome int

const (
	// Reserved: the caller owns the key; it runs the request, then
	// Completes or Releases the ticket.
	Reserved Outcome = iota
	// Replay: a completed response for the same fingerprint, copied out.
	Replay
	// Mismatch: the key is reserved or completed with another fingerprint.
	Mismatch
	// InFlight: another request holds the reservation; Wait on the ticket.
	InFlight
	// Unreplayable: completed, but its response was not stored (too large
	// or no blocks): a retry must not run again.
	Unreplayable
)

// Ticket names a record in the state Begin saw it in.
type Ticket struct {
	idx   int
	state uint64
}

// ErrNoResponses means the region has no response table.
var ErrNoResponses = errors.New("shm: region has no response table")

// errReservationLost is Complete's error when the reservation's owner was
// reaped meanwhile (the record may belong to another key by now).
var errReservationLost = errors.New("shm: complete: reservation lost (its owner was reaped)")

// Responses is the table of stored responses in a region.
type Responses struct {
	r         *Region
	recs      []record
	mask      uint64
	probe     int
	bitmap    []uint64
	blocks    []byte
	blockSize int
	nblocks   uint32
	hint      atomic.Uint32 // where this process starts looking for free blocks
	hand      atomic.Uint32 // where this process's eviction walk resumes
	lockWait  time.Duration
	acc       accounts // the clients' accounts (a `by` key each), charge word acct
	addr      accounts // the client addresses' accounts, charge word addr
}

func newResponses(r *Region, lay sections) *Responses {
	o := r.geo
	if o.Responses == 0 {
		return &Responses{r: r}
	}
	nb := uint32(o.blocks())
	recs := unsafe.Slice((*record)(r.at(lay.off[secRecords])), o.Responses)
	return &Responses{
		r:         r,
		recs:      recs,
		mask:      uint64(o.Responses - 1),
		probe:     min(defaultProbe, o.Responses),
		bitmap:    unsafe.Slice((*uint64)(r.at(lay.off[secBitmap])), (nb+63)/64),
		blocks:    r.data[lay.off[secBlocks] : lay.off[secBlocks]+uint64(o.ResponseBytes)],
		blockSize: o.BlockSize,
		nblocks:   nb,
		lockWait:  defaultLockWait,
		acc: accounts{r: r, a: unsafe.Slice((*account)(r.at(lay.off[secRecordAccounts])), numAccounts), n: len(recs),
			word:   func(i int) *uint64 { return &recs[i].acct },
			state:  func(i int) *uint64 { return &recs[i].state },
			capped: ErrQuota,
		},
		addr: accounts{r: r, a: unsafe.Slice((*account)(r.at(lay.off[secAddrAccounts])), numAccounts), n: len(recs),
			word:   func(i int) *uint64 { return &recs[i].addr },
			state:  func(i int) *uint64 { return &recs[i].state },
			capped: ErrAddrQuota,
		},
	}
}

// Held reports how many records the keys of account a hold (reserved,
// completed, and expired ones not yet taken over): one load.
func (t *Responses) Held(a uint16) int {
	if len(t.recs) == 0 {
		return 0
	}
	return t.acc.held(a)
}

// AddrHeld is Held for the client-address account a.
func (t *Responses) AddrHeld(a uint16) int {
	if len(t.recs) == 0 {
		return 0
	}
	return t.addr.held(a)
}

// Len is the number of records (0: no response table).
func (t *Responses) Len() int { return len(t.recs) }

// BlockSize is the size of one block, its first 8 bytes being the chain.
func (t *Responses) BlockSize() int { return t.blockSize }

// Begin looks up k at region time now. If no live record holds it, it
// reserves one for the caller (Reserved), charged to q's account and to
// addr's, the account of the client's address (in a set of accounts of
// its own); addr.Max 0 charges no address account (the address is not
// known). For a completed response with the same fingerprint it copies it
// into dst (Replay). Errors: ErrFull, ErrLockTimeout or ErrRetired (no
// record could be had: answer 503, never run unreserved), ErrQuota (q's
// account holds q.Max records) or ErrAddrQuota (addr's holds addr.Max:
// either way this client must wait), ErrNotJoined, ErrNoResponses.
//
// A new key of an account at its maximum may take only an expired record
// of its own account (of both, when both are at their maximum): in its
// probe window, or freed by a sweep of the account's records (bounded, at
// most once a millisecond per account).
func (t *Responses) Begin(k Key, q, addr Quota, fp Fingerprint, now time.Duration, dst *Response) (Outcome, Ticket, error) {
	if len(t.recs) == 0 {
		return 0, Ticket{}, ErrNoResponses
	}
	owner := t.r.owner.Load()
	if owner == 0 {
		return 0, Ticket{}, ErrNotJoined
	}
	home := k.A & t.mask
	locked := false
	unlock := func() {
		if locked {
			unlockWord(&t.recs[home].ilock, owner)
			locked = false
		}
	}
	defer unlock()
	for {
		i, s, cand, found := t.scan(k, home, now, owner)
		if found {
			unlock()
			out, ok := t.examine(i, s, fp, dst)
			if ok {
				return out, Ticket{i, s}, nil
			}
			continue // changed while read: look again
		}
		if cand < 0 {
			t.r.count(evRespFull, 1)
			return 0, Ticket{}, ErrFull
		}
		var err error
		if cand, err = t.withinQuota(home, cand, q, addr, now, owner); err != nil {
			t.r.count(evRespQuota, 1)
			return 0, Ticket{}, err
		}
		if !locked {
			if t.r.stale(owner) {
				return 0, Ticket{}, ErrRetired // a retired process reserves nothing
			}
			if err := lockWord(t.r, &t.recs[home].ilock, owner, t.lockWait, nil); err != nil {
				return 0, Ticket{}, err
			}
			locked = true
			continue
		}
		var ap *Quota
		if addr.Max > 0 {
			ap = &addr
		}
		tk, ok, err := t.claim(cand, k, KindIdempotency, &q, ap, &fp, owner, now)
		if ok {
			return Reserved, tk, nil
		}
		if err != nil {
			if err == ErrQuota || err == ErrAddrQuota {
				t.r.count(evRespQuota, 1)
			}
			return 0, Ticket{}, err
		}
		if t.r.stale(owner) {
			return 0, Ticket{}, ErrRetired
		}
	}
}

// withinQuota returns the record a new key of q's account and addr's
// (addr.Max 0: none) may take, given cand, the one the scan chose: cand
// while both accounts are under their maximum, else an expired record of
// the account at its maximum (of both, when both are), or the error of
// the account that holds its maximum (ErrQuota first, then ErrAddrQuota).
// The claim checks the counts again under their locks.
func (t *Responses) withinQuota(home uint64, cand int, q, addr Quota, now time.Duration, owner uint64) (int, error) {
	over := func() (key, address bool) {
		return q.Max > 0 && t.acc.held(q.Account) >= q.Max, addr.Max > 0 && t.addr.held(addr.Account) >= addr.Max
	}
	overKey, overAddr := over()
	if !overKey && !overAddr {
		return cand, nil
	}
	for i, s := range t.window(home) {
		rec := &t.recs[i]
		if recPhase(s) == recEmpty {
			break
		}
		if recPhase(s) == recComplete && time.Duration(atomic.LoadUint64(&rec.expiry)) <= now &&
			(!overKey || atomic.LoadUint64(&rec.acct) == q.charge()) &&
			(!overAddr || atomic.LoadUint64(&rec.addr) == addr.charge()) {
			return i, nil
		}
	}
	// A sweep frees a record's charge on both accounts: after either,
	// both are read again (a client whose records were its address's
	// too is under both once its own sweep freed them).
	swept := overKey && t.sweep(&t.acc, q.Account, now, owner) > 0
	if overAddr && t.sweep(&t.addr, addr.Account, now, owner) > 0 {
		swept = true
	}
	if swept {
		overKey, overAddr = over()
	}
	switch {
	case overKey:
		return -1, ErrQuota
	case overAddr:
		return -1, ErrAddrQuota
	}
	return cand, nil
}

// sweep frees the expired records of account a of the set as among the
// next records of the account's sweep (see accounts.sweepRange) and
// returns how many it freed: COMPLETE → BUSY, blocks freed, the charges
// (of both sets) cleared, BUSY → TOMB.
func (t *Responses) sweep(as *accounts, a uint16, now time.Duration, owner uint64) (n int) {
	from, count, ok := as.sweepRange(a)
	if !ok {
		return 0
	}
	want := uint64(a) + 1
	for j := 0; j < count; j++ {
		i := (from + j) & int(t.mask)
		rec := &t.recs[i]
		if atomic.LoadUint64(as.word(i)) != want {
			continue
		}
		s := atomic.LoadUint64(&rec.state)
		switch recPhase(s) {
		case recComplete:
			if time.Duration(atomic.LoadUint64(&rec.expiry)) > now {
				continue
			}
		case recTomb: // a charge left behind by a lock timeout
		default:
			continue
		}
		if _, ok, err := t.retire(i, s, owner); ok && err == nil {
			n++
		}
	}
	if n > 0 {
		t.r.count(evRespSwept, uint64(n))
	}
	return n
}

// retire frees record i, found in state s (COMPLETE and expired, or a
// TOMB still charged), for owner: COMPLETE → BUSY, its blocks freed, its
// charges (of both sets) cleared, BUSY → TOMB. It returns the blocks it
// freed; ok is false when the record changed meanwhile, and err is a
// charge a lock timeout kept, for a later claim or sweep to clear.
func (t *Responses) retire(i int, s, owner uint64) (blocks int, ok bool, err error) {
	rec := &t.recs[i]
	gen := recGen(s) + 1
	busy := mkRec(recBusy, gen, owner)
	if !atomic.CompareAndSwapUint64(&rec.state, s, busy) {
		return 0, false, nil
	}
	if recPhase(s) == recComplete {
		blocks = t.freeRec(rec, stampOf(owner))
	}
	err = t.uncharge(i, busy, owner, t.lockWait)
	if atomic.CompareAndSwapUint64(&rec.state, busy, mkRec(recTomb, gen, 0)) && recPhase(s) == recComplete {
		t.r.count(evRecFreed, 1) // an expired record in use until now
	}
	return blocks, true, err
}

// scan probes from home for an idempotency key: the record holding k
// (state read before key), or the first claimable record: EMPTY, TOMB or
// expired, else the cache entry that expires first (evictable). Records of
// dead owners are released on the way.
func (t *Responses) scan(k Key, home uint64, now time.Duration, owner uint64) (i int, s uint64, cand int, found bool) {
	cand = -1
	evict, evictExp := -1, time.Duration(0)
	for i, s := range t.window(home) {
		rec := &t.recs[i]
		switch recPhase(s) {
		case recEmpty:
			return i, s, firstOf(cand, i), false
		case recTomb:
			cand = firstOf(cand, i)
		case recBusy, recReserved:
			if t.r.stale(recOwner(s)) {
				t.releaseRec(i, s, owner, 0)
				continue
			}
			if recPhase(s) == recReserved && t.keyIs(rec, k, KindIdempotency) {
				return i, s, cand, true
			}
		case recComplete:
			exp := time.Duration(atomic.LoadUint64(&rec.expiry))
			expired := exp <= now
			if t.keyIs(rec, k, KindIdempotency) && !expired {
				return i, s, cand, true
			}
			switch {
			case expired && cand < 0:
				cand = i
			case !expired && Kind(atomic.LoadUint64(&rec.kind)) == KindCache && (evict < 0 || exp < evictExp):
				evict, evictExp = i, exp
			}
		}
	}
	return -1, 0, firstOf(cand, evict), false
}

// window walks the probe window that starts at home, as every probe of
// the table does: each record's index with its state word, read before
// any other field of the record.
func (t *Responses) window(home uint64) iter.Seq2[int, uint64] {
	return func(yield func(int, uint64) bool) {
		for j := 0; j < t.probe; j++ {
			i := int((home + uint64(j)) & t.mask)
			if !yield(i, atomic.LoadUint64(&t.recs[i].state)) {
				return
			}
		}
	}
}

// firstOf is cand, the first claimable record a scan has met, or i when
// it has met none yet (cand < 0).
func firstOf(cand, i int) int {
	if cand < 0 {
		return i
	}
	return cand
}

func (t *Responses) keyIs(rec *record, k Key, kind Kind) bool {
	return atomic.LoadUint64(&rec.keyA) == k.A && atomic.LoadUint64(&rec.keyB) == k.B &&
		Kind(atomic.LoadUint64(&rec.kind)) == kind
}

// examine judges the found record i in state s against fp; ok is false
// when the record changed while it was read, so that the caller looks
// again.
func (t *Responses) examine(i int, s uint64, fp Fingerprint, dst *Response) (Outcome, bool) {
	rec := &t.recs[i]
	same := true
	for w := range rec.fp {
		if atomic.LoadUint64(&rec.fp[w]) != binary.LittleEndian.Uint64(fp[w*8:]) {
			same = false
		}
	}
	if atomic.LoadUint64(&rec.state) != s {
		return 0, false
	}
	switch {
	case !same:
		return Mismatch, true
	case recPhase(s) == recReserved:
		return InFlight, true
	case atomic.LoadUint64(&rec.length)>>32&flagUnreplayable != 0:
		return Unreplayable, true
	}
	if !t.read(rec, s, dst) {
		if atomic.LoadUint64(&rec.state) == s {
			// Not a copy torn by a change: the stored bytes are damaged.
			// The request ran and must not run again; its response is
			// lost, as an unstored one is.
			return Unreplayable, true
		}
		return 0, false
	}
	return Replay, true
}

// claim reserves record i for k, of kind, under k's insert lock, charged
// to q's account and to addr's (nil: to none, as a cache record is; fp
// nil: no fingerprint). It takes an EMPTY or TOMB record, a COMPLETE one
// that expired, or, evicting it, a COMPLETE cache entry. It reports false
// with a nil error when the record was taken meanwhile or this process
// was reaped; a refusal (ErrQuota, ErrAddrQuota, ErrLockTimeout) leaves
// the record free, and charged to nobody unless a lock timed out.
func (t *Responses) claim(i int, k Key, kind Kind, q, addr *Quota, fp *Fingerprint, owner uint64, now time.Duration) (Ticket, bool, error) {
	rec := &t.recs[i]
	s := atomic.LoadUint64(&rec.state)
	evict := false
	switch recPhase(s) {
	case recEmpty, recTomb:
	case recComplete:
		if time.Duration(atomic.LoadUint64(&rec.expiry)) > now {
			if Kind(atomic.LoadUint64(&rec.kind)) != KindCache {
				return Ticket{}, false, nil
			}
			evict = true
		}
	default:
		return Ticket{}, false, nil
	}
	gen := recGen(s) + 1
	busy := mkRec(recBusy, gen, owner)
	if !atomic.CompareAndSwapUint64(&rec.state, s, busy) {
		return Ticket{}, false, nil
	}
	reused := recPhase(s) == recComplete
	if reused {
		t.freeRec(rec, stampOf(owner))
	}
	if err := t.recharge(i, busy, q, addr, owner); err != nil {
		if err != errLost {
			// One account may have been charged before the other refused.
			t.uncharge(i, busy, owner, t.lockWait)
		}
		if atomic.CompareAndSwapUint64(&rec.state, busy, mkRec(recTomb, gen, 0)) {
			t.wake(rec)
		}
		if reused {
			t.r.count(evRecFreed, 1) // it was in use as the expired record
		}
		if err == errLost {
			return Ticket{}, false, nil
		}
		return Ticket{}, false, err
	}
	if reused {
		t.r.count(evRecReused, 1)
		if evict {
			t.r.count(evCacheEvicted, 1)
		}
	} else {
		t.r.count(evRecTaken, 1)
	}
	atomic.StoreUint64(&rec.keyA, k.A)
	atomic.StoreUint64(&rec.keyB, k.B)
	// The stamp of the blocks this owner's chain will have (see freeChain).
	atomic.StoreUint64(&rec.kind, uint64(kind)|uint64(stampOf(owner))<<32)
	for w := range rec.fp {
		var v uint64
		if fp != nil {
			v = binary.LittleEndian.Uint64(fp[w*8:])
		}
		atomic.StoreUint64(&rec.fp[w], v)
	}
	atomic.StoreUint64(&rec.length, 0)
	atomic.StoreUint64(&rec.chain, noBlock)
	atomic.StoreUint64(&rec.sum, 0)
	atomic.StoreUint64(&rec.expiry, 0)
	reserved := mkRec(recReserved, gen, owner)
	if !atomic.CompareAndSwapUint64(&rec.state, busy, reserved) {
		return Ticket{}, false, nil // reaped as dead meanwhile: a zombie claims nothing
	}
	return Ticket{i, reserved}, true, nil
}

// recharge moves the charges of record i, which owner holds in state
// busy, to addr's address account and q's account (nil: to none), one
// after the other, each under its own account's lock: nothing to do for
// one it is charged to already.
func (t *Responses) recharge(i int, busy uint64, q, addr *Quota, owner uint64) error {
	if err := t.addr.move(i, busy, addr, owner, t.lockWait); err != nil {
		return err
	}
	return t.acc.move(i, busy, q, owner, t.lockWait)
}

// uncharge clears record i's charges in both sets of accounts, while it is
// in state s (see accounts.uncharge); it returns the first error.
func (t *Responses) uncharge(i int, s, owner uint64, wait time.Duration) error {
	err := t.acc.uncharge(i, s, owner, wait)
	if err2 := t.addr.uncharge(i, s, owner, wait); err == nil {
		err = err2
	}
	return err
}

// charged reports whether record i has a charge in either set.
func (t *Responses) charged(i int) bool {
	return atomic.LoadUint64(&t.recs[i].acct) != 0 || atomic.LoadUint64(&t.recs[i].addr) != 0
}

// Complete stores resp for the reservation tk, replayable until now+ttl,
// and wakes the waiters. A nil resp (too large to store) completes the
// record unreplayable: retries get Unreplayable, never a second run. When
// the pool has no room, even after evicting cache entries and records that
// expired, the record is completed unreplayable too and the returned
// stored is false.
func (t *Responses) Complete(tk Ticket, resp *Response, now, ttl time.Duration) (stored bool, err error) {
	rec := &t.recs[tk.idx]
	if atomic.LoadUint64(&rec.state) != tk.state || recPhase(tk.state) != recReserved {
		return false, errReservationLost
	}
	var flags uint64 = flagUnreplayable
	var n uint32
	chain := uint64(noBlock)
	if resp != nil {
		data := encodeResponse(resp)
		if first, count, ok := t.storeEvicting(data, now); ok {
			chain = uint64(count)<<32 | uint64(first)
			flags, n = 0, uint32(len(data))
			atomic.StoreUint64(&rec.sum, xxhash.Sum64(data))
		} else {
			t.r.count(evRespNoBlock, 1)
		}
	}
	atomic.StoreUint64(&rec.length, flags<<32|uint64(n))
	atomic.StoreUint64(&rec.chain, chain)
	atomic.StoreUint64(&rec.expiry, uint64(now+ttl))
	if !atomic.CompareAndSwapUint64(&rec.state, tk.state, mkRec(recComplete, recGen(tk.state), 0)) {
		me := stampOf(t.r.owner.Load())
		t.freeChain(chain, me, me, me, nil)
		return false, errReservationLost
	}
	t.wake(rec)
	return flags == 0, nil
}

// Release gives up the reservation tk (the response is not to be kept:
// 5xx, 408, 429): the key is free again, its record no longer charged to
// its account, and waiters race for it.
func (t *Responses) Release(tk Ticket) {
	t.releaseRec(tk.idx, tk.state, t.r.owner.Load(), t.lockWait)
}

// releaseRec turns record i, BUSY or RESERVED in state s, into a
// tombstone, clearing its charge first (the account's lock taken for
// owner, waiting up to wait for a live holder). A record whose charge
// cannot be cleared (a lock timeout) is released by its owner all the
// same, still charged, for a later claim or sweep to clear; one of a dead
// owner is then left for later. An owner of 0 releases only uncharged
// records.
func (t *Responses) releaseRec(i int, s, owner uint64, wait time.Duration) bool {
	rec := &t.recs[i]
	dead, finished := t.r.stale(recOwner(s)), false
	if atomic.LoadUint64(&rec.chain)>>32 != 0 {
		// A chain being freed (BUSY) or completed (RESERVED): only the
		// supervisor, reaping the dead owner, lets go of it, holding the
		// record BUSY meanwhile so that no other release does.
		taken := mkRec(recBusy, recGen(s)+1, sweeperRec)
		if owner != sweeperID || !dead || !atomic.CompareAndSwapUint64(&rec.state, s, taken) {
			return false
		}
		if recPhase(s) == recBusy {
			t.freeChain(atomic.LoadUint64(&rec.chain), uint32(atomic.LoadUint64(&rec.kind)>>32), stampOf(recOwner(s)), stampSuper, &rec.chain)
		} else {
			atomic.StoreUint64(&rec.chain, noBlock) // its blocks, of the dead owner's stamp, are reclaimStale's
		}
		s, finished = taken, true
	}
	if t.charged(i) {
		if owner == 0 {
			return false
		}
		// Once finished, released though still charged (as a lock
		// timeout leaves it, for a claim or a sweep to clear).
		if err := t.uncharge(i, s, owner, wait); err != nil && (dead || err == errLost) && !finished {
			return false
		}
	}
	if !atomic.CompareAndSwapUint64(&rec.state, s, mkRec(recTomb, recGen(s), 0)) {
		return false
	}
	t.r.count(evRecFreed, 1)
	if dead {
		t.r.count(evRecovered, 1)
	}
	t.wake(rec)
	return true
}

// Wait parks until the record of tk leaves the state tk saw, or d passes;
// then the caller calls Begin again. It sleeps on a futex shared by every
// process that maps the region, so a completion wakes it at once.
func (t *Responses) Wait(tk Ticket, d time.Duration) {
	rec := &t.recs[tk.idx]
	deadline := nanotime() + int64(d)
	atomic.AddUint32(&rec.waiters, 1)
	defer atomic.AddUint32(&rec.waiters, ^uint32(0))
	for {
		seq := atomic.LoadUint32(&rec.seq)
		if atomic.LoadUint64(&rec.state) != tk.state {
			return
		}
		left := deadline - nanotime()
		if left <= 0 {
			return
		}
		// A dead owner never wakes us: look again at least every 50 ms.
		futexWait(&rec.seq, seq, time.Duration(min(left, int64(50*time.Millisecond))))
		if s := atomic.LoadUint64(&rec.state); s == tk.state && t.r.stale(recOwner(s)) {
			t.releaseRec(tk.idx, s, t.r.owner.Load(), 0)
		}
	}
}

func (t *Responses) wake(rec *record) {
	atomic.AddUint32(&rec.seq, 1)
	if atomic.LoadUint32(&rec.waiters) != 0 {
		futexWake(&rec.seq)
	}
}

// read copies the response of COMPLETE record rec (state s) into dst and
// reports whether it is intact: the state unchanged after the copy and the
// checksum right.
func (t *Responses) read(rec *record, s uint64, dst *Response) bool {
	n := uint32(atomic.LoadUint64(&rec.length))
	chain := atomic.LoadUint64(&rec.chain)
	sum := atomic.LoadUint64(&rec.sum)
	data := make([]byte, n)
	if !t.load(uint32(chain), uint32(chain>>32), data) {
		return false
	}
	if atomic.LoadUint64(&rec.state) != s || xxhash.Sum64(data) != sum {
		return false
	}
	return decodeResponse(data, dst)
}

// releaseStale releases the records, insert locks and account locks of
// dead owners (an account whose lock is taken from a dead owner is counted
// again). The supervisor calls it, holding account locks as sweeperID.
func (t *Responses) releaseStale() (n int) {
	for i := range t.recs {
		rec := &t.recs[i]
		s := atomic.LoadUint64(&rec.state)
		if p := recPhase(s); (p == recBusy || p == recReserved) && t.r.stale(recOwner(s)) && t.releaseRec(i, s, sweeperID, t.lockWait) {
			n++
		}
		if l := atomic.LoadUint64(&rec.ilock); l != 0 && t.r.stale(l) && atomic.CompareAndSwapUint64(&rec.ilock, l, 0) {
			n++
		}
	}
	if len(t.recs) > 0 {
		n += t.acc.releaseStale() + t.addr.releaseStale()
	}
	return n
}

// endForgets ends the Forgets of a supervisor that died inside one (the
// records it held BUSY): each record's blocks are freed, if the Forget
// had not, and the record is a tombstone, charged until a claim or a
// sweep clears it, as one a lock timeout left. Only ReapAll calls it,
// when no process is left that could be inside a Forget.
func (t *Responses) endForgets() (n int) {
	for i := range t.recs {
		rec := &t.recs[i]
		s := atomic.LoadUint64(&rec.state)
		if recPhase(s) != recBusy || recOwner(s) != sweeperRec {
			continue
		}
		t.freeRec(rec, stampSuper)
		if atomic.CompareAndSwapUint64(&rec.state, s, mkRec(recTomb, recGen(s), 0)) {
			t.r.count(evRecFreed, 1)
			t.r.count(evRecovered, 1)
			n++
		}
	}
	return n
}

// ErrInFlight is Forget's answer for a key whose request is running: its
// reservation cannot be dropped without letting a retry run it twice.
var ErrInFlight = errors.New("shm: the key's request is in flight")

// Forget drops the completed response stored for k (an operator's
// correction): a retry with k runs again. It reports whether there was
// one (an expired one does not count). It needs no worker identity, so
// the supervisor can call it; a reader copying the response meanwhile
// sees the record change and misses.
func (t *Responses) Forget(k Key, now time.Duration) (bool, error) {
	if len(t.recs) == 0 {
		return false, ErrNoResponses
	}
	for {
		i, s, _, found := t.scan(k, k.A&t.mask, now, sweeperID)
		if !found {
			return false, nil
		}
		if recPhase(s) != recComplete {
			return false, ErrInFlight
		}
		// As a sweep frees an expired record: BUSY for the supervisor,
		// its blocks and its charge released, then a tombstone.
		rec := &t.recs[i]
		gen := recGen(s) + 1
		busy := mkRec(recBusy, gen, sweeperRec)
		if !atomic.CompareAndSwapUint64(&rec.state, s, busy) {
			continue // changed meanwhile: look again
		}
		if testHook != nil {
			testHook("forgetting")
		}
		// The record names what is left of the chain as it is freed: a
		// supervisor killed meanwhile leaves the rest to endForgets.
		t.freeRec(rec, stampSuper)
		t.uncharge(i, busy, sweeperID, t.lockWait) // a charge kept by a timeout is cleared by a later claim or sweep
		if atomic.CompareAndSwapUint64(&rec.state, busy, mkRec(recTomb, gen, 0)) {
			t.r.count(evRecFreed, 1)
		}
		t.wake(rec)
		return true, nil
	}
}
