//go:build linux

package loop

import (
	"bytes"
	"net/http"

	"github.com/preforkd/preforkd/route"
)

// The HTTP/1.1 request head (RFC 9112 §2-§3, §5-§6): the request line and
// the header section, checked as a reverse proxy must check what it
// forwards, and indexed once, so that the framing, the core's view and
// the head sent upstream all work from the same bytes.

// kind classifies a header field by its name.
type kind uint8

const (
	kindOther          kind = iota
	kindHost                // kept as sent, also sent as X-Forwarded-Host
	kindHopByHop            // never forwarded (RFC 9110 §7.6.1)
	kindConnection          // hop-by-hop, and names more hop-by-hop fields
	kindUpgrade             // hop-by-hop unless the request is upgraded
	kindLength              // Content-Length: the framing is sent anew
	kindEncoding            // Transfer-Encoding: likewise
	kindExpect              // answered here, never forwarded
	kindForwardedFor        // merged into the one X-Forwarded-For sent
	kindForwardedOther      // X-Forwarded-Proto/-Host: replaced
	kindDropped             // named by Connection, or a name with '_': never forwarded
)

// span is a piece of a head, as offsets into it.
type span struct{ from, to int32 }

func (s span) of(b []byte) []byte { return b[s.from:s.to] }

// field is one header line: its name and its value without the spaces
// around it.
type field struct {
	name, value span
	kind        kind
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
		if c := raw[line.from]; c == ' ' || c == '\t' {
			return errObsFold
		}
		colon := bytes.IndexByte(line.of(raw), ':')
		if colon < 0 {
			return errNoColon
		}
		f := field{name: span{line.from, line.from + int32(colon)}}
		name := f.name.of(raw)
		if !route.IsToken(b2s(name)) {
			return errName
		}
		f.value = trimOWS(raw, span{f.name.to + 1, line.to})
		if !fieldValueOK(f.value.of(raw)) {
			return errValue
		}
		f.kind = classify(name)
		if f.kind == kindOther && bytes.IndexByte(name, '_') >= 0 {
			// nginx's underscores_in_headers off: X_Forwarded_For would be
			// X-Forwarded-For to an application that maps '_' to '-' (CGI,
			// WSGI, Rack), past every rule that reads the real one.
			f.kind = kindDropped
		}
		v := f.value.of(raw)
		switch f.kind {
		case kindHost:
			h.hostFields++
			if !h.absolute {
				h.host = f.value
			}
		case kindLength:
			if h.hasLength {
				return errTwoLengths
			}
			n, ok := parseLength(v)
			if !ok {
				return errLength
			}
			h.hasLength, h.length = true, n
		case kindEncoding:
			hasEncoding = true
			if bad := h.encoding(v); bad != nil {
				return bad
			}
		case kindUpgrade:
			hasUpgrade = true
			eachToken(v, func(t []byte) { h2c = h2c || equalFold(t, "h2c") })
		case kindConnection:
			eachToken(v, func(t []byte) {
				switch {
				case equalFold(t, "upgrade"):
					upgradeToken = true
				case equalFold(t, "close"):
					h.close = true
				case equalFold(t, "keep-alive"):
					if h.minor == 0 {
						h.close = false
					}
				default:
					named = true
				}
			})
		case kindExpect:
			h.expect = h.expect || equalFold(v, "100-continue")
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
		if len(uri) < len(scheme) || !equalFold(uri[:len(scheme)], scheme) {
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
	eachToken(v, func(t []byte) {
		n++
		lastChunked = equalFold(t, "chunked")
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
		if cf.kind != kindConnection {
			continue
		}
		eachToken(cf.value.of(h.raw), func(t []byte) {
			for i := range h.fields {
				f := &h.fields[i]
				if f.kind == kindOther && bytes.EqualFold(f.name.of(h.raw), t) {
					f.kind = kindDropped
				}
			}
		})
	}
}

// hasBody reports whether a body follows the head.
func (h *head) hasBody() bool { return h.chunked || h.length > 0 }

// classify tells a header field's kind by its name.
func classify(name []byte) kind {
	switch len(name) {
	case 2:
		if equalFold(name, "te") {
			return kindHopByHop
		}
	case 4:
		if equalFold(name, "host") {
			return kindHost
		}
	case 6:
		if equalFold(name, "expect") {
			return kindExpect
		}
	case 7:
		switch {
		case equalFold(name, "upgrade"):
			return kindUpgrade
		case equalFold(name, "trailer"):
			return kindHopByHop
		}
	case 10:
		switch {
		case equalFold(name, "connection"):
			return kindConnection
		case equalFold(name, "keep-alive"):
			return kindHopByHop
		}
	case 14:
		if equalFold(name, "content-length") {
			return kindLength
		}
	case 15:
		if equalFold(name, "x-forwarded-for") {
			return kindForwardedFor
		}
	case 16:
		if equalFold(name, "x-forwarded-host") {
			return kindForwardedOther
		}
	case 17:
		switch {
		case equalFold(name, "transfer-encoding"):
			return kindEncoding
		case equalFold(name, "x-forwarded-proto"):
			return kindForwardedOther
		}
	}
	if len(name) > 6 && equalFold(name[:6], "proxy-") {
		return kindHopByHop // Proxy-Connection, Proxy-Authorization, ...
	}
	return kindOther
}

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

// fieldValueOK reports whether v has no control character but HTAB
// (RFC 9110 §5.5: CR, LF and NUL must be refused; the others are no
// better).
func fieldValueOK(v []byte) bool {
	for _, c := range v {
		if c < ' ' && c != '\t' || c == 0x7f {
			return false
		}
	}
	return true
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

// trimOWS trims spaces and tabs from both ends of raw[s].
func trimOWS(raw []byte, s span) span {
	for s.from < s.to && (raw[s.from] == ' ' || raw[s.from] == '\t') {
		s.from++
	}
	for s.to > s.from && (raw[s.to-1] == ' ' || raw[s.to-1] == '\t') {
		s.to--
	}
	return s
}

// eachToken calls f with each element of a comma-separated list, trimmed,
// skipping empty ones.
func eachToken(list []byte, f func([]byte)) {
	for len(list) > 0 {
		i := bytes.IndexByte(list, ',')
		var t []byte
		if i < 0 {
			t, list = list, nil
		} else {
			t, list = list[:i], list[i+1:]
		}
		t = bytes.Trim(t, " \t")
		if len(t) > 0 {
			f(t)
		}
	}
}

// equalFold reports whether b equals s in ASCII, ignoring case.
func equalFold(b []byte, s string) bool {
	if len(b) != len(s) {
		return false
	}
	for i := 0; i < len(s); i++ {
		x, y := b[i], s[i]
		if x != y && lower(x) != lower(y) {
			return false
		}
	}
	return true
}

func lower(c byte) byte {
	if 'A' <= c && c <= 'Z' {
		return c + 'a' - 'A'
	}
	return c
}
