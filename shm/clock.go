package shm

import (
	"sync/atomic"
	"time"
	"unsafe"
	_ "unsafe" // for go:linkname
)

// nanotime is the runtime's CLOCK_MONOTONIC reading (through the vDSO): one
// clock for every process on the machine, unlike the monotonic reading in a
// time.Time, which counts from the start of its own process.
//
//go:linkname nanotime runtime.nanotime
func nanotime() int64

// Now is the region's clock: time since the region's time base, read from
// the system-wide monotonic clock, so every process that maps the region
// reads the same clock. Wall-clock jumps do not move it. It is the only
// clock the packages built on shm read; everything else takes `now` as a
// parameter.
func (r *Region) Now() time.Duration {
	return time.Duration(nanotime() - r.timeBase)
}

// SetNow moves the region's time base so that Now reads d at this instant.
// Persistence uses it before any worker starts, to continue a dumped
// region's time; calling it while other processes use the region breaks
// their decisions, and processes that attached earlier keep the old base.
func (r *Region) SetNow(d time.Duration) {
	r.timeBase = nanotime() - int64(d)
	atomic.StoreUint64((*uint64)(unsafe.Pointer(&r.data[hTimeBase])), uint64(r.timeBase))
}
