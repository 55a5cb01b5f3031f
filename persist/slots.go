package persist

import (
	"encoding/binary"
	"errors"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/preforkd/preforkd/shm"
)

// Re-inserting a dump through shm.Counters.Insert costs a lock, four CASes
// and a claim count per entry: about ten times a file read of the same
// bytes. A loader is alone with a fresh region (no worker exists yet), so
// it may place entries directly through Region.Bytes, which shm provides
// for exactly this; and a dumper, alone with a region no worker writes any
// more, may read the slots in the order that makes them fit again. This
// file is the only one that knows the slot layout; it uses it only for a
// region whose header matches the layout below (layout version, slot size,
// byte order, slot offset), and falls back to shm's Range and Insert for
// any other. TestDirectPlacement proves the two agree.

// directLayout is the shm layout version whose counter slots this file knows.
const directLayout = 1

// Region header words (shm layout version 1) and slot words.
const (
	rhVersion   = 8
	rhSlots     = 24
	rhOffSlots  = 88
	rhByteOrder = 96
	rhSlotSize  = 104

	phaseEmpty = 0
	phaseLive  = 2
	phaseShift = 62
	genShift   = 48
)

// slotWords is one counter slot: state, key A, key B, meta, insert lock, spare.
type slotWords [slotSize / 8]uint64

// table is a region's counter slots, accessed directly (see above).
type table struct {
	slots []slotWords
	mask  uint64
	probe int
}

// regionWord reads a native-endian header word of r.
func regionWord(r *shm.Region, off int) uint64 {
	return binary.NativeEndian.Uint64(r.Bytes()[off:])
}

// directTable returns r's slots for direct placement, or ok=false when r's
// layout is not the one this file knows.
func directTable(r *shm.Region) (*table, bool) {
	b := r.Bytes()
	g := r.Geometry()
	if shm.LayoutVersion != directLayout || len(b) < 4096 ||
		regionWord(r, rhVersion) != directLayout || regionWord(r, rhByteOrder) != byteOrderMark ||
		regionWord(r, rhSlotSize) != slotSize || regionWord(r, rhSlots) != uint64(g.Counters) {
		return nil, false
	}
	off := regionWord(r, rhOffSlots)
	if g.Counters <= 0 || off%slotSize != 0 || off > uint64(len(b)) ||
		uint64(g.Counters) > (uint64(len(b))-off)/slotSize ||
		uintptr(unsafe.Pointer(&b[0]))%8 != 0 {
		return nil, false
	}
	slots := unsafe.Slice((*slotWords)(unsafe.Pointer(&b[off])), g.Counters)
	return &table{slots: slots, mask: uint64(g.Counters - 1), probe: g.Probe}, true
}

var (
	errDuplicate = errors.New("duplicate key")
	errNoRoom    = errors.New("no slot within the probe window")
)

// place installs e in the first EMPTY slot of its probe window, as a
// claim from EMPTY would (LIVE, generation 1). It requires a table that
// only this process uses and that holds nothing but EMPTY slots and
// entries placed by it. It costs at most one probe window.
func (t *table) place(e shm.Entry) error {
	h := e.Key.A & t.mask
	for j := 0; j < t.probe; j++ {
		s := &t.slots[(h+uint64(j))&t.mask]
		if atomic.LoadUint64(&s[0])>>phaseShift == phaseEmpty {
			s[1], s[2], s[3] = e.Key.A, e.Key.B, e.Meta
			atomic.StoreUint64(&s[0], phaseLive<<phaseShift|1<<genShift|e.Payload&shm.PayloadMask)
			return nil
		}
		if s[1] == e.Key.A && s[2] == e.Key.B {
			return errDuplicate // a key is never LIVE in two slots
		}
	}
	return errNoRoom
}

// boundary returns a slot index that no live entry's probe path crosses
// (no entry lies at or after it with its home before it), or 0 when there
// is none. Entries re-placed in slot order starting there each land at
// most as far from their home as they were, so a table re-filled from
// them in a table of the same size loses none. Starting anywhere else, an
// entry that wrapped around the end of the table can take the slot of
// one that then no longer fits. Any EMPTY slot is followed by a boundary.
func (t *table) boundary() int {
	for b := range t.slots {
		crossed := false
		for j := 0; j < t.probe && !crossed; j++ {
			i := (uint64(b) + uint64(j)) & t.mask
			s := &t.slots[i]
			crossed = atomic.LoadUint64(&s[0])>>phaseShift == phaseLive && int((i-s[1])&t.mask) > j
		}
		if !crossed {
			return b
		}
	}
	return 0
}

// rangeFrom calls fn for every LIVE slot, in slot order from slot b
// around to b−1. It requires that nothing writes the table.
func (t *table) rangeFrom(b int, fn func(shm.Entry)) {
	n := len(t.slots)
	for k := 0; k < n; k++ {
		s := &t.slots[(b+k)&int(t.mask)]
		st := atomic.LoadUint64(&s[0])
		if st>>phaseShift == phaseLive {
			fn(shm.Entry{Key: shm.Key{A: s[1], B: s[2]}, Meta: s[3], Payload: st & shm.PayloadMask})
		}
	}
}

// entries calls fn for every live entry of r, which nothing writes: in
// slot order from a boundary when r's layout is known, else through
// shm's Range.
func entries(r *shm.Region, fn func(shm.Entry)) {
	if t, ok := directTable(r); ok {
		t.rangeFrom(t.boundary(), fn)
		return
	}
	r.Counters().Range(func(e shm.Entry) bool { fn(e); return true })
}

// placer installs entries into a fresh region: directly when its layout
// is known, else through shm's Insert.
type placer struct {
	r      *shm.Region
	direct *table
	now    time.Duration
	id     borrowed
}

func newPlacer(r *shm.Region, now time.Duration) *placer {
	p := &placer{r: r, now: now, id: borrowed{r: r}}
	p.direct, _ = directTable(r)
	return p
}

func (p *placer) place(e shm.Entry) error {
	if p.direct != nil {
		return p.direct.place(e)
	}
	if err := p.id.join(); err != nil {
		return err
	}
	if _, ok := p.r.Counters().Peek(e.Key, p.now); ok {
		return errDuplicate
	}
	if err := p.r.Counters().Insert(e, p.now); err != nil {
		return errNoRoom
	}
	return nil
}

func (p *placer) done() { p.id.release() }

// borrowed is a worker identity for the loader's own claims (Insert and
// Restore claim as a worker): worker index 0, joined only when r has no
// identity yet, and retired on release, so that the first real worker 0
// gets a new incarnation and nothing stays owned by the loader.
type borrowed struct {
	r      *shm.Region
	joined bool
}

func (b *borrowed) join() error {
	if b.joined || b.r.Worker() >= 0 {
		return nil
	}
	if err := b.r.Join(0); err != nil {
		return err
	}
	b.joined = true
	return nil
}

func (b *borrowed) release() {
	if b.joined {
		b.r.Reap(0)
		b.joined = false
	}
}
