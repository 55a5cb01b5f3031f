package persist

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/preforkd/preforkd/bucket"
	"github.com/preforkd/preforkd/internal/smallfile"
	"github.com/preforkd/preforkd/shm"
)

// ErrRefused is returned by Inspect, after its description, for a file
// that a load would refuse, in whole or in part.
var ErrRefused = errors.New("persist: a load would refuse it")

// Inspect describes the dump or live region at path to w: its header, each
// guard and checksum, its sections and occupancy, and why a load would
// refuse it. It tells the two apart by their magic. Guards that depend on
// the configuration (a rule's definition, persist.key) are shown, not
// judged. For a file that a load would refuse (whole, or a section of it)
// the description is written and the error wraps ErrRefused; any other
// error is for a file that cannot be read.
func Inspect(path string, w io.Writer) error {
	fi, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("persist: inspect: %w", err)
	}
	if !fi.Mode().IsRegular() {
		f := notRegular(fi)
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintf(tw, "file:\t%s\nverdict:\trefused: %s\n", path, f)
		tw.Flush()
		return fmt.Errorf("%w: %s: %s", ErrRefused, path, f)
	}
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("persist: inspect: %w", err)
	}
	magic := make([]byte, 8)
	n, _ := io.ReadFull(f, magic)
	if string(magic[:n]) == shm.Magic {
		f.Close()
		return inspectLive(path, fi, w)
	}
	_, err = f.Seek(0, io.SeekStart)
	var data []byte
	if err == nil {
		data, err = readDump(f, fi.Size())
	}
	f.Close()
	if err != nil {
		return fmt.Errorf("persist: inspect: %w", err)
	}
	if verdict := inspectDump(path, fi, data, w); verdict != "" {
		return fmt.Errorf("%w: %s: %s", ErrRefused, path, verdict)
	}
	return nil
}

// inspectDump describes a dump; it returns why a load would refuse it (or
// a part of it), "" when it would not.
func inspectDump(path string, fi os.FileInfo, data []byte, out io.Writer) string {
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	defer w.Flush()
	fmt.Fprintf(w, "file:\t%s (dump, %d bytes, mode %v)\n", path, fi.Size(), fi.Mode().Perm())
	p, whole := parse(data)
	if whole != nil {
		fmt.Fprintf(w, "verdict:\trefused: %s\n", whole)
		return whole.String()
	}
	p.unread(data, fi.Size())
	h := p.hdr
	fmt.Fprintf(w, "format:\tversion %d, header checksum ok\n", h.version)
	fmt.Fprintf(w, "build:\t%q\n", h.build)
	fmt.Fprintf(w, "written:\t%s (%s ago by this clock)\n", h.wall.UTC().Format(time.RFC3339), time.Since(h.wall).Round(time.Second))
	fmt.Fprintf(w, "region clock:\t%v at dump; region created %s\n", h.regionTime, h.created.UTC().Format(time.RFC3339))
	fmt.Fprintf(w, "layout:\tslot size %d, byte order ok, region layout %d; geometry %d slots, probe %d, %d workers\n",
		h.slotSize, h.regionLayout, h.slots, h.probe, h.maxWorkers)
	fmt.Fprintf(w, "seeds:\t%#016x %#016x\n", h.seed1, h.seed2)
	var verdict []string
	distrust := trust(fi, "dump")
	for _, f := range p.refused {
		verdict = append(verdict, f.String())
	}
	// refuse notes a refusal under the section being described.
	refuse := func(f Refusal) {
		verdict = append(verdict, f.String())
		fmt.Fprintf(w, "\t%s\n", f)
	}
	for i, s := range p.sections {
		fmt.Fprintf(w, "section %d:\t%s, %d bytes at %d, checksum ok\n", i+1, sectionName(s.typ), len(s.payload), s.offset)
		d, bad, known := parseSection(s)
		switch {
		case bad != nil:
			refuse(*bad)
		case known:
			// The seeds are checked as Load checks them.
			if f := seedsDiffer(sectionName(s.typ), &h, d.seeds()); f != nil {
				refuse(*f)
			}
			d.describe(w, &h)
		default:
			fmt.Fprintf(w, "\tunknown to this build: skipped at load\n")
		}
	}
	for _, f := range p.refused {
		fmt.Fprintf(w, "refused:\t%s\n", f)
	}
	if f := p.nothingKnown(); f != nil {
		verdict = append(verdict, f.String())
		fmt.Fprintf(w, "refused:\t%s\n", f)
	}
	if p.trailing > 0 {
		fmt.Fprintf(w, "trailing:\t%d bytes after the last section (ignored)\n", p.trailing)
	}
	switch {
	case distrust != nil:
		fmt.Fprintf(w, "verdict:\trefused: %s (judged for uid %d, who runs inspect)\n", distrust, os.Geteuid())
		return distrust.String()
	case len(verdict) == 0:
		fmt.Fprintf(w, "verdict:\tloadable (rule definitions and persist.key are checked against the configuration at load)\n")
		return ""
	}
	fmt.Fprintf(w, "verdict:\tpartly refused: %s\n", strings.Join(verdict, "; "))
	return "partly: " + strings.Join(verdict, "; ")
}

// described is a section payload this build decodes, as inspect shows it.
type described interface {
	seeds() sectionSeeds
	describe(w io.Writer, h *header)
}

// parseSection decodes s when this build knows its type (known), or says
// why a load would refuse it (bad).
func parseSection(s section) (d described, bad *Refusal, known bool) {
	switch s.typ {
	case sectionCounters:
		return decoded(parseCounters(s.payload))
	case sectionResponses:
		return decoded(parseResponses(s.payload))
	case sectionCache:
		return decoded(parseCache(s.payload))
	}
	return nil, nil, false
}

// decoded is parseSection's answer for a section of a type it knows, from
// that type's parser.
func decoded[T described](d T, bad *Refusal) (described, *Refusal, bool) {
	if bad != nil {
		return nil, bad, true
	}
	return d, nil, true
}

func (c counters) describe(w io.Writer, h *header) {
	n := len(c.entries) / entrySize
	occ := 0.0
	if h.slots > 0 {
		occ = 100 * float64(n) / float64(h.slots)
	}
	fmt.Fprintf(w, "\t%d entries (%.2f%% of %d slots), %d rules\n", n, occ, h.slots, len(c.rules))
	owner := tagOwnersOf(c.rules)
	per := make([]int, len(c.rules))
	unowned := 0
	for b := c.entries; len(b) >= entrySize; b = b[entrySize:] {
		meta := binary.LittleEndian.Uint64(b[16:])
		if i := owner[bucket.MetaTag(meta)]; i >= 0 && c.rules[i].meta() == meta {
			per[i]++
		} else {
			unowned++
		}
	}
	for i, d := range c.rules {
		rule, override := ruleLabel(d.name)
		fmt.Fprintf(w, "\trule %q%s:\t%s, tag %#04x, %d entries\n", rule, override, d, d.tag(), per[i])
	}
	if unowned > 0 {
		fmt.Fprintf(w, "\t%d entries of no rule (dropped at load)\n", unowned)
	}
}

func (rs responses) describe(w io.Writer, h *header) {
	var unreplayable, expired, body int
	for rest := rs.records; len(rest) > 0; {
		e, next, _ := nextRecord(rest)
		rest = next
		if e.Unreplayable {
			unreplayable++
		}
		if e.Expiry <= h.regionTime {
			expired++
		}
		body += len(e.Response.Body)
	}
	fmt.Fprintf(w, "\t%d stored responses (%d not replayable, %d expired at dump), %d body bytes; persist.key hash %#016x (kept only under the same persist.key)\n",
		rs.count, unreplayable, expired, body, rs.keyHash)
}

func (cs cacheSection) describe(w io.Writer, h *header) {
	var expired, bytes int
	for rest := cs.entries; len(rest) > 0; {
		var e shm.StoredEntry
		e, rest = nextCacheEntry(rest)
		if e.Expiry <= h.regionTime {
			expired++
		}
		bytes += len(e.Data)
	}
	fmt.Fprintf(w, "\t%d cached responses (%d expired at dump), %d bytes; %d tag generations of %d slots; persist.key hash %#016x (kept only under the same persist.key)\n",
		cs.count, expired, bytes, len(cs.gens)/tagGenSize, cs.slots, cs.keyHash)
}

func inspectLive(path string, fi os.FileInfo, out io.Writer) error {
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	defer w.Flush()
	fmt.Fprintf(w, "file:\t%s (live region, %d bytes, mode %v)\n", path, fi.Size(), fi.Mode().Perm())
	if holder := lockHolder(path); holder != "" {
		fmt.Fprintf(w, "lock:\t%s\n", holder)
	}
	r, err := shm.OpenFile(path)
	if err != nil {
		var he *shm.HeaderError
		if errors.As(err, &he) {
			fmt.Fprintf(w, "verdict:\trefused: %v (a supervisor would replace it with a fresh region)\n", err)
			return fmt.Errorf("%w: %s: %v", ErrRefused, path, err)
		}
		return fmt.Errorf("persist: inspect: %w", err)
	}
	defer r.Close()
	g := r.Geometry()
	s1, s2 := r.Seeds()
	st := r.Counters().Stats()
	fmt.Fprintf(w, "layout:\tversion %d, header ok; %d slots, probe %d, %d workers\n", shm.LayoutVersion, g.Counters, g.Probe, g.MaxWorkers)
	fmt.Fprintf(w, "created:\t%s; region clock %v\n", r.Created().UTC().Format(time.RFC3339), r.Now())
	fmt.Fprintf(w, "seeds:\t%#016x %#016x\n", s1, s2)
	fmt.Fprintf(w, "occupancy:\t%.2f%%: %d live, %d busy, %d tombstones, %d empty; %d insert locks held\n",
		100*st.Occupancy(), st.Live, st.Busy, st.Tomb, st.Empty, st.Locked)
	fmt.Fprintf(w, "probe:\tmax %d, mean %.2f\n", st.MaxProbe, st.MeanProbe)
	fmt.Fprintf(w, "counters:\tfull %d, lock timeouts %d, claims %d, reclaims %d, recovered %d\n",
		st.Full, st.LockTimeout, st.Claims, st.Reclaims, st.Recovered)
	if t := r.Responses(); t != nil && t.Len() > 0 {
		rs := t.Stats()
		fmt.Fprintf(w, "responses:\t%d records: %d complete, %d reserved; blocks %d of %d used (%d B each); full %d, no blocks %d\n",
			rs.Records, rs.Complete, rs.Reserved, rs.BlocksUsed, rs.Blocks, t.BlockSize(), rs.Full, rs.NoBlocks)
		ts := r.Tags().Stats()
		fmt.Fprintf(w, "cache:\t%d entries (%d bytes), %d fills in flight, %d evicted; tag generations: %d of %d slots used, %d tag purges, %d URL purges and invalidations\n",
			rs.Cached, rs.CacheBytes, rs.Filling, rs.Evicted, ts.Used, ts.Slots, ts.TagPurges, ts.URLPurges)
	}
	for _, wi := range r.Workers() {
		state := "no process"
		if wi.PID != 0 {
			state = "pid " + strconv.Itoa(wi.PID)
			if !pidAlive(wi.PID) {
				state += " (dead: released at re-attach)"
			}
		}
		fmt.Fprintf(w, "worker %d:\tincarnation %d, %s\n", wi.Index, wi.Incarnation, state)
	}
	if f := trust(fi, "live region"); f != nil {
		fmt.Fprintf(w, "verdict:\trefused: %s (judged for uid %d, who runs inspect; a supervisor would replace it with a fresh region)\n", f, os.Geteuid())
		return fmt.Errorf("%w: %s: %s", ErrRefused, path, f)
	}
	fmt.Fprintf(w, "verdict:\tre-attachable (BUSY slots and insert locks of dead processes are released first)\n")
	return nil
}

// trust is the refusal a supervisor running as this user would make of a
// file it cannot trust, or nil.
func trust(fi os.FileInfo, what string) *Refusal {
	if why := untrusted(fi); why != "" {
		return &Refusal{ReasonUntrusted, what, why}
	}
	return nil
}

// lockHolder describes the live region's lock file, without taking it.
// Only a regular file is read: a FIFO there would block inspect.
func lockHolder(path string) string {
	b, err := smallfile.Read(path+lockSuffix, 64, nil)
	if err != nil {
		return ""
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return ""
	}
	if pidAlive(pid) {
		return fmt.Sprintf("last taken by pid %d, which is running (a supervisor may hold the region)", pid)
	}
	return fmt.Sprintf("last taken by pid %d, which is gone", pid)
}

func pidAlive(pid int) bool {
	_, err := os.Stat("/proc/" + strconv.Itoa(pid))
	return err == nil
}
