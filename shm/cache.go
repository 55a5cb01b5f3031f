package shm

import (
	"sync/atomic"
	"time"

	"github.com/cespare/xxhash/v2"
)

// The response cache's records (KindCache) in the response table. A key
// has at most one entry that lookups use (COMPLETE until its expiry) and
// at most one fill lock (RESERVED, owned by the process that fetches the
// response). The lock is a record of its own, not the entry's, so that
// the entry stays readable while it is refreshed (to serve it stale); when
// the fill completes, the lock's record becomes the entry and every other
// entry of the key is dropped. Locks are taken by the claim protocol of
// idempotency reservations (insert lock on the key's home record, rescan),
// so a key never has two; a lock whose owner dies is released like a
// reservation, and its waiters wake.
//
// What an entry holds is the caller's bytes: the table checks them with a
// checksum and copies them out, nothing more.

// CacheFind is what CacheLookup found for a key.
type CacheFind struct {
	// Data is the entry's bytes, copied into the caller's buffer; nil
	// when the key has no entry. From CacheLookupPart, an entry larger
	// than its whole is copied in part: Data is its first bytes, Size
	// its length, and CacheCopy copies it whole.
	Data []byte
	// Size is the entry's length in bytes.
	Size int
	// Expiry is the region time at which the entry's record becomes
	// reclaimable.
	Expiry time.Duration
	// Entry names the entry, for CacheEvict.
	Entry Ticket
	// Filling says that a fill of the key is in flight; Fill names its
	// lock, to Wait on.
	Filling bool
	Fill    Ticket
}

// lookupTries bounds the lookups of an entry that keeps changing while it
// is copied: after them it is a miss.
const lookupTries = 4

// CacheLookup looks up the cache entry and the fill lock of k at region
// time now. The entry's bytes are copied into buf (grown if it is too
// small) and checked; an entry that changes while it is read is looked up
// again, and after a few tries it is a miss, never a torn read.
func (t *Responses) CacheLookup(k Key, now time.Duration, buf []byte) (CacheFind, error) {
	return t.CacheLookupPart(k, now, buf, -1, 0)
}

// CacheLookupPart is CacheLookup that copies an entry longer than whole
// bytes (whole < 0: none is) only in part: its first part bytes, checked
// unchanged after the copy but not against the checksum, which
// CacheCopy checks (Data is then shorter than Size).
func (t *Responses) CacheLookupPart(k Key, now time.Duration, buf []byte, whole, part int) (CacheFind, error) {
	if len(t.recs) == 0 {
		return CacheFind{}, ErrNoResponses
	}
	home := k.A & t.mask
	for range lookupTries {
		var f CacheFind
		ei, es := -1, uint64(0)
	probe:
		for i, s := range t.window(home) {
			rec := &t.recs[i]
			switch recPhase(s) {
			case recEmpty:
				break probe
			case recBusy, recReserved:
				if t.r.stale(recOwner(s)) {
					t.releaseRec(i, s, t.r.owner.Load(), 0)
					continue
				}
				if recPhase(s) == recReserved && !f.Filling && t.keyIs(rec, k, KindCache) {
					f.Filling, f.Fill = true, Ticket{i, s}
				}
			case recComplete:
				if ei >= 0 {
					continue
				}
				exp := time.Duration(atomic.LoadUint64(&rec.expiry))
				if exp > now && t.keyIs(rec, k, KindCache) {
					ei, es, f.Expiry = i, s, exp
				}
			}
		}
		if ei < 0 {
			return f, nil
		}
		rec := &t.recs[ei]
		n := int(uint32(atomic.LoadUint64(&rec.length)))
		var data []byte
		var ok bool
		if whole >= 0 && n > whole {
			data, ok = t.readPart(rec, es, buf, min(part, n))
		} else {
			data, ok = t.readInto(rec, es, buf)
		}
		if ok {
			f.Data, f.Size, f.Entry = data, n, Ticket{ei, es}
			return f, nil
		}
		buf = data[:0]
	}
	return CacheFind{}, nil
}

// readInto copies the bytes of COMPLETE record rec (state s) into buf and
// reports whether they are intact: the state unchanged after the copy and
// the checksum right. buf is grown when it is too small.
func (t *Responses) readInto(rec *record, s uint64, buf []byte) ([]byte, bool) {
	n := int(uint32(atomic.LoadUint64(&rec.length)))
	sum := atomic.LoadUint64(&rec.sum)
	data, ok := t.readPart(rec, s, buf, n)
	return data, ok && xxhash.Sum64(data) == sum
}

// readPart copies the first n bytes of COMPLETE record rec (state s)
// into buf and reports whether the record was unchanged after the copy.
func (t *Responses) readPart(rec *record, s uint64, buf []byte, n int) ([]byte, bool) {
	chain := atomic.LoadUint64(&rec.chain)
	if cap(buf) < n {
		buf = make([]byte, n)
	}
	data := buf[:n]
	if !t.load(uint32(chain), uint32(chain>>32), data) {
		return data, false
	}
	return data, atomic.LoadUint64(&rec.state) == s
}

// CacheCopy copies the whole entry tk names (as CacheLookupPart found
// it) into buf (grown if it is too small), checked as a lookup checks
// one; false when the entry changed since tk (dropped, evicted or
// replaced, its blocks perhaps reused) or its bytes are not those stored.
func (t *Responses) CacheCopy(tk Ticket, buf []byte) ([]byte, bool) {
	if tk.idx < 0 || tk.idx >= len(t.recs) || recPhase(tk.state) != recComplete {
		return nil, false
	}
	data, ok := t.readInto(&t.recs[tk.idx], tk.state, buf)
	if !ok {
		return nil, false
	}
	return data, true
}

// CacheLock takes the fill lock of k at region time now: a RESERVED cache
// record owned by this process, which CacheFill turns into k's entry or
// CacheUnlock gives up. When a live process holds it already, held is
// false and tk names that lock, to Wait on. A record is taken from those
// free in k's probe window, else from the cache entry there that expires
// first (evicted; never k's own entry, which may still be served stale).
// Errors: ErrFull (no record: fetch without storing), ErrLockTimeout,
// ErrRetired, ErrNotJoined, ErrNoResponses.
func (t *Responses) CacheLock(k Key, now time.Duration) (tk Ticket, held bool, err error) {
	if len(t.recs) == 0 {
		return Ticket{}, false, ErrNoResponses
	}
	owner := t.r.owner.Load()
	if owner == 0 {
		return Ticket{}, false, ErrNotJoined
	}
	home := k.A & t.mask
	locked := false
	defer func() {
		if locked {
			unlockWord(&t.recs[home].ilock, owner)
		}
	}()
	for {
		lock, cand := t.cacheScan(k, home, now)
		if lock.idx >= 0 {
			return lock, false, nil
		}
		if cand < 0 {
			t.r.count(evRespFull, 1)
			return Ticket{}, false, ErrFull
		}
		if !locked {
			if t.r.stale(owner) {
				return Ticket{}, false, ErrRetired
			}
			if err := lockWord(t.r, &t.recs[home].ilock, owner, t.lockWait, nil); err != nil {
				return Ticket{}, false, err
			}
			locked = true
			continue // rescan under the lock
		}
		tk, ok, err := t.claim(cand, k, KindCache, nil, nil, nil, owner, now)
		if ok {
			return tk, true, nil
		}
		if err != nil {
			return Ticket{}, false, err // a lock timeout clearing an old charge
		}
		if t.r.stale(owner) {
			return Ticket{}, false, ErrRetired
		}
	}
}

// cacheScan probes from home for k's fill lock (lock.idx -1: none) and
// a record to claim for it.
func (t *Responses) cacheScan(k Key, home uint64, now time.Duration) (lock Ticket, cand int) {
	lock.idx, cand = -1, -1
	evict, evictExp := -1, time.Duration(0)
	for i, s := range t.window(home) {
		rec := &t.recs[i]
		switch recPhase(s) {
		case recEmpty:
			return lock, firstOf(cand, i)
		case recTomb:
			cand = firstOf(cand, i)
		case recBusy, recReserved:
			if t.r.stale(recOwner(s)) {
				if t.releaseRec(i, s, t.r.owner.Load(), 0) {
					cand = firstOf(cand, i)
				}
				continue
			}
			if recPhase(s) == recReserved && t.keyIs(rec, k, KindCache) {
				return Ticket{i, s}, -1
			}
		case recComplete:
			exp := time.Duration(atomic.LoadUint64(&rec.expiry))
			switch {
			case exp <= now:
				cand = firstOf(cand, i)
			case Kind(atomic.LoadUint64(&rec.kind)) == KindCache && !t.keyIs(rec, k, KindCache) && (evict < 0 || exp < evictExp):
				evict, evictExp = i, exp
			}
		}
	}
	return lock, firstOf(cand, evict)
}

// CacheFill completes the fill lock tk: data becomes its key's entry
// until region time expiry, every other entry of the key is dropped, and
// the waiters wake. When the pool has no room for data, even after
// evicting cache entries and records that expired, the lock is given up
// and stored is false. now is the region time, to judge expiry.
func (t *Responses) CacheFill(tk Ticket, data []byte, expiry, now time.Duration) (stored bool, err error) {
	rec := &t.recs[tk.idx]
	if atomic.LoadUint64(&rec.state) != tk.state || recPhase(tk.state) != recReserved {
		return false, errReservationLost
	}
	first, count, ok := t.storeEvicting(data, now)
	if !ok {
		t.r.count(evRespNoBlock, 1)
		t.Release(tk)
		return false, nil
	}
	chain := uint64(count)<<32 | uint64(first)
	atomic.StoreUint64(&rec.length, uint64(uint32(len(data))))
	atomic.StoreUint64(&rec.chain, chain)
	atomic.StoreUint64(&rec.sum, xxhash.Sum64(data))
	atomic.StoreUint64(&rec.expiry, uint64(expiry))
	if !atomic.CompareAndSwapUint64(&rec.state, tk.state, mkRec(recComplete, recGen(tk.state), 0)) {
		me := stampOf(t.r.owner.Load())
		t.freeChain(chain, me, me, me, nil)
		return false, errReservationLost
	}
	k := Key{A: atomic.LoadUint64(&rec.keyA), B: atomic.LoadUint64(&rec.keyB)}
	t.dropEntries(k, tk.idx)
	t.wake(rec)
	return true, nil
}

// CacheUnlock gives up the fill lock tk without an entry; its waiters
// wake and look again.
func (t *Responses) CacheUnlock(tk Ticket) { t.Release(tk) }

// CacheEvict drops the entry tk names (one found purged or unreadable),
// unless it changed meanwhile.
func (t *Responses) CacheEvict(tk Ticket) bool {
	if recPhase(tk.state) != recComplete {
		return false
	}
	_, ok := t.drop(tk.idx, tk.state)
	return ok
}

// CacheDrop drops every entry of k (one that its application no longer
// lets be stored); it returns how many.
func (t *Responses) CacheDrop(k Key) int {
	if len(t.recs) == 0 {
		return 0
	}
	return t.dropEntries(k, -1)
}

// dropEntries drops the COMPLETE cache records of k in its probe window
// but record keep.
func (t *Responses) dropEntries(k Key, keep int) (n int) {
	home := k.A & t.mask
	for i, s := range t.window(home) {
		rec := &t.recs[i]
		if recPhase(s) == recEmpty {
			return n
		}
		if i == keep || recPhase(s) != recComplete || !t.keyIs(rec, k, KindCache) {
			continue
		}
		if _, ok := t.drop(i, s); ok {
			n++
		}
	}
	return n
}
