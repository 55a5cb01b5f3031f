//go:build linux

package loop

import (
	"bytes"
	"net/http"

	"github.com/preforkd/preforkd/engine"
	"github.com/preforkd/preforkd/route"
)

// The HTTP/1.1 request head (RFC 9112 §2-§3, §5-§6): the request line and
// the header section, checked as a reverse proxy must check what it
// forwards, and indexed once, so that the framing, the core's view and
// the head sent upstream all work from the same bytes.

// span is a piece of a head, as offsets into it.
type span struct{ from, to int32 }

func (s span) of(b []byte) []byte { return b[s.from:s.to] }

// field is one header line: its name and its value without the spaces
// around it.
type field struct {
	name, value span
	kind        engine.FieldKind
}

// inlineFields is how many header lines are indexed without allocating.
const inlineFields = 40

// head is a parsed request head. Its spans index raw.
type head struct {
	raw    []byte // the request line and the header section, CRLF CRLF included
	fields []field
	inline [inlineFields]field
	headInfo
}

// upgrades is the request's Upgrade lines as one list.
func (h *head) upgrades() (list []byte) {
	for _, f := range h.fields {
		if f.kind == engine.FieldUpgrade {
			list = append(append(list, ','), f.value.of(h.raw)...)
		}
	}
	return list
}

// headInfo is what parsing a head found, apart from its fields.
type headInfo struct {
	method span
	target span // as sent
	path   span // the path as sent (an absolute-form target's, without its authority)
	query  span // without '?'
	host   span // Host, or the authority of an absolute-form target

	pathSlash  bool // an absolute-form target without a path: the path is "/"
	hasQuery   bool
	minor      byte // 1 for HTTP/1.1, 0 for HTTP/1.0
	absolute   bool // absolute-form target: Host is replaced by its authority
	asterisk   bool // OPTIONS *: answered here
	upgrade    bool // Connection: upgrade with an Upgrade field, HTTP/1.1, not h2c
	close      bool // the connection ends after this request
	expect     bool // Expect: 100-continue
	chunked    bool // Transfer-Encoding: chunked
	hasLength  bool // a Content-Length field
	isHead     bool // the method is HEAD
	hostFields int
	length     int64
}

// parseField checks the header line raw[l] (engine.ParseFieldLine) and
// indexes its name and value.
func parseField(raw []byte, l span) (field, engine.FieldFault) {
	fl, fault := engine.ParseFieldLine(l.of(raw))
	return field{
		name:  span{l.from, l.from + int32(fl.NameEnd)},
		value: span{l.from + int32(fl.ValueFrom), l.from + int32(fl.ValueTo)},
	}, fault
}

// scanHead looks for the end of a head in b, whose first from bytes were
// scanned before: it returns the length of the head (CRLF CRLF included),
// 0 when it is not whole yet, or engine.ErrBareLF for a line ended by a bare LF,
// refused at once (RFC 9112 §2.2) rather than left to wait for a CRLF
// CRLF that never comes.
func scanHead(b []byte, from int) (int, *engine.BadRequest) {
	for i := from; i < len(b); i++ {
		j := bytes.IndexByte(b[i:], '\n')
		if j < 0 {
			return 0, nil
		}
		i += j
		if i == 0 || b[i-1] != '\r' {
			return 0, engine.ErrBareLF
		}
		if i >= 3 && b[i-2] == '\n' && b[i-3] == '\r' {
			return i + 1, nil
		}
	}
	return 0, nil
}

// skipEmptyLines returns how many CRLFs lead b: a client may send one
// after a request's body (RFC 9112 §2.2), which is not a request.
func skipEmptyLines(b []byte) int {
	n := 0
	for len(b) >= n+2 && b[n] == '\r' && b[n+1] == '\n' {
		n += 2
	}
	return n
}

// parse indexes raw, a whole head (scanHead), and checks what a proxy
// must not forward. It does not allocate unless the head has more than
// inlineFields lines.
func (h *head) parse(raw []byte) *engine.BadRequest {
	h.raw, h.fields, h.headInfo = raw, h.inline[:0], headInfo{}
	end := bytes.IndexByte(raw, '\n') - 1 // the request line's CR
	if bad := h.parseLine(span{0, int32(end)}); bad != nil {
		return bad
	}
	emptyHost := false
	var framing engine.Framing
	var hops engine.Hops
	for pos := end + 2; pos < len(raw); {
		eol := pos + bytes.IndexByte(raw[pos:], '\n') - 1
		line := span{int32(pos), int32(eol)}
		pos = eol + 2
		if line.to == line.from {
			break // the blank line that ends the section
		}
		f, fault := parseField(raw, line)
		if fault != engine.FieldOK {
			return fault.BadRequest()
		}
		f.kind = engine.ClassifyRequestField(f.name.of(raw))
		v := f.value.of(raw)
		switch f.kind {
		case engine.FieldHost:
			h.hostFields++
			emptyHost = f.value.from == f.value.to
			if !h.absolute {
				h.host = f.value
			}
		case engine.FieldLength:
			if h.hasLength {
				return engine.ErrTwoLengths
			}
			n, ok := engine.ParseLength(v)
			if !ok {
				return engine.ErrLength
			}
			h.hasLength, h.length = true, n
			framing.Length()
		case engine.FieldEncoding:
			if bad := framing.Encoding(v); bad != nil {
				return bad
			}
		case engine.FieldUpgrade:
			hops.Upgrade(v)
		case engine.FieldConnection:
			hops.Connection(v)
		case engine.FieldExpect:
			h.expect = h.expect || engine.EqualFold(v, "100-continue")
		}
		h.fields = append(h.fields, f)
	}
	h.close = hops.Close(h.minor == 0)
	// An HTTP/1.0 client's expectation is ignored: it gets no 100
	// Continue, an interim response it does not know (RFC 9110 §10.1.1).
	h.expect = h.expect && h.minor == 1
	if bad := framing.Problem(h.minor == 0); bad != nil {
		return bad
	}
	h.chunked = framing.Chunked()
	switch {
	case h.hostFields > 1:
		return engine.ErrTwoHosts
	case (h.hostFields == 0 || emptyHost) && h.minor == 1:
		// RFC 9112 §3.2, absolute-form too; an http URI has a host
		// (RFC 9110 §4.2.1), so an empty Host is none.
		return engine.ErrNoHost
	}
	if hops.Named() {
		h.dropConnectionNamed()
	}
	h.upgrade = hops.Upgrades(h.minor == 0)
	return nil
}

// parseLine checks the request line raw[l] and indexes its target.
func (h *head) parseLine(l span) *engine.BadRequest {
	line := l.of(h.raw)
	sp := bytes.IndexByte(line, ' ')
	if sp <= 0 {
		return engine.ErrLine
	}
	h.method = span{l.from, l.from + int32(sp)}
	rest := line[sp+1:]
	sp2 := bytes.IndexByte(rest, ' ')
	if sp2 <= 0 {
		return engine.ErrLine
	}
	h.target = span{h.method.to + 1, h.method.to + 1 + int32(sp2)}
	version := rest[sp2+1:]
	method := h.method.of(h.raw)
	if !route.IsToken(b2s(method)) {
		return engine.ErrLine
	}
	switch string(method) {
	case "PRI":
		return engine.ErrPRI
	case "CONNECT":
		return engine.ErrConnect
	case "HEAD":
		h.isHead = true
	}
	switch {
	case len(version) != 8 || string(version[:5]) != "HTTP/" || version[6] != '.' ||
		!isDigit(version[5]) || !isDigit(version[7]):
		return engine.ErrLine
	case version[5] != '1' || version[7] > '1':
		return engine.ErrVersion
	}
	h.minor = version[7] - '0'
	for _, c := range h.target.of(h.raw) {
		if c <= ' ' || c == 0x7f {
			return engine.ErrLine
		}
	}
	return h.parseTarget()
}

// parseTarget splits the request target into path and query: an
// origin-form target, an absolute-form one (its authority is the host,
// RFC 9112 §3.2.2), or OPTIONS's asterisk-form.
func (h *head) parseTarget() *engine.BadRequest {
	t := h.target
	uri := t.of(h.raw)
	switch {
	case len(uri) == 1 && uri[0] == '*':
		if string(h.method.of(h.raw)) != http.MethodOptions {
			return engine.ErrLine
		}
		h.asterisk = true
		return nil
	case uri[0] != '/':
		const scheme = "http://"
		if len(uri) < len(scheme) || !engine.EqualFold(uri[:len(scheme)], scheme) {
			return engine.ErrTarget
		}
		from := t.from + int32(len(scheme))
		rest := h.raw[from:t.to]
		i := bytes.IndexAny(rest, "/?")
		if i < 0 {
			i = len(rest)
		}
		if i == 0 {
			return engine.ErrTarget
		}
		h.host, h.absolute = span{from, from + int32(i)}, true
		t = span{from + int32(i), t.to}
		if t.from == t.to || h.raw[t.from] == '?' {
			h.pathSlash = true // the path is "/"
		}
	}
	if bytes.IndexByte(t.of(h.raw), '#') >= 0 {
		return engine.ErrTarget
	}
	h.path = t
	if q := bytes.IndexByte(t.of(h.raw), '?'); q >= 0 {
		h.path = span{t.from, t.from + int32(q)}
		h.query = span{t.from + int32(q) + 1, t.to}
		h.hasQuery = true
	}
	return nil
}

// dropConnectionNamed marks the fields named by Connection as hop-by-hop
// (RFC 9110 §7.6.1), except those whose kind already decides their fate.
func (h *head) dropConnectionNamed() {
	var named engine.NameSet
	for _, cf := range h.fields {
		if cf.kind == engine.FieldConnection {
			named.AddOptions(cf.value.of(h.raw))
		}
	}
	if named.Empty() {
		return
	}
	for i := range h.fields {
		f := &h.fields[i]
		if f.kind == engine.FieldOther && named.Has(f.name.of(h.raw)) {
			f.kind = engine.FieldDropped
		}
	}
}

// ownHost reports whether the server writes the Host the upstream gets:
// for an absolute-form target (its authority), or a request without a
// Host value (the upstream's authority); the client's Host lines are
// then not sent.
func (h *head) ownHost() bool { return h.absolute || h.host.from == h.host.to }

// hasBody reports whether a body follows the head.
func (h *head) hasBody() bool { return h.chunked || h.length > 0 }

func isDigit(c byte) bool { return '0' <= c && c <= '9' }
