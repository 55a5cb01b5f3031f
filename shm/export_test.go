package shm

import (
	"fmt"
	"math/bits"
	"sync/atomic"
	"time"
)

// Geometry defaults and limits, for the tests of the external package.
const (
	DefaultProbe      = defaultProbe
	DefaultMaxWorkers = defaultMaxWorkers
	MaxCounters       = maxCounters
)

// SetTestHook installs the crash-point hook for tests of this package.
func SetTestHook(f func(stage string)) { testHook = f }

// SetLockWait changes the bounded wait for a live insert-lock holder.
func (c *Counters) SetLockWait(d time.Duration) { c.lockWait = d }

// Bytes is the whole mapped region.
func (r *Region) Bytes() []byte { return r.data }

// LiveKeys lists the key of every LIVE slot, duplicates included.
func (c *Counters) LiveKeys() []Key {
	var out []Key
	for i := range c.slots {
		sl := &c.slots[i]
		if phaseOf(atomic.LoadUint64(&sl.state)) == phaseLive {
			out = append(out, Key{atomic.LoadUint64(&sl.keyA), atomic.LoadUint64(&sl.keyB)})
		}
	}
	return out
}

// Retire bumps worker w's incarnation without sweeping, so that only the
// lazy release by other processes can free what it held.
func (r *Region) Retire(w int) { r.workers[w].retire() }

// SetWorkerPID records pid for worker w, as a worker that joined would.
func (r *Region) SetWorkerPID(w, pid int) { atomic.StoreUint64(&r.workers[w].pid, uint64(pid)) }

// SetBootID overwrites the boot id the time base was set under.
func (r *Region) SetBootID(id uint64) { r.store(hBootID, id) }

// SetHeld overwrites account a's count, as a bug would.
func (c *Counters) SetHeld(a uint16, n int) { atomic.StoreUint64(&c.acc.a[a].held, uint64(n)) }

// AllowSweep lets account a's next sweep start at once.
func (c *Counters) AllowSweep(a uint16) { atomic.StoreUint64(&c.acc.a[a].sweepAt, 0) }

// AllowSweep lets account a's next sweep start at once.
func (t *Responses) AllowSweep(a uint16) { atomic.StoreUint64(&t.acc.a[a].sweepAt, 0) }

// StartSweep reports whether a sweep of account a may start now, and
// starts it (without visiting anything).
func (c *Counters) StartSweep(a uint16) bool { _, _, ok := c.acc.sweepRange(a); return ok }

// AllowAddrSweep lets the next sweep of client-address account a start now.
func (t *Responses) AllowAddrSweep(a uint16) { atomic.StoreUint64(&t.addr.a[a].sweepAt, 0) }

// SetHeld sets the count of the records' (by) account a.
func (t *Responses) SetHeld(a uint16, n int) { atomic.StoreUint64(&t.acc.a[a].held, uint64(n)) }

// CheckPool checks the response table at rest (no process inside an
// operation): every block in use is in the chain of exactly one
// completed record, with the stamp that record names, every free block
// has no stamp or a dead process's, and no record or insert lock is held; it returns the
// first problem found, or "". leaked is how many blocks are in use but in
// no chain.
func (t *Responses) CheckPool() (leaked int, problem string) {
	owned := make([]int, t.nblocks) // record index + 1
	inChains := 0
	for i := range t.recs {
		rec := &t.recs[i]
		s := atomic.LoadUint64(&rec.state)
		if p := recPhase(s); p == recBusy || p == recReserved {
			return 0, fmt.Sprintf("record %d left in phase %d by owner %x", i, p, recOwner(s))
		}
		if l := atomic.LoadUint64(&rec.ilock); l != 0 {
			return 0, fmt.Sprintf("insert lock of record %d left held by %x", i, l)
		}
		if recPhase(s) != recComplete {
			continue
		}
		chain := atomic.LoadUint64(&rec.chain)
		b, n := uint32(chain), uint32(chain>>32)
		for j := uint32(0); j < n; j++ {
			if b >= t.nblocks {
				return 0, fmt.Sprintf("record %d: block %d of its chain is %d, past the pool", i, j, b)
			}
			if o := owned[b]; o != 0 {
				return 0, fmt.Sprintf("block %d is in the chains of records %d and %d", b, o-1, i)
			}
			if atomic.LoadUint64(&t.bitmap[b/64])&(1<<(b%64)) == 0 {
				return 0, fmt.Sprintf("block %d of record %d's chain is free", b, i)
			}
			h := atomic.LoadUint64(&t.blockWords(b)[0])
			if st, want := uint32(h>>32), uint32(atomic.LoadUint64(&rec.kind)>>32); st != want {
				return 0, fmt.Sprintf("block %d of record %d's chain has stamp %x, its record names %x", b, i, st, want)
			}
			owned[b] = i + 1
			inChains++
			b = uint32(h)
		}
	}
	used := 0
	for i := range t.bitmap {
		used += bits.OnesCount64(atomic.LoadUint64(&t.bitmap[i]))
	}
	for b := uint32(0); b < t.nblocks; b++ {
		if st := uint32(atomic.LoadUint64(&t.blockWords(b)[0]) >> 32); atomic.LoadUint64(&t.bitmap[b/64])&(1<<(b%64)) == 0 && st != 0 && !t.r.staleStamp(st) {
			return 0, fmt.Sprintf("free block %d has stamp %x", b, atomic.LoadUint64(&t.blockWords(b)[0])>>32)
		}
	}
	return used - inChains, ""
}
