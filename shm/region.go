package shm

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/edsrzf/mmap-go"
)

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
	// ErrNeedsLinux is what making a shared region (Create, CreateFile,
	// OpenFile) answers on a system other than Linux: it needs memfd and
	// futexes. A private region (CreatePrivate) works anywhere. The
	// Linux-only entry points of the packages above shm (prefork.Run,
	// persist.OpenRegion) wrap it.
	ErrNeedsLinux = errors.New("shm: a shared region needs Linux (memfd, futex)")
)

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
	tags    *Tags
	stats   *statistics

	owner atomic.Uint64 // this process's owner id once joined; 0 before
	close sync.Once
}

// Create makes a new region in an anonymous memory file (memfd) sealed
// against resizing, with its memory reserved up front, so that a region
// larger than the machine can hold fails here rather than with SIGBUS later.
// The creating process holds no worker identity: it must Join before it
// updates counters (a supervisor that never updates them does not).
func Create(opts Options) (*Region, error) {
	o, size, err := plan(opts)
	if err != nil {
		return nil, err
	}
	f, err := memfd("preforkd-region")
	if err != nil {
		return nil, err
	}
	if err := reserve(f, size); err != nil {
		f.Close()
		return nil, err
	}
	if err := seal(f); err != nil {
		f.Close()
		return nil, err
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

// CreatePrivate makes a region in this process's heap. It cannot be shared
// with other processes; it serves single-process use and tests (the race
// detector sees its accesses, which it cannot inside a mapping).
func CreatePrivate(opts Options) (*Region, error) {
	o, size, err := plan(opts)
	if err != nil {
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

// reserve sizes f and allocates its pages, turning "does not fit" into an error.
func reserve(f *os.File, size uint64) error {
	if err := f.Truncate(int64(size)); err != nil {
		return fmt.Errorf("shm: sizing the region to %d bytes: %w", size, err)
	}
	if err := allocate(f, size); err != nil {
		return fmt.Errorf("shm: a region of %d bytes %w: %w", size, ErrNoRoom, err)
	}
	return nil
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
	adviseHuge(m)
	return &Region{file: f, mem: m, data: []byte(m)}, nil
}

// File returns the region's file, to pass to child processes (nil for a
// private region). It stays owned by the region.
func (r *Region) File() *os.File { return r.file }

// Geometry reports the region's normalized options.
func (r *Region) Geometry() Options { return r.geo }

// Seeds reports the region's two hash seeds.
func (r *Region) Seeds() (uint64, uint64) { return r.seed1, r.seed2 }

// Created reports the wall-clock time at which the region was created.
func (r *Region) Created() time.Time { return time.Unix(0, int64(r.word(hCreated))) }

// ResponsesKey is the caller's name for what made the stored responses
// and cache entries, as SetResponsesKey last gave it: 0 when none was
// given (a region made by a build that did not name it).
func (r *Region) ResponsesKey() uint64 { return r.word(hResponsesKey) }

// SetResponsesKey names what makes the stored responses and cache entries
// from now on. persist gives the hash of persist.key, the application's
// version, so that a region re-attached under another version drops what
// the old one made instead of serving it.
func (r *Region) SetResponsesKey(k uint64) { r.store(hResponsesKey, k) }

// Counters returns the region's counter table.
func (r *Region) Counters() *Counters { return r.counts }

// Responses returns the region's response table.
func (r *Region) Responses() *Responses { return r.resps }

// Tags returns the region's tag-generation table (empty without a
// response table).
func (r *Region) Tags() *Tags { return r.tags }

// Close unmaps the region and closes its file. Idempotent. Nothing of the
// region may be used after: its tables, a bucket.Limiter or a core.Core
// over it read memory no longer mapped, and the process dies of the
// fault (a runtime fatal error, not a panic that can be recovered). A
// prefork worker never closes its region: a goroutine its engine gave up
// on at the end of the drain may still run, and the kernel unmaps the
// region when the process exits.
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
