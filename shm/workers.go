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

// workerEntry is one worker's line in the worker table: its incarnation and
// counters only it writes (so the hot path shares no line with another worker).
type workerEntry struct {
	incarnation uint64 // bumped by the supervisor when the worker is reaped
	pid         uint64
	full        uint64 // decisions answered by on_full: no slot in the probe window
	lockTimeout uint64 // decisions answered by on_full: insert lock held too long
	claims      uint64 // new keys installed (EMPTY or TOMB slots)
	reclaims    uint64 // slots taken over from a key equivalent to a fresh one
	recovered   uint64 // BUSY slots, records and insert locks released from dead owners
	respFull    uint64 // reservations refused: no response record in the probe window
	respNoBlock uint64 // responses completed unreplayable: no blocks left to store them
	requests    uint64 // responses sent (requests.go)
	errors5xx   uint64 // responses sent with a 5xx status (requests.go)
	_           [5]uint64
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
	w := o >> 32
	if w >= uint64(len(r.workers)) {
		return true
	}
	return uint32(atomic.LoadUint64(&r.workers[w].incarnation)) != uint32(o)
}

// count adds one to a counter in this process's worker entry (nothing
// when it has not joined).
func (r *Region) count(field func(*workerEntry) *uint64) {
	if o := r.owner.Load(); o != 0 {
		atomic.AddUint64(field(&r.workers[o>>32]), 1)
	}
}

// Reap is called by the supervisor after it has waited for worker w's
// process: it bumps w's incarnation, so that everything the dead process
// held is recognisably stale, and releases it at once. It returns how many
// BUSY slots, reservations and insert locks it released. The next process
// to Join(w) gets the new incarnation.
func (r *Region) Reap(w int) (released int, err error) {
	if w < 0 || w >= len(r.workers) {
		return 0, fmt.Errorf("shm: worker index %d outside [0, %d)", w, len(r.workers))
	}
	r.workers[w].retire()
	return r.counts.releaseStale() + r.resps.releaseStale(), nil
}

// ReapAll treats every worker as dead: for a region re-attached after the
// whole process tree died.
func (r *Region) ReapAll() (released int) {
	for w := range r.workers {
		r.workers[w].retire()
	}
	return r.counts.releaseStale() + r.resps.releaseStale()
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
