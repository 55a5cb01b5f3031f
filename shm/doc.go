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
//	| statistics: fold sequence, name table, gates, a row per worker index and the retired row |
//	| slot accounts (65,536 × 32 B) | record accounts (65,536 × 32 B, with records) |
//	| tag generations (8 B each) | address accounts (65,536 × 32 B, with records) |
//
// Each section starts on a page boundary, at the offset its header word
// records. The header also holds the magic, the layout version, the
// geometry, two hash seeds (random per region), the time base of the
// region's clock and the reclaim watermark. A worker entry holds the
// worker's incarnation and pid.
//
// # Statistics
//
// Each worker index has a row of counters that only the process joined as
// that index writes, with atomic adds on cache lines no other worker
// touches: shm's own events (claims, reclaims, on_full answers, records
// and blocks taken and freed, from which the occupancies follow without a
// scan) and the caller's words ([Region.StatRow]). [Region.Reap] folds the
// row of the reaped process into a retired row under a sequence lock, and
// [Region.SumStats] sums the rows between two folds, so that a sum never
// goes down and never counts anything twice. The supervisors count in
// words of the retired row of their own ([Region.SupervisorCounts]: workers
// replaced, reloads), which go on with the region as the workers' counts
// do. A name table gives each name
// (a rule) one index for the region's life, and gates let one log line a
// second through across all workers.
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
//     ([Region.KillOrphans]). Response blocks too: each block's header
//     carries the stamp of the process that holds it (a chain it builds,
//     or frees after taking each block from its builder's stamp by a
//     CAS), and a record whose chain is being freed is BUSY and names
//     what is left of it; [Region.Reap] finishes a dead process's frees
//     and gives back every block of a dead process's stamp that no
//     completed record holds, while the others go on, each block by a
//     CAS, so that a block is never freed twice.
//
// # Accounts
//
// Every slot (and record) is charged to one of 65,536 accounts, named by
// the [Quota] of the call that claimed it: a rate-limit rule, a client's
// idempotency namespace. An account's count is one load ([Counters.Held]),
// maintained on claim, reclaim and release, never by a walk; a claim for
// an account at its Quota.Max is refused with [ErrQuota] before it takes
// a slot, unless it takes a fresh slot of its own account (in its probe
// window, or freed by the account's sweep: a bounded walk, at most once a
// millisecond). A count and a slot's charge change under the account's
// lock; whoever takes that lock from a dead process counts the account
// again, so a crash never makes a count drift. An idempotency record is
// also charged to a second set of 65,536 accounts, its client address's
// ([Responses.Begin]; refused with [ErrAddrQuota]), by the same protocol
// on a charge word of its own: one client's invented keys never widen the
// share of its address.
//
// Response records are claimed by the same protocol (insert lock on the
// home record, rescan, BUSY, then RESERVED); readers copy a response and
// check the state and a checksum again, so a torn read is a miss, never a
// wrong replay. A duplicate waits on a futex in the record, shared by every
// process.
//
// Each record has a kind: idempotency records ([Responses.Begin]) and
// response cache records ([Responses.CacheLookup] and its kin) share the
// table but never see each other's keys. A cache key has at most one fill
// lock (a RESERVED record, taken by the same protocol, that the process
// fetching the response holds and others wait on) and one entry that
// lookups use; the lock becomes the entry when the fill completes, so the
// old entry stays readable meanwhile. Cache entries are evicted to make
// room (the one that expires first in a full probe window; a clock hand
// over the table when blocks run short); a completed idempotency record
// never is before its expiry. The tag generations ([Tags]) are counters
// indexed by a tag's hash: a purge is one atomic add.
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
// Linux only (memfd, sealing, fallocate, futex). Elsewhere the package
// builds for development: [CreatePrivate] works (its waiters poll), and
// [Create], [CreateFile] and [OpenFile] return an error that wraps
// [ErrNeedsLinux]. A region that does not fit in the memory available
// (MemAvailable, and the cgroup's memory.max) is refused by [Create],
// with an error that wraps [ErrNoRoom]. The
// race detector does not see accesses inside a mapping: [CreatePrivate]
// makes a heap-backed region for goroutine tests.
// The bulk operations for persistence ([Counters.Snapshot],
// [Counters.Place] and their kin) require that no worker runs; with the
// live-region calls they serve package persist and are not covered by
// semantic versioning (STABILITY.md lists them).
package shm
