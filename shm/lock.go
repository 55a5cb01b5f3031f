package shm

import (
	"runtime"
	"sync/atomic"
	"time"
)

// The two tables' synchronisation beyond a CAS: the insert lock that
// claims take on a key's home slot or record, and the futex on which a
// duplicate request waits for the original in another process.

// defaultLockWait bounds the wait for an insert lock held by a live
// process. The lock is held for a few stores; a wait this long means the
// holder is stopped or starved, and the caller's on_full policy answers
// instead.
const defaultLockWait = 250 * time.Millisecond

// lockWord takes lock word w for owner. A live holder is waited for up to
// wait (not at all when wait is 0), then ErrLockTimeout. A dead holder's
// lock is released at once; with repair set, it is taken over instead,
// and repair runs holding it, to mend what the holder left half-done.
func lockWord(r *Region, w *uint64, owner uint64, wait time.Duration, repair func()) error {
	var b lockBackoff
	for n := 0; ; n++ {
		cur := atomic.LoadUint64(w)
		if cur == 0 {
			if atomic.CompareAndSwapUint64(w, 0, owner) {
				return nil
			}
			continue
		}
		if r.stale(cur) {
			if repair == nil {
				if atomic.CompareAndSwapUint64(w, cur, 0) {
					r.count(evRecovered, 1)
				}
				continue
			}
			if atomic.CompareAndSwapUint64(w, cur, owner) {
				repair()
				r.count(evRecovered, 1)
				return nil
			}
			continue
		}
		if wait <= 0 || !b.wait(n, wait) {
			return ErrLockTimeout
		}
	}
}

// lockBackoff paces the retries of a lock that a live process holds: the
// first 64 yield the processor, the later ones sleep longer and longer (up
// to 1ms), until wait has passed since the first sleep.
type lockBackoff struct{ deadline int64 }

// wait paces retry n of a lock; it reports false, without waiting, once
// the wait is over.
func (b *lockBackoff) wait(n int, wait time.Duration) bool {
	if n < 64 {
		runtime.Gosched()
		return true
	}
	if b.deadline == 0 {
		b.deadline = nanotime() + int64(wait)
	} else if nanotime() > b.deadline {
		return false
	}
	time.Sleep(time.Duration(min(n-63, 50)) * 20 * time.Microsecond)
	return true
}

// unlockWord releases an insert lock word if owner still holds it.
func unlockWord(w *uint64, owner uint64) { atomic.CompareAndSwapUint64(w, owner, 0) }
