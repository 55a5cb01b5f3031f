package proxy

import (
	"bytes"
	"errors"
	"net/netip"
	"unsafe"

	"github.com/valyala/fasthttp"

	"github.com/preforkd/preforkd/core"
	"github.com/preforkd/preforkd/engine"
)

// The request as the server reads it: the request line and the raw header
// section as they came off the wire (fasthttp keeps a copy), indexed once
// so that the framing checks, the core's header lookups and the forwarded
// header section all work from the same bytes.

// field is one header line: its name and its value (without the spaces
// around it), as offsets into the raw header section.
type field struct {
	name, value span
	kind        engine.FieldKind
}

type span struct{ from, to int32 }

// inlineFields is how many header lines are indexed without allocating.
const inlineFields = 48

// request is the server's state for one request, pooled. It is the
// core.Request the decision core sees.
type request struct {
	s   *Server
	ctx *fasthttp.RequestCtx
	c   *conn

	// readsAtStart is c.reads when the handler began (interim.go);
	// interimBuf holds an interim response being written.
	readsAtStart uint64
	interimBuf   []byte

	raw    []byte // the raw header section (fasthttp's copy)
	fields []field
	inline [inlineFields]field

	method []byte
	path   []byte // the path as sent (the authority dropped from an absolute-form target)
	query  []byte // without '?'; nil when there is none
	host   []byte // Host, or the authority of an absolute-form target
	// target is a copy of the target as sent, made only when an
	// application's request gets the forwarded path in its place in
	// fasthttp's (runApp); empty otherwise, and fasthttp's is the target.
	target []byte
	// fwd is how the request is forwarded (the core's Forward): the path,
	// and the client's fields left out.
	fwd core.Forward

	upgrade bool // Connection: upgrade with an Upgrade field
	// upgradeClose: HTTP/1.1 with an Upgrade field and close among its
	// Connection options, whose close headerReceived took from fasthttp
	// (so that a 101 can tunnel): done puts it back for any other answer.
	upgradeClose bool
	absolute     bool // absolute-form target: Host is replaced by its authority
	hasLength    bool // the client sent a Content-Length
	// begun: an exchange was begun for the request, and counts its
	// response; a request refused before one is counted by done.
	begun bool
	// ex is the exchange expect began, until serve takes it.
	ex *core.Exchange
	// streaming: the response body streams once the handler returned;
	// the request is recycled when it ends (upBody.CloseWithError).
	streaming bool
	// gone: the client reset its connection before its response began,
	// and is sent nothing (bodyFailed).
	gone bool

	body body // the request body as read so far
	// up is the upstream's response header, copied to the client's once
	// it is whole.
	up fasthttp.ResponseHeader

	// head is the request head sent upstream; scratch is for short-lived
	// values (the forward path).
	head    []byte
	scratch []byte
}

// parse indexes the request's header section and target and checks what
// fasthttp let through that a proxy must not forward. It does not
// allocate unless the request has more than inlineFields header lines, or
// an absolute-form target without a path (its scratch buffer, kept with
// the pooled request, grows once).
func (r *request) parse() *engine.BadRequest {
	h := &r.ctx.Request.Header
	r.raw = h.RawHeaders()
	r.method = h.Method()
	if p := h.Protocol(); !bytes.Equal(p, strHTTP11) && !bytes.Equal(p, strHTTP10) {
		return engine.ErrVersion
	}
	r.fields = r.inline[:0]
	var framing engine.Framing
	var hops engine.Hops
	hasLength, hosts := false, 0
	for pos := 0; pos < len(r.raw); {
		end := bytes.IndexByte(r.raw[pos:], '\n')
		if end < 0 {
			end = len(r.raw)
		} else {
			end += pos
		}
		line := span{int32(pos), int32(end)}
		pos = end + 1
		if line.to > line.from && r.raw[line.to-1] == '\r' {
			line.to--
		} else if int(line.to) < len(r.raw) {
			return engine.ErrBareLF // a line ended by "\n" alone (RFC 9112 §2.2)
		}
		if line.to == line.from {
			break // the blank line that ends the section
		}
		fl, fault := engine.ParseFieldLine(r.raw[line.from:line.to])
		if fault != engine.FieldOK {
			return fault.BadRequest()
		}
		f := field{
			name:  span{line.from, line.from + int32(fl.NameEnd)},
			value: span{line.from + int32(fl.ValueFrom), line.from + int32(fl.ValueTo)},
		}
		f.kind = engine.ClassifyRequestField(r.raw[f.name.from:f.name.to])
		switch f.kind {
		case engine.FieldHost:
			r.host = r.raw[f.value.from:f.value.to]
			hosts++
		case engine.FieldLength:
			framing.Length()
			hasLength = true
		case engine.FieldEncoding:
			// fasthttp frames a body it does not know the coding of
			// (Transfer-Encoding: identity) as none, and would read it
			// as the next request: the engines refuse alike.
			if bad := framing.Encoding(r.raw[f.value.from:f.value.to]); bad != nil {
				return bad
			}
		case engine.FieldUpgrade:
			hops.Upgrade(r.raw[f.value.from:f.value.to])
		case engine.FieldConnection:
			hops.Connection(r.raw[f.value.from:f.value.to])
		}
		r.fields = append(r.fields, f)
	}
	http10 := !h.IsHTTP11()
	r.upgradeClose = hops.UpgradeClose(http10)
	if bad := framing.Problem(http10); bad != nil {
		return bad
	}
	if hosts == 0 && !http10 {
		return engine.ErrNoHost // RFC 9112 §3.2, absolute-form too
	}
	r.hasLength = hasLength
	if hops.Named() {
		r.dropConnectionNamed()
	}
	r.upgrade = hops.Upgrades(http10)
	return r.parseTarget()
}

// parseTarget splits the request target into path and query, and refuses
// the targets and methods a reverse proxy does not forward.
func (r *request) parseTarget() *engine.BadRequest {
	switch string(r.method) {
	case "CONNECT":
		return engine.ErrConnect
	case "PRI":
		return engine.ErrPRI
	}
	uri := r.ctx.Request.Header.RequestURI()
	if len(uri) > 0 && uri[0] != '/' {
		// absolute-form: the server must use its authority (RFC 9112
		// §3.2.2). Only http is spoken here.
		rest, ok := cutSchemeHTTP(uri)
		if !ok {
			return engine.ErrTarget
		}
		i := bytes.IndexAny(rest, "/?")
		if i < 0 {
			i = len(rest)
		}
		if i == 0 {
			return engine.ErrTarget
		}
		r.host, r.absolute = rest[:i], true
		uri = rest[i:]
		if len(uri) == 0 || uri[0] == '?' {
			uri = append(r.scratch[:0], '/')
			uri = append(uri, rest[i:]...)
			r.scratch = uri
		}
	}
	if len(uri) == 0 || bytes.IndexByte(uri, '#') >= 0 {
		return engine.ErrTarget
	}
	r.path, r.query = uri, nil
	if q := bytes.IndexByte(uri, '?'); q >= 0 {
		r.path, r.query = uri[:q], uri[q+1:]
	}
	return nil
}

// dropConnectionNamed marks the fields named by Connection as hop-by-hop
// (RFC 9110 §7.6.1), except those whose kind already decides their fate.
func (r *request) dropConnectionNamed() {
	var named engine.NameSet
	for _, cf := range r.fields {
		if cf.kind == engine.FieldConnection {
			named.AddOptions(r.raw[cf.value.from:cf.value.to])
		}
	}
	if named.Empty() {
		return
	}
	for i := range r.fields {
		f := &r.fields[i]
		if f.kind == engine.FieldOther && named.Has(r.raw[f.name.from:f.name.to]) {
			f.kind = engine.FieldDropped
		}
	}
}

// The core sees the request as the upstream will get it
// (engine.RequestFieldSeen, engine.ForwardedField).

// sentAs reports whether f is a field called name that the upstream gets
// as the client sent it.
func (r *request) sentAs(f *field, name string) bool {
	return int(f.name.to-f.name.from) == len(name) && engine.EqualFold(r.raw[f.name.from:f.name.to], name) &&
		engine.RequestFieldSeen(f.kind, r.ownHost(), r.upgrade)
}

// ownHost reports whether the server writes the Host the upstream gets:
// for an absolute-form target (its authority), or a request without a
// Host value (the upstream's authority); the client's Host lines are
// then not sent.
func (r *request) ownHost() bool { return r.absolute || len(r.host) == 0 }

// forwarded returns the value this server sends for a field it writes
// itself, whatever the client sent.
func (r *request) forwarded(name string) (string, bool) {
	v, ok := engine.ForwardedField(s2b(name), r.host)
	return b2s(v), ok
}

// Header implements core.Request.
func (r *request) Header(name string) (first string, lines int) {
	if v, ok := r.forwarded(name); ok {
		return v, 1
	}
	for i := range r.fields {
		if f := &r.fields[i]; r.sentAs(f, name) {
			if lines == 0 {
				first = b2s(r.raw[f.value.from:f.value.to])
			}
			lines++
		}
	}
	return first, lines
}

// HeaderLines implements core.Request.
func (r *request) HeaderLines(name string, dst []string) []string {
	if v, ok := r.forwarded(name); ok {
		return append(dst, v)
	}
	for i := range r.fields {
		if f := &r.fields[i]; r.sentAs(f, name) {
			dst = append(dst, b2s(r.raw[f.value.from:f.value.to]))
		}
	}
	return dst
}

// Method implements core.Request.
func (r *request) Method() string { return b2s(r.method) }

// Path implements core.Request.
func (r *request) Path() string { return b2s(r.path) }

// Query implements core.Request.
func (r *request) Query() string { return b2s(r.query) }

// Target implements core.RequestTarget, for the access log: the target
// as sent.
func (r *request) Target() string {
	if len(r.target) > 0 {
		return b2s(r.target)
	}
	return b2s(r.ctx.Request.Header.RequestURI())
}

// Peer implements core.Request.
func (r *request) Peer() netip.Addr { return r.c.peer }

// Proto implements core.Protocol, for the access log.
func (r *request) Proto() string {
	if r.ctx.Request.Header.IsHTTP11() {
		return "HTTP/1.1"
	}
	return "HTTP/1.0"
}

// HasBody implements core.Request: a length other than 0, or chunked
// (-1; -2 is fasthttp's "until close", which a request does not have).
func (r *request) HasBody() bool {
	n := r.ctx.Request.Header.ContentLength()
	return n > 0 || n == -1
}

// Gone implements core.Request: fasthttp cannot tell while a handler
// runs, and the core's waits are bounded anyway.
func (r *request) Gone() bool { return false }

// Body implements core.Request: the whole body, read into memory.
func (r *request) Body(max int64) ([]byte, error) {
	b, err := r.body.readAll(r, max)
	if isGone(err) {
		err = errors.Join(core.ErrClientGone, err)
	}
	return b, err
}

var _ core.Request = (*request)(nil)

// appendHead appends the request head the upstream gets: the request line
// with the forward path, the client's header lines as sent but the
// hop-by-hop ones and those the core drops, the fields the core adds,
// X-Forwarded-For/-Proto/-Host, and the body's framing.
func (r *request) appendHead(dst []byte) []byte {
	dst = append(dst, r.method...)
	dst = append(dst, ' ')
	dst = append(dst, r.s.up.Target.Prefix...)
	dst = append(dst, r.fwd.Path...)
	if r.query != nil {
		dst = append(dst, '?')
		dst = append(dst, r.query...)
	}
	dst = append(dst, " HTTP/1.1\r\n"...)
	ownHost := r.ownHost()
	if ownHost {
		host := r.host
		if len(host) == 0 {
			host = []byte(r.s.up.Target.Authority) // HTTP/1.0 without Host, or with an empty one: HTTP/1.1 needs one
		}
		dst = engine.AppendField(dst, "Host", host)
	}
	for _, f := range r.fields {
		switch f.kind {
		case engine.FieldOther:
			if (len(r.fwd.Drop) > 0 || len(r.fwd.Add) > 0) && r.fwd.Dropped(b2s(r.raw[f.name.from:f.name.to])) {
				continue
			}
		case engine.FieldHost:
			if ownHost {
				continue
			}
		case engine.FieldUpgrade:
			if !r.upgrade {
				continue
			}
		default:
			continue
		}
		dst = append(dst, r.raw[f.name.from:f.value.to]...)
		dst = append(dst, "\r\n"...)
	}
	// The core's own fields: the request id it made, a cache's validators.
	for _, f := range r.fwd.Add {
		dst = engine.AppendField(dst, f.Name, f.Value)
	}
	xff := engine.BeginForwardedFor(dst)
	for _, f := range r.fields {
		if f.kind == engine.FieldForwardedFor {
			xff.Add(b2s(r.raw[f.value.from:f.value.to]))
		}
	}
	dst = xff.End(r.c.peer)
	dst = engine.AppendField(dst, "X-Forwarded-Proto", "http")
	if len(r.host) > 0 {
		dst = engine.AppendField(dst, "X-Forwarded-Host", r.host)
	}
	if r.upgrade {
		dst = append(dst, "Connection: Upgrade\r\n"...)
	}
	switch b := &r.body; {
	case b.done:
		if n := len(b.bytes()); n > 0 || r.hasLength || b.length < 0 {
			dst = engine.AppendLength(dst, int64(n))
		}
	case b.length >= 0:
		dst = engine.AppendLength(dst, b.length)
	default:
		dst = append(dst, "Transfer-Encoding: chunked\r\n"...)
	}
	return append(dst, "\r\n"...)
}

var (
	strHTTP11 = []byte("HTTP/1.1")
	strHTTP10 = []byte("HTTP/1.0")
)

// cutSchemeHTTP returns what follows "http://" (in any case) in uri.
func cutSchemeHTTP(uri []byte) ([]byte, bool) {
	const scheme = "http://"
	if len(uri) < len(scheme) || !engine.EqualFold(uri[:len(scheme)], scheme) {
		return nil, false
	}
	return uri[len(scheme):], true
}

// s2b returns s as bytes without copying, for reading only.
func s2b(s string) []byte { return unsafe.Slice(unsafe.StringData(s), len(s)) }

// b2s returns b as a string without copying: for the core, which uses
// what the request returns only while it decides.
func b2s(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	return unsafe.String(&b[0], len(b))
}
