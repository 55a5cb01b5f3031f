package shm

import (
	"fmt"
	"os"
	"sync/atomic"
)

// A worker identity is an index in the worker table and that entry's
// incarnation. Everything a process claims (a BUSY slot, an insert lock, a
// reservation) is owned by its identity; when the supervisor reaps the
// process it bumps the incarnation, which makes all of it recognisably
// stale, to be released by one CAS.

// workerEntry is one worker's line in the worker table: its identity. Its
// counters are in the statistics section (Region.StatRow).
type workerEntry struct {
	incarnation uint64 // bumped by the supervisor when the worker is reaped
	pid         uint64
	uses        uint64 // the word of the metas the process writes (Counters.Use); 0 before one did
	_           [13]uint64
}

// Owner ids pack a worker index and its incarnation; 0 is nobody.
func ownerID(w int, inc uint32) uint64 { return uint64(w)<<32 | uint64(inc) }

// Join binds this process to worker index w with w's current incarnation.
// Slots this process claims are owned by (w, incarnation), so that the
// supervisor can release them when it reaps the process. Two live
// processes must never join as the same index.
func (r *Region) Join(w int) error {
	if w < 0 || w >= len(r.workers) {
		return fmt.Errorf("shm: worker index %d outside [0, %d)", w, len(r.workers))
	}
	inc := uint32(atomic.LoadUint64(&r.workers[w].incarnation))
	// The metas this process writes are published before its pid makes
	// the entry live (Counters.settled): never a word left by the last
	// process of this index.
	if r.counts != nil {
		atomic.StoreUint64(&r.workers[w].uses, r.counts.usesWord())
	}
	atomic.StoreUint64(&r.workers[w].pid, uint64(os.Getpid()))
	r.owner.Store(ownerID(w, inc))
	return nil
}

// Worker reports the index this process joined as, or -1.
func (r *Region) Worker() int {
	o := r.owner.Load()
	if o == 0 {
		return -1
	}
	return int(o >> 32)
}

// stale reports whether owner o belongs to a process that has been reaped.
func (r *Region) stale(o uint64) bool {
	if o == sweeperID || o == sweeperRec {
		return false // the supervisor
	}
	w := o >> 32
	if w >= uint64(len(r.workers)) {
		return true
	}
	return uint32(atomic.LoadUint64(&r.workers[w].incarnation)) != uint32(o)
}

// Reap is called by the supervisor after it has waited for worker w's
// process: it bumps w's incarnation, so that everything the dead process
// held is recognisably stale, and releases it at once. It returns how many
// BUSY slots, reservations and insert locks it released. It also gives
// back to the pool the response blocks the dead process held that no
// completed record holds (a chain it was building, completing or
// freeing), while the other processes go on. It also folds
// w's statistics row into the retired row: the totals keep the dead
// process's counts, and w's row starts at zero for the next process to
// Join(w), which gets the new incarnation.
func (r *Region) Reap(w int) (released int, err error) {
	if w < 0 || w >= len(r.workers) {
		return 0, fmt.Errorf("shm: worker index %d outside [0, %d)", w, len(r.workers))
	}
	r.workers[w].retire()
	r.stats.fold(w)
	released = r.counts.releaseStale() + r.resps.releaseStale()
	r.resps.reclaimStale() // last: after the records above gave up their chains
	return released, nil
}

// ReapAll treats every worker as dead: for a region re-attached after the
// whole process tree died, before any process uses it again. It also
// ends a Forget the dead supervisor was inside, counts every account
// again from its elements' charges, and gives back to the pool the
// blocks that no completed record holds (any a supervisor killed inside
// a Forget left).
func (r *Region) ReapAll() (released int) {
	r.stats.unlockDead() // a supervisor that died inside a fold
	for w := range r.workers {
		r.workers[w].retire()
		r.stats.fold(w)
	}
	released = r.counts.releaseStale() + r.resps.releaseStale() + r.resps.endForgets()
	released += r.resps.reclaimLeaked() // last: after the records above gave up their chains
	r.counts.acc.rebuild()
	r.resps.acc.rebuild()
	r.resps.addr.rebuild()
	return released
}

// retire bumps the incarnation (never to 0, which would make owner ids 0).
func (e *workerEntry) retire() {
	for {
		old := atomic.LoadUint64(&e.incarnation)
		next := uint64(uint32(old + 1))
		if next == 0 {
			next = 1
		}
		if atomic.CompareAndSwapUint64(&e.incarnation, old, next) {
			atomic.StoreUint64(&e.pid, 0)
			// No word of the reaped process's metas is left for the next
			// one: a process of an older build, which publishes none,
			// must not pass for one that writes this build's (Counters.settled).
			atomic.StoreUint64(&e.uses, 0)
			return
		}
	}
}

// WorkerInfo is one worker-table entry.
type WorkerInfo struct {
	Index       int
	Incarnation uint32
	PID         int // 0 when no process is joined (or it was reaped)
}

// Workers lists the worker entries that have a process or have been used.
func (r *Region) Workers() []WorkerInfo {
	var out []WorkerInfo
	for w := range r.workers {
		e := &r.workers[w]
		inc, pid := atomic.LoadUint64(&e.incarnation), atomic.LoadUint64(&e.pid)
		if pid != 0 || inc > 1 {
			out = append(out, WorkerInfo{Index: w, Incarnation: uint32(inc), PID: int(pid)})
		}
	}
	return out
}
