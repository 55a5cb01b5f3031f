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

// badRequest is why a request cannot be served, before anything is
// forwarded; closeConn when its framing cannot be trusted (RFC 9112 §6.3:
// the connection must close after the answer).
type badRequest struct {
	status    int
	detail    string
	closeConn bool
}

var (
	errObsFold     = &badRequest{400, "obsolete line folding in the header section", true}
	errCLTE        = &badRequest{400, "both Content-Length and Transfer-Encoding", true}
	errNoColon     = &badRequest{400, "a header line without a colon", true}
	errName        = &badRequest{400, "a header field name that is not a token", true}
	errValue       = &badRequest{400, "a control character in a header field value", true}
	errBareLF      = &badRequest{400, "a header line ended by a bare LF", true}
	errLine        = &badRequest{400, "a malformed request line", true}
	errTarget      = &badRequest{400, "the request target is not an absolute path", false}
	errPRI         = &badRequest{400, "PRI is the HTTP/2 connection preface, not a request", true}
	errConnect     = &badRequest{405, "CONNECT is not supported", true}
	errVersion     = &badRequest{505, "only HTTP/1.0 and HTTP/1.1 are supported", true}
	errLength      = &badRequest{400, "a malformed Content-Length", true}
	errTwoLengths  = &badRequest{400, "more than one Content-Length", true}
	errEncoding    = &badRequest{400, "a Transfer-Encoding whose last coding is not chunked", true}
	errCoding      = &badRequest{501, "a transfer coding other than chunked", true}
	errEncoding10  = &badRequest{400, "Transfer-Encoding in an HTTP/1.0 request", true}
	errTwoHosts    = &badRequest{400, "more than one Host", true}
	errTooLarge    = &badRequest{431, "the request header section is too large", true}
	errHeadTimeout = &badRequest{408, "the request header did not arrive in time", true}
	errBodyTimeout = &badRequest{408, "the request body did not arrive in time", true}
	errBodyEnded   = &badRequest{400, "the request body ended early", true}
	errBadChunk    = &badRequest{400, "malformed chunked request body", true}
	errBodyTooLong = &badRequest{413, "the request body is too large", true}
	errUpgradeBody = &badRequest{400, "an upgrade request with a long body", true}
)

// fieldFaults are the answers to the header lines engine.ParseFieldLine
// finds at fault.
var fieldFaults = [...]*badRequest{
	engine.FaultObsFold:   errObsFold,
	engine.FaultNoColon:   errNoColon,
	engine.FaultName:      errName,
	engine.FaultValueCtrl: errValue,
}

func (b *badRequest) Error() string { return "loop: " + b.detail }

// scanHead looks for the end of a head in b, whose first from bytes were
// scanned before: it returns the length of the head (CRLF CRLF included),
// 0 when it is not whole yet, or errBareLF for a line ended by a bare LF,
// refused at once (RFC 9112 §2.2) rather than left to wait for a CRLF
// CRLF that never comes.
func scanHead(b []byte, from int) (int, *badRequest) {
	for i := from; i < len(b); i++ {
		j := bytes.IndexByte(b[i:], '\n')
		if j < 0 {
			return 0, nil
		}
		i += j
		if i == 0 || b[i-1] != '\r' {
			return 0, errBareLF
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
func (h *head) parse(raw []byte) *badRequest {
	h.raw, h.fields, h.headInfo = raw, h.inline[:0], headInfo{}
	end := bytes.IndexByte(raw, '\n') - 1 // the request line's CR
	if bad := h.parseLine(span{0, int32(end)}); bad != nil {
		return bad
	}
	upgradeToken, hasUpgrade, h2c, named := false, false, false, false
	hasEncoding := false
	for pos := end + 2; pos < len(raw); {
		eol := pos + bytes.IndexByte(raw[pos:], '\n') - 1
		line := span{int32(pos), int32(eol)}
		pos = eol + 2
		if line.to == line.from {
			break // the blank line that ends the section
		}
		f, fault := parseField(raw, line)
		if fault != engine.FieldOK {
			return fieldFaults[fault]
		}
		f.kind = engine.ClassifyRequestField(f.name.of(raw))
		v := f.value.of(raw)
		switch f.kind {
		case engine.FieldHost:
			h.hostFields++
			if !h.absolute {
				h.host = f.value
			}
		case engine.FieldLength:
			if h.hasLength {
				return errTwoLengths
			}
			n, ok := parseLength(v)
			if !ok {
				return errLength
			}
			h.hasLength, h.length = true, n
		case engine.FieldEncoding:
			hasEncoding = true
			if bad := h.encoding(v); bad != nil {
				return bad
			}
		case engine.FieldUpgrade:
			hasUpgrade = true
			engine.EachToken(v, func(t []byte) { h2c = h2c || engine.EqualFold(t, "h2c") })
		case engine.FieldConnection:
			engine.EachToken(v, func(t []byte) {
				switch {
				case engine.EqualFold(t, "upgrade"):
					upgradeToken = true
				case engine.EqualFold(t, "close"):
					h.close = true
				case engine.EqualFold(t, "keep-alive"):
					if h.minor == 0 {
						h.close = false
					}
				default:
					named = true
				}
			})
		case engine.FieldExpect:
			h.expect = h.expect || engine.EqualFold(v, "100-continue")
		}
		h.fields = append(h.fields, f)
	}
	switch {
	case h.hasLength && hasEncoding:
		return errCLTE
	case hasEncoding && h.minor == 0:
		return errEncoding10
	case hasEncoding && !h.chunked:
		return errEncoding
	case h.hostFields > 1:
		return errTwoHosts
	}
	if named {
		h.dropConnectionNamed()
	}
	// An upgrade to h2c is never tunnelled: HTTP/2 spoken straight to
	// the upstream would pass every later request by the core. The
	// request goes on without it, as HTTP/1.1.
	h.upgrade = upgradeToken && hasUpgrade && !h2c && h.minor == 1
	return nil
}

// parseLine checks the request line raw[l] and indexes its target.
func (h *head) parseLine(l span) *badRequest {
	line := l.of(h.raw)
	sp := bytes.IndexByte(line, ' ')
	if sp <= 0 {
		return errLine
	}
	h.method = span{l.from, l.from + int32(sp)}
	rest := line[sp+1:]
	sp2 := bytes.IndexByte(rest, ' ')
	if sp2 <= 0 {
		return errLine
	}
	h.target = span{h.method.to + 1, h.method.to + 1 + int32(sp2)}
	version := rest[sp2+1:]
	method := h.method.of(h.raw)
	if !route.IsToken(b2s(method)) {
		return errLine
	}
	switch string(method) {
	case "PRI":
		return errPRI
	case "CONNECT":
		return errConnect
	case "HEAD":
		h.isHead = true
	}
	switch {
	case len(version) != 8 || string(version[:5]) != "HTTP/" || version[6] != '.' ||
		!isDigit(version[5]) || !isDigit(version[7]):
		return errLine
	case version[5] != '1' || version[7] > '1':
		return errVersion
	}
	h.minor = version[7] - '0'
	h.close = h.minor == 0 // HTTP/1.0 keeps its connection only when it asks
	for _, c := range h.target.of(h.raw) {
		if c <= ' ' || c == 0x7f {
			return errLine
		}
	}
	return h.parseTarget()
}

// parseTarget splits the request target into path and query: an
// origin-form target, an absolute-form one (its authority is the host,
// RFC 9112 §3.2.2), or OPTIONS's asterisk-form.
func (h *head) parseTarget() *badRequest {
	t := h.target
	uri := t.of(h.raw)
	switch {
	case len(uri) == 1 && uri[0] == '*':
		if string(h.method.of(h.raw)) != http.MethodOptions {
			return errLine
		}
		h.asterisk = true
		return nil
	case uri[0] != '/':
		const scheme = "http://"
		if len(uri) < len(scheme) || !engine.EqualFold(uri[:len(scheme)], scheme) {
			return errTarget
		}
		from := t.from + int32(len(scheme))
		rest := h.raw[from:t.to]
		i := bytes.IndexAny(rest, "/?")
		if i < 0 {
			i = len(rest)
		}
		if i == 0 {
			return errTarget
		}
		h.host, h.absolute = span{from, from + int32(i)}, true
		t = span{from + int32(i), t.to}
		if t.from == t.to || h.raw[t.from] == '?' {
			h.pathSlash = true // the path is "/"
		}
	}
	if bytes.IndexByte(t.of(h.raw), '#') >= 0 {
		return errTarget
	}
	h.path = t
	if q := bytes.IndexByte(t.of(h.raw), '?'); q >= 0 {
		h.path = span{t.from, t.from + int32(q)}
		h.query = span{t.from + int32(q) + 1, t.to}
		h.hasQuery = true
	}
	return nil
}

// encoding reads a Transfer-Encoding field value: chunked is the one
// coding known here (RFC 9112 §6.1), and it must be the last, once.
func (h *head) encoding(v []byte) *badRequest {
	n, lastChunked := 0, false
	engine.EachToken(v, func(t []byte) {
		n++
		lastChunked = engine.EqualFold(t, "chunked")
	})
	switch {
	case n == 0, h.chunked, !lastChunked:
		return errEncoding // the body's length cannot be known
	case n > 1:
		return errCoding // another coding under chunked
	}
	h.chunked = true
	return nil
}

// dropConnectionNamed marks the fields named by Connection as hop-by-hop
// (RFC 9110 §7.6.1), except those whose kind already decides their fate.
func (h *head) dropConnectionNamed() {
	for _, cf := range h.fields {
		if cf.kind != engine.FieldConnection {
			continue
		}
		engine.EachToken(cf.value.of(h.raw), func(t []byte) {
			for i := range h.fields {
				f := &h.fields[i]
				if f.kind == engine.FieldOther && bytes.EqualFold(f.name.of(h.raw), t) {
					f.kind = engine.FieldDropped
				}
			}
		})
	}
}

// ownHost reports whether the server writes the Host the upstream gets:
// for an absolute-form target (its authority), or a request without a
// Host value (the upstream's authority); the client's Host lines are
// then not sent.
func (h *head) ownHost() bool { return h.absolute || h.host.from == h.host.to }

// hasBody reports whether a body follows the head.
func (h *head) hasBody() bool { return h.chunked || h.length > 0 }

// parseLength reads a Content-Length value: digits only, no sign, no
// list, at most 18 of them.
func parseLength(v []byte) (int64, bool) {
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
