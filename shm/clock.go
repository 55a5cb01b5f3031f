package shm

import (
	"os"
	"strings"
	"sync/atomic"
	"time"
	"unsafe"
	_ "unsafe" // for go:linkname

	"github.com/cespare/xxhash/v2"
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
	r.store(hBootID, bootID())
}

// Beat records the region time and the wall clock together, so that a
// region re-attached after its processes died can continue its time from
// the wall-clock downtime when its time base cannot be trusted (see
// ResumeClock). The supervisor calls it about once a second; only one
// process may.
func (r *Region) Beat(wall time.Time) {
	r.store(hBeatNow, uint64(r.Now()))
	r.store(hBeatWall, uint64(wall.UnixNano()))
}

// ClockResume is what ResumeClock did.
type ClockResume struct {
	// Rebased is false when the time base was kept.
	Rebased bool
	// Reason says why the time base was not trusted: "another boot",
	// "time base ahead of the clock", "clock ahead of the wall clock".
	Reason string
	// Before is what Now read before, After what it reads after.
	Before, After time.Duration
}

// MaxDowntime is the most downtime a resumed clock counts (a dump's load,
// ResumeClock). Every time kept in a region spans less: a rule's window
// (at most bucket.MaxWindow, ~203 days), a stored response (its TTL, at
// most that too), a cached one (fresh, then stale-while-revalidate or
// stale-if-error, then kept for revalidation, each at most its TTL, and a
// Vary stub one more: four of them). Past it everything has run out
// either way; counting more would only spend the 48-bit range of region
// time, and a wall clock that was wrong at the dump (1970, on a machine
// without a real-time clock, before NTP) would spend it all at once: past
// the range, a rule's times no longer fit and it stops limiting, in every
// later dump too.
const MaxDowntime = (1 << 46) * time.Microsecond // ~814 days

// beatSlack is how far the region's clock may have run ahead of the wall
// clock since the last Beat before it is distrusted: beats are a second
// apart, and the two clocks drift by NTP's slew at most.
const beatSlack = 2 * time.Second

// ResumeClock checks the time base of a region re-attached after its
// processes died, before any worker starts (only then may it be called).
// The monotonic clock is kept when it is this boot's and agrees with the
// last Beat: the downtime counted as it passed. Otherwise — a region from
// another boot, or another time namespace, whose time base may be ahead
// of this clock (Now would be negative, and every limited client stay
// limited for the whole offset) or behind it (granting allowance that
// never elapsed) — the time continues from the last Beat plus the
// wall-clock time since, never less than zero nor more than MaxDowntime,
// as a dump's does.
func (r *Region) ResumeClock(wall time.Time) ClockResume {
	now := r.Now()
	beatNow := time.Duration(r.word(hBeatNow))
	elapsed := time.Duration(wall.UnixNano() - int64(r.word(hBeatWall)))
	res := ClockResume{Before: now, After: now}
	switch {
	case r.word(hBootID) != bootID():
		res.Reason = "another boot"
	case now < beatNow:
		res.Reason = "time base ahead of the clock"
	case now-beatNow > max(elapsed, 0)+beatSlack:
		res.Reason = "clock ahead of the wall clock"
	default:
		return res
	}
	res.Rebased = true
	res.After = beatNow + min(max(elapsed, 0), MaxDowntime)
	r.SetNow(res.After)
	r.Beat(wall)
	return res
}

// bootID identifies the running kernel's boot (a hash of
// /proc/sys/kernel/random/boot_id): CLOCK_MONOTONIC readings compare only
// within one. 0 when it cannot be read.
func bootID() uint64 {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return 0
	}
	return xxhash.Sum64String(strings.TrimSpace(string(b))) | 1
}
