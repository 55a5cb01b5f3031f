// Package persist carries the shared-memory region of preforkd across
// restarts: [Dump] writes its counters and stored responses to a file on
// graceful shutdown,
// [Load] restores them at the next boot behind a guard for everything that
// could make them mean something else, and [OpenRegion] keeps the region
// itself in a file on tmpfs (persist.live) so that it survives a kill -9
// of the whole process tree. [Inspect] describes a dump or a live region.
//
// The calls most users want, in the supervisor (package prefork's hooks):
//
//	o := persist.Options{Path: cfg.Persist.Path, Key: cfg.Persist.Key, Live: cfg.Persist.Live,
//		Build: version, Rules: rules}
//	r, lock, _, err := persist.OpenRegion(o, geometry, log) // NewRegion: before any worker
//	rep, err := persist.Load(r, o, log)                     // Prepare: still before any worker
//	st, err := persist.Dump(r, o)                           // Finish: after the last worker exited
//	lock.Unlock()
//
// # Guarantees
//
// A dump replaces the previous one atomically and durably (temporary file
// in the same directory, fsync, rename, fsync of the directory; mode
// 0600): a crash at any point leaves the old dump or the new one, never a
// torn file, and stray temporary files are ignored by Load and removed by
// the next Dump. Dump and Load require that no worker runs: Dump reads the
// region, Load writes a fresh one directly.
//
// Load verifies every guard and checksum before it restores anything, and
// refuses what fails with one log line naming the [Reason]; the server
// starts anyway, cold or with what passed:
//
//   - bad magic, format version, layout (slot size or byte order), a
//     header checksum, a file cut inside its header, a directory or other
//     non-regular file: the whole dump is refused;
//   - a section whose frame checksum fails, or that is cut short: that
//     section is refused, and with a bad frame also every section after it
//     (its length cannot be trusted); a section whose payload checksum
//     fails, whose seeds are not the header's, or whose content is
//     inconsistent (malformed): that section only;
//   - a rule whose definition changed (algorithm, window, limit or the
//     effective burst), that was removed, or whose 16-bit tag is shared
//     with another rule (entries carry only the tag): that rule's state
//     only; other rules keep theirs;
//   - another persist.key: the stored responses only; counters are kept.
//
// A dump from a table of another size is not refused: entries are
// re-inserted by key, so that growing table.counters and restarting keeps
// every limit (a smaller table keeps what fits; the rest is counted as
// "table full"). Into a table of the same size every entry fits again.
// The region layout version of the dumped region is recorded but not
// guarded: what an entry means is fixed by the dump's format version, so
// an upgrade that changes the region's memory layout keeps the dump.
//
// Restored counters keep their identity and their time: the fresh region
// adopts the dump's hash seeds, and its clock continues from the dump's
// region clock plus the wall-clock downtime, clamped at zero (a wall clock
// that jumped back grants nothing). Buckets refill and windows roll over
// the downtime, and stored responses age by it; entries that are then as
// fresh as new keys and responses past their TTL are dropped. Only LIVE
// counter slots and completed responses are ever written: no BUSY slot,
// insert lock, reservation or request in flight survives a dump. Loading
// compacts the tables: tombstones are gone.
//
// A dump is consumed when loaded: renamed to PATH.loaded (PATH.refused if
// nothing could be restored from it), durably, so that a later crash never
// restores older state from disk; the renamed file stays for [Inspect]. A
// re-attached live region is newer than any dump: the dump is moved to
// PATH.superseded unread.
//
// # Rule fingerprints
//
// A dump records, for every configured rule, its name, algorithm, window,
// limit and effective burst (a GCRA burst of 0 is recorded as the limit).
// These fix what a counter means. The path, methods, key source (by), mode
// and on_full choose which requests and clients a rule counts, not what a
// count is worth, so changing them keeps the state. Dump writes only
// entries of configured rules whose meta word (tag, algorithm, window) is
// the rule's own, so Options.Rules must list the rules in force.
//
// # File format (version 1)
//
// All integers little-endian. CRC is CRC-32C (Castagnoli).
//
//	Header
//	offset  size  field
//	0       8     magic "PFKDDUMP"
//	8       4     format version (1)
//	12      4     header length H = 98 + B
//	16      8     byte-order mark 0x0102030405060708
//	24      4     region layout version of the dumped region (informative)
//	28      4     slot size (64)
//	32      8     counter slots of the dumped region (informative)
//	40      4     probe window (informative)
//	44      4     worker indexes (informative)
//	48      8     hash seed 1
//	56      8     hash seed 2
//	64      8     region clock at dump, ns (≥ 0)
//	72      8     wall clock at dump, Unix ns
//	80      8     region created, Unix ns (informative)
//	88      4     section count
//	92      2     build string length B (≤ 255)
//	94      B     build string
//	94+B    4     CRC of bytes [0, 94+B)
//
//	Section frame (repeated "section count" times, right after the header)
//	0       4     type: 1 counters, 2 responses; others are skipped by readers
//	4       4     flags (0; ignored by readers)
//	8       8     payload length L
//	16      4     CRC of the payload
//	20      4     CRC of bytes [0, 20) of this frame
//	24      L     payload
//
//	Counters payload
//	0       8     hash seed 1 (must equal the header's)
//	8       8     hash seed 2 (must equal the header's)
//	16      4     rule count R
//	20      4     reserved (0)
//	24      …     R rules, each: name length N (2) · algorithm (1: 0 gcra,
//	              1 fixed-window) · reserved (5) · window ns (8) · limit (4) ·
//	              effective burst (4) · name (N)
//	…       32·E  E entries to the end of the payload, in slot order, each:
//	              key A (8) · key B (8) · meta (8) · payload (8, < 2^48)
//
//	Responses payload
//	0       8     hash seed 1 (must equal the header's)
//	8       8     hash seed 2 (must equal the header's)
//	16      8     xxhash64 of "preforkd persist.key\x00" + persist.key
//	24      …     completed responses to the end of the payload, each:
//	              key A (8) · key B (8) · request fingerprint (32) ·
//	              expiry, region ns (8) · flags (4: bit 0 not replayable) ·
//	              status (2) · content-type length C (2) · location
//	              length L (2) · reserved (2) · body length N (4) ·
//	              content type (C) · location (L) · body (N)
//
// Bytes after the last section are ignored (and logged). The file's size
// follows the number of live entries, not the table's: 32 bytes a counter,
// 72 bytes plus its strings and body a stored response.
//
// # Limits
//
// A re-attached live region records no rule definitions: it
// keeps every key, as a reload (HUP) does, so a changed limit applies to
// the existing counts, and keys of a rule whose window or algorithm
// changed are unreachable (another namespace) and age out.
// Dump and Load each read or write the whole counter table once (64 bytes
// a slot), so their cost at low occupancy is bounded below by that pass.
// Loading stored responses borrows worker index 0 (see [Load]). One
// supervisor dumps to a given path at a time.
package persist
