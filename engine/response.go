package engine

import (
	"bytes"
	"errors"
	"time"
)

// The rules of an upstream's response head, for the engines that read
// the upstream themselves (engine/loop, engine/nethttp's forwarder): one
// parser, so that they take, refuse and pass on the same responses. What
// is not right is a 502, as nginx's "upstream sent invalid header".

// MaxResponseHead bounds a response's head, as nginx's proxy_buffer_size:
// a larger one is ErrRespTooLarge.
const MaxResponseHead = 16 << 10

// MaxInterims bounds the interim responses (1xx but 101) before the final
// one: more are ErrRespInterims.
const MaxInterims = 16

// What an upstream's response can be refused for. Each is a 502 to the
// client, and an UpstreamResponse failure to the core.
var (
	ErrRespBareLF   = errors.New("a response header line ended by a bare LF")
	ErrRespLine     = errors.New("a malformed response status line")
	ErrRespStatus   = errors.New("a response status outside 100-599")
	ErrRespField    = errors.New("a malformed response header field")
	ErrRespLength   = errors.New("a malformed or repeated response Content-Length")
	ErrRespTooLarge = errors.New("a response header section over 16 KiB")
	ErrRespInterims = errors.New("too many interim responses")
	ErrRespUnasked  = errors.New("the upstream switched protocols unasked")
	ErrRespCoding   = errors.New("a response transfer coding other than chunked alone")
	ErrRespStray    = errors.New("the upstream sent bytes past the end of its response")
	ErrRespSwitch   = errors.New("a 101 response to no protocol the request asked for")
)

// Span is a piece of a head, as offsets into it.
type Span struct{ From, To int32 }

// Of is the piece of b.
func (s Span) Of(b []byte) []byte { return b[s.From:s.To] }

// Field is one header line of a head: its name, its value without the
// spaces around it, and its kind.
type Field struct {
	Name, Value Span
	Kind        FieldKind
}

// ResponseHead is a parsed response head. Its spans index Raw.
type ResponseHead struct {
	Raw    []byte
	Fields []Field // every field line, in order; Kind FieldDropped for those Connection names
	Status int
	Reason Span // empty for none
	Minor  byte // 0 for HTTP/1.0, 1 for HTTP/1.1

	HasLength bool  // a Content-Length the body is framed by
	Length    int64 // ... its value
	Encoded   bool  // Transfer-Encoding: the length is the coding's
	Chunked   bool  // ... and it is chunked (else the body ends at the close)
	Close     bool  // the upstream closes the connection after it
	HasDate   bool  // a Date field, which goes on as sent

	// IdleFor is how long the connection may wait idle for the next
	// request: a margin short of the Keep-Alive timeout the upstream gave
	// (KeepAliveIdle). 0: it gave none, and the pool's own bound holds.
	IdleFor time.Duration
}

// ParseResponseHead indexes raw, one whole head (the status line, the fields, the
// empty line; every line ended by CRLF), appending its fields to fields.
// It refuses what a proxy must not pass on: a status line that is not
// HTTP/1.x with three digits in 100-599, a field line RFC 9112 §5 refuses
// (ParseFieldLine), a Content-Length that is not one number, a
// Transfer-Encoding that is not chunked alone or comes in HTTP/1.0, a
// 101 without Upgrade. A
// Transfer-Encoding overrides a Content-Length (RFC 9112 §6.3) and the
// connection is not reused after it. (Without any framing field, the body
// of a response that has one ends at the close: Bodyless says which.)
//
// It returns the head by value, so that raw and fields, a caller's stack
// buffers, stay there.
func ParseResponseHead(raw []byte, fields []Field) (ResponseHead, error) {
	h := ResponseHead{Raw: raw, Fields: fields[:0]}
	end := bytes.IndexByte(raw, '\n') - 1
	if end < 0 {
		return h, ErrRespLine
	}
	line := raw[:end]
	// HTTP/1.x SP 3DIGIT [SP reason]
	if len(line) < 12 || string(line[:7]) != "HTTP/1." || !isDigit(line[7]) || line[8] != ' ' ||
		!isDigit(line[9]) || !isDigit(line[10]) || !isDigit(line[11]) || len(line) > 12 && line[12] != ' ' {
		return h, ErrRespLine
	}
	h.Minor = line[7] - '0'
	h.Close = h.Minor == 0
	h.Status = int(line[9]-'0')*100 + int(line[10]-'0')*10 + int(line[11]-'0')
	if h.Status < 100 || h.Status > 599 {
		return h, ErrRespStatus
	}
	if len(line) > 13 {
		h.Reason = Span{13, int32(end)}
		if !FieldValueOK(h.Reason.Of(raw)) {
			return h, ErrRespLine
		}
	}
	named, codings, upgrade := false, 0, false
	for pos := end + 2; pos < len(raw); {
		eol := pos + bytes.IndexByte(raw[pos:], '\n') - 1
		if eol <= pos {
			break // the empty line
		}
		fl, fault := ParseFieldLine(raw[pos:eol])
		if fault != FieldOK {
			return h, ErrRespField
		}
		from := int32(pos)
		f := Field{Name: Span{from, from + int32(fl.NameEnd)}, Value: Span{from + int32(fl.ValueFrom), from + int32(fl.ValueTo)}}
		pos = eol + 2
		name, v := f.Name.Of(raw), f.Value.Of(raw)
		f.Kind = ClassifyField(name)
		switch f.Kind {
		case FieldLength:
			n, ok := ParseLength(v)
			if h.HasLength || !ok {
				return h, ErrRespLength
			}
			h.HasLength, h.Length = true, n
		case FieldEncoding:
			// Chunked alone, once, is the only coding read here. (Tokens
			// by nextToken, not EachToken: its callback would move raw, a
			// caller's stack buffer, to the heap.)
			h.Encoded = true
			before := codings
			for list := v; len(list) > 0; {
				var t []byte
				if t, list = nextToken(list); len(t) > 0 {
					codings++
					h.Chunked = EqualFold(t, "chunked")
				}
			}
			if codings == before {
				return h, ErrRespCoding // a Transfer-Encoding that names none
			}
		case FieldUpgrade:
			for list := v; len(list) > 0 && !upgrade; {
				var t []byte
				t, list = nextToken(list)
				upgrade = len(t) > 0
			}
		case FieldConnection:
			for list := v; len(list) > 0; {
				var t []byte
				switch t, list = nextToken(list); {
				case len(t) == 0, EqualFold(t, "upgrade"):
				case EqualFold(t, "close"):
					h.Close = true
				case EqualFold(t, "keep-alive"):
					if h.Minor == 0 {
						h.Close = false
					}
				default:
					named = true
				}
			}
		case FieldHopByHop:
			if len(name) == 10 && EqualFold(name, "keep-alive") {
				if secs, ok := keepAliveTimeout(v); ok {
					idle := KeepAliveIdle(secs)
					if idle == 0 {
						h.Close = true // kept for no time at all
					} else if h.IdleFor == 0 || idle < h.IdleFor {
						h.IdleFor = idle
					}
				}
			}
		case FieldOther:
			if len(name) == 4 && EqualFold(name, "date") {
				h.HasDate = true // kept: the server sends its own only without
			}
		}
		h.Fields = append(h.Fields, f)
	}
	switch {
	case h.Status == 101 && !upgrade:
		// RFC 9110 §15.2.2: a 101 says in Upgrade what it switches to;
		// a tunnel to a protocol nobody named is not one to open.
		return h, ErrRespSwitch
	case h.Encoded && (codings != 1 || !h.Chunked):
		// Another coding (gzip, chunked) would reach the client coded
		// with nothing to say so once this hop's Transfer-Encoding is
		// dropped; a body up to the close under one cannot be told
		// from a cut one (RFC 9112 §6.1).
		return h, ErrRespCoding
	case h.Encoded && h.Minor == 0:
		// RFC 9112 §6.1: Transfer-Encoding in HTTP/1.0 is faulty framing.
		return h, ErrRespCoding
	case h.Encoded && h.HasLength:
		// RFC 9112 §6.3: Transfer-Encoding overrides Content-Length, and
		// the connection cannot be trusted after.
		h.HasLength, h.Close = false, true
	}
	if named && dropConnectionNamed(raw, h.Fields) {
		h.HasDate = false // not passed on: the server sends its own
	}
	return h, nil
}

// KeepAliveIdle is how long a connection may wait idle in the pool after
// a response whose Keep-Alive field said timeout=secs (RFC 2068 §19.7.1.1,
// what Node.js, Apache and others send): a second short of it, or half a
// shorter one, so that the next request does not reach the upstream just
// as it closes the connection, which a request that is not retried (a
// POST, without an idempotency key) would get as a 502. (Node.js closes
// after 5 s; the pools keep a connection 60 s.)
func KeepAliveIdle(secs int64) time.Duration {
	d := time.Duration(secs) * time.Second
	return d - min(time.Second, d/2)
}

// keepAliveTimeout reads the timeout parameter of a Keep-Alive field's
// value ("timeout=5, max=100"): whole seconds, up to a day; ok is false
// without one.
func keepAliveTimeout(v []byte) (secs int64, ok bool) {
	for len(v) > 0 {
		var p []byte
		p, v = nextToken(v)
		name, val, found := bytes.Cut(p, []byte("="))
		if !found || !EqualFold(bytes.TrimRight(name, " \t"), "timeout") {
			continue
		}
		val = bytes.TrimLeft(val, " \t")
		if len(val) >= 2 && val[0] == '"' && val[len(val)-1] == '"' {
			val = val[1 : len(val)-1]
		}
		if len(val) == 0 || len(val) > 5 {
			return 0, false // 86400 has five digits
		}
		for _, c := range val {
			if !isDigit(c) {
				return 0, false
			}
			secs = secs*10 + int64(c-'0')
		}
		return min(secs, 86400), true
	}
	return 0, false
}

// dropConnectionNamed marks every field of raw a Connection field names,
// but close, keep-alive and upgrade, as not to be passed on, and reports
// whether a Date was one.
func dropConnectionNamed(raw []byte, fields []Field) (date bool) {
	var named NameSet
	for _, cf := range fields {
		if cf.Kind == FieldConnection {
			named.AddOptions(cf.Value.Of(raw))
		}
	}
	if named.Empty() {
		return false
	}
	for i := range fields {
		f := &fields[i]
		if name := f.Name.Of(raw); f.Kind != FieldConnection && f.Kind != FieldUpgrade && named.Has(name) {
			f.Kind = FieldDropped
			date = date || len(name) == 4 && EqualFold(name, "date")
		}
	}
	return date
}

// Passed reports whether field f goes on to the client
// (ResponseFieldPassed): not the hop-by-hop fields, the framing nor those
// Connection names.
func (h *ResponseHead) Passed(f *Field) bool { return ResponseFieldPassed(f.Kind, h.Status == 101) }

// Each calls f with every field line as the upstream sent it (it
// implements core.Header: the core keeps what it stores of them, and
// reads Date).
func (h *ResponseHead) Each(f func(name, value []byte)) {
	for i := range h.Fields {
		fl := &h.Fields[i]
		f(fl.Name.Of(h.Raw), fl.Value.Of(h.Raw))
	}
}

// Bodyless reports whether the response to a request (a HEAD request:
// head) has no body, whatever its fields say (RFC 9112 §6.3).
func Bodyless(status int, head bool) bool {
	return head || status < 200 || status == 204 || status == 304
}

// ParseLength parses a Content-Length value: 1 to 18 digits, nothing
// else (no sign, no space, no list).
func ParseLength(v []byte) (int64, bool) {
	if len(v) == 0 || len(v) > 18 {
		return 0, false
	}
	var n int64
	for _, c := range v {
		if !isDigit(c) {
			return 0, false
		}
		n = n*10 + int64(c-'0')
	}
	return n, true
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }
