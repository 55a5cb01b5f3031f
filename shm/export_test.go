package shm

import (
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
