package persist

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/preforkd/preforkd/bucket"
	"github.com/preforkd/preforkd/shm"
)

// Options says where the dump lives and what it is checked against. The
// zero value persists nothing.
type Options struct {
	// Path is the dump file (persist.path). "" means no dump: Dump and
	// Load do nothing.
	Path string
	// Key is persist.key, the application's version: stored responses
	// are dropped at load when it differs from the dump's; counters are
	// kept.
	Key string
	// Live is persist.live, a file on tmpfs that holds the region itself
	// (see OpenRegion). "" means an anonymous region.
	Live string
	// Build names the build that writes the dump (recorded, shown by
	// Inspect). "" records nothing.
	Build string
	// Rules are the rate-limit rules of the configuration in force, with
	// each override's rule: core.Options.StateRules of the workers' core
	// options (an override's clients are counted under a rule of its own,
	// which a list of the RateLimits' Rule fields lacks). Only counter
	// state of these rules is dumped, and at load only state of
	// rules whose definition is unchanged is restored. A definition is
	// what a count is worth: name, algorithm, window, limit and effective
	// burst (a GCRA burst of 0 is the limit). Path, methods, key source,
	// mode and on_full choose what a rule counts; changing them keeps the
	// state.
	Rules []bucket.Rule
	// Now is the wall clock, read once by Dump and once by Load to count
	// the downtime between them. nil means time.Now.
	Now func() time.Time
}

func (o Options) wall() time.Time {
	if o.Now != nil {
		return o.Now()
	}
	return time.Now()
}

// DumpStats describes a written dump.
type DumpStats struct {
	Entries    int           // counter entries written
	Responses  int           // stored responses written
	Cached     int           // response cache entries written
	TagGens    int           // tag generations written
	Expired    int           // entries as fresh as a new key at dump time: not written
	Unowned    int           // entries of no rule in Options.Rules (or of two rules with one tag): not written
	Bytes      int64         // size of the dump
	RegionTime time.Duration // the region's clock at dump
	Removed    int           // consumed dumps (PATH.loaded, PATH.superseded) removed to make room (see Dump)
}

// Dump writes r's state to o.Path, replacing the previous dump atomically
// and durably: a unique temporary file in the same directory is written,
// fsynced and renamed over the old dump, then the directory is fsynced. A
// crash at any point leaves the old dump or the new one, never a torn
// file. Temporary files left by an earlier crash are removed first. A
// dump that finds its file system (or quota) full removes the consumed
// dumps beside it, PATH.loaded and PATH.superseded, which hold older state
// than it does and which no load takes again, and is written once more
// (DumpStats.Removed counts them); PATH.refused is kept.
//
// Dump is exact when nothing writes r: after the last worker has exited.
// It may also run while workers serve from r (a Dumper does, every
// persist.interval): it takes no lock, and what it writes is consistent
// entry by entry, not as of one instant. Every counter that lived
// throughout the dump is in it, exactly once, with a state its key held
// during the dump (its key, rule and count read together, never a mix of
// two keys: see shm.Counters.Snapshot); a key installed during the dump
// may be missing. Stored responses and cache entries are each read whole
// or not at all (a torn read is skipped), completed ones only. The tag
// generations are read before the cache entries: a purge made during the
// dump is in the next one (an entry stored after it carries the newer
// generation, and is dropped at load as purged). Its cost follows the
// number of live entries (plus one scan of the table), not the table's
// size on disk.
func Dump(r *shm.Region, o Options) (DumpStats, error) {
	if o.Path == "" {
		return DumpStats{}, nil
	}
	removeTemps(o.Path)
	tmp, st, err := writeTemp(r, o)
	if noSpace(err) {
		// The consumed dumps beside it hold older state than this one,
		// which no load takes again: their room is this dump's.
		if n := removeConsumed(o.Path); n > 0 {
			tmp, st, err = writeTemp(r, o)
			st.Removed = n
			if err != nil {
				err = fmt.Errorf("%w (after removing %d consumed dumps to make room)", err, n)
			}
		}
	}
	if err != nil {
		return st, err
	}
	defer inProgress.Delete(tmp)
	if err := keepRefused(o.Path); err != nil {
		os.Remove(tmp)
		return st, fmt.Errorf("persist: dump: %w", err)
	}
	if err := renameDurably(tmp, o.Path); err != nil {
		os.Remove(tmp)
		return st, fmt.Errorf("persist: dump: %w", err)
	}
	return st, nil
}

// noSpace reports whether err is a full file system's (or a full quota's).
func noSpace(err error) bool {
	return errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT)
}

// removeConsumed removes the consumed dumps beside path that hold older
// state than a dump being written there, PATH.loaded and PATH.superseded
// (regular files only), and returns how many it removed. PATH.refused is
// kept: it holds state that no load took.
func removeConsumed(path string) (n int) {
	for _, s := range []string{SuffixLoaded, SuffixSuperseded} {
		if fi, err := os.Lstat(path + s); err == nil && fi.Mode().IsRegular() && os.Remove(path+s) == nil {
			n++
		}
	}
	return n
}

// keepRefused moves a file at path that a load refuses unread (another
// user's, or writable by group or others: see untrusted) to
// PATH.refused, before a dump is renamed over it. Load leaves such a file
// where it is, for its owner to look at and make trusted; without this,
// the first dump after the refusal (at once with persist.interval, else
// at the stop) would destroy the state it holds.
func keepRefused(path string) error {
	fi, err := os.Lstat(path)
	if err != nil || !fi.Mode().IsRegular() || untrusted(fi) == "" {
		return nil
	}
	if err := os.Rename(path, path+SuffixRefused); err != nil {
		return fmt.Errorf("keeping the refused dump: %w", err)
	}
	return nil
}

// tempPattern names a dump's temporary files: PATH.tmp-PID-RANDOM, PID
// the writer's.
func tempPattern(path string) string {
	return filepath.Base(path) + ".tmp-" + strconv.Itoa(os.Getpid()) + "-*"
}

// inProgress holds the names of the temporary files this process's
// Dumps are writing: its pid's other ones were left by an earlier process
// that had the same pid (in a container the supervisor is pid 1 at every
// start) and died before the rename. tempsMu orders the making of one
// with removeTemps.
var (
	inProgress sync.Map
	tempsMu    sync.Mutex
)

// removeTemps removes the temporary files that a Dump left when its
// process died before the rename. A living process's are its own: during
// a binary upgrade the old supervisor and the new one both dump to the
// path for a moment, and each writes and renames its own file.
func removeTemps(path string) {
	tempsMu.Lock()
	defer tempsMu.Unlock()
	dir, prefix := filepath.Dir(path), filepath.Base(path)+".tmp-"
	des, _ := os.ReadDir(dir)
	for _, de := range des {
		name := de.Name()
		rest, ok := strings.CutPrefix(name, prefix)
		if !ok || !de.Type().IsRegular() {
			continue
		}
		if pid, _, ok := strings.Cut(rest, "-"); ok {
			n, err := strconv.Atoi(pid)
			if err == nil && n == os.Getpid() {
				if _, writing := inProgress.Load(filepath.Join(dir, name)); writing {
					continue
				}
			} else if err == nil && processAlive(n) {
				continue
			}
		}
		os.Remove(filepath.Join(dir, name))
	}
}

// removePrefixed removes the files in dir whose names start with prefix.
func removePrefixed(dir, prefix string) {
	des, _ := os.ReadDir(dir)
	for _, de := range des {
		if strings.HasPrefix(de.Name(), prefix) && de.Type().IsRegular() {
			os.Remove(filepath.Join(dir, de.Name()))
		}
	}
}

// writeTemp writes the dump to a new temporary file next to o.Path and
// fsyncs it. It returns the file's name; on error nothing is left behind.
func writeTemp(r *shm.Region, o Options) (name string, st DumpStats, err error) {
	tempsMu.Lock()
	f, err := os.CreateTemp(filepath.Dir(o.Path), tempPattern(o.Path))
	if err == nil {
		inProgress.Store(f.Name(), true)
	}
	tempsMu.Unlock()
	if err != nil {
		return "", st, fmt.Errorf("persist: dump: %w", err)
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(f.Name())
			inProgress.Delete(f.Name())
		}
	}()
	if err := f.Chmod(0o600); err != nil {
		return "", st, fmt.Errorf("persist: dump: %w", err)
	}
	w := bufio.NewWriterSize(f, 1<<20)
	st, err = encode(r, o, w, f)
	if err != nil {
		return "", st, fmt.Errorf("persist: dump %s: %w", f.Name(), err)
	}
	if err := f.Sync(); err != nil {
		return "", st, fmt.Errorf("persist: dump: fsync %s: %w", f.Name(), err)
	}
	if err := f.Close(); err != nil {
		return "", st, fmt.Errorf("persist: dump: %w", err)
	}
	return f.Name(), st, nil
}

// renameDurably renames from to to, in the same directory, and fsyncs
// the directory so that the rename survives a crash.
func renameDurably(from, to string) error {
	if err := os.Rename(from, to); err != nil {
		return err
	}
	return syncDir(filepath.Dir(to))
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	if err := d.Sync(); err != nil {
		d.Close()
		return fmt.Errorf("fsync %s: %w", dir, err)
	}
	return d.Close()
}

// encoder writes a dump through a buffer, and patches each section's
// frame (whose length and checksum are known only at its end) with a
// positioned write once everything is written.
type encoder struct {
	w       *bufio.Writer
	f       *os.File
	off     int64
	pending []sectionWriter
}

func (e *encoder) write(p []byte) {
	e.w.Write(p) // errors stick in w: Flush reports them
	e.off += int64(len(p))
}

// sectionWriter streams one section's payload and sums it.
type sectionWriter struct {
	e   *encoder
	typ uint32
	at  int64 // its frame
	crc uint32
	n   uint64
	buf []byte // batches small writes
}

func (e *encoder) section(typ uint32) *sectionWriter {
	s := &sectionWriter{e: e, typ: typ, at: e.off, buf: make([]byte, 0, 64<<10)}
	e.write(make([]byte, frameSize))
	return s
}

// room makes room for n more bytes in s.buf.
func (s *sectionWriter) room(n int) {
	if len(s.buf)+n > cap(s.buf) {
		s.flush()
	}
}

func (s *sectionWriter) flush() {
	s.crc = crc32.Update(s.crc, crcTable, s.buf)
	s.n += uint64(len(s.buf))
	s.e.write(s.buf)
	s.buf = s.buf[:0]
}

func (s *sectionWriter) end() {
	s.flush()
	s.e.pending = append(s.e.pending, *s)
}

func (e *encoder) finish() error {
	if err := e.w.Flush(); err != nil {
		return err
	}
	for _, s := range e.pending {
		if _, err := e.f.WriteAt(frame(s.typ, s.n, s.crc), s.at); err != nil {
			return err
		}
	}
	return nil
}

// encode writes the dump of r through w to f.
func encode(r *shm.Region, o Options, w *bufio.Writer, f *os.File) (DumpStats, error) {
	now := r.Now()
	st := DumpStats{RegionTime: now}
	g := r.Geometry()
	s1, s2 := r.Seeds()
	h := header{
		version:      FormatVersion,
		byteOrder:    formatByteOrder,
		regionLayout: shm.LayoutVersion,
		slotSize:     formatSlotSize,
		slots:        uint64(g.Counters),
		probe:        uint32(g.Probe),
		maxWorkers:   uint32(g.MaxWorkers),
		seed1:        s1,
		seed2:        s2,
		regionTime:   max(now, 0),
		wall:         o.wall(),
		created:      r.Created(),
		sections:     3,
		build:        o.Build,
	}
	e := &encoder{w: w, f: f}
	e.write(h.encode())

	// Counters: rules, then every live entry of a rule that is not as
	// fresh as a new key, in the order of shm's snapshot, so that a load
	// into a region of the same geometry fits every entry again.
	rules := make([]ruleDef, len(o.Rules))
	metas := make([]uint64, len(o.Rules))
	owner := tagOwners(o.Rules)
	for i, rule := range o.Rules {
		rules[i] = defOf(rule)
		metas[i] = rules[i].meta()
	}
	cs := e.section(sectionCounters)
	cs.buf = append(cs.buf, countersHead(s1, s2, rules)...)
	le := binary.LittleEndian
	for en := range r.Counters().Snapshot() {
		i := owner[bucket.MetaTag(en.Meta)]
		if i < 0 || metas[i] != en.Meta {
			st.Unowned++
			continue
		}
		if bucket.Fresh(en.Meta, en.Payload, now) {
			st.Expired++
			continue
		}
		cs.room(entrySize)
		cs.buf = le.AppendUint64(cs.buf, en.Key.A)
		cs.buf = le.AppendUint64(cs.buf, en.Key.B)
		cs.buf = le.AppendUint64(cs.buf, en.Meta)
		cs.buf = le.AppendUint64(cs.buf, en.Payload)
		st.Entries++
	}
	cs.end()

	// Responses: the persist.key guard, then every completed response
	// that has not expired (reservations and requests in flight are not
	// visited).
	rs := e.section(sectionResponses)
	rs.buf = append(rs.buf, responsesHead(s1, s2, responsesKey(r, o))...)
	for se := range r.Responses().Snapshot(now) {
		if se.Kind != shm.KindIdempotency {
			continue
		}
		rs.room(recordFixed + len(se.Response.ContentType) + len(se.Response.Location) + 2 + len(se.Response.ContentEncoding) + len(se.Response.Body))
		rs.buf = appendRecord(rs.buf, &se)
		st.Responses++
	}
	rs.end()

	// Cache: the same guard, the tag generations, then every entry that
	// has not expired. Both go together: entries without the generations
	// they recorded would all look purged, and generations without their
	// purges' effect could make a purged entry current again.
	tags := r.Tags()
	var gens []shm.TagGen
	for g := range tags.Snapshot() {
		gens = append(gens, g)
	}
	xs := e.section(sectionCache)
	xs.buf = append(xs.buf, cacheHead(s1, s2, responsesKey(r, o), tags.Len(), len(gens))...)
	for _, g := range gens {
		xs.room(tagGenSize)
		xs.buf = le.AppendUint32(xs.buf, uint32(g.Slot))
		xs.buf = le.AppendUint64(xs.buf, g.Gen)
	}
	st.TagGens = len(gens)
	for se := range r.Responses().Snapshot(now) {
		if se.Kind != shm.KindCache {
			continue
		}
		xs.room(cacheFixed + len(se.Data))
		xs.buf = le.AppendUint64(xs.buf, se.Key.A)
		xs.buf = le.AppendUint64(xs.buf, se.Key.B)
		xs.buf = le.AppendUint64(xs.buf, uint64(se.Expiry))
		xs.buf = le.AppendUint32(xs.buf, uint32(len(se.Data)))
		xs.buf = append(xs.buf, se.Data...)
		st.Cached++
	}
	xs.end()

	if err := e.finish(); err != nil {
		return st, err
	}
	st.Bytes = e.off
	return st, nil
}

// tagOwners maps each 16-bit tag to the index of the one rule that has it,
// or -1: no rule, or several (whose entries cannot be told apart, so are
// neither dumped nor restored).
func tagOwners(rules []bucket.Rule) *[1 << 16]int32 {
	var t [1 << 16]int32
	for i := range t {
		t[i] = -1
	}
	seen := make(map[uint16]bool, len(rules))
	for i, r := range rules {
		tag := r.Tag()
		switch {
		case seen[tag]:
			t[tag] = -1
		default:
			seen[tag] = true
			t[tag] = int32(i)
		}
	}
	return &t
}
