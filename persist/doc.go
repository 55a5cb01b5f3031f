// Package persist carries preforkd's shared-memory region across restarts:
// [Dump] writes its counters, stored responses and response cache (with
// its tag generations) to a file after the last
// worker has exited, [Load] restores them before the first worker of the
// next boot, [OpenRegion] keeps the region itself in a file on tmpfs so
// that it survives a kill -9 of the whole process tree, and [Inspect]
// describes a dump or a live region.
//
// The calls a supervisor makes (through package prefork's hooks):
//
//	o := persist.Options{Path: path, Key: key, Live: live, Build: version, Rules: rules}
//	err := persist.CheckDirs(o)                             // at start: the files can be written
//	r, lock, _, err := persist.OpenRegion(o, geometry, log) // before any worker
//	rep, err := persist.Load(r, o, log)                     // still before any worker
//	d := persist.StartDumper(r, interval, options, log)     // persist.interval: dumps while serving
//	d.Stop()                                                // once the last worker exited
//	st, err := persist.Dump(r, o)                           // after the last worker exited
//	lock.Unlock()
//
// # Guarantees
//
// A dump replaces the previous one atomically and durably (temporary file
// in the same directory, fsync, rename, fsync of the directory; mode
// 0600): a crash at any point leaves the old dump or the new one, never a
// torn file; one that finds its file system full first makes room by
// removing the consumed dumps beside it (PATH.loaded, PATH.superseded),
// older state that no load takes again. Only LIVE counter slots,
// completed responses and cache entries are written: nothing a worker
// held in flight (a reservation, a fill lock) survives a dump. Cache
// entries go with the tag generations they recorded, so that a purge made
// before the dump still applies and one made after the restart reaches
// restored entries.
//
// A dump made while workers serve (a [Dumper], every persist.interval)
// reads the region without a lock, at the lowest CPU priority: workers
// never wait for it. It is consistent entry by entry rather than as of
// one instant (see [Dump]): a crash of the whole process tree or of the
// machine costs what changed since the last dump, at most the interval.
//
// Load trusts nothing it has not checked: a file another user owns or
// that group or others may write, a guard or a checksum that fails, is
// refused with one log line naming its [Reason], and the rest is restored
// (see [Load]); OpenRegion judges a live region's owner and mode alike.
// The region adopts the dump's hash seeds and continues its clock from the
// dump's plus the wall-clock downtime, clamped at zero, so buckets refill
// over the downtime and a wall clock that jumped back grants nothing. A
// dump is consumed when loaded, so a later crash never restores older
// state.
//
// One supervisor uses a dump path or a live region at a time: OpenRegion
// locks both, and a second supervisor gets [ErrInUse].
//
// # Limits
//
// [OpenRegion] and [Lock.Files] need Linux: elsewhere (where the package
// builds for development, and dumps can be inspected) they return an
// error that wraps shm.ErrNeedsLinux.
// A live region records the persist.key its stored responses were made
// under (the one it was made or loaded with): re-attached under another,
// its responses and cache are dropped and its counters kept, as at a load.
// It records no rule definitions: it keeps every
// key, as a reload (HUP) does, so a changed limit applies to the existing
// counts, and keys of a rule whose window or algorithm changed are
// unreachable (another namespace) and age out. Dump and Load each scan the
// whole counter table once, so their cost at low occupancy is bounded
// below by that pass.
package persist
