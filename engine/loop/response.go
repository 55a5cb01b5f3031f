//go:build linux

package loop

import (
	"bytes"
	"errors"

	"github.com/preforkd/preforkd/engine"
)

// The upstream's response head (RFC 9112 §4, §6.3), checked before
// anything of it reaches a client: a status line, a header section
// without bare LFs, obs-fold or control characters, one length at most.
// What is not right is a 502, as nginx's "upstream sent invalid header".

// maxResponseHead bounds a response's head, as nginx's proxy_buffer_size:
// a larger one is a 502.
const maxResponseHead = 16 << 10

var (
	errRespBareLF   = errors.New("loop: a response header line ended by a bare LF")
	errRespLine     = errors.New("loop: a malformed response status line")
	errRespStatus   = errors.New("loop: a response status outside 100-599")
	errRespField    = errors.New("loop: a malformed response header field")
	errRespLength   = errors.New("loop: a malformed or repeated response Content-Length")
	errRespTooLarge = errors.New("loop: a response header section over 16 KiB")
	errRespInterim  = errors.New("loop: too many interim responses")
	errRespUnasked  = errors.New("loop: the upstream switched protocols unasked")
	errRespStray    = errors.New("loop: the upstream sent bytes past the end of its response")
	errRespClosed   = errors.New("loop: the upstream closed the connection before a whole response")
	errRespCut      = errors.New("loop: the upstream's response did not reach its end")
)

// respHead is a parsed response head. Its spans index raw.
type respHead struct {
	raw    []byte
	fields []field
	inline [inlineFields]field
	respInfo
}

// respInfo is what parsing a response head found, apart from its fields.
type respInfo struct {
	status    int
	reason    span
	minor     byte
	hasLength bool
	length    int64
	encoded   bool // Transfer-Encoding: the length is the coding's
	chunked   bool // ... and it is chunked (else the body ends at the close)
	close     bool // the upstream closes the connection after it
	hasDate   bool // a Date field, which goes on as sent
}

// parse indexes raw, a whole head (scanHead).
func (h *respHead) parse(raw []byte) error {
	h.raw, h.fields, h.respInfo = raw, h.inline[:0], respInfo{}
	end := bytes.IndexByte(raw, '\n') - 1
	line := raw[:end]
	// HTTP/1.x SP 3DIGIT [SP reason]
	if len(line) < 12 || string(line[:7]) != "HTTP/1." || !isDigit(line[7]) || line[8] != ' ' ||
		!isDigit(line[9]) || !isDigit(line[10]) || !isDigit(line[11]) || len(line) > 12 && line[12] != ' ' {
		return errRespLine
	}
	h.minor = line[7] - '0'
	h.close = h.minor == 0
	h.status = int(line[9]-'0')*100 + int(line[10]-'0')*10 + int(line[11]-'0')
	if h.status < 100 || h.status > 599 {
		return errRespStatus
	}
	if len(line) > 13 {
		h.reason = span{13, int32(end)}
		if !engine.FieldValueOK(h.reason.of(raw)) {
			return errRespLine
		}
	}
	named := false
	for pos := end + 2; pos < len(raw); {
		eol := pos + bytes.IndexByte(raw[pos:], '\n') - 1
		l := span{int32(pos), int32(eol)}
		pos = eol + 2
		if l.to == l.from {
			break
		}
		f, fault := parseField(raw, l)
		if fault != engine.FieldOK {
			return errRespField
		}
		name, v := f.name.of(raw), f.value.of(raw)
		f.kind = engine.ClassifyField(name)
		switch f.kind {
		case engine.FieldLength:
			if h.hasLength {
				return errRespLength
			}
			n, ok := parseLength(v)
			if !ok {
				return errRespLength
			}
			h.hasLength, h.length = true, n
		case engine.FieldEncoding:
			h.encoded = true
			h.chunked = false
			engine.EachToken(v, func(t []byte) { h.chunked = engine.EqualFold(t, "chunked") })
		case engine.FieldConnection:
			engine.EachToken(v, func(t []byte) {
				switch {
				case engine.EqualFold(t, "close"):
					h.close = true
				case engine.EqualFold(t, "keep-alive"):
					if h.minor == 0 {
						h.close = false
					}
				case engine.EqualFold(t, "upgrade"):
				default:
					named = true
				}
			})
		case engine.FieldOther:
			if len(name) == 4 && engine.EqualFold(name, "date") {
				h.hasDate = true // kept: the server sends its own only without
			}
		}
		h.fields = append(h.fields, f)
	}
	if h.encoded && h.hasLength {
		// RFC 9112 §6.3: Transfer-Encoding overrides Content-Length, and
		// the connection cannot be trusted after.
		h.hasLength, h.close = false, true
	}
	if h.encoded && !h.chunked {
		h.close = true // the body ends with the connection
	}
	if named {
		h.dropConnectionNamed()
	}
	return nil
}

// dropConnectionNamed marks every field a Connection field names, but
// close, keep-alive and upgrade, as not to be passed on.
func (h *respHead) dropConnectionNamed() {
	for _, cf := range h.fields {
		if cf.kind != engine.FieldConnection {
			continue
		}
		engine.EachToken(cf.value.of(h.raw), func(t []byte) {
			if engine.EqualFold(t, "close") || engine.EqualFold(t, "keep-alive") || engine.EqualFold(t, "upgrade") {
				return
			}
			for i := range h.fields {
				f := &h.fields[i]
				if f.kind != engine.FieldConnection && f.kind != engine.FieldUpgrade && bytes.EqualFold(f.name.of(h.raw), t) {
					f.kind = engine.FieldDropped
				}
			}
		})
	}
}

// passed reports whether field f goes to the client
// (engine.ResponseFieldPassed).
func (h *respHead) passed(f *field) bool { return engine.ResponseFieldPassed(f.kind, h.status == 101) }

// Each implements core.Header: every field line as the upstream sent it
// (the core keeps what it stores of them, and reads Date).
func (h *respHead) Each(f func(name, value []byte)) {
	for i := range h.fields {
		fl := &h.fields[i]
		f(fl.name.of(h.raw), fl.value.of(h.raw))
	}
}

// bodyless reports whether a response to a request of the given kind
// has no body, whatever its fields say (RFC 9112 §6.3).
func bodyless(status int, head bool) bool {
	return head || status < 200 || status == 204 || status == 304
}
