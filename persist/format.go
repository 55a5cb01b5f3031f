package persist

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"strings"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/preforkd/preforkd/bucket"
	"github.com/preforkd/preforkd/shm"
)

// The dump format, version 1. All integers little-endian; CRC is CRC-32C
// (Castagnoli).
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
//	0       4     type: 1 counters, 2 responses, 3 cache; others are
//	              skipped by readers
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
//	              expiry, region ns (8) · flags (4: bit 0 not replayable;
//	              bit 1 the record has a client-address account, which
//	              bits 16-31 hold; bit 2 the body field starts with the
//	              content coding, as length (2) and bytes; builds before
//	              these wrote none of them, and readers ignore the bits
//	              they do not know) ·
//	              status (2) · content-type length C (2) · location
//	              length L (2) · account (2: the client's count, see
//	              shm.Quota; 0 in dumps of builds before accounts, which
//	              wrote it as reserved) · body length N (4) ·
//	              content type (C) · location (L) · body (N, with
//	              bit 2 the content coding first)
//
//	Cache payload (the response cache's entries and tag generations)
//	0       8     hash seed 1 (must equal the header's)
//	8       8     hash seed 2 (must equal the header's)
//	16      8     xxhash64 of "preforkd persist.key\x00" + persist.key
//	24      4     tag-generation slots of the dumped region
//	28      4     generations G
//	32      12·G  slot (4) · generation (8), for every slot not 0
//	…       …     entries to the end of the payload, each: key A (8) ·
//	              key B (8) · expiry, region ns (8) · length N (4) ·
//	              entry (N: package core's encoding, checked when used)
//
// Bytes after the last section are ignored (and logged). The file's size
// follows the number of live entries, not the table's: 32 bytes a counter,
// 72 bytes plus its strings and body a stored response, 28 bytes plus its
// entry a cached response.
const (
	// Magic opens every dump (a live region opens with shm.Magic instead).
	Magic = "PFKDDUMP"
	// FormatVersion is the version of the dump format this build writes
	// and the only one it reads: another version is refused, never misread.
	FormatVersion = 1

	// Layout fields of the header, fixed in format 1. They describe the
	// dump, not the region it came from: entries are re-inserted by key,
	// whatever the region's slot layout. Another value means a writer of
	// another byte order or entry layout.
	formatByteOrder = 0x0102030405060708
	formatSlotSize  = 64

	headerFixed  = 94  // header bytes before the build string
	maxBuild     = 255 // longest build string kept (longer ones are cut)
	frameSize    = 24  // section frame: type, flags, length, payload CRC, frame CRC
	entrySize    = 32  // counter entry: key A, key B, meta, payload
	ruleFixed    = 24  // rule record before its name
	countersFix  = 24  // counters payload before its rules: seeds, rule count, reserved
	responsesFix = 24  // responses payload before its records: seeds, persist.key hash
	recordFixed  = 72  // stored response before its strings and body
	cacheFix     = 32  // cache payload before its generations: seeds, persist.key hash, slots, count
	tagGenSize   = 12  // a tag generation: slot, generation
	cacheFixed   = 28  // cache entry before its bytes: key A, key B, expiry, length
)

// Section types. A reader skips a type it does not know (after checking
// its frame and checksum) with a log line.
const (
	sectionCounters  = 1
	sectionResponses = 2
	sectionCache     = 3
)

func sectionName(t uint32) string {
	switch t {
	case sectionCounters:
		return "counters"
	case sectionResponses:
		return "responses"
	case sectionCache:
		return "cache"
	}
	return fmt.Sprintf("type %d", t)
}

// crcTable is CRC-32C (Castagnoli), computed in hardware on amd64 and arm64.
var crcTable = crc32.MakeTable(crc32.Castagnoli)

// Reason names why a dump, a section of it or a rule's state was refused.
// Each refusal is one log line that carries its Reason.
type Reason string

// The reasons a load refuses something.
const (
	ReasonMagic       Reason = "bad magic"           // not a dump
	ReasonVersion     Reason = "format version"      // written by a build with another format
	ReasonLayout      Reason = "layout"              // other slot size or byte order
	ReasonSeed        Reason = "seed"                // a section's seeds are not the header's
	ReasonChecksum    Reason = "checksum"            // a header, frame or payload checksum failed
	ReasonTruncated   Reason = "truncated"           // the file ends before what its header promises
	ReasonMalformed   Reason = "malformed"           // checksums pass but the content is inconsistent
	ReasonRuleChanged Reason = "rule changed"        // a rule's definition differs: its state is dropped
	ReasonKeyChanged  Reason = "persist key changed" // persist.key differs: stored responses are dropped
	ReasonTagSlots    Reason = "tag table changed"   // the cache's tag generations cannot be mapped: its entries are dropped
	ReasonUnreadable  Reason = "unreadable"          // not a regular file
	ReasonUntrusted   Reason = "untrusted"           // owned by another user, or writable by group or others
)

// Refusal is one thing a load refused.
type Refusal struct {
	Reason Reason
	// What was refused: "dump" (the whole file), a section ("counters",
	// "responses", "cache"), or "rule NAME".
	What   string
	Detail string
}

func (r Refusal) String() string {
	s := r.What + ": " + string(r.Reason)
	if r.Detail != "" {
		s += ": " + r.Detail
	}
	return s
}

// header is the dump header, decoded.
type header struct {
	version      uint32
	byteOrder    uint64
	regionLayout uint32 // shm.LayoutVersion of the dumped region (informative)
	slotSize     uint32
	slots        uint64 // geometry of the dumped region (informative: entries are re-inserted by key)
	probe        uint32
	maxWorkers   uint32
	seed1, seed2 uint64
	regionTime   time.Duration // the region's clock at dump
	wall         time.Time     // the wall clock at dump
	created      time.Time     // when the dumped region was created
	sections     uint32
	build        string
}

func (h *header) encode() []byte {
	build := h.build
	if len(build) > maxBuild {
		build = build[:maxBuild]
	}
	n := headerFixed + len(build) + 4
	b := make([]byte, n)
	le := binary.LittleEndian
	copy(b[0:8], Magic)
	le.PutUint32(b[8:], h.version)
	le.PutUint32(b[12:], uint32(n))
	le.PutUint64(b[16:], h.byteOrder)
	le.PutUint32(b[24:], h.regionLayout)
	le.PutUint32(b[28:], h.slotSize)
	le.PutUint64(b[32:], h.slots)
	le.PutUint32(b[40:], h.probe)
	le.PutUint32(b[44:], h.maxWorkers)
	le.PutUint64(b[48:], h.seed1)
	le.PutUint64(b[56:], h.seed2)
	le.PutUint64(b[64:], uint64(h.regionTime))
	le.PutUint64(b[72:], uint64(h.wall.UnixNano()))
	le.PutUint64(b[80:], uint64(h.created.UnixNano()))
	le.PutUint32(b[88:], h.sections)
	le.PutUint16(b[92:], uint16(len(build)))
	copy(b[headerFixed:], build)
	le.PutUint32(b[n-4:], crc32.Checksum(b[:n-4], crcTable))
	return b
}

// frame is a section frame.
func frame(typ uint32, length uint64, payloadCRC uint32) []byte {
	b := make([]byte, frameSize)
	le := binary.LittleEndian
	le.PutUint32(b[0:], typ)
	le.PutUint32(b[4:], 0) // flags: none defined; readers ignore them
	le.PutUint64(b[8:], length)
	le.PutUint32(b[16:], payloadCRC)
	le.PutUint32(b[20:], crc32.Checksum(b[:20], crcTable))
	return b
}

// ruleDef is what the dump records of a rule: everything that fixes what
// its state means. Path, methods, key source, mode and on_full are left
// out: they choose which requests and clients a rule counts, not what a
// count is worth, so changing them keeps the state.
type ruleDef struct {
	name   string
	algo   bucket.Algorithm
	window time.Duration
	limit  int64
	burst  int64 // effective: a GCRA burst of 0 is recorded as the limit
}

func defOf(r bucket.Rule) ruleDef {
	d := ruleDef{name: r.Name, algo: r.Algorithm, window: r.Window, limit: r.Limit, burst: r.Burst}
	if d.algo == bucket.GCRA && d.burst == 0 {
		d.burst = d.limit
	}
	return d
}

func (d ruleDef) rule() bucket.Rule {
	return bucket.Rule{Name: d.name, Algorithm: d.algo, Window: d.window, Limit: d.limit, Burst: d.burst}
}

func (d ruleDef) tag() uint16 { return d.rule().Tag() }

// meta is the meta word a limiter of this rule writes beside its keys.
func (d ruleDef) meta() uint64 { return d.rule().Meta() }

// diff describes how d (the dump's) differs from cur, "" when equal.
func (d ruleDef) diff(cur ruleDef) string {
	switch {
	case d.algo != cur.algo:
		return fmt.Sprintf("algorithm %v → %v", d.algo, cur.algo)
	case d.window != cur.window:
		return fmt.Sprintf("window %v → %v", d.window, cur.window)
	case d.limit != cur.limit:
		return fmt.Sprintf("limit %d → %d", d.limit, cur.limit)
	case d.burst != cur.burst:
		return fmt.Sprintf("burst %d → %d", d.burst, cur.burst)
	}
	return ""
}

// ruleLabel is how a dumped rule is named to people (inspect, the log):
// a rule by its name, and the state of one of its overrides, which package
// core names "RULE\x00key\x00VALUE" or "RULE\x00clients\x00CIDR\x00...",
// by the rule's name and the override (" override key sha256:…"): an
// override's key by the first 8 bytes of its SHA-256, never its value,
// which may be a customer's API key ("printf %s KEY | sha256sum" finds
// it). Anything else after the rule's name is hashed whole.
func ruleLabel(name string) (rule, override string) {
	rule, rest, ok := strings.Cut(name, "\x00")
	if !ok {
		return name, ""
	}
	kind, what, _ := strings.Cut(rest, "\x00")
	switch kind {
	case "key":
		sum := sha256.Sum256([]byte(what))
		return rule, fmt.Sprintf(" override key sha256:%x", sum[:8])
	case "clients":
		return rule, " override clients " + strings.ReplaceAll(what, "\x00", ",")
	}
	sum := sha256.Sum256([]byte(rest))
	return rule, fmt.Sprintf(" override sha256:%x", sum[:8])
}

// ruleText is ruleLabel as one text: "login", "api override key sha256:…".
func ruleText(name string) string {
	rule, override := ruleLabel(name)
	return rule + override
}

func (d ruleDef) String() string {
	s := fmt.Sprintf("%s %d per %v", d.algo, d.limit, d.window)
	if d.algo == bucket.GCRA && d.burst != d.limit {
		s += fmt.Sprintf(" burst %d", d.burst)
	}
	return s
}

func appendRule(b []byte, d ruleDef) []byte {
	name := d.name
	if len(name) > 0xffff {
		name = name[:0xffff] // a name this long cannot match: its state is dropped at load
	}
	le := binary.LittleEndian
	b = le.AppendUint16(b, uint16(len(name)))
	b = append(b, byte(d.algo), 0, 0, 0, 0, 0)
	b = le.AppendUint64(b, uint64(d.window))
	b = le.AppendUint32(b, uint32(d.limit))
	b = le.AppendUint32(b, uint32(d.burst))
	return append(b, name...)
}

// countersHead is the counters payload before its entries.
func countersHead(seed1, seed2 uint64, rules []ruleDef) []byte {
	le := binary.LittleEndian
	b := make([]byte, 0, countersFix+len(rules)*(ruleFixed+16))
	b = le.AppendUint64(b, seed1)
	b = le.AppendUint64(b, seed2)
	b = le.AppendUint32(b, uint32(len(rules)))
	b = le.AppendUint32(b, 0)
	for _, d := range rules {
		b = appendRule(b, d)
	}
	return b
}

// responsesHead is the responses payload before its records.
func responsesHead(seed1, seed2, key uint64) []byte {
	le := binary.LittleEndian
	b := make([]byte, 0, responsesFix)
	b = le.AppendUint64(b, seed1)
	b = le.AppendUint64(b, seed2)
	return le.AppendUint64(b, key)
}

// A stored response's flags.
const (
	recordUnreplayable = 1  // completed, not replayable
	recordAddrAccount  = 2  // charged to the address account in the high 16 bits
	recordEncoding     = 4  // the body field starts with the content coding: length (2), bytes
	recordAddrShift    = 16 // where the address account is
	recordAddrMask     = 0xffff0000
)

// appendRecord encodes one stored response.
func appendRecord(b []byte, e *shm.StoredEntry) []byte {
	le := binary.LittleEndian
	ct, loc, ce, body := e.Response.ContentType, e.Response.Location, e.Response.ContentEncoding, e.Response.Body
	var flags uint32
	if e.Unreplayable {
		flags, ct, loc, ce, body = recordUnreplayable, "", "", "", nil
	}
	ce = ce[:min(len(ce), 0xffff)]
	if ce != "" {
		flags |= recordEncoding
	}
	if e.HasAddrAccount {
		flags |= recordAddrAccount | uint32(e.AddrAccount)<<recordAddrShift
	}
	ct, loc = ct[:min(len(ct), 0xffff)], loc[:min(len(loc), 0xffff)]
	b = le.AppendUint64(b, e.Key.A)
	b = le.AppendUint64(b, e.Key.B)
	b = append(b, e.Fingerprint[:]...)
	b = le.AppendUint64(b, uint64(e.Expiry))
	b = le.AppendUint32(b, flags)
	b = le.AppendUint16(b, uint16(e.Response.Status))
	b = le.AppendUint16(b, uint16(len(ct)))
	b = le.AppendUint16(b, uint16(len(loc)))
	b = le.AppendUint16(b, e.Account)
	n := len(body)
	if ce != "" {
		n += 2 + len(ce)
	}
	b = le.AppendUint32(b, uint32(n))
	b = append(b, ct...)
	b = append(b, loc...)
	if ce != "" {
		b = le.AppendUint16(b, uint16(len(ce)))
		b = append(b, ce...)
	}
	return append(b, body...)
}

// keyHash identifies persist.key without storing it.
func keyHash(key string) uint64 { return xxhash.Sum64String("preforkd persist.key\x00" + key) }

// responsesKey is the persist.key hash that r's stored responses were
// made under: the one its region records (the key at start: a reload
// that changes persist.key does not make the responses already stored
// the new version's), or o.Key's for a region that records none.
func responsesKey(r *shm.Region, o Options) uint64 {
	if k := r.ResponsesKey(); k != 0 {
		return k
	}
	return keyHash(o.Key)
}

// section is one framed section of a parsed dump.
type section struct {
	typ, flags uint32
	offset     int // of its frame in the file
	payload    []byte
}

// parsed is a dump whose framing has been checked.
type parsed struct {
	hdr      header
	sections []section // those whose frame and checksum passed
	refused  []Refusal // sections refused on their frame or checksum
	trailing int       // bytes after the last section (ignored)
	ended    bool      // every section's frame was read: trailing counts
}

// unread adds to p the bytes of the file that readDump left unread after
// the last section (data is what it read of size bytes).
func (p *parsed) unread(data []byte, size int64) {
	if p != nil && p.ended {
		p.trailing += int(size - int64(len(data)))
	}
}

// nothingKnown refuses a dump none of whose sections this build restores
// (every dump has its counters section), so that a load and inspect both
// say why it is set aside; nil when one is there.
func (p *parsed) nothingKnown() *Refusal {
	for _, s := range p.sections {
		switch s.typ {
		case sectionCounters, sectionResponses, sectionCache:
			return nil
		}
	}
	if len(p.refused) > 0 {
		return nil // refused, and said why, already
	}
	return &Refusal{ReasonMalformed, "dump", "no section to restore"}
}

// parse checks a dump's framing: magic, format version, header checksum,
// layout, and each section's frame and checksum. A non-nil Refusal
// refuses the whole file. parse allocates nothing in proportion to a
// count it has read; every count is checked against the bytes left.
func parse(data []byte) (*parsed, *Refusal) {
	refuse := func(r Reason, f string, a ...any) (*parsed, *Refusal) {
		return nil, &Refusal{Reason: r, What: "dump", Detail: fmt.Sprintf(f, a...)}
	}
	le := binary.LittleEndian
	switch {
	case len(data) == 0:
		return refuse(ReasonTruncated, "empty file")
	case len(data) < len(Magic) && string(data) == Magic[:len(data)]:
		return refuse(ReasonTruncated, "%d bytes", len(data))
	case len(data) < len(Magic) || string(data[:len(Magic)]) != Magic:
		return refuse(ReasonMagic, "%q", data[:min(len(data), len(Magic))])
	case len(data) < 16:
		return refuse(ReasonTruncated, "%d bytes, shorter than a header", len(data))
	}
	if v := le.Uint32(data[8:]); v != FormatVersion {
		return refuse(ReasonVersion, "format version %d, this build reads %d", v, FormatVersion)
	}
	n := int(le.Uint32(data[12:]))
	if n < headerFixed+4 || n > headerFixed+maxBuild+4 {
		return refuse(ReasonMalformed, "header length %d", n)
	}
	if n > len(data) {
		return refuse(ReasonTruncated, "%d bytes, shorter than its %d-byte header", len(data), n)
	}
	if got, want := crc32.Checksum(data[:n-4], crcTable), le.Uint32(data[n-4:]); got != want {
		return refuse(ReasonChecksum, "header checksum %#08x, recorded %#08x", got, want)
	}
	h := header{
		version:      FormatVersion,
		byteOrder:    le.Uint64(data[16:]),
		regionLayout: le.Uint32(data[24:]),
		slotSize:     le.Uint32(data[28:]),
		slots:        le.Uint64(data[32:]),
		probe:        le.Uint32(data[40:]),
		maxWorkers:   le.Uint32(data[44:]),
		seed1:        le.Uint64(data[48:]),
		seed2:        le.Uint64(data[56:]),
		regionTime:   time.Duration(le.Uint64(data[64:])),
		wall:         time.Unix(0, int64(le.Uint64(data[72:]))),
		created:      time.Unix(0, int64(le.Uint64(data[80:]))),
		sections:     le.Uint32(data[88:]),
	}
	if b := int(le.Uint16(data[92:])); headerFixed+b+4 != n {
		return refuse(ReasonMalformed, "build string of %d bytes in a %d-byte header", b, n)
	}
	h.build = string(data[headerFixed : n-4])
	switch {
	case h.byteOrder != formatByteOrder:
		return refuse(ReasonLayout, "byte order mark %#016x, want %#016x", h.byteOrder, uint64(formatByteOrder))
	case h.slotSize != formatSlotSize:
		return refuse(ReasonLayout, "slot size %d, want %d", h.slotSize, formatSlotSize)
	case h.regionTime < 0:
		return refuse(ReasonMalformed, "region clock %v", h.regionTime)
	}
	p := &parsed{hdr: h}
	off := n
	for i := uint32(0); i < h.sections; i++ {
		what := fmt.Sprintf("section %d", i+1)
		if len(data)-off < frameSize {
			p.refused = append(p.refused, Refusal{ReasonTruncated, what, fmt.Sprintf("file ends at byte %d, inside the frame at %d", len(data), off)})
			return p, nil
		}
		f := data[off : off+frameSize]
		if got, want := crc32.Checksum(f[:20], crcTable), le.Uint32(f[20:]); got != want {
			// Its length cannot be trusted, so neither can anything after it.
			p.refused = append(p.refused, Refusal{ReasonChecksum, what, fmt.Sprintf("frame at byte %d: checksum %#08x, recorded %#08x; it and the sections after it are lost", off, got, want)})
			return p, nil
		}
		s := section{typ: le.Uint32(f), flags: le.Uint32(f[4:]), offset: off}
		what = sectionName(s.typ)
		length := le.Uint64(f[8:])
		start := off + frameSize
		if length > uint64(len(data)-start) {
			p.refused = append(p.refused, Refusal{ReasonTruncated, what, fmt.Sprintf("%d payload bytes promised at byte %d, %d in the file", length, start, len(data)-start)})
			return p, nil
		}
		s.payload = data[start : start+int(length)]
		off = start + int(length)
		if got, want := crc32.Checksum(s.payload, crcTable), le.Uint32(f[16:]); got != want {
			p.refused = append(p.refused, Refusal{ReasonChecksum, what, fmt.Sprintf("payload checksum %#08x, recorded %#08x", got, want)})
			continue
		}
		p.sections = append(p.sections, s)
	}
	p.trailing, p.ended = len(data)-off, true
	return p, nil
}

// sectionSeeds are the hash seeds a section payload was written under,
// its first 16 bytes: a load keeps the section only when they are the
// header's.
type sectionSeeds struct{ seed1, seed2 uint64 }

func (s sectionSeeds) seeds() sectionSeeds { return s }

// counters is a decoded counters payload.
type counters struct {
	sectionSeeds
	rules   []ruleDef
	entries []byte // entrySize bytes each: key A, key B, meta, payload
}

func parseCounters(b []byte) (counters, *Refusal) {
	bad := func(f string, a ...any) (counters, *Refusal) {
		return counters{}, &Refusal{Reason: ReasonMalformed, What: "counters", Detail: fmt.Sprintf(f, a...)}
	}
	le := binary.LittleEndian
	if len(b) < countersFix {
		return bad("%d-byte payload", len(b))
	}
	c := counters{sectionSeeds: sectionSeeds{le.Uint64(b), le.Uint64(b[8:])}}
	n := le.Uint32(b[16:])
	rest := b[countersFix:]
	if uint64(n) > uint64(len(rest)/ruleFixed) {
		return bad("%d rules cannot fit in %d bytes", n, len(rest))
	}
	c.rules = make([]ruleDef, 0, n)
	for i := uint32(0); i < n; i++ {
		if len(rest) < ruleFixed {
			return bad("rule %d of %d: %d bytes left", i+1, n, len(rest))
		}
		nl := int(le.Uint16(rest))
		if nl > len(rest)-ruleFixed {
			return bad("rule %d of %d: name of %d bytes, %d left", i+1, n, nl, len(rest)-ruleFixed)
		}
		algo := bucket.Algorithm(rest[2])
		if _, err := algo.MarshalText(); err != nil {
			// No build wrote it: what its keys count cannot be read.
			return bad("rule %d of %d: algorithm %d is none this build knows", i+1, n, rest[2])
		}
		c.rules = append(c.rules, ruleDef{
			algo:   algo,
			window: time.Duration(le.Uint64(rest[8:])),
			limit:  int64(le.Uint32(rest[16:])),
			burst:  int64(le.Uint32(rest[20:])),
			name:   string(rest[ruleFixed : ruleFixed+nl]),
		})
		rest = rest[ruleFixed+nl:]
	}
	if len(rest)%entrySize != 0 {
		return bad("%d bytes of entries is not a whole number of %d-byte entries", len(rest), entrySize)
	}
	c.entries = rest
	return c, nil
}

// responses is a decoded responses payload.
type responses struct {
	sectionSeeds
	keyHash uint64
	count   int    // records
	records []byte // count records, filling the rest of the payload
}

func parseResponses(b []byte) (responses, *Refusal) {
	if len(b) < responsesFix {
		return responses{}, &Refusal{Reason: ReasonMalformed, What: "responses", Detail: fmt.Sprintf("%d-byte payload", len(b))}
	}
	le := binary.LittleEndian
	rs := responses{sectionSeeds: sectionSeeds{le.Uint64(b), le.Uint64(b[8:])}, keyHash: le.Uint64(b[16:]), records: b[responsesFix:]}
	for rest := rs.records; len(rest) > 0; rs.count++ {
		_, next, ok := nextRecord(rest)
		if !ok {
			return responses{}, &Refusal{Reason: ReasonMalformed, What: "responses",
				Detail: fmt.Sprintf("record %d overruns the payload by %d bytes", rs.count+1, recordLen(rest)-len(rest))}
		}
		rest = next
	}
	return rs, nil
}

// recordLen is the length the record at the start of b claims.
func recordLen(b []byte) int {
	if len(b) < recordFixed {
		return recordFixed
	}
	le := binary.LittleEndian
	return recordFixed + int(le.Uint16(b[62:])) + int(le.Uint16(b[64:])) + int(le.Uint32(b[68:]))
}

// nextRecord decodes the stored response at the start of b. Its strings
// are copied; its body aliases b.
func nextRecord(b []byte) (e shm.StoredEntry, rest []byte, ok bool) {
	if len(b) < recordFixed {
		return e, nil, false
	}
	le := binary.LittleEndian
	ctLen, locLen, bodyLen := int(le.Uint16(b[62:])), int(le.Uint16(b[64:])), uint64(le.Uint32(b[68:]))
	end := uint64(recordFixed+ctLen+locLen) + bodyLen
	if end > uint64(len(b)) {
		return e, nil, false
	}
	e.Key = shm.Key{A: le.Uint64(b), B: le.Uint64(b[8:])}
	copy(e.Fingerprint[:], b[16:48])
	e.Expiry = time.Duration(le.Uint64(b[48:]))
	flags := le.Uint32(b[56:])
	e.Unreplayable = flags&recordUnreplayable != 0
	if flags&recordAddrAccount != 0 {
		e.AddrAccount, e.HasAddrAccount = uint16(flags&recordAddrMask>>recordAddrShift), true
	}
	e.Response.Status = int(le.Uint16(b[60:]))
	e.Account = le.Uint16(b[66:])
	s := recordFixed
	e.Response.ContentType = string(b[s : s+ctLen])
	s += ctLen
	e.Response.Location = string(b[s : s+locLen])
	s += locLen
	if flags&recordEncoding != 0 {
		if end-uint64(s) < 2 {
			return e, nil, false
		}
		ce := uint64(s) + 2 + uint64(le.Uint16(b[s:]))
		if ce > end {
			return e, nil, false
		}
		e.Response.ContentEncoding = string(b[s+2 : ce])
		s = int(ce)
	}
	e.Response.Body = b[s:end]
	return e, b[end:], true
}

// cacheHead is the cache payload before its generations.
func cacheHead(seed1, seed2, key uint64, slots, gens int) []byte {
	le := binary.LittleEndian
	b := make([]byte, 0, cacheFix)
	b = le.AppendUint64(b, seed1)
	b = le.AppendUint64(b, seed2)
	b = le.AppendUint64(b, key)
	b = le.AppendUint32(b, uint32(slots))
	return le.AppendUint32(b, uint32(gens))
}

// cacheSection is a decoded cache payload.
type cacheSection struct {
	sectionSeeds
	keyHash uint64
	slots   int
	gens    []byte // tagGenSize bytes each
	count   int    // entries
	entries []byte // count entries, filling the rest of the payload
}

func parseCache(b []byte) (cacheSection, *Refusal) {
	bad := func(f string, a ...any) (cacheSection, *Refusal) {
		return cacheSection{}, &Refusal{Reason: ReasonMalformed, What: "cache", Detail: fmt.Sprintf(f, a...)}
	}
	if len(b) < cacheFix {
		return bad("%d-byte payload", len(b))
	}
	le := binary.LittleEndian
	cs := cacheSection{sectionSeeds: sectionSeeds{le.Uint64(b), le.Uint64(b[8:])}, keyHash: le.Uint64(b[16:]), slots: int(le.Uint32(b[24:]))}
	g := uint64(le.Uint32(b[28:]))
	rest := b[cacheFix:]
	if g > uint64(len(rest)/tagGenSize) {
		return bad("%d tag generations cannot fit in %d bytes", g, len(rest))
	}
	cs.gens, rest = rest[:g*tagGenSize], rest[g*tagGenSize:]
	for b := cs.gens; len(b) > 0; b = b[tagGenSize:] {
		if int(le.Uint32(b)) >= cs.slots {
			return bad("tag slot %d of a table of %d", le.Uint32(b), cs.slots)
		}
	}
	cs.entries = rest
	for len(rest) > 0 {
		if len(rest) < cacheFixed || uint64(le.Uint32(rest[24:])) > uint64(len(rest)-cacheFixed) {
			return bad("entry %d overruns the payload", cs.count+1)
		}
		rest = rest[cacheFixed+int(le.Uint32(rest[24:])):]
		cs.count++
	}
	return cs, nil
}

// nextCacheEntry decodes the entry at the start of b (checked by
// parseCache); its bytes alias b.
func nextCacheEntry(b []byte) (shm.StoredEntry, []byte) {
	le := binary.LittleEndian
	n := int(le.Uint32(b[24:]))
	e := shm.StoredEntry{
		Kind:   shm.KindCache,
		Key:    shm.Key{A: le.Uint64(b), B: le.Uint64(b[8:])},
		Expiry: time.Duration(le.Uint64(b[16:])),
		Data:   b[cacheFixed : cacheFixed+n],
	}
	return e, b[cacheFixed+n:]
}
