package httpcache

import (
	"encoding/binary"
	"time"
	"unsafe"
)

// A cache entry as the response table stores it (opaque to package shm,
// which checks and copies it). All integers little-endian; times are
// region times in nanoseconds.
//
//	offset size
//	0      1    version (EntryVersion)
//	1      1    flags: EntryStub
//	2      2    status
//	4      4    body length B
//	8      8    stored: region time the response arrived (response_time)
//	16     8    age it had then (corrected_initial_age, RFC 9111 §4.2.3)
//	24     8    freshness lifetime
//	32     8    stale-while-revalidate window
//	40     8    stale-if-error window
//	48     2    generations G
//	50     2    fields N
//	52     4    bytes of the fields F
//	56     16·G generations: slot hash (8) · generation (8); the first is
//	            the URL's, the others its tags'
//	…      F    N fields: name length (2) · value length (4) · name · value;
//	            the top bit of the name length marks a hidden field
//	…      B    body
//
// A hidden field (version 2) is kept for the cache's own use and never
// sent: preforkd's targeted field, which decides freshness again when a
// 304 refreshes the entry. Version 1 entries (no hidden fields) decode
// as they are.
//
// A vary stub (EntryStub) is what the primary key of a response that
// varies holds: its fields are the Vary names (values empty), nothing
// else; the response itself is stored under a key that adds the
// request's values of those fields.
const (
	EntryVersion = 2
	EntryFixed   = 56

	hiddenBit = 1 << 15

	EntryStub = 1 // a vary stub, not a response
)

// Entry is a decoded entry: its slices alias the bytes it was decoded
// from.
type Entry struct {
	Flags   uint8
	Status  int
	Stored  time.Duration // region time the response arrived
	Age     time.Duration // the age it had then
	Fresh   time.Duration // freshness lifetime
	SWR     time.Duration // stale-while-revalidate window
	SIE     time.Duration // stale-if-error window
	Gens    []byte        // 16 bytes each: slot hash, generation
	NFields int
	Fields  []byte // walked with NextField
	// Body is the body; nil when the entry was decoded from its head
	// alone (DecodeHead): BodyAt and BodySize say where it is.
	Body     []byte
	BodyAt   int // the body's offset in the entry
	BodySize int // the body's length
}

// Stub reports whether e is a vary stub.
func (e *Entry) Stub() bool { return e.Flags&EntryStub != 0 }

// Decode decodes b, checking every length; false for bytes that are
// not an entry of this version.
func Decode(b []byte, e *Entry) bool {
	if !decode(b, len(b), e) {
		return false
	}
	e.Body = b[e.BodyAt:]
	return true
}

// HeadSize is the length of the head (all but the body) of the entry
// that b begins, from its first EntryFixed bytes; false when b is shorter.
func HeadSize(b []byte) (int, bool) {
	if len(b) < EntryFixed {
		return 0, false
	}
	le := binary.LittleEndian
	return EntryFixed + 16*int(le.Uint16(b[48:])) + int(le.Uint32(b[52:])), true
}

// DecodeHead decodes the head of an entry of size bytes from b, its first
// bytes (the head whole, some of the body perhaps), as Decode does but
// for the body, which e leaves nil (e.BodyAt and e.BodySize say where it
// is).
func DecodeHead(b []byte, size int, e *Entry) bool {
	return decode(b, size, e)
}

// decode decodes the head of an entry of size bytes that b begins.
func decode(b []byte, size int, e *Entry) bool {
	if len(b) < EntryFixed || b[0] != EntryVersion && b[0] != 1 {
		return false
	}
	le := binary.LittleEndian
	ng, nf, fl, bl := int(le.Uint16(b[48:])), int(le.Uint16(b[50:])), int(le.Uint32(b[52:])), int(le.Uint32(b[4:]))
	if EntryFixed+16*ng+fl+bl != size || EntryFixed+16*ng+fl > len(b) {
		return false
	}
	*e = Entry{
		Flags:   b[1],
		Status:  int(le.Uint16(b[2:])),
		Stored:  time.Duration(le.Uint64(b[8:])),
		Age:     time.Duration(le.Uint64(b[16:])),
		Fresh:   time.Duration(le.Uint64(b[24:])),
		SWR:     time.Duration(le.Uint64(b[32:])),
		SIE:     time.Duration(le.Uint64(b[40:])),
		NFields: nf,
	}
	at := EntryFixed
	e.Gens = b[at : at+16*ng]
	at += 16 * ng
	e.Fields = b[at : at+fl]
	e.BodyAt, e.BodySize = at+fl, bl
	// Check the fields' framing once, so that iterating never fails.
	n, f := 0, e.Fields
	for ; len(f) > 0; n++ {
		if len(f) < 6 {
			return false
		}
		l := 6 + int(le.Uint16(f)&^hiddenBit) + int(le.Uint32(f[2:]))
		if l > len(f) {
			return false
		}
		f = f[l:]
	}
	return n == nf
}

// NextField returns the field at the start of f and the rest; f must come
// from a decoded entry. A hidden field is the cache's own: never sent.
func NextField(f []byte) (name string, value []byte, hidden bool, rest []byte) {
	le := binary.LittleEndian
	nl, vl := int(le.Uint16(f)), int(le.Uint32(f[2:]))
	hidden, nl = nl&hiddenBit != 0, nl&^hiddenBit
	n := f[6 : 6+nl]
	if nl > 0 {
		name = unsafe.String(&n[0], nl)
	}
	return name, f[6+nl : 6+nl+vl], hidden, f[6+nl+vl:]
}

// Get returns the value of the entry's first field called name
// (canonical).
func (e *Entry) Get(name string) (string, bool) {
	for f := e.Fields; len(f) > 0; {
		var n string
		var v []byte
		n, v, _, f = NextField(f)
		if n == name {
			if len(v) == 0 {
				return "", true
			}
			return unsafe.String(&v[0], len(v)), true
		}
	}
	return "", false
}

// Writer builds an entry.
type Writer struct {
	b       []byte
	nfields int
}

// Begin starts an entry with room for gens generations, in dst's memory.
func (w *Writer) Begin(dst []byte, flags uint8, status int, stored, age, fresh, swr, sie time.Duration, gens int) {
	le := binary.LittleEndian
	b := append(dst[:0], make([]byte, EntryFixed+16*gens)...)
	b[0], b[1] = EntryVersion, flags
	le.PutUint16(b[2:], uint16(status))
	le.PutUint64(b[8:], uint64(stored))
	le.PutUint64(b[16:], uint64(age))
	le.PutUint64(b[24:], uint64(fresh))
	le.PutUint64(b[32:], uint64(swr))
	le.PutUint64(b[40:], uint64(sie))
	le.PutUint16(b[48:], uint16(gens))
	w.b, w.nfields = b, 0
}

// Gen sets generation i.
func (w *Writer) Gen(i int, hash, gen uint64) {
	at := EntryFixed + 16*i
	binary.LittleEndian.PutUint64(w.b[at:], hash)
	binary.LittleEndian.PutUint64(w.b[at+8:], gen)
}

// MaxFieldValue bounds a stored field value; a response with a longer one
// is not stored.
const MaxFieldValue = 1 << 20

// MaxFieldName bounds a stored field name; a response with a longer one
// is not stored.
const MaxFieldName = hiddenBit - 1

// Field appends a field line; hidden marks it the cache's own. The name
// must be at most MaxFieldName bytes long.
func (w *Writer) Field(name string, value []byte, hidden bool) {
	le := binary.LittleEndian
	nl := uint16(len(name))
	if hidden {
		nl |= hiddenBit
	}
	w.b = le.AppendUint16(w.b, nl)
	w.b = le.AppendUint32(w.b, uint32(len(value)))
	w.b = append(w.b, name...)
	w.b = append(w.b, value...)
	w.nfields++
}

// Finish appends the body and fills in the lengths.
func (w *Writer) Finish(body []byte) []byte {
	le := binary.LittleEndian
	ng := int(le.Uint16(w.b[48:]))
	le.PutUint16(w.b[50:], uint16(w.nfields))
	le.PutUint32(w.b[52:], uint32(len(w.b)-EntryFixed-16*ng))
	le.PutUint32(w.b[4:], uint32(len(body)))
	return append(w.b, body...)
}

// Gen is generation i of e: the hash of the slot it counts in, and its
// value when the response was stored.
func (e *Entry) Gen(i int) (hash, gen uint64) {
	le := binary.LittleEndian
	return le.Uint64(e.Gens[16*i:]), le.Uint64(e.Gens[16*i+8:])
}

// NumGens is how many generations e recorded.
func (e *Entry) NumGens() int { return len(e.Gens) / 16 }
