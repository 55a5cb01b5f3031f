package shm

import (
	"math/bits"
	"sync/atomic"
)

// TableStats are the two tables' occupancy and events, from the counts
// every process keeps in its statistics row as it changes a slot or a
// record: reading them scans nothing. The occupancies are exact while no
// worker is between a change and its count, which is a few instructions;
// a worker killed right there leaves them off by one.
type TableStats struct {
	Slots int // counter slots in the table
	Probe int // how far from its home a key may be placed
	// Live is the slots that hold a key: installed, and not taken over
	// since. A key whose state turned fresh still holds its slot until
	// another key reclaims it.
	Live int

	Full        uint64 // decisions answered by on_full: no slot in the probe window
	LockTimeout uint64 // decisions answered by on_full: insert lock held too long
	Claims      uint64 // keys installed in EMPTY or TOMB slots
	Reclaims    uint64 // slots taken over from keys equivalent to fresh ones
	Recovered   uint64 // BUSY slots, records, insert locks and account locks released from dead processes
	Placed      uint64 // slots filled by a load (a dump, a migrated live region)
	Quota       uint64 // new keys refused: their account held its maximum of slots (ErrQuota)
	Swept       uint64 // slots of fresh keys freed by the sweep of an account at its maximum

	Records      int    // response records (0: no response table)
	RecordsInUse int    // records reserved, being completed, or completed (expired or not)
	RecordsFull  uint64 // reservations refused: no record in the probe window
	Blocks       int    // blocks of the response pool
	BlockSize    int    // bytes of one block
	BlocksUsed   int    // blocks holding a stored response
	NoBlocks     uint64 // responses completed unreplayable for want of blocks
	RecordsQuota uint64 // reservations refused: their account held its maximum of records
	RecordsSwept uint64 // expired records freed by the sweep of an account at its maximum
	CacheEvicted uint64 // cache entries dropped before their expiry to make room
	TagPurges    uint64 // tag purges of the cache (Tags.Purge)
	URLPurges    uint64 // URL generations advanced (Tags.Bump: purges by URL, invalidations)
}

// Occupancy is the fraction of counter slots that hold a key.
func (s TableStats) Occupancy() float64 {
	if s.Slots == 0 {
		return 0
	}
	return float64(s.Live) / float64(s.Slots)
}

// tableStats decodes shm's words of a summed row.
func (r *Region) tableStats(w []uint64) TableStats {
	gauge := func(in, out uint64) int { return int(max(int64(in-out), 0)) }
	return TableStats{
		Slots: len(r.counts.slots), Probe: r.counts.probe,
		Live:        gauge(w[evClaims]+w[evReclaims]+w[evPlaced], w[evEvictions]),
		Full:        w[evFull],
		LockTimeout: w[evLockTimeout],
		Claims:      w[evClaims],
		Reclaims:    w[evReclaims],
		Recovered:   w[evRecovered],
		Placed:      w[evPlaced],
		Quota:       w[evQuota],
		Swept:       w[evSwept],

		Records:      len(r.resps.recs),
		RecordsInUse: gauge(w[evRecTaken], w[evRecFreed]),
		RecordsFull:  w[evRespFull],
		Blocks:       int(r.resps.nblocks),
		BlockSize:    r.resps.blockSize,
		BlocksUsed:   gauge(w[evBlocksTaken], w[evBlocksFreed]),
		NoBlocks:     w[evRespNoBlock],
		RecordsQuota: w[evRespQuota],
		RecordsSwept: w[evRespSwept],
		CacheEvicted: w[evCacheEvicted],
		TagPurges:    r.word(hTagPurges),
		URLPurges:    r.word(hURLPurges),
	}
}

// Stats describes a region's counter table by a scan of every slot, for
// what only a scan can tell (probe distances, tombstones): `preforkd
// inspect`, and tests that check the maintained counts against it. Any
// process that maps the region can call it; while workers run it is a
// moving picture. Metrics use Region.SumStats, which scans nothing.
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
	Recovered   uint64 // BUSY slots, insert locks and account locks released from dead processes
	Quota       uint64 // new keys refused: their account held its maximum of slots (ErrQuota)
	Swept       uint64 // slots of fresh keys freed by the sweep of an account at its maximum
}

// Occupancy is the fraction of slots that hold a key or are being installed.
func (s Stats) Occupancy() float64 {
	if s.Slots == 0 {
		return 0
	}
	return float64(s.Live+s.Busy) / float64(s.Slots)
}

// Stats scans the table and sums the events of the statistics rows.
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
	var sum StatSum
	c.r.SumStats(&sum)
	t := sum.Table
	st.Full, st.LockTimeout, st.Claims, st.Reclaims, st.Recovered = t.Full, t.LockTimeout, t.Claims, t.Reclaims, t.Recovered
	st.Quota, st.Swept = t.Quota, t.Swept
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
	Quota      uint64 // reservations refused: their account held its maximum of records (ErrQuota)
	Swept      uint64 // expired records freed by the sweep of an account at its maximum
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
	var sum StatSum
	t.r.SumStats(&sum)
	st.Full, st.NoBlocks, st.Evicted = sum.Table.RecordsFull, sum.Table.NoBlocks, sum.Table.CacheEvicted
	st.Quota, st.Swept = sum.Table.RecordsQuota, sum.Table.RecordsSwept
	return st
}
