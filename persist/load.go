package persist

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"io/fs"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/preforkd/preforkd/bucket"
	"github.com/preforkd/preforkd/shm"
)

// Why entries of an accepted section were not restored: the keys of
// Report.Dropped (counters) and Report.DroppedResponses.
const (
	DropExpired     = "expired"           // as fresh as a new key at the rebased time (the same as no entry); a response past its TTL
	DropRuleChanged = "rule changed"      // its rule was changed or removed (one log line per rule)
	DropNoRule      = "no rule"           // no rule of the dump owns its meta word
	DropTableFull   = "table full"        // no slot or record in its probe window (a smaller table)
	DropDuplicate   = "duplicate"         // its key was already restored
	DropNoTable     = "no response table" // the region has no response table (table.responses = 0)
)

// Suffixes of a consumed dump: PATH.loaded after a load in which a section
// passed its guards (Report.Loaded), PATH.refused after one in which none
// did, PATH.superseded when a live region was preferred to it. Each
// overwrites an older one. A dump that finds its file system full removes
// PATH.loaded and PATH.superseded to make room (see Dump).
const (
	SuffixLoaded     = ".loaded"
	SuffixRefused    = ".refused"
	SuffixSuperseded = ".superseded"
)

// Report says what Load did. Every refusal in it was also one log line.
type Report struct {
	Found bool // a dump was at Options.Path
	// Loaded: its counters section, or stored responses or cache entries,
	// passed the guards; the region adopted the dump's hash seeds and
	// continues its clock (entries may still be dropped, see Dropped).
	Loaded           bool
	Build            string         // the build that wrote it
	Written          time.Time      // the wall clock at dump
	Downtime         time.Duration  // wall-clock time since the dump, counted as elapsed (never negative)
	RegionTime       time.Duration  // the region's clock after the rebase (when Loaded)
	Counters         int            // counter entries restored
	Responses        int            // stored responses restored
	Cached           int            // response cache entries restored
	TagGens          int            // tag generations restored
	Dropped          map[string]int // entries of an accepted counters section not restored, by Drop… reason
	DroppedResponses map[string]int // records of an accepted responses section not restored, by Drop… reason
	DroppedCache     map[string]int // entries of an accepted cache section not restored, by Drop… reason
	Refused          []Refusal      // what failed a guard, in the order met
	MovedTo          string         // where the dump went once consumed; "" when it stayed
}

// Load restores the dump at o.Path into r, which must be a fresh region
// that no worker uses yet: after shm.Create, before the first worker.
//
// Every guard and checksum is verified first. What fails is refused with
// one log line naming the reason (see Reason), reported in Report.Refused,
// and not restored; what passed is. A refusal is not an error: the server
// starts cold or with the sections that passed:
//
//   - a file another user owns, or that group or others may write
//     (checksums are no authentication), a directory or another file that
//     is not a regular one: the whole dump is refused, and left where it
//     is (the next Dump moves such a file to PATH.refused rather than
//     replace it);
//   - bad magic, format version, layout (slot size or byte order), a
//     header checksum, a file cut inside its header: the whole dump is
//     refused;
//   - a section whose frame checksum fails, or that is cut short: that
//     section is refused, and with a bad frame also every section after it
//     (its length cannot be trusted); a section whose payload checksum
//     fails, whose seeds are not the header's, or whose content is
//     inconsistent (malformed): that section only;
//   - a rule whose definition changed (algorithm, window, limit or the
//     effective burst), that was removed, or whose 16-bit tag is shared
//     with another rule (entries carry only the tag): that rule's state
//     only; other rules keep theirs;
//   - another persist.key: the stored responses and the cache only;
//     counters are kept;
//   - a cache section from a region whose tag table had another size: the
//     cache only (its entries' generations cannot be checked).
//
// A dump from a table of another size is not refused: entries are
// re-inserted by key, so that growing table.counters and restarting keeps
// every limit (a smaller table keeps what fits; the rest is counted as
// "table full"). Into a table of the same size every entry fits again.
// The region layout version of the dumped region is recorded but not
// guarded: what an entry means is fixed by the dump's format version, so
// an upgrade that changes the region's memory layout keeps the dump.
//
// Restored state keeps its hash seeds and its region times: the region's
// clock continues from the dump's plus the wall-clock downtime (clamped at
// zero, so that a wall clock that jumped back grants nothing), so buckets
// refill, windows roll and stored responses age over the downtime.
// Entries that are then as fresh as new keys, entries of changed rules and
// expired responses are dropped.
//
// Each restored counter is charged to the account of the rule that owns it
// now (bucket.Rule.Account: a tier's keys to its rule's), and each stored
// response to the accounts it was dumped with (its client's and its client
// address's; a record of a build before address accounts to no address),
// so that the region's counts
// (max_keys, max_records) equal what it holds; a cap lowered since the dump
// is not applied to restored entries.
//
// The dump is then consumed: renamed to PATH.loaded (or PATH.refused when
// no section passed its guards), and the rename fsynced, so that a later crash
// never restores state older than itself. The error is for I/O trouble
// (an unreadable file, which is then moved to PATH.refused unread so that
// no dump is written over it; a failed rename) and for a region that is not fresh
// (shm.ErrNotEmpty, and nothing is changed); the caller logs it and
// starts. A nil log means slog.Default().
func Load(r *shm.Region, o Options, log *slog.Logger) (Report, error) {
	rep := newReport()
	if o.Path == "" {
		return rep, nil
	}
	if log == nil {
		log = slog.Default()
	}
	log = log.With("path", o.Path)
	fi, err := os.Stat(o.Path)
	if errors.Is(err, fs.ErrNotExist) {
		noDump(o.Path, log)
		return rep, nil
	}
	if err != nil {
		return rep, fmt.Errorf("persist: load: %w", err)
	}
	rep.Found = true
	l := &loader{r: r, o: o, log: log, rep: &rep}
	if !fi.Mode().IsRegular() {
		l.refuse(notRegular(fi))
		return rep, nil
	}
	data, size, why, err := readTrusted(o.Path)
	if err != nil {
		// Unread, but this service's state all the same: left at PATH,
		// the first dump would be renamed over it. Kept aside, for the
		// operator to load again once the cause is gone.
		// (The directory's fsync is best effort: a rename a crash undoes
		// leaves the dump where the next start tries it again.)
		kept := o.Path + SuffixRefused
		if rerr := os.Rename(o.Path, kept); rerr != nil {
			return rep, fmt.Errorf("%w; keeping it aside failed too: %w", err, rerr)
		}
		_ = syncDir(filepath.Dir(kept))
		rep.MovedTo = kept
		return rep, fmt.Errorf("%w (the dump is kept unread as %s)", err, kept)
	}
	if why != "" {
		// Not consumed: it is not this service's file to move.
		l.refuse(Refusal{ReasonUntrusted, "dump", why})
		return rep, nil
	}
	l.size = size
	if err := l.load(data); err != nil {
		return rep, err
	}
	dest := o.Path + SuffixRefused
	if rep.Loaded {
		dest = o.Path + SuffixLoaded
	}
	if err := consume(o.Path, dest); err != nil {
		return rep, err
	}
	rep.MovedTo = dest
	if !rep.Loaded {
		log.Warn("persist: nothing of the dump loaded: kept aside", "moved_to", dest)
	}
	return rep, nil
}

// noDump says that there is no dump at path. With a consumed one beside
// it (PATH.loaded), the last start loaded that dump and no stop nor
// periodic dump wrote one since: it ended without a graceful stop (kill
// -9, a crash, a power loss) or its dump at the stop failed, and the state
// it served is lost. A warning says so, not a first start's line.
func noDump(path string, log *slog.Logger) {
	loaded := path + SuffixLoaded
	if fi, err := os.Lstat(loaded); err == nil && fi.Mode().IsRegular() {
		log.Warn("persist: no dump to load: the last start loaded one and wrote none since (it did not stop gracefully, or its dump failed); the counts start from nothing",
			"loaded", loaded, "dump_written", fi.ModTime().UTC().Format(time.RFC3339))
		return
	}
	log.Info("persist: no dump to load")
}

// readTrusted reads the dump in the file at path (see readDump), of size
// bytes, unless it cannot be trusted (why says so): its owner and mode
// are those of the open file, the one read.
func readTrusted(path string) (data []byte, size int64, why string, err error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, 0, "", fmt.Errorf("persist: load: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, 0, "", fmt.Errorf("persist: load: %w", err)
	}
	if why := untrusted(fi); why != "" {
		return nil, 0, why, nil
	}
	if data, err = readDump(f, fi.Size()); err != nil {
		return nil, 0, "", fmt.Errorf("persist: load: %w", err)
	}
	return data, fi.Size(), "", nil
}

// readDump reads the dump in r, a file of size bytes, as far as its
// header and section frames say it goes: what follows the last section
// (parsed.unread counts it) is not read, nor is what follows a frame that
// fails its checksum (whose length cannot be trusted), so that a file
// with a long tail (a sparse file extended by a truncate) is not read
// whole. A file that does not start with a dump's magic is read no
// further (for parse to refuse).
func readDump(r io.Reader, size int64) ([]byte, error) {
	var data []byte
	// take reads n more bytes, or as many as the file has left; ok says
	// whether it had them all.
	take := func(n uint64) (ok bool, err error) {
		m := min(n, uint64(max(size-int64(len(data)), 0)))
		at := len(data)
		data = slices.Grow(data, int(m))[:at+int(m)]
		if _, err := io.ReadFull(r, data[at:]); err != nil {
			return false, err
		}
		return m == n, nil
	}
	le := binary.LittleEndian
	if ok, err := take(uint64(len(Magic))); err != nil || !ok || string(data) != Magic {
		return data, err
	}
	if ok, err := take(8); err != nil || !ok { // format version, header length
		return data, err
	}
	n := uint64(le.Uint32(data[12:]))
	if n < headerFixed+4 || n > headerFixed+maxBuild+4 {
		return data, nil // parse refuses it
	}
	if ok, err := take(n - uint64(len(data))); err != nil || !ok {
		return data, err
	}
	for i := le.Uint32(data[88:]); i > 0; i-- {
		if ok, err := take(frameSize); err != nil || !ok {
			return data, err
		}
		f := data[len(data)-frameSize:]
		if crc32.Checksum(f[:20], crcTable) != le.Uint32(f[20:]) {
			return data, nil
		}
		if ok, err := take(le.Uint64(f[8:])); err != nil || !ok {
			return data, err
		}
	}
	return data, nil
}

func newReport() Report {
	return Report{Dropped: map[string]int{}, DroppedResponses: map[string]int{}, DroppedCache: map[string]int{}}
}

// consume renames a dump out of the way, durably.
func consume(path, dest string) error {
	if err := renameDurably(path, dest); err != nil {
		return fmt.Errorf("persist: consuming the dump: %w", err)
	}
	return nil
}

type loader struct {
	r    *shm.Region
	o    Options
	log  *slog.Logger
	rep  *Report
	size int64 // of the file data was read from; 0: data is all of it
}

func (l *loader) refuse(f Refusal, attrs ...any) {
	l.rep.Refused = append(l.rep.Refused, f)
	l.log.Warn("persist: "+f.What+" refused: "+string(f.Reason), append([]any{"detail", f.Detail}, attrs...)...)
}

// load restores what passes its guards from the dump in data. Its only
// error is a region that is not fresh.
func (l *loader) load(data []byte) error {
	p, whole := parse(data)
	if whole != nil {
		l.refuse(*whole)
		return nil
	}
	p.unread(data, max(l.size, int64(len(data))))
	l.rep.Build, l.rep.Written = p.hdr.build, p.hdr.wall
	for _, f := range p.refused {
		l.refuse(f)
	}
	if p.trailing > 0 {
		l.log.Warn("persist: bytes after the last section ignored", "bytes", p.trailing)
	}
	if f := p.nothingKnown(); f != nil {
		l.refuse(*f)
		return nil
	}
	var cs, rs, xs *section
	for i := range p.sections {
		s := &p.sections[i]
		switch {
		case s.typ == sectionCounters && cs == nil:
			cs = s
		case s.typ == sectionResponses && rs == nil:
			rs = s
		case s.typ == sectionCache && xs == nil:
			xs = s
		default:
			l.log.Warn("persist: section skipped", "section", sectionName(s.typ), "bytes", len(s.payload),
				"detail", "unknown to this build or repeated")
		}
	}
	// Every guard first; then the region adopts the dump's seeds and clock
	// if anything is to be restored.
	var c *counters
	var resp *responses
	if cs != nil {
		if cp, bad := parseCounters(cs.payload); l.passes("counters", &p.hdr, cp.seeds(), bad) {
			c = &cp
		}
	}
	if rs != nil {
		if rp, bad := parseResponses(rs.payload); l.keyed("responses", "stored", &p.hdr, rp.seeds(), bad, rp.count, rp.keyHash) {
			resp = &rp
		}
	}
	var cache *cacheSection
	if xs != nil {
		cp, bad := parseCache(xs.payload)
		if l.keyed("cache", "cached", &p.hdr, cp.seeds(), bad, cp.count, cp.keyHash) {
			if cp.slots == l.r.Tags().Len() {
				cache = &cp
			} else {
				l.refuse(Refusal{ReasonTagSlots, "cache", fmt.Sprintf("%d tag slots in the dump, %d in the region: %d cached responses dropped", cp.slots, l.r.Tags().Len(), cp.count)})
			}
		}
	}
	if c == nil && resp == nil && cache == nil {
		return nil
	}
	now, err := l.adopt(&p.hdr)
	if err != nil {
		return err
	}
	if c != nil {
		l.counters(*c, now)
	}
	if resp != nil {
		l.responses(*resp, now)
	}
	if cache != nil {
		l.cache(*cache, now)
	}
	for _, m := range []map[string]int{l.rep.Dropped, l.rep.DroppedResponses, l.rep.DroppedCache} {
		for k, v := range m {
			if v == 0 {
				delete(m, k)
			}
		}
	}
	if l.rep.Loaded {
		l.log.Info("persist: dump loaded", "build", l.rep.Build, "written", l.rep.Written.UTC().Format(time.RFC3339),
			"downtime", l.rep.Downtime, "entries", l.rep.Counters, "dropped", dropSummary(l.rep.Dropped),
			"responses", l.rep.Responses, "dropped_responses", dropSummary(l.rep.DroppedResponses),
			"cached", l.rep.Cached, "tag_generations", l.rep.TagGens, "dropped_cached", dropSummary(l.rep.DroppedCache))
	}
	return nil
}

func dropSummary(m map[string]int) string {
	var parts []string
	for k, v := range m {
		parts = append(parts, fmt.Sprintf("%s=%d", k, v))
	}
	sort.Strings(parts)
	return strings.Join(parts, " ")
}

// ruleVerdicts judges each of the dump's rules against the configuration:
// why its state must be dropped, or "" to keep it.
func ruleVerdicts(dumped []ruleDef, current []bucket.Rule) []string {
	cur := make(map[string]ruleDef, len(current))
	byTag := map[uint16][]string{}
	for _, r := range current {
		d := defOf(r)
		cur[d.name] = d
		byTag[d.tag()] = append(byTag[d.tag()], ruleText(d.name))
	}
	dumpTags := map[uint16]int{}
	for _, d := range dumped {
		dumpTags[d.tag()]++
	}
	out := make([]string, len(dumped))
	for i, d := range dumped {
		c, ok := cur[d.name]
		switch {
		case !ok:
			out[i] = "no longer configured"
		case d.diff(c) != "":
			out[i] = d.diff(c)
		case len(byTag[d.tag()]) > 1 || dumpTags[d.tag()] > 1:
			// Entries carry only the tag: with two rules on one tag they
			// cannot be told apart, so neither rule's state is trusted.
			out[i] = fmt.Sprintf("its 16-bit tag %#04x is shared by rules %s", d.tag(), strings.Join(byTag[d.tag()], ", "))
		}
	}
	return out
}

// passes refuses section what when it did not parse (bad, its parser's
// refusal) or was written under other hash seeds than the header's s, and
// reports whether it passed both.
func (l *loader) passes(what string, h *header, s sectionSeeds, bad *Refusal) bool {
	if bad == nil {
		bad = seedsDiffer(what, h, s)
	}
	if bad != nil {
		l.refuse(*bad)
		return false
	}
	return true
}

// keyed runs the guards of a section of responses (what: the stored
// responses or the cache, whose entries are kind): it must pass (see
// passes), and hold count entries made under this persist.key (key, its
// hash in the dump). It reports whether its entries are to be restored.
// A section that holds none refuses nothing for another persist.key, as
// a live region does: nothing is dropped (the cache's tag generations
// matter only to its entries).
func (l *loader) keyed(what, kind string, h *header, s sectionSeeds, bad *Refusal, count int, key uint64) bool {
	switch {
	case !l.passes(what, h, s, bad), count == 0:
		return false
	case key != keyHash(l.o.Key):
		l.refuse(Refusal{ReasonKeyChanged, what, fmt.Sprintf("%d %s responses dropped; counters are kept", count, kind)})
		return false
	}
	return true
}

// notRegular is the refusal of a dump path that is a directory or another
// file that is not a regular one.
func notRegular(fi os.FileInfo) Refusal {
	return Refusal{ReasonUnreadable, "dump", fmt.Sprintf("not a regular file (%v)", fi.Mode().Type())}
}

// seedsDiffer is the refusal of section what when its hash seeds s are
// not the header's, or nil when they are.
func seedsDiffer(what string, h *header, s sectionSeeds) *Refusal {
	if s.seed1 == h.seed1 && s.seed2 == h.seed2 {
		return nil
	}
	return &Refusal{ReasonSeed, what, fmt.Sprintf("section seeds %#x/%#x, header seeds %#x/%#x", s.seed1, s.seed2, h.seed1, h.seed2)}
}

// adopt gives the fresh region the dump's hash seeds (keys are stored as
// seeded hashes) and continues the dump's region clock over the downtime.
// It returns the region time to restore at.
func (l *loader) adopt(h *header) (time.Duration, error) {
	if err := l.r.SetSeeds(h.seed1, h.seed2); err != nil {
		return 0, err // shm.ErrNotEmpty: says it all
	}
	l.rep.Loaded = true
	if g := l.r.Geometry(); uint64(g.Counters) != h.slots {
		l.log.Info("persist: table geometry changed: entries re-inserted by key", "dumped_slots", h.slots, "slots", g.Counters)
	}
	wall := l.o.wall()
	down := wall.Sub(h.wall)
	if down < 0 {
		l.log.Warn("persist: the wall clock is behind the dump's: no downtime counted",
			"written", h.wall.UTC().Format(time.RFC3339Nano), "now", wall.UTC().Format(time.RFC3339Nano))
		down = 0
	}
	if down > shm.MaxDowntime {
		l.log.Warn("persist: downtime longer than any window or TTL: counted as the longest",
			"written", h.wall.UTC().Format(time.RFC3339Nano), "now", wall.UTC().Format(time.RFC3339Nano), "counted", shm.MaxDowntime)
		down = shm.MaxDowntime
	}
	down = min(down, time.Duration(math.MaxInt64)-h.regionTime)
	now := h.regionTime + down
	l.r.SetNow(now)
	l.rep.Downtime, l.rep.RegionTime = down, now
	return now, nil
}

// counters restores the entries of c at region time now.
func (l *loader) counters(c counters, now time.Duration) {
	verdict := ruleVerdicts(c.rules, l.o.Rules)
	owner := tagOwnersOf(c.rules)
	metas := make([]uint64, len(c.rules))
	for i, d := range c.rules {
		metas[i] = d.meta()
	}
	// A dump does not keep the accounts: a restored entry is charged to
	// the account of the rule that owns it now (its Group's).
	accounts := make([]uint16, len(c.rules))
	for _, r := range l.o.Rules {
		for i, d := range c.rules {
			if d.name == r.Name {
				accounts[i] = r.Account()
			}
		}
	}
	changed := make([]int, len(c.rules))
	tab := l.r.Counters()
	le := binary.LittleEndian
	for b := c.entries; len(b) >= entrySize; b = b[entrySize:] {
		e := shm.Entry{
			Key:     shm.Key{A: le.Uint64(b), B: le.Uint64(b[8:])},
			Meta:    le.Uint64(b[16:]),
			Payload: le.Uint64(b[24:]),
		}
		i := owner[bucket.MetaTag(e.Meta)]
		switch {
		case i < 0 || metas[i] != e.Meta || e.Payload > shm.PayloadMask:
			l.rep.Dropped[DropNoRule]++
		case verdict[i] != "":
			changed[i]++
		case bucket.Fresh(e.Meta, e.Payload, now):
			l.rep.Dropped[DropExpired]++
		default:
			e.Account = accounts[i]
			switch err := tab.Place(e); {
			case err == nil:
				l.rep.Counters++
			case errors.Is(err, shm.ErrDuplicate):
				l.rep.Dropped[DropDuplicate]++
			default:
				l.rep.Dropped[DropTableFull]++
			}
		}
	}
	for i, v := range verdict {
		if v != "" {
			l.rep.Dropped[DropRuleChanged] += changed[i]
			l.refuse(Refusal{ReasonRuleChanged, "rule " + ruleText(c.rules[i].name), v + ": its state is dropped"}, "entries", changed[i])
		}
	}
}

// tagOwnersOf maps each tag to the one dumped rule that has it, or -1.
func tagOwnersOf(defs []ruleDef) *[1 << 16]int32 {
	rules := make([]bucket.Rule, len(defs))
	for i, d := range defs {
		rules[i] = bucket.Rule{Name: d.name}
	}
	return tagOwners(rules)
}

// responses restores the stored responses of rs at region time now.
func (l *loader) responses(rs responses, now time.Duration) {
	t := l.r.Responses()
	for rest := rs.records; len(rest) > 0; {
		e, next, _ := nextRecord(rest) // parseResponses checked every record
		rest = next
		if why := placeStored(t, e, now); why != "" {
			l.rep.DroppedResponses[why]++
		} else {
			l.rep.Responses++
		}
	}
	if n := l.rep.DroppedResponses[DropNoTable]; n > 0 {
		l.log.Warn("persist: stored responses dropped: the region has no response table", "records", n)
	}
}

// cache restores the tag generations and the cache entries of cs at
// region time now: the generations first, so that every entry is judged
// against the purges made before the dump, as it would have been then.
func (l *loader) cache(cs cacheSection, now time.Duration) {
	tags := l.r.Tags()
	le := binary.LittleEndian
	for b := cs.gens; len(b) >= tagGenSize; b = b[tagGenSize:] {
		if tags.Place(shm.TagGen{Slot: int(le.Uint32(b)), Gen: le.Uint64(b[4:])}) == nil {
			l.rep.TagGens++
		}
	}
	t := l.r.Responses()
	for rest := cs.entries; len(rest) > 0; {
		var e shm.StoredEntry
		e, rest = nextCacheEntry(rest)
		if why := placeStored(t, e, now); why != "" {
			l.rep.DroppedCache[why]++
		} else {
			l.rep.Cached++
		}
	}
}

// placeStored places e, a stored response or a cache entry, in t at region
// time now. It returns "" when e is placed, else the reason it is dropped.
func placeStored(t *shm.Responses, e shm.StoredEntry, now time.Duration) string {
	if e.Expiry <= now {
		return DropExpired
	}
	switch err := t.Place(e, now); {
	case err == nil:
		return ""
	case errors.Is(err, shm.ErrNoResponses):
		return DropNoTable
	case errors.Is(err, shm.ErrDuplicate):
		return DropDuplicate
	default:
		return DropTableFull
	}
}
