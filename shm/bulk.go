package shm

import (
	"encoding/binary"
	"errors"
	"fmt"
	"iter"
	"sync/atomic"
	"time"

	"github.com/cespare/xxhash/v2"
)

// Bulk operations for persistence: a snapshot of each table, and placement
// of whole entries into a region that no other process uses yet (a
// supervisor before its first worker, loading a dump or migrating a live
// region). They keep the layout inside this package: callers see keys,
// meta words, payloads and responses, never slots.

// Errors of the bulk operations.
var (
	// ErrNotEmpty is returned by SetSeeds on a table that already holds keys.
	ErrNotEmpty = errors.New("shm: table not empty")
	// ErrDuplicate is returned by Place for a key the table already holds.
	ErrDuplicate = errors.New("shm: key already in the table")
)

// SetSeeds replaces the region's hash seeds, so that keys hashed in an
// earlier region (a dump) keep their identity. Only an empty table may be
// reseeded, and only before other processes attach.
func (r *Region) SetSeeds(s1, s2 uint64) error {
	for i := range r.counts.slots {
		if phaseOf(atomic.LoadUint64(&r.counts.slots[i].state)) != phaseEmpty {
			return ErrNotEmpty
		}
	}
	r.store(hSeed1, s1)
	r.store(hSeed2, s2)
	r.seed1, r.seed2 = s1, s2
	return nil
}

// Entry is one LIVE counter slot's content.
type Entry struct {
	Key     Key
	Meta    uint64
	Payload uint64
	// Account is the account the slot is charged to (see Quota). A dump
	// does not keep it: a loader derives it from the entry's rule.
	Account uint16
}

// Snapshot returns an iterator over the LIVE entries of the table.
//
// Each entry is read consistently, also while workers write the table (a
// dump every persist.interval): its state word, then its key and meta,
// then its state again. Key and meta are written only while a slot is
// not LIVE, and every change of key bumps the state's generation, so a
// second state LIVE in the same generation is the same key, whose
// payload it is: the entry is the slot as it was at that second read. A
// key updated between the reads is read again, never skipped; a slot
// that changed keys meanwhile is read anew. So every key that stays LIVE
// throughout the iteration is yielded exactly once, with a payload it
// held during it. The whole is a moving picture: two entries may be read
// apart in time, a key installed meanwhile may be missing, and one
// reclaimed and installed again behind the reader may come twice (a
// loader keeps the first).
//
// When nothing writes the table, the entries come in slot order from a
// slot that no entry's probe path crosses, so that placing them in that
// order (Place) into an empty table of the same geometry fits every one
// again: each lands at most as far from its home as it was. From any other
// start (a boundary that moved while workers wrote), an entry that
// wrapped around the end of the table can take the slot of one that then
// no longer fits.
func (c *Counters) Snapshot() iter.Seq[Entry] {
	return func(yield func(Entry) bool) {
		b := uint64(c.boundary())
		for k := range uint64(len(c.slots)) {
			e, ok := c.read(&c.slots[(b+k)&c.mask])
			if ok && !yield(e) {
				return
			}
		}
	}
}

// snapshotRetries bounds the reads of one slot that a writer keeps
// changing to another key; a payload that changes costs no retry.
const snapshotRetries = 64

// read reads a LIVE slot consistently (see Snapshot); ok is false for a
// slot that is not LIVE.
func (c *Counters) read(sl *slot) (e Entry, ok bool) {
	for range snapshotRetries {
		s := atomic.LoadUint64(&sl.state)
		if phaseOf(s) != phaseLive {
			return e, false
		}
		e = Entry{
			Key:     Key{A: atomic.LoadUint64(&sl.keyA), B: atomic.LoadUint64(&sl.keyB)},
			Meta:    atomic.LoadUint64(&sl.meta),
			Account: uint16(atomic.LoadUint64(&sl.acct) - 1),
		}
		s2 := atomic.LoadUint64(&sl.state)
		if phaseOf(s2) == phaseLive && genOf(s2) == genOf(s) {
			e.Payload = payloadOf(s2)
			return e, true
		}
	}
	return e, false
}

// boundary returns a slot index that no LIVE entry's probe path crosses
// (no entry lies at or after it with its home before it), or 0 when there
// is none. Any EMPTY slot is followed by one.
func (c *Counters) boundary() int {
	for b := range c.slots {
		crossed := false
		for j := 0; j < c.probe && !crossed; j++ {
			i := (uint64(b) + uint64(j)) & c.mask
			sl := &c.slots[i]
			crossed = phaseOf(atomic.LoadUint64(&sl.state)) == phaseLive && (i-atomic.LoadUint64(&sl.keyA))&c.mask > uint64(j)
		}
		if !crossed {
			return b
		}
	}
	return 0
}

// Place installs e in the first EMPTY slot of its probe window, as a claim
// from EMPTY would (LIVE, generation 1, charged to e.Account), without the
// insert lock, without a quota and without counting a claim. It requires that no other process uses the
// region and that the table holds only EMPTY slots and entries put there
// by Place; it costs at most one probe window. Errors: ErrDuplicate (the
// key is in the table already), ErrFull (no EMPTY slot in the window).
func (c *Counters) Place(e Entry) error {
	if e.Payload > PayloadMask {
		return fmt.Errorf("shm: payload %#x exceeds 48 bits", e.Payload)
	}
	home := e.Key.A & c.mask
	for j := 0; j < c.probe; j++ {
		i := int((home + uint64(j)) & c.mask)
		sl := &c.slots[i]
		if phaseOf(atomic.LoadUint64(&sl.state)) == phaseEmpty {
			// Plain stores: nobody reads the slot before its state is
			// published, and a load places a million of them.
			sl.keyA, sl.keyB, sl.meta = e.Key.A, e.Key.B, e.Meta
			c.acc.place(i, e.Account)
			atomic.StoreUint64(&sl.state, mkState(phaseLive, 1, e.Payload))
			c.r.count(evPlaced, 1)
			return nil
		}
		if sl.keyA == e.Key.A && sl.keyB == e.Key.B {
			return ErrDuplicate // a key is never LIVE in two slots
		}
	}
	return ErrFull
}

// StoredEntry is one completed record, as persistence dumps and restores it.
type StoredEntry struct {
	Kind         Kind
	Key          Key
	Fingerprint  Fingerprint   // idempotency records
	Expiry       time.Duration // region time until which it replays (or is a cache entry)
	Unreplayable bool          // an idempotency record completed without a stored response
	Response     Response      // a replayable idempotency record's response
	Data         []byte        // a cache entry's bytes
	Account      uint16        // an idempotency record's account (see Quota); cache entries have none
	// AddrAccount is an idempotency record's client-address account
	// (see Responses.Begin), when HasAddrAccount: a record of a build
	// before address accounts, or of a client whose address was not
	// known, has none.
	AddrAccount    uint16
	HasAddrAccount bool
}

// Snapshot returns an iterator over the COMPLETE records that have not
// expired at now, their responses (or cache entries) copied out.
// Reservations, fill locks and requests in flight are not visited, nor a
// record that changed while it was read; an idempotency record whose
// stored bytes are damaged is visited as Unreplayable.
func (t *Responses) Snapshot(now time.Duration) iter.Seq[StoredEntry] {
	return func(yield func(StoredEntry) bool) {
		for i := range t.recs {
			rec := &t.recs[i]
			s := atomic.LoadUint64(&rec.state)
			if recPhase(s) != recComplete {
				continue
			}
			e := StoredEntry{
				Kind:   Kind(atomic.LoadUint64(&rec.kind)),
				Key:    Key{A: atomic.LoadUint64(&rec.keyA), B: atomic.LoadUint64(&rec.keyB)},
				Expiry: time.Duration(atomic.LoadUint64(&rec.expiry)),
			}
			if a := atomic.LoadUint64(&rec.acct); a != 0 {
				e.Account = uint16(a - 1)
			}
			if a := atomic.LoadUint64(&rec.addr); a != 0 {
				e.AddrAccount, e.HasAddrAccount = uint16(a-1), true
			}
			if e.Expiry <= now {
				continue
			}
			switch e.Kind {
			case KindCache:
				data, ok := t.readInto(rec, s, nil)
				if !ok {
					continue
				}
				e.Data = data
			default:
				for w := range rec.fp {
					binary.LittleEndian.PutUint64(e.Fingerprint[w*8:], atomic.LoadUint64(&rec.fp[w]))
				}
				e.Unreplayable = atomic.LoadUint64(&rec.length)>>32&flagUnreplayable != 0
				if !e.Unreplayable && !t.read(rec, s, &e.Response) {
					if atomic.LoadUint64(&rec.state) != s {
						continue
					}
					// Damaged bytes, not a change (see examine): the
					// request ran, so the record stays, unreplayable.
					e.Unreplayable, e.Response = true, Response{}
				}
			}
			if atomic.LoadUint64(&rec.state) != s {
				continue
			}
			if !yield(e) {
				return
			}
		}
	}
}

// Place installs e as a completed record at region time now, charged to
// e.Account (and e.AddrAccount), without the insert lock, a quota or a
// worker identity; an
// entry already expired at now is
// skipped. It requires that no other process uses the region. When the
// pool has no room for an idempotency record's response, the record is
// completed unreplayable, as Complete does; a cache entry without room is
// ErrFull. Errors: ErrDuplicate (the key has a live record of e's kind),
// ErrFull (no record in the probe window), ErrNoResponses.
func (t *Responses) Place(e StoredEntry, now time.Duration) error {
	if len(t.recs) == 0 {
		return ErrNoResponses
	}
	if e.Expiry <= now {
		return nil
	}
	cand := t.placeScan(e.Key, e.Kind, now)
	switch {
	case cand == -2:
		return ErrDuplicate
	case cand < 0:
		return ErrFull
	}
	var flags uint64 = flagUnreplayable
	var n uint32
	chain, sum := uint64(noBlock), uint64(0)
	switch {
	case e.Kind == KindCache:
		first, count, ok := t.store(e.Data, stampSuper)
		if !ok {
			return ErrFull
		}
		chain = uint64(count)<<32 | uint64(first)
		flags, n, sum = 0, uint32(len(e.Data)), xxhash.Sum64(e.Data)
	case !e.Unreplayable:
		data := encodeResponse(&e.Response)
		if first, count, ok := t.store(data, stampSuper); ok {
			chain = uint64(count)<<32 | uint64(first)
			flags, n, sum = 0, uint32(len(data)), xxhash.Sum64(data)
		}
	}
	rec := &t.recs[cand]
	s := atomic.LoadUint64(&rec.state)
	if recPhase(s) == recComplete { // expired
		t.freeRec(rec, stampSuper)
		t.r.count(evRecReused, 1)
	} else {
		t.r.count(evRecTaken, 1)
	}
	t.acc.drop(cand)
	t.addr.drop(cand)
	if e.Kind != KindCache {
		t.acc.place(cand, e.Account)
		if e.HasAddrAccount {
			t.addr.place(cand, e.AddrAccount)
		}
	}
	atomic.StoreUint64(&rec.keyA, e.Key.A)
	atomic.StoreUint64(&rec.keyB, e.Key.B)
	atomic.StoreUint64(&rec.kind, uint64(e.Kind)|stampSuper<<32) // the stamp of its chain
	for w := range rec.fp {
		atomic.StoreUint64(&rec.fp[w], binary.LittleEndian.Uint64(e.Fingerprint[w*8:]))
	}
	atomic.StoreUint64(&rec.length, flags<<32|uint64(n))
	atomic.StoreUint64(&rec.chain, chain)
	atomic.StoreUint64(&rec.sum, sum)
	atomic.StoreUint64(&rec.expiry, uint64(e.Expiry))
	atomic.StoreUint64(&rec.state, mkRec(recComplete, recGen(s)+1, 0))
	return nil
}

// placeScan finds the record Place installs a key of kind in: the first
// EMPTY, TOMB or expired record of its probe window; -1 when there is
// none, -2 when the key has a live record of that kind already.
func (t *Responses) placeScan(k Key, kind Kind, now time.Duration) int {
	home := k.A & t.mask
	cand := -1
	for i, s := range t.window(home) {
		rec := &t.recs[i]
		switch recPhase(s) {
		case recEmpty:
			return firstOf(cand, i)
		case recTomb:
			cand = firstOf(cand, i)
		case recComplete, recReserved, recBusy:
			live := recPhase(s) != recComplete || time.Duration(atomic.LoadUint64(&rec.expiry)) > now
			if live && t.keyIs(rec, k, kind) {
				return -2
			}
			if !live && cand < 0 {
				cand = i
			}
		}
	}
	return cand
}
