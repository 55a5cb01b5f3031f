package shm

import (
	"runtime"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/cespare/xxhash/v2"
)

// The statistics section: what the supervisor reports as metrics, counted
// where the work is done without a shared cache line on the hot path.
//
//	| control line (fold sequence) | name table | gates | rows: one per worker index, then the retired row |
//
// A row holds shm's own events (the ev* words) and then the caller's
// Options.StatWords words. Row w is written only by the process joined as
// w (atomic adds, no contention); when the supervisor reaps that process
// it folds the row into the retired row, so that the sum of all rows never
// goes down while rows stay per process. The caller's first
// Options.StatGauges words are gauges, not counters: values of the
// process now (its open connections), which die with it, so that a fold
// drops them. A fold and a sum exclude each
// other through the fold sequence (a sequence lock: odd while a fold
// runs), so a sum never sees a folded count twice nor misses it.

// shm's own events, the first words of every row.
const (
	evFull         = iota // counter decisions answered by on_full: no slot in the probe window
	evLockTimeout         // counter decisions answered by on_full: insert lock held too long
	evClaims              // counter slots published LIVE from EMPTY or TOMB
	evReclaims            // counter slots published LIVE for another key (reclaimed)
	evEvictions           // LIVE counter slots taken over by a reclaim (LIVE → BUSY)
	evRecovered           // BUSY slots, records, insert locks and account locks released from dead owners
	evPlaced              // counter slots placed LIVE by a load
	evRespFull            // reservations refused: no record in the probe window
	evRespNoBlock         // responses completed unreplayable: no blocks left to store them
	evRecTaken            // records taken from EMPTY or TOMB (reservations and loads)
	evRecFreed            // records turned into tombstones (released)
	evRecReused           // expired completed records taken for another key
	evBlocksTaken         // response blocks allocated
	evBlocksFreed         // response blocks freed
	evQuota               // new keys refused: their account held its maximum of slots
	evSwept               // slots of fresh keys freed by an account's sweep
	evRespQuota           // reservations refused: their account held its maximum of records
	evRespSwept           // expired records freed by an account's sweep
	evCacheEvicted        // cache entries dropped before their expiry, to make room
	evSupervisor          // SupervisorWords words: the supervisors' own counts (Region.SupervisorCounts)
	shmWords       = 24   // room for more events without moving the caller's words
)

// SupervisorWords is how many words Region.SupervisorCounts has.
const SupervisorWords = 5

// shmWords has room for them.
const _ = uint(shmWords - evSupervisor - SupervisorWords)

// Geometry limits of the statistics section.
const (
	maxStatWords = 1 << 16
	maxStatNames = 1 << 16
	maxStatGates = 1 << 20
	gateSize     = 16
)

// rowWords is the width of one row: shm's words and the caller's, in whole
// cache lines, so that two workers' rows never share one.
func (o Options) rowWords() uint64 { return roundUp(shmWords+uint64(o.StatWords), 8) }

// statBytes is the size of the statistics section.
func (o Options) statBytes() uint64 {
	return 64 + roundUp(uint64(o.StatNames)*8, 64) + roundUp(uint64(o.StatGates)*gateSize, 64) +
		uint64(o.MaxWorkers+1)*o.rowWords()*8
}

type gate struct {
	last uint64 // region time + 1 of the last line let through; 0 = never
	mark uint64 // left by the last line's writer for the next
}

// statistics is the section's view.
type statistics struct {
	seq     *uint64
	names   []uint64 // xxhash64 of each name, 0 = free
	gates   []gate
	rows    []uint64 // (MaxWorkers+1) rows of width words
	width   int
	words   int      // shmWords + StatWords: the part of a row in use
	gauges  int      // the caller's words from the first that a fold drops (Options.StatGauges)
	retired int      // index of the retired row
	private []uint64 // the row of a process that has not joined
	spare   gate     // the gate of an index out of range
}

func newStatistics(r *Region, off uint64) *statistics {
	o := r.geo
	st := &statistics{
		width:   int(o.rowWords()),
		words:   shmWords + o.StatWords,
		gauges:  o.StatGauges,
		retired: o.MaxWorkers,
		private: make([]uint64, shmWords+o.StatWords),
	}
	st.seq = (*uint64)(r.at(off))
	at := off + 64
	if o.StatNames > 0 {
		st.names = unsafe.Slice((*uint64)(r.at(at)), o.StatNames)
	}
	at += roundUp(uint64(o.StatNames)*8, 64)
	if o.StatGates > 0 {
		st.gates = unsafe.Slice((*gate)(r.at(at)), o.StatGates)
	}
	at += roundUp(uint64(o.StatGates)*gateSize, 64)
	st.rows = unsafe.Slice((*uint64)(r.at(at)), (o.MaxWorkers+1)*st.width)
	return st
}

func (st *statistics) row(w int) []uint64 {
	return st.rows[w*st.width : w*st.width+st.words : w*st.width+st.words]
}

// ownRow is the row this process adds shm's events to: its worker
// index's once joined, else the retired row. A process that is not a
// worker but acts on the region (the supervisor: loading a dump,
// releasing what dead workers held) counts there, which only such
// processes and folds write.
func (r *Region) ownRow() []uint64 {
	if o := r.owner.Load(); o != 0 {
		return r.stats.row(int(o >> 32))
	}
	return r.stats.row(r.stats.retired)
}

// count adds n to shm's event ev in this process's row.
func (r *Region) count(ev int, n uint64) { atomic.AddUint64(&r.ownRow()[ev], n) }

// StatRow returns this process's row of statistics: the
// Options.StatWords words that belong to the caller, to add to with
// atomic.AddUint64 and nothing else. No other process writes them while
// this one runs; once it was reaped they are folded into the retired row.
// Before Join it is a private row that nobody reads.
func (r *Region) StatRow() []uint64 {
	if o := r.owner.Load(); o != 0 {
		return r.stats.row(int(o >> 32))[shmWords:]
	}
	return r.stats.private[shmWords:]
}

// SupervisorCounts returns the words the region's supervisors count in
// (their caller's meanings: workers replaced, reloads), to add to and
// read with atomics and nothing else. They are words of the retired row,
// which no worker writes and no fold moves: they go on with the region,
// as the workers' counts do, across a binary upgrade whose two
// supervisors share it and a live region attached again by a restart.
func (r *Region) SupervisorCounts() []uint64 {
	return r.stats.row(r.stats.retired)[evSupervisor : evSupervisor+SupervisorWords : evSupervisor+SupervisorWords]
}

// fold moves row w's counters into the retired row and drops its gauges
// (they said what the process had open, and it has nothing open any
// more). Each word is taken out with one swap, so an add of a process
// still writing (an orphan of a dead supervisor) lands in the row or in
// the retired row, never nowhere.
func (st *statistics) fold(w int) {
	st.lock()
	row, ret := st.row(w), st.row(st.retired)
	for i := range row {
		if v := atomic.SwapUint64(&row[i], 0); v != 0 && (i < shmWords || i >= shmWords+st.gauges) {
			atomic.AddUint64(&ret[i], v)
		}
	}
	atomic.AddUint64(st.seq, 1)
}

// lock makes the fold sequence odd; folds are rare and short.
func (st *statistics) lock() {
	for {
		s := atomic.LoadUint64(st.seq)
		if s&1 == 0 && atomic.CompareAndSwapUint64(st.seq, s, s+1) {
			return
		}
		runtime.Gosched()
	}
}

// unlockDead ends a fold that a dead process left half done: its words
// were moved or not, none twice.
func (st *statistics) unlockDead() {
	if s := atomic.LoadUint64(st.seq); s&1 != 0 {
		atomic.CompareAndSwapUint64(st.seq, s, s+1)
	}
}

// tornWait bounds how long a sum waits for a fold to end: only a fold
// whose process died (a supervisor killed in the middle of one) lasts.
const tornWait = time.Second

// read sets dst to the sum of the rows ws (all rows when ws is nil),
// between two folds. It reports false when a fold did not end within
// tornWait: the sum may then miss or double a dead worker's counts.
func (st *statistics) read(dst []uint64, ws []int) bool {
	return st.consistent(func() {
		clear(dst)
		if ws == nil {
			for w := 0; w <= st.retired; w++ {
				addRow(dst, st.row(w))
			}
			return
		}
		for _, w := range ws {
			addRow(dst, st.row(w))
		}
	})
}

// consistent runs sum, a read of the rows, between two folds (the
// sequence lock's reader side): again while a fold ran meanwhile, and
// waiting for one in progress up to tornWait. It reports false when a
// fold did not end by then (its process died in it): sum's result may
// miss or double a dead worker's counts.
func (st *statistics) consistent(sum func()) bool {
	var deadline int64
	for {
		s := atomic.LoadUint64(st.seq)
		folding := s&1 != 0
		if folding {
			if deadline == 0 {
				deadline = nanotime() + int64(tornWait)
			}
			if nanotime() < deadline {
				runtime.Gosched()
				continue
			}
		}
		sum()
		switch {
		case folding:
			return false
		case atomic.LoadUint64(st.seq) == s:
			return true
		}
	}
}

func addRow(dst, row []uint64) {
	for i := range row {
		dst[i] += atomic.LoadUint64(&row[i])
	}
}

// StatSum is a sum of statistics rows: shm's own (Table) and the caller's
// words (Words, Options.StatWords of them).
type StatSum struct {
	Table TableStats
	Words []uint64
	// Consistent is false when the sum was taken during a fold that never
	// ended (its process died in it): a count may then be missed or seen
	// twice. It is always true in the supervisor, which does the folds.
	Consistent bool
	raw        []uint64
}

// SumStats adds up every worker's row and the retired row into s (whose
// buffers it reuses): the totals since the region was created. Counters
// in it never go down from one sum to the next, whatever workers come and
// go. It reads no slot or record: its cost is the rows' size.
func (r *Region) SumStats(s *StatSum) { r.sumRows(s, nil) }

// WorkerStats sets s to worker index w's row alone: the counts of the
// process joined as w since it joined (zero after it was reaped).
func (r *Region) WorkerStats(w int, s *StatSum) {
	if w < 0 || w >= r.stats.retired {
		*s = StatSum{Words: s.Words[:0], raw: s.raw[:0], Consistent: true}
		return
	}
	r.sumRows(s, []int{w})
}

// OthersStats sets s to the sum of every row but worker index w's (the
// retired row included): what every other worker counted, read at one
// instant under the fold sequence, so that a difference of two such sums
// never counts the work of w, nor loses that of a worker reaped between
// them.
func (r *Region) OthersStats(w int, s *StatSum) {
	ws := make([]int, 0, r.stats.retired+1)
	for i := 0; i <= r.stats.retired; i++ {
		if i != w {
			ws = append(ws, i)
		}
	}
	r.sumRows(s, ws)
}

func (r *Region) sumRows(s *StatSum, ws []int) {
	n := r.stats.words
	if cap(s.raw) < n {
		s.raw = make([]uint64, n)
	}
	s.raw = s.raw[:n]
	s.Consistent = r.stats.read(s.raw, ws)
	s.Words = s.raw[shmWords:]
	s.Table = r.tableStats(s.raw)
}

// StatName returns the index of name in the region's name table
// (Options.StatNames entries), the same in every process for the region's
// life: it keys the per-name words of a caller (a rate-limit rule's
// counts) so that they stay put across reloads that add, remove or reorder
// names. An absent name is added when add is true. ok is false when the
// name is absent and not added, or the table is full. Names are told
// apart by a 64-bit hash.
func (r *Region) StatName(name string, add bool) (index int, ok bool) {
	names := r.stats.names
	n := len(names)
	if n == 0 {
		return 0, false
	}
	h := xxhash.Sum64String(name)
	if h == 0 {
		h = 1
	}
	start := int(h % uint64(n))
	for j := 0; j < n; j++ {
		i := (start + j) % n
		v := atomic.LoadUint64(&names[i])
		if v == 0 && add {
			if atomic.CompareAndSwapUint64(&names[i], 0, h) {
				return i, true
			}
			v = atomic.LoadUint64(&names[i]) // taken meanwhile, perhaps by this very name
		}
		switch v {
		case h:
			return i, true
		case 0:
			return 0, false // entries are never removed: the name is absent
		}
	}
	return 0, false
}

// Gate is a pair of words shared by every process of the region that lets
// one event an interval through, for log lines that a flood of requests in
// many workers would otherwise multiply.
type Gate struct{ g *gate }

// Gate returns gate i of the region's Options.StatGates; an index out of
// range gets a gate of this process alone.
func (r *Region) Gate(i int) Gate {
	if i < 0 || i >= len(r.stats.gates) {
		return Gate{&r.stats.spare}
	}
	return Gate{&r.stats.gates[i]}
}

// Pass reports whether an event at region time now may go through: no
// other went through, in any process, during the last interval every.
// Of several processes that ask at once, one passes.
func (g Gate) Pass(now, every time.Duration) bool {
	last := atomic.LoadUint64(&g.g.last)
	if last != 0 && now-time.Duration(last-1) < every {
		return false
	}
	return atomic.CompareAndSwapUint64(&g.g.last, last, uint64(now)+1)
}

// SwapMark leaves v for the next event that passes and returns what the
// last one left (0 for none), e.g. a running count, so that the next line
// can say how many events were held back in between.
func (g Gate) SwapMark(v uint64) uint64 { return atomic.SwapUint64(&g.g.mark, v) }

// Mark is what the last SwapMark or CompareAndSwapMark left, read
// without writing: a word every process may check on a hot path.
func (g Gate) Mark() uint64 { return atomic.LoadUint64(&g.g.mark) }

// CompareAndSwapMark leaves v when the mark is still old, and reports
// whether it did.
func (g Gate) CompareAndSwapMark(old, v uint64) bool {
	return atomic.CompareAndSwapUint64(&g.g.mark, old, v)
}

// StatTotal is the caller's word i summed over every row, between two
// folds: one counter's total, without summing whole rows (a rate-limited
// log line counts what it held back with it).
func (r *Region) StatTotal(i int) uint64 {
	st := r.stats
	if i < 0 || shmWords+i >= st.words {
		return 0
	}
	var n uint64
	st.consistent(func() {
		n = 0
		for w := 0; w <= st.retired; w++ {
			n += atomic.LoadUint64(&st.rows[w*st.width+shmWords+i])
		}
	})
	return n
}
