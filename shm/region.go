package shm

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"os"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/edsrzf/mmap-go"
	"golang.org/x/sys/unix"
)

// Magic opens every region; LayoutVersion changes whenever the layout does.
const (
	Magic         = "PFKDSHM\x00"
	LayoutVersion = 1
)

// Geometry limits and defaults.
const (
	DefaultCounters   = 262144
	DefaultMaxWorkers = 256
	DefaultProbe      = 16
	MaxCounters       = 1 << 30

	DefaultBlockSize     = 4096
	DefaultResponseBytes = 64 << 20
	MaxResponses         = 1 << 26
	MaxBlocks            = 1<<32 - 2
	MaxWorkersLimit      = 1 << 16

	headerSize      = 4096
	workerEntrySize = 128
	slotSize        = 64
	pageSize        = 4096
)

// Header word offsets (bytes). Every field is one 8-byte word.
const (
	hMagic      = 0
	hVersion    = 8 // layout version
	hSize       = 16
	hSlots      = 24
	hProbe      = 32
	hMaxWorkers = 40
	hSeed1      = 48
	hSeed2      = 56
	hTimeBase   = 64 // CLOCK_MONOTONIC ns at region time zero
	hCreated    = 72 // wall clock (Unix ns) at creation
	hOffWorkers = 80
	hOffSlots   = 88
	hByteOrder  = 96  // byteOrderMark as written by the creator
	hSlotSize   = 104 // slotSize, so a reader can check the geometry
	hOwnerPID   = 112 // pid of the supervisor that holds the region (informative)
	hReclaimed  = 120 // reclaim watermark: the latest `now` at which a slot was judged fresh and reclaimed
	hRecords    = 128 // response records
	hOffRecords = 136
	hBlockSize  = 144 // response block size in bytes
	hBlocks     = 152 // response blocks
	hOffBitmap  = 160 // free bitmap of the blocks, one bit per block
	hOffBlocks  = 168
	hRecordSize = 176
	hBootID     = 184 // hash of the kernel's boot id under which hTimeBase was set (0: unknown)
	hBeatNow    = 192 // region time (ns) at the supervisor's last Beat
	hBeatWall   = 200 // wall clock (Unix ns) at the last Beat (or creation)
)

const byteOrderMark = 0x0102030405060708

// Errors a caller matches.
var (
	// ErrFull means no slot could be had for a new key within the probe window.
	ErrFull = errors.New("shm: table full")
	// ErrLockTimeout means the key's insert lock stayed held by a live process
	// for longer than the bounded wait; callers treat it like ErrFull.
	ErrLockTimeout = errors.New("shm: insert lock timeout")
	// ErrNotJoined means the region has no worker identity to claim slots with.
	ErrNotJoined = errors.New("shm: region not joined as a worker")
	// ErrRetired means this process's worker identity was retired (its
	// supervisor reaped it, or a new supervisor took the region over): it
	// may still update keys that exist but claims nothing. Callers treat
	// it like ErrFull.
	ErrRetired = errors.New("shm: worker identity retired")
)

// Options is the geometry of a new region. Zero values are the defaults.
type Options struct {
	// Counters is the number of counter slots, rounded up to a power of two.
	// 0 means DefaultCounters.
	Counters int
	// MaxWorkers bounds the worker indexes that can Join. 0 means DefaultMaxWorkers.
	MaxWorkers int
	// Probe is how many slots a key may be placed from its home slot.
	// 0 means DefaultProbe; it is capped at the number of slots.
	Probe int
	// Responses is the number of stored-response records, rounded up to
	// a power of two. 0 means no response table.
	Responses int
	// ResponseBytes is the size of the block pool for stored responses.
	// 0 means DefaultResponseBytes when Responses > 0.
	ResponseBytes int64
	// BlockSize is the size of one block of the pool, a multiple of 64
	// between 256 and 1 MiB. 0 means DefaultBlockSize.
	BlockSize int
}

func (o Options) normalize() (Options, error) {
	if o.Counters < 0 || o.MaxWorkers < 0 || o.Probe < 0 {
		return o, fmt.Errorf("shm: negative geometry %+v", o)
	}
	if o.Counters == 0 {
		o.Counters = DefaultCounters
	}
	if o.Counters > MaxCounters {
		return o, fmt.Errorf("shm: %d counter slots is more than the maximum %d", o.Counters, MaxCounters)
	}
	o.Counters = 1 << bits.Len(uint(o.Counters-1))
	if o.MaxWorkers == 0 {
		o.MaxWorkers = DefaultMaxWorkers
	}
	if o.MaxWorkers > MaxWorkersLimit {
		return o, fmt.Errorf("shm: %d workers is more than the maximum %d", o.MaxWorkers, MaxWorkersLimit)
	}
	if o.Probe == 0 {
		o.Probe = DefaultProbe
	}
	o.Probe = min(o.Probe, o.Counters)
	if o.Responses < 0 || o.ResponseBytes < 0 || o.BlockSize < 0 {
		return o, fmt.Errorf("shm: negative response geometry %+v", o)
	}
	if o.Responses == 0 {
		o.ResponseBytes, o.BlockSize = 0, 0
		return o, nil
	}
	if o.Responses > MaxResponses {
		return o, fmt.Errorf("shm: %d response records is more than the maximum %d", o.Responses, MaxResponses)
	}
	o.Responses = 1 << bits.Len(uint(o.Responses-1))
	if o.BlockSize == 0 {
		o.BlockSize = DefaultBlockSize
	}
	if o.BlockSize < 256 || o.BlockSize > 1<<20 || o.BlockSize%64 != 0 {
		return o, fmt.Errorf("shm: block size %d is not a multiple of 64 in [256, 1 MiB]", o.BlockSize)
	}
	if o.ResponseBytes == 0 {
		o.ResponseBytes = DefaultResponseBytes
	}
	if o.ResponseBytes/int64(o.BlockSize) > MaxBlocks {
		return o, fmt.Errorf("shm: %d response bytes is more than %d blocks", o.ResponseBytes, MaxBlocks)
	}
	o.ResponseBytes = max(o.ResponseBytes/int64(o.BlockSize), 1) * int64(o.BlockSize)
	return o, nil
}

// sections are the byte offsets of a region's parts and its total size.
type sections struct {
	workers, slots, records, bitmap, blocks, size uint64
}

// layout computes the sections for normalized options.
func (o Options) layout() sections {
	var s sections
	s.workers = headerSize
	s.slots = roundUp(s.workers+uint64(o.MaxWorkers)*workerEntrySize, pageSize)
	s.records = roundUp(s.slots+uint64(o.Counters)*slotSize, pageSize)
	s.bitmap = roundUp(s.records+uint64(o.Responses)*recordSize, pageSize)
	nblocks := uint64(o.ResponseBytes) / max(uint64(o.BlockSize), 1)
	s.blocks = roundUp(s.bitmap+(nblocks+63)/64*8, pageSize)
	s.size = roundUp(s.blocks+uint64(o.ResponseBytes), pageSize)
	return s
}

func roundUp(n, to uint64) uint64 { return (n + to - 1) / to * to }

// Size reports the bytes a region with these options occupies.
func (o Options) Size() (int64, error) {
	n, err := o.normalize()
	if err != nil {
		return 0, err
	}
	return int64(n.layout().size), nil
}

// Region is one mapping of a shared region. It is safe for concurrent use
// by many goroutines, and by many processes that map the same region.
type Region struct {
	file *os.File // nil for a private region
	mem  mmap.MMap
	heap []uint64 // backing of a private region, kept referenced
	data []byte

	geo      Options
	seed1    uint64
	seed2    uint64
	timeBase int64

	workers []workerEntry
	counts  *Counters
	resps   *Responses

	owner atomic.Uint64 // this process's owner id once joined; 0 before
	close sync.Once
}

// workerEntry is one worker's line in the worker table: its incarnation and
// counters only it writes (so the hot path shares no line with another worker).
type workerEntry struct {
	incarnation uint64 // bumped by the supervisor when the worker is reaped
	pid         uint64
	full        uint64 // decisions answered by on_full: no slot in the probe window
	lockTimeout uint64 // decisions answered by on_full: insert lock held too long
	claims      uint64 // new keys installed (EMPTY or TOMB slots)
	reclaims    uint64 // slots taken over from a key equivalent to a fresh one
	recovered   uint64 // BUSY slots and insert locks released from dead owners
	respFull    uint64 // reservations refused: no response record in the probe window
	respNoBlock uint64 // responses completed unreplayable: no blocks left to store them
	_           [7]uint64
}

// Create makes a new region in an anonymous memory file (memfd) sealed
// against resizing, with its memory reserved up front, so that a region
// larger than the machine can hold fails here rather than with SIGBUS later.
// The creating process holds no worker identity: it must Join before it
// updates counters (a supervisor that never updates them does not).
func Create(opts Options) (*Region, error) {
	o, err := opts.normalize()
	if err != nil {
		return nil, err
	}
	size := o.layout().size
	if err := checkFits(size); err != nil {
		return nil, err
	}
	fd, err := unix.MemfdCreate("preforkd-region", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, fmt.Errorf("shm: memfd_create: %w", err)
	}
	f := os.NewFile(uintptr(fd), "preforkd-region")
	if err := reserve(f, size); err != nil {
		f.Close()
		return nil, err
	}
	if _, err := unix.FcntlInt(f.Fd(), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_SEAL); err != nil {
		f.Close()
		return nil, fmt.Errorf("shm: sealing the region: %w", err)
	}
	r, err := mapFile(f, int(size))
	if err != nil {
		f.Close()
		return nil, err
	}
	if err := r.format(o); err != nil {
		r.Close()
		return nil, err
	}
	return r, nil
}

// reserve sizes f and allocates its pages, turning "does not fit" into an error.
func reserve(f *os.File, size uint64) error {
	if err := f.Truncate(int64(size)); err != nil {
		return fmt.Errorf("shm: sizing the region to %d bytes: %w", size, err)
	}
	if err := unix.Fallocate(int(f.Fd()), 0, 0, int64(size)); err != nil {
		return fmt.Errorf("shm: a region of %d bytes does not fit in the memory available: %w", size, err)
	}
	return nil
}

// CreatePrivate makes a region in this process's heap. It cannot be shared
// with other processes; it serves single-process use and tests (the race
// detector sees its accesses, which it cannot inside a mapping).
func CreatePrivate(opts Options) (*Region, error) {
	o, err := opts.normalize()
	if err != nil {
		return nil, err
	}
	size := o.layout().size
	if err := checkFits(size); err != nil {
		return nil, err
	}
	heap := make([]uint64, size/8)
	r := &Region{heap: heap, data: unsafe.Slice((*byte)(unsafe.Pointer(&heap[0])), size)}
	if err := r.format(o); err != nil {
		return nil, err
	}
	return r, nil
}

// Attach maps an existing region from f, typically an inherited file
// descriptor, after checking its header. The region keeps f open.
func Attach(f *os.File) (*Region, error) {
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("shm: attach: %w", err)
	}
	if st.Size() < headerSize {
		return nil, fmt.Errorf("shm: attach: %d bytes is too small for a region", st.Size())
	}
	r, err := mapFile(f, int(st.Size()))
	if err != nil {
		return nil, err
	}
	if err := r.load(); err != nil {
		r.unmap()
		return nil, err
	}
	return r, nil
}

func mapFile(f *os.File, size int) (*Region, error) {
	m, err := mmap.MapRegion(f, size, mmap.RDWR, 0, 0)
	if err != nil {
		return nil, fmt.Errorf("shm: mapping %d bytes: %w", size, err)
	}
	// Keys land on random slots: with 4 KiB pages nearly every decision
	// misses the TLB. Huge pages fix that where the kernel allows them for
	// shared memory (transparent_hugepage/shmem_enabled "advise" or
	// "always"); elsewhere this is a no-op.
	_ = unix.Madvise(m, unix.MADV_HUGEPAGE)
	return &Region{file: f, mem: m, data: []byte(m)}, nil
}

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
	sec := o.layout()
	copy(r.data[hMagic:hMagic+8], Magic)
	r.store(hVersion, LayoutVersion)
	r.store(hSize, sec.size)
	r.store(hSlots, uint64(o.Counters))
	r.store(hProbe, uint64(o.Probe))
	r.store(hMaxWorkers, uint64(o.MaxWorkers))
	r.store(hSeed1, s1)
	r.store(hSeed2, s2)
	r.store(hTimeBase, uint64(nanotime()))
	created := time.Now().UnixNano()
	r.store(hCreated, uint64(created))
	r.store(hBootID, bootID())
	r.store(hBeatWall, uint64(created))
	r.store(hOffWorkers, sec.workers)
	r.store(hOffSlots, sec.slots)
	r.store(hRecords, uint64(o.Responses))
	r.store(hOffRecords, sec.records)
	r.store(hBlockSize, uint64(o.BlockSize))
	r.store(hBlocks, uint64(o.ResponseBytes)/max(uint64(o.BlockSize), 1))
	r.store(hOffBitmap, sec.bitmap)
	r.store(hOffBlocks, sec.blocks)
	r.store(hRecordSize, recordSize)
	r.store(hByteOrder, byteOrderMark)
	r.store(hSlotSize, slotSize)
	r.store(hOwnerPID, uint64(os.Getpid()))
	if err := r.load(); err != nil {
		return err
	}
	for w := range r.workers {
		atomic.StoreUint64(&r.workers[w].incarnation, 1)
	}
	return nil
}

// HeaderError says why a region's header was refused.
type HeaderError struct{ Reason string }

func (e *HeaderError) Error() string { return "shm: bad region header: " + e.Reason }

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
	}
	n, err := o.normalize()
	if err != nil || n != o || o.Counters == 0 {
		return bad("geometry %+v", o)
	}
	sec := o.layout()
	if r.word(hOffWorkers) != sec.workers || r.word(hOffSlots) != sec.slots ||
		r.word(hOffRecords) != sec.records || r.word(hOffBitmap) != sec.bitmap || r.word(hOffBlocks) != sec.blocks ||
		r.word(hSize) != sec.size || uint64(len(r.data)) != sec.size {
		return bad("section offsets or size (%d bytes mapped, header says %d)", len(r.data), r.word(hSize))
	}
	r.geo = o
	r.seed1, r.seed2 = r.word(hSeed1), r.word(hSeed2)
	r.timeBase = int64(r.word(hTimeBase))
	r.workers = unsafe.Slice((*workerEntry)(unsafe.Pointer(&r.data[sec.workers])), o.MaxWorkers)
	r.counts = newCounters(r, unsafe.Slice((*slot)(unsafe.Pointer(&r.data[sec.slots])), o.Counters))
	r.resps = newResponses(r, sec)
	return nil
}

func (r *Region) word(off int) uint64 {
	return atomic.LoadUint64((*uint64)(unsafe.Pointer(&r.data[off])))
}

func (r *Region) store(off int, v uint64) {
	atomic.StoreUint64((*uint64)(unsafe.Pointer(&r.data[off])), v)
}

// File returns the region's file, to pass to child processes (nil for a
// private region). It stays owned by the region.
func (r *Region) File() *os.File { return r.file }

// Geometry reports the region's normalized options.
func (r *Region) Geometry() Options { return r.geo }

// Seeds reports the region's two hash seeds.
func (r *Region) Seeds() (uint64, uint64) { return r.seed1, r.seed2 }

// Bytes is the whole mapped region. Writing it while other processes use the
// region breaks every guarantee of this package; it exists for persistence,
// which reads and writes it only while no worker runs.
func (r *Region) Bytes() []byte { return r.data }

// Close unmaps the region and closes its file. Idempotent.
func (r *Region) Close() error {
	var err error
	r.close.Do(func() {
		err = r.unmap()
		if r.file != nil {
			if cerr := r.file.Close(); err == nil {
				err = cerr
			}
		}
	})
	return err
}

func (r *Region) unmap() error {
	if r.mem == nil {
		return nil
	}
	if err := r.mem.Unmap(); err != nil {
		return fmt.Errorf("shm: unmap: %w", err)
	}
	return nil
}

// Counters returns the region's counter table.
func (r *Region) Counters() *Counters { return r.counts }

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

// Reap is called by the supervisor after it has waited for worker w's
// process: it bumps w's incarnation, so that everything the dead process
// held is recognisably stale, and releases it at once. It returns how many
// BUSY slots and insert locks it released. The next process to Join(w)
// gets the new incarnation.
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
