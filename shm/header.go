package shm

import (
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"os"
	"sync/atomic"
	"time"
	"unsafe"
)

// HeaderError says why a region's header was refused.
type HeaderError struct{ Reason string }

func (e *HeaderError) Error() string { return "shm: bad region header: " + e.Reason }

func randomSeed() (uint64, error) {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return 0, fmt.Errorf("shm: random seed: %w", err)
	}
	return binary.LittleEndian.Uint64(b[:]), nil
}

// format writes a fresh header for o into zeroed memory and binds r to it.
func (r *Region) format(o Options) error {
	s1, err := randomSeed()
	if err != nil {
		return err
	}
	s2, err := randomSeed()
	if err != nil {
		return err
	}
	lay := o.layout()
	copy(r.data[hMagic:hMagic+8], Magic)
	r.store(hVersion, LayoutVersion)
	r.store(hByteOrder, byteOrderMark)
	r.store(hSize, lay.size)
	for i, sec := range sectionTable {
		r.store(sec.word, lay.off[i])
	}
	r.store(hSlots, uint64(o.Counters))
	r.store(hSlotSize, slotSize)
	r.store(hProbe, uint64(o.Probe))
	r.store(hMaxWorkers, uint64(o.MaxWorkers))
	r.store(hRecords, uint64(o.Responses))
	r.store(hRecordSize, recordSize)
	r.store(hBlockSize, uint64(o.BlockSize))
	r.store(hBlocks, o.blocks())
	r.store(hStatWords, uint64(o.StatWords))
	r.store(hStatNames, uint64(o.StatNames))
	r.store(hStatGates, uint64(o.StatGates))
	r.store(hStatGauges, uint64(o.StatGauges))
	r.store(hStatLayout, o.StatLayout)
	r.store(hTags, uint64(o.Tags))
	r.store(hSeed1, s1)
	r.store(hSeed2, s2)
	r.store(hTimeBase, uint64(nanotime()))
	created := time.Now().UnixNano()
	r.store(hCreated, uint64(created))
	r.store(hBootID, bootID())
	r.store(hBeatWall, uint64(created))
	r.store(hOwnerPID, uint64(os.Getpid()))
	if err := r.load(); err != nil {
		return err
	}
	for w := range r.workers {
		atomic.StoreUint64(&r.workers[w].incarnation, 1)
	}
	return nil
}

// load validates the header and binds r's views to the sections it describes.
func (r *Region) load() error {
	bad := func(f string, a ...any) error { return &HeaderError{Reason: fmt.Sprintf(f, a...)} }
	if string(r.data[hMagic:hMagic+8]) != Magic {
		return bad("magic %q", r.data[hMagic:hMagic+8])
	}
	if v := r.word(hByteOrder); v != byteOrderMark {
		return bad("byte order mark %#x", v)
	}
	if v := r.word(hVersion); v != LayoutVersion {
		return bad("layout version %d, want %d", v, LayoutVersion)
	}
	if v := r.word(hSlotSize); v != slotSize {
		return bad("slot size %d, want %d", v, slotSize)
	}
	if v := r.word(hRecordSize); v != recordSize {
		return bad("record size %d, want %d", v, recordSize)
	}
	o := Options{
		Counters:      int(r.word(hSlots)),
		MaxWorkers:    int(r.word(hMaxWorkers)),
		Probe:         int(r.word(hProbe)),
		Responses:     int(r.word(hRecords)),
		BlockSize:     int(r.word(hBlockSize)),
		ResponseBytes: int64(r.word(hBlocks) * r.word(hBlockSize)),
		StatWords:     int(r.word(hStatWords)),
		StatNames:     int(r.word(hStatNames)),
		StatGates:     int(r.word(hStatGates)),
		StatGauges:    int(r.word(hStatGauges)),
		StatLayout:    r.word(hStatLayout),
		Tags:          int(r.word(hTags)),
	}
	n, err := o.normalize()
	if err != nil || n != o || o.Counters == 0 {
		return bad("geometry %+v", o)
	}
	lay := o.layout()
	for i, sec := range sectionTable {
		if got := r.word(sec.word); got != lay.off[i] {
			return bad("%s at offset %d, want %d", sec.name, got, lay.off[i])
		}
	}
	if r.word(hSize) != lay.size || uint64(len(r.data)) != lay.size {
		return bad("size: %d bytes mapped, header says %d, geometry needs %d", len(r.data), r.word(hSize), lay.size)
	}
	r.geo = o
	r.seed1, r.seed2 = r.word(hSeed1), r.word(hSeed2)
	r.timeBase = int64(r.word(hTimeBase))
	r.workers = unsafe.Slice((*workerEntry)(r.at(lay.off[secWorkers])), o.MaxWorkers)
	r.counts = newCounters(r, unsafe.Slice((*slot)(r.at(lay.off[secSlots])), o.Counters),
		unsafe.Slice((*account)(r.at(lay.off[secSlotAccounts])), numAccounts))
	r.resps = newResponses(r, lay)
	r.stats = newStatistics(r, lay.off[secStats])
	r.tags = newTags(r, lay)
	return nil
}

// at is the address of byte off of the region.
func (r *Region) at(off uint64) unsafe.Pointer { return unsafe.Pointer(&r.data[off]) }

func (r *Region) word(off int) uint64 { return atomic.LoadUint64((*uint64)(r.at(uint64(off)))) }

func (r *Region) store(off int, v uint64) { atomic.StoreUint64((*uint64)(r.at(uint64(off))), v) }
