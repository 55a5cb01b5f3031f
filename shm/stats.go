package shm

import (
	"math/bits"
	"sync/atomic"
)

// Stats describes a region's counter table. Any process that maps the
// region can read it; it is computed by a scan (no cost on the hot path)
// and is a moving picture while workers run.
type Stats struct {
	Slots int // slots in the table
	Probe int // probe limit: how far from its home a key may be placed
	Empty int // never used
	Live  int // holding a key
	Busy  int // being installed (or held by a dead process not yet released)
	Tomb  int // released; reusable

	MaxProbe  int     // largest distance of a live key from its home slot
	MeanProbe float64 // mean distance of live keys from their home slots
	Locked    int     // insert locks held at the time of the scan

	Full        uint64 // decisions answered by on_full: no slot in the probe window
	LockTimeout uint64 // decisions answered by on_full: insert lock held too long
	Claims      uint64 // new keys installed in EMPTY or TOMB slots
	Reclaims    uint64 // slots taken over from keys equivalent to fresh ones
	Recovered   uint64 // BUSY slots and insert locks released from dead processes
}

// Occupancy is the fraction of slots that hold a key or are being installed.
func (s Stats) Occupancy() float64 {
	if s.Slots == 0 {
		return 0
	}
	return float64(s.Live+s.Busy) / float64(s.Slots)
}

// Stats scans the table and sums the per-worker counters.
func (c *Counters) Stats() Stats {
	st := Stats{Slots: len(c.slots), Probe: c.probe}
	var dist int
	for i := range c.slots {
		sl := &c.slots[i]
		s := atomic.LoadUint64(&sl.state)
		switch phaseOf(s) {
		case phaseEmpty:
			st.Empty++
		case phaseBusy:
			st.Busy++
		case phaseTomb:
			st.Tomb++
		case phaseLive:
			st.Live++
			d := int((uint64(i) - atomic.LoadUint64(&sl.keyA)) & c.mask)
			dist += d
			st.MaxProbe = max(st.MaxProbe, d+1)
		}
		if atomic.LoadUint64(&sl.ilock) != 0 {
			st.Locked++
		}
	}
	if st.Live > 0 {
		st.MeanProbe = 1 + float64(dist)/float64(st.Live)
	}
	for w := range c.r.workers {
		e := &c.r.workers[w]
		st.Full += atomic.LoadUint64(&e.full)
		st.LockTimeout += atomic.LoadUint64(&e.lockTimeout)
		st.Claims += atomic.LoadUint64(&e.claims)
		st.Reclaims += atomic.LoadUint64(&e.reclaims)
		st.Recovered += atomic.LoadUint64(&e.recovered)
	}
	return st
}

// ResponseStats describes the response table, from a scan.
type ResponseStats struct {
	Records    int
	Reserved   int // idempotency reservations (and records being claimed)
	Complete   int // completed idempotency records
	Cached     int // response cache entries
	Filling    int // response cache fills in flight
	CacheBytes int // bytes of the cache entries
	Blocks     int
	BlocksUsed int
	Full       uint64 // reservations and fill locks refused: no record in the probe window
	NoBlocks   uint64 // responses not stored for want of blocks
	Evicted    uint64 // cache entries dropped before their expiry to make room
}

// Stats scans the response table.
func (t *Responses) Stats() ResponseStats {
	st := ResponseStats{Records: len(t.recs), Blocks: int(t.nblocks)}
	for i := range t.recs {
		rec := &t.recs[i]
		cache := Kind(atomic.LoadUint64(&rec.kind)) == KindCache
		switch recPhase(atomic.LoadUint64(&rec.state)) {
		case recReserved:
			if cache {
				st.Filling++
			} else {
				st.Reserved++
			}
		case recBusy:
			st.Reserved++
		case recComplete:
			if cache {
				st.Cached++
				st.CacheBytes += int(uint32(atomic.LoadUint64(&rec.length)))
			} else {
				st.Complete++
			}
		}
	}
	for i := range t.bitmap {
		st.BlocksUsed += bits.OnesCount64(atomic.LoadUint64(&t.bitmap[i]))
	}
	for w := range t.r.workers {
		st.Full += atomic.LoadUint64(&t.r.workers[w].respFull)
		st.NoBlocks += atomic.LoadUint64(&t.r.workers[w].respNoBlock)
		st.Evicted += atomic.LoadUint64(&t.r.workers[w].respEvicted)
	}
	return st
}
