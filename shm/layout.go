package shm

import (
	"fmt"
	"math/bits"
	"unsafe"
)

// Magic opens every region; LayoutVersion changes whenever the layout does.
const (
	Magic         = "PFKDSHM\x00"
	LayoutVersion = 5
)

// Geometry defaults and limits (see Options).
const (
	defaultCounters   = 262144
	defaultMaxWorkers = 256
	// defaultProbe bounds how far from its home slot a key is placed. A
	// rule's keys may hold half the table (max_keys' default beside other
	// rules); with linear probing at that occupancy a window of 16 slots
	// is all taken for about 0.4% of new keys of the other rules, one of
	// 32 for about 0.01% (simulated), which is what "the other rules keep
	// their room" needs. A longer window costs only claims of new keys.
	defaultProbe         = 32
	defaultBlockSize     = 4096
	defaultResponseBytes = 64 << 20
	maxCounters          = 1 << 30
	maxWorkers           = 1 << 16
	maxResponses         = 1 << 26
	maxBlocks            = 1<<32 - 2
	defaultTags          = 1 << 16
	maxTags              = 1 << 24
)

// Sizes of the header, the pages sections are aligned to, and the
// elements of the sections that are arrays of structs.
const (
	headerSize      = 4096
	pageSize        = 4096
	workerEntrySize = 128
	slotSize        = 64
	recordSize      = 128
)

// Each struct that maps an element of the region has exactly its declared
// size: the index is 0 only then, and anything else does not compile
// (out of range, or a negative uintptr).
var (
	_ = [1]struct{}{}[unsafe.Sizeof(workerEntry{})-workerEntrySize]
	_ = [1]struct{}{}[unsafe.Sizeof(slot{})-slotSize]
	_ = [1]struct{}{}[unsafe.Sizeof(record{})-recordSize]
	_ = [1]struct{}{}[unsafe.Sizeof(account{})-accountSize]
)

// Header word offsets (bytes). Every field is one 8-byte word; words not
// listed are zero. A word once used keeps its offset in later layouts.
const (
	hMagic             = 0
	hVersion           = 8 // layout version
	hSize              = 16
	hSlots             = 24
	hProbe             = 32
	hMaxWorkers        = 40
	hSeed1             = 48
	hSeed2             = 56
	hTimeBase          = 64 // CLOCK_MONOTONIC ns at region time zero
	hCreated           = 72 // wall clock (Unix ns) at creation
	hOffWorkers        = 80
	hOffSlots          = 88
	hByteOrder         = 96  // byteOrderMark as written by the creator
	hSlotSize          = 104 // slotSize, so a reader can check the geometry
	hOwnerPID          = 112 // pid of the supervisor that holds the region (informative)
	hReclaimed         = 120 // reclaim watermark: the latest `now` at which a slot was judged fresh and reclaimed
	hRecords           = 128 // response records
	hOffRecords        = 136
	hBlockSize         = 144 // response block size in bytes
	hBlocks            = 152 // response blocks
	hOffBitmap         = 160 // free bitmap of the blocks, one bit per block
	hOffBlocks         = 168
	hRecordSize        = 176
	hBootID            = 184 // hash of the kernel's boot id under which hTimeBase was set (0: unknown)
	hBeatNow           = 192 // region time (ns) at the supervisor's last Beat
	hBeatWall          = 200 // wall clock (Unix ns) at the last Beat (or creation)
	hOffStats          = 208 // statistics section
	hStatWords         = 216 // the caller's words per statistics row
	hStatNames         = 224 // entries of the name table
	hStatGates         = 232 // gates
	hOffSlotAccounts   = 240
	hOffRecordAccounts = 248
	hTags              = 256 // tag-generation slots of the response cache
	hOffTags           = 264
	hTagEpoch          = 272 // bumped before every tag purge (see Tags.Purge)
	hTagPurges         = 280 // tag purges, for statistics
	hURLPurges         = 288 // URL generations bumped (purges and invalidations)
	hOffAddrAccounts   = 296
	hStatGauges        = 304 // the first caller's words of a row that are gauges (a reap drops them)
	hStatLayout        = 312 // the caller's name for the layout of its words in a row (Options.StatLayout)
	hResponsesKey      = 320 // the caller's name for what made the stored responses (SetResponsesKey); 0: none given
)

const byteOrderMark = 0x0102030405060708

// The sections after the header, in this order.
const (
	secWorkers        = iota // one workerEntry per worker index
	secSlots                 // counter slots
	secRecords               // response records
	secBitmap                // free bitmap of the response blocks
	secBlocks                // response blocks
	secStats                 // statistics: fold sequence, name table, gates, one row per worker index and the retired row
	secSlotAccounts          // the accounts of the counter slots
	secRecordAccounts        // the accounts of the response records (none without records)
	secTags                  // tag generations of the response cache
	secAddrAccounts          // the client-address accounts of the response records (none without records)
	numSections
)

// sectionTable says, for each section, the header word that records its
// offset and how many bytes it takes for normalized options. Each section
// starts on a page boundary after the one before it. Adding a section is
// an entry here, a header word for its offset (and for any geometry it
// adds to Options), and a new LayoutVersion.
var sectionTable = [numSections]struct {
	name  string
	word  int
	bytes func(Options) uint64
}{
	secWorkers:      {"worker table", hOffWorkers, func(o Options) uint64 { return uint64(o.MaxWorkers) * workerEntrySize }},
	secSlots:        {"counter slots", hOffSlots, func(o Options) uint64 { return uint64(o.Counters) * slotSize }},
	secRecords:      {"response records", hOffRecords, func(o Options) uint64 { return uint64(o.Responses) * recordSize }},
	secBitmap:       {"block bitmap", hOffBitmap, func(o Options) uint64 { return (o.blocks() + 63) / 64 * 8 }},
	secBlocks:       {"response blocks", hOffBlocks, func(o Options) uint64 { return uint64(o.ResponseBytes) }},
	secStats:        {"statistics", hOffStats, Options.statBytes},
	secSlotAccounts: {"slot accounts", hOffSlotAccounts, func(o Options) uint64 { return numAccounts * accountSize }},
	secRecordAccounts: {"record accounts", hOffRecordAccounts, func(o Options) uint64 {
		if o.Responses == 0 {
			return 0
		}
		return numAccounts * accountSize
	}},
	secTags: {"tag generations", hOffTags, func(o Options) uint64 { return uint64(o.Tags) * 8 }},
	secAddrAccounts: {"address accounts", hOffAddrAccounts, func(o Options) uint64 {
		if o.Responses == 0 {
			return 0
		}
		return numAccounts * accountSize
	}},
}

// sections are the byte offsets of a region's sections and its total size.
type sections struct {
	off  [numSections]uint64
	size uint64
}

// layout places the sections for normalized options. It is the one place
// that computes offsets: the creator writes them into the header, and
// every process that attaches checks the header against them.
func (o Options) layout() sections {
	var s sections
	at := uint64(headerSize)
	for i, sec := range sectionTable {
		s.off[i] = at
		at = roundUp(at+sec.bytes(o), pageSize)
	}
	s.size = at
	return s
}

func roundUp(n, to uint64) uint64 { return (n + to - 1) / to * to }

// Options is the geometry of a new region. Zero values are the defaults.
type Options struct {
	// Counters is the number of counter slots, rounded up to a power of
	// two, at most 2^30. 0 means 262144.
	Counters int
	// MaxWorkers bounds the worker indexes that can Join, at most 65536.
	// 0 means 256.
	MaxWorkers int
	// Probe is how many slots a key may be placed from its home slot.
	// 0 means 32; it is capped at the number of slots.
	Probe int
	// Responses is the number of stored-response records, rounded up to
	// a power of two, at most 2^26. 0 means no response table.
	Responses int
	// ResponseBytes is the size of the block pool for stored responses,
	// rounded down to whole blocks. 0 means 64 MiB when Responses > 0.
	ResponseBytes int64
	// BlockSize is the size of one block of the pool, a multiple of 64
	// between 256 and 1 MiB. 0 means 4096.
	BlockSize int
	// Tags is the number of tag-generation slots of the response cache
	// (see Tags), rounded up to a power of two, at most 2^24. 0 means
	// 65536 when Responses > 0; a region without a response table has
	// none.
	Tags int

	// StatWords is the number of the caller's words in each statistics
	// row (Region.StatRow), at most 65536; shm's own events come on top.
	// 0 means none.
	StatWords int
	// StatNames is the size of the name table (Region.StatName), at most
	// 65536. 0 means none.
	StatNames int
	// StatGates is the number of shared gates (Region.Gate), at most
	// 2^20. 0 means none.
	StatGates int
	// StatGauges is how many of the caller's words, from the first, are
	// gauges: values of the process that writes them (its connections
	// open now), which a reap drops instead of folding them into the
	// retired row as it does counters. At most StatWords; 0 means none.
	StatGauges int
	// StatLayout is the caller's name for what its words of a row mean
	// (package metrics: a hash of its families), kept in the header so
	// that a program attaching the region of another build (a binary
	// upgrade) can tell whether it reads the rows as they are written.
	// shm only keeps it. 0 means unnamed.
	StatLayout uint64
}

// blocks is the number of response blocks of normalized options.
func (o Options) blocks() uint64 { return uint64(o.ResponseBytes) / max(uint64(o.BlockSize), 1) }

func (o Options) normalize() (Options, error) {
	if o.Counters < 0 || o.MaxWorkers < 0 || o.Probe < 0 {
		return o, fmt.Errorf("shm: negative geometry %+v", o)
	}
	if o.Counters == 0 {
		o.Counters = defaultCounters
	}
	if o.Counters > maxCounters {
		return o, fmt.Errorf("shm: %d counter slots is more than the maximum %d", o.Counters, maxCounters)
	}
	o.Counters = 1 << bits.Len(uint(o.Counters-1))
	if o.MaxWorkers == 0 {
		o.MaxWorkers = defaultMaxWorkers
	}
	if o.MaxWorkers > maxWorkers {
		return o, fmt.Errorf("shm: %d workers is more than the maximum %d", o.MaxWorkers, maxWorkers)
	}
	if o.Probe == 0 {
		o.Probe = defaultProbe
	}
	o.Probe = min(o.Probe, o.Counters)
	if o.StatWords < 0 || o.StatWords > maxStatWords || o.StatNames < 0 || o.StatNames > maxStatNames ||
		o.StatGates < 0 || o.StatGates > maxStatGates || o.StatGauges < 0 || o.StatGauges > o.StatWords {
		return o, fmt.Errorf("shm: statistics geometry %d words, %d names, %d gates, %d gauges outside [0, %d], [0, %d], [0, %d], [0, words]",
			o.StatWords, o.StatNames, o.StatGates, o.StatGauges, maxStatWords, maxStatNames, maxStatGates)
	}
	if o.Responses < 0 || o.ResponseBytes < 0 || o.BlockSize < 0 || o.Tags < 0 {
		return o, fmt.Errorf("shm: negative response geometry %+v", o)
	}
	if o.Responses == 0 {
		o.ResponseBytes, o.BlockSize, o.Tags = 0, 0, 0
		return o, nil
	}
	if o.Tags == 0 {
		o.Tags = defaultTags
	}
	if o.Tags > maxTags {
		return o, fmt.Errorf("shm: %d tag slots is more than the maximum %d", o.Tags, maxTags)
	}
	o.Tags = 1 << bits.Len(uint(o.Tags-1))
	if o.Responses > maxResponses {
		return o, fmt.Errorf("shm: %d response records is more than the maximum %d", o.Responses, maxResponses)
	}
	o.Responses = 1 << bits.Len(uint(o.Responses-1))
	if o.BlockSize == 0 {
		o.BlockSize = defaultBlockSize
	}
	if o.BlockSize < 256 || o.BlockSize > 1<<20 || o.BlockSize%64 != 0 {
		return o, fmt.Errorf("shm: block size %d is not a multiple of 64 in [256, 1 MiB]", o.BlockSize)
	}
	if o.ResponseBytes == 0 {
		o.ResponseBytes = defaultResponseBytes
	}
	if o.ResponseBytes/int64(o.BlockSize) > maxBlocks {
		return o, fmt.Errorf("shm: %d response bytes is more than %d blocks", o.ResponseBytes, maxBlocks)
	}
	o.ResponseBytes = max(o.ResponseBytes/int64(o.BlockSize), 1) * int64(o.BlockSize)
	return o, nil
}

// Normalized is o as a region is made with it: defaults filled in, the
// counter slots, records and tag slots rounded up to powers of two, the
// block pool down to whole blocks; or why no region can be.
func (o Options) Normalized() (Options, error) { return o.normalize() }

// Size reports the bytes a region with these options occupies.
func (o Options) Size() (int64, error) {
	n, err := o.normalize()
	if err != nil {
		return 0, err
	}
	return int64(n.layout().size), nil
}

// plan is the preamble of every constructor: the normalized options and
// the region's size, refused when the machine cannot hold it.
func plan(opts Options) (Options, uint64, error) {
	o, err := opts.normalize()
	if err != nil {
		return o, 0, err
	}
	size := o.layout().size
	if err := checkFits(size); err != nil {
		return o, 0, err
	}
	return o, size, nil
}
