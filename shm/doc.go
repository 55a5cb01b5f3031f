// Package shm is the shared-memory region of preforkd: one fixed-size
// mapping that a supervisor creates before it starts its workers, holding
// a counter table that every worker updates with one atomic
// compare-and-swap per key, and a table of stored responses.
//
// Most users want [Create] in the supervisor, [Attach] on the inherited
// file descriptor in each worker, [Region.Join] with the worker's index,
// and then a limiter from package bucket over [Region.Counters].
//
// # Layout
//
//	| header (4 KiB) | worker table (128 B a worker) | counter slots (64 B each) |
//	| response records (128 B each) | block bitmap (1 bit a block) | response blocks |
//
// Each section starts on a page boundary, at the offset its header word
// records. The header also holds the magic, the layout version, the
// geometry, two hash seeds (random per region), the time base of the
// region's clock and the reclaim watermark. A worker entry holds the
// worker's incarnation and pid, and the counters only that worker writes,
// among them its responses and their 5xx ([Region.CountRequest]), which
// the supervisor samples to judge a reload's canary.
// The region holds no Go pointers, only offsets; every word that two
// processes share is read and written with sync/atomic on an 8-byte-aligned
// address inside one cache line.
//
// # The slot protocol
//
// A slot is one cache line: a state word (phase EMPTY, BUSY, LIVE or TOMB ·
// 14-bit generation · 48-bit payload), the key's 128-bit identity (two
// seeded xxhash64), the caller's meta word, and an insert lock used on the
// key's home slot. Invariants, each checked by the spin model in model/ and
// by the multi-process tests of this package:
//
//   - A lookup probes at most Probe slots from the key's home and reads a
//     slot's state before its key, so that a CAS from a stale snapshot
//     fails on the generation instead of landing on another key's slot.
//   - An update is one CAS of the state word; a refusal writes nothing.
//   - A new key is installed only under its home slot's insert lock, after
//     a rescan under that lock, through BUSY (generation + 1, owner =
//     worker · incarnation) to LIVE: a key is never LIVE in two slots. The
//     key's first decision is published with it (BUSY → LIVE(op(0))), so a
//     just-installed key never looks fresh to others.
//   - A claim prefers an EMPTY or TOMB slot; it reclaims only when the probe
//     window has none, and only a LIVE slot equivalent to a fresh key
//     (judged by the FreshFunc that package bucket installs), so a full
//     table never resets a client being limited. An op on payload 0 runs
//     no earlier than the reclaim watermark, so a process that read the
//     clock before another reclaimed the key's slot cannot start it afresh
//     in a window it used up.
//   - Slots never return to EMPTY, so a lookup stops at the first EMPTY slot.
//   - Whatever a dead process held (a BUSY slot, an insert lock, a
//     reservation) is owned by an incarnation that [Region.Reap] retires;
//     it is then released by one CAS, by the supervisor's sweep or lazily
//     by whoever meets it. A live holder of an insert lock is waited for at
//     most 250 ms, after which the caller's on_full policy answers. A
//     retired process claims nothing ([ErrRetired]); a supervisor that
//     re-attaches a live region first kills the orphans that still map it
//     ([Region.KillOrphans]).
//
// Response records are claimed by the same protocol (insert lock on the
// home record, rescan, BUSY, then RESERVED); readers copy a response and
// check the state and a checksum again, so a torn read is a miss, never a
// wrong replay. A duplicate waits on a futex in the record, shared by every
// process.
//
// # Time
//
// [Region.Now] is the system-wide CLOCK_MONOTONIC relative to the region's
// time base, so every process reads the same clock and wall-clock jumps
// move nothing. Only the edges read it; the tables and the algorithms take
// `now` as a parameter.
//
// # Limits
//
// Linux only (memfd, sealing, fallocate, futex). A region that does not
// fit in the memory available (MemAvailable, and the cgroup's memory.max)
// is refused by [Create]. The race detector does not see accesses inside a
// mapping: [CreatePrivate] makes a heap-backed region for goroutine tests.
// The bulk operations for persistence ([Counters.Snapshot],
// [Counters.Place] and their kin) require that no worker runs; with the
// live-region calls they serve package persist and are not covered by
// semantic versioning (STABILITY.md lists them).
package shm
