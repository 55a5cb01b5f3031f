package core

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
//	0      1    version (entryVersion)
//	1      1    flags: entryStub
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
//	…      F    N fields: name length (2) · value length (4) · name · value
//	…      B    body
//
// A vary stub (entryStub) is what the primary key of a response that
// varies holds: its fields are the Vary names (values empty), nothing
// else; the response itself is stored under a key that adds the
// request's values of those fields.
const (
	entryVersion = 1
	entryFixed   = 56

	entryStub = 1 // a vary stub, not a response
)

// entry is a decoded entry: its slices alias the bytes it was decoded
// from.
type entry struct {
	flags   uint8
	status  int
	stored  time.Duration
	age     time.Duration
	fresh   time.Duration
	swr     time.Duration
	sie     time.Duration
	gens    []byte // 16 bytes each
	nfields int
	fields  []byte
	body    []byte
}

func (e *entry) stub() bool { return e.flags&entryStub != 0 }

// decodeEntry decodes b, checking every length; false for bytes that are
// not an entry of this version.
func decodeEntry(b []byte, e *entry) bool {
	if len(b) < entryFixed || b[0] != entryVersion {
		return false
	}
	le := binary.LittleEndian
	ng, nf, fl, bl := int(le.Uint16(b[48:])), int(le.Uint16(b[50:])), int(le.Uint32(b[52:])), int(le.Uint32(b[4:]))
	if entryFixed+16*ng+fl+bl != len(b) {
		return false
	}
	*e = entry{
		flags:   b[1],
		status:  int(le.Uint16(b[2:])),
		stored:  time.Duration(le.Uint64(b[8:])),
		age:     time.Duration(le.Uint64(b[16:])),
		fresh:   time.Duration(le.Uint64(b[24:])),
		swr:     time.Duration(le.Uint64(b[32:])),
		sie:     time.Duration(le.Uint64(b[40:])),
		nfields: nf,
	}
	at := entryFixed
	e.gens = b[at : at+16*ng]
	at += 16 * ng
	e.fields = b[at : at+fl]
	e.body = b[at+fl:]
	// Check the fields' framing once, so that iterating never fails.
	n, f := 0, e.fields
	for ; len(f) > 0; n++ {
		if len(f) < 6 {
			return false
		}
		l := 6 + int(le.Uint16(f)) + int(le.Uint32(f[2:]))
		if l > len(f) {
			return false
		}
		f = f[l:]
	}
	return n == nf
}

// nextField returns the field at the start of f and the rest; f must come
// from a decoded entry.
func nextField(f []byte) (name string, value, rest []byte) {
	le := binary.LittleEndian
	nl, vl := int(le.Uint16(f)), int(le.Uint32(f[2:]))
	n := f[6 : 6+nl]
	if nl > 0 {
		name = unsafe.String(&n[0], nl)
	}
	return name, f[6+nl : 6+nl+vl], f[6+nl+vl:]
}

// get returns the value of the entry's first field called name
// (canonical).
func (e *entry) get(name string) (string, bool) {
	for f := e.fields; len(f) > 0; {
		var n string
		var v []byte
		n, v, f = nextField(f)
		if n == name {
			if len(v) == 0 {
				return "", true
			}
			return unsafe.String(&v[0], len(v)), true
		}
	}
	return "", false
}

// entryWriter builds an entry.
type entryWriter struct {
	b       []byte
	nfields int
}

// begin starts an entry with room for gens generations.
func (w *entryWriter) begin(dst []byte, flags uint8, status int, stored, age, fresh, swr, sie time.Duration, gens int) {
	le := binary.LittleEndian
	b := append(dst[:0], make([]byte, entryFixed+16*gens)...)
	b[0], b[1] = entryVersion, flags
	le.PutUint16(b[2:], uint16(status))
	le.PutUint64(b[8:], uint64(stored))
	le.PutUint64(b[16:], uint64(age))
	le.PutUint64(b[24:], uint64(fresh))
	le.PutUint64(b[32:], uint64(swr))
	le.PutUint64(b[40:], uint64(sie))
	le.PutUint16(b[48:], uint16(gens))
	w.b, w.nfields = b, 0
}

// gen sets generation i.
func (w *entryWriter) gen(i int, hash, gen uint64) {
	at := entryFixed + 16*i
	binary.LittleEndian.PutUint64(w.b[at:], hash)
	binary.LittleEndian.PutUint64(w.b[at+8:], gen)
}

// maxFieldValue bounds a stored field value; a response with a longer one
// is not stored.
const maxFieldValue = 1 << 20

// field appends a field line.
func (w *entryWriter) field(name string, value []byte) {
	le := binary.LittleEndian
	w.b = le.AppendUint16(w.b, uint16(len(name)))
	w.b = le.AppendUint32(w.b, uint32(len(value)))
	w.b = append(w.b, name...)
	w.b = append(w.b, value...)
	w.nfields++
}

// finish appends the body and fills in the lengths.
func (w *entryWriter) finish(body []byte) []byte {
	le := binary.LittleEndian
	ng := int(le.Uint16(w.b[48:]))
	le.PutUint16(w.b[50:], uint16(w.nfields))
	le.PutUint32(w.b[52:], uint32(len(w.b)-entryFixed-16*ng))
	le.PutUint32(w.b[4:], uint32(len(body)))
	return append(w.b, body...)
}
