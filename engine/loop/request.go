//go:build linux

package loop

import (
	"net/netip"
	"sync/atomic"
	"unsafe"

	"github.com/preforkd/preforkd/core"
	"github.com/preforkd/preforkd/engine"
)

// request is one request from its head to its end, pooled per loop. It is
// the core.Request the core decides over.
type request struct {
	c   *conn // nil for a background refresh
	l   *loop
	h   head
	buf []byte // the head's bytes: h.raw aliases it

	ex      *core.Exchange
	verdict core.Verdict // what a waiter decided
	fwd     core.Forward
	peer    netip.Addr
	phase   phase
	// waiting: the request is with a waiter (or a refresh is under way)
	// and must not be recycled by the loop meanwhile.
	waiting bool
	gone    atomic.Bool // the client went away (Gone, read by a waiter)
	begun   bool        // an exchange began: it counts the response
	refresh bool        // a background refresh: no client
	counted bool        // the response was counted (OnResponse)

	body bodyIn

	// The upstream side.
	up       *upConn
	sent     []byte // the head sent upstream (in buf's memory, after the client's head, when it fits)
	streamed bool   // the body streams after sent
	retried  bool

	// The response to the client.
	status    int
	respMode  uint8 // how the response body is framed for the client
	respLeft  int64 // bytes of a length-framed response body left
	headSent  bool  // the response head went to the client
	keep      bool  // the core keeps the response: it is read to its end whatever the client does
	discarded bool  // the client went away: the response is read, not sent
	// stream is the core's answer's body while it is sent a piece at a
	// time (phStream): a large cached body.
	stream core.BodyStream
}

// phase is where a request stands.
type phase uint8

const (
	phHead      phase = iota // DecideHead
	phCoreBody               // the body is read for the core
	phDecide                 // Decide
	phAppBody                // the body is read for the application
	phReadAhead              // the body is read before anything is sent upstream
	phUpstream               // sent upstream, the response awaited
	phRelay                  // the response is relayed
	phTunnel                 // upgraded
	phStream                 // the core's answer's body is sent as the client takes it
	phDone
)

// How a response body is framed for the client.
const (
	frameNone    uint8 = iota // no body
	frameLength               // Content-Length
	frameChunked              // chunked, made here
	frameClose                // up to the close of the connection
)

func (l *loop) getRequest(c *conn) *request {
	var r *request
	if n := len(l.requests); n > 0 {
		r = l.requests[n-1]
		l.requests = l.requests[:n-1]
	} else {
		r = &request{l: l}
	}
	r.c = c
	return r
}

// recycle puts r back once nothing refers to it: its exchange ended.
func (l *loop) recycle(r *request) {
	if r.buf != nil {
		l.putBuf(r.buf)
	}
	r.body.release(l)
	r.c, r.ex, r.up = nil, nil, nil
	r.buf, r.sent = nil, nil
	// All of the head: a refusal before a head was parsed (conn.refuse)
	// answers on a request from the pool, as to a GET.
	r.h.raw, r.h.fields, r.h.headInfo = nil, nil, headInfo{}
	r.fwd, r.peer, r.verdict = core.Forward{}, netip.Addr{}, 0
	r.phase, r.waiting, r.begun, r.counted = 0, false, false, false
	r.gone.Store(false)
	r.streamed, r.retried = false, false
	r.status, r.respMode, r.respLeft = 0, 0, 0
	r.headSent, r.keep, r.discarded = false, false, false
	r.stream = nil
	if len(l.requests) < 1024 {
		l.requests = append(l.requests, r)
	}
}

// The core sees the request as the upstream will get it
// (engine.RequestFieldSeen, engine.ForwardedField).

// sentAs reports whether f is a field called name that the upstream gets
// as the client sent it.
func (r *request) sentAs(f *field, name string) bool {
	h := &r.h
	return int(f.name.to-f.name.from) == len(name) && engine.EqualFold(f.name.of(h.raw), name) &&
		engine.RequestFieldSeen(f.kind, h.ownHost(), h.upgrade)
}

// forwarded returns the value this server sends for a field it writes
// itself, whatever the client sent.
func (r *request) forwarded(name string) (string, bool) {
	v, ok := engine.ForwardedField(s2b(name), r.h.host.of(r.h.raw))
	return b2s(v), ok
}

// Header implements core.Request.
func (r *request) Header(name string) (first string, lines int) {
	if v, ok := r.forwarded(name); ok {
		return v, 1
	}
	for i := range r.h.fields {
		if f := &r.h.fields[i]; r.sentAs(f, name) {
			if lines == 0 {
				first = b2s(f.value.of(r.h.raw))
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
	for i := range r.h.fields {
		if f := &r.h.fields[i]; r.sentAs(f, name) {
			dst = append(dst, b2s(f.value.of(r.h.raw)))
		}
	}
	return dst
}

// Method implements core.Request.
func (r *request) Method() string { return b2s(r.h.method.of(r.h.raw)) }

// Path implements core.Request.
func (r *request) Path() string {
	if r.h.pathSlash {
		return "/"
	}
	return b2s(r.h.path.of(r.h.raw))
}

// Target implements core.RequestTarget, for the access log: the target
// as sent.
func (r *request) Target() string { return b2s(r.h.target.of(r.h.raw)) }

// Query implements core.Request.
func (r *request) Query() string { return b2s(r.h.query.of(r.h.raw)) }

// Peer implements core.Request.
func (r *request) Peer() netip.Addr { return r.peer }

// HasBody implements core.Request.
func (r *request) HasBody() bool { return r.h.hasBody() }

// Gone implements core.Request: the client closed its connection.
func (r *request) Gone() bool { return r.gone.Load() }

// Body implements core.Request: the body read before Decide
// (core.Exchange.WantsBody), or its failure.
func (r *request) Body(max int64) ([]byte, error) {
	b := &r.body
	switch {
	case b.err != nil:
		return nil, b.err
	case int64(len(b.buf)) > max:
		return nil, core.ErrBodyTooLarge
	case !b.done:
		return nil, core.ErrBodyTooLarge // read up to max+1 and stopped there
	}
	return b.buf, nil
}

// Proto implements core.Protocol, for the access log.
func (r *request) Proto() string {
	if r.h.minor == 0 {
		return "HTTP/1.0"
	}
	return "HTTP/1.1"
}

var _ core.Request = (*request)(nil)

// appendHead appends the request head the upstream gets: the request line
// with the forward path, the client's header lines as sent but the
// hop-by-hop ones and those the core drops, X-Forwarded-For/-Proto/-Host,
// the fields the core adds, and the body's framing.
func (r *request) appendHead(dst []byte, t *engine.Target) []byte {
	h := &r.h
	raw := h.raw
	dst = append(dst, h.method.of(raw)...)
	dst = append(dst, ' ')
	dst = append(dst, t.Prefix...)
	dst = append(dst, r.fwd.Path...)
	if h.hasQuery {
		dst = append(dst, '?')
		dst = append(dst, h.query.of(raw)...)
	}
	dst = append(dst, " HTTP/1.1\r\n"...)
	ownHost := h.ownHost()
	if ownHost {
		host := h.host.of(raw)
		if len(host) == 0 {
			host = s2b(t.Authority) // none, or empty: HTTP/1.1 needs one
		}
		dst = engine.AppendField(dst, "Host", host)
	}
	for i := range h.fields {
		f := &h.fields[i]
		switch f.kind {
		case engine.FieldOther:
			if (len(r.fwd.Drop) > 0 || len(r.fwd.Add) > 0) && r.fwd.Dropped(b2s(f.name.of(raw))) {
				continue
			}
		case engine.FieldHost:
			if ownHost {
				continue
			}
		case engine.FieldUpgrade:
			if !h.upgrade {
				continue
			}
		default:
			continue
		}
		dst = append(dst, raw[f.name.from:f.value.to]...)
		dst = append(dst, "\r\n"...)
	}
	xff := engine.BeginForwardedFor(dst)
	for i := range h.fields {
		if f := &h.fields[i]; f.kind == engine.FieldForwardedFor {
			xff.Add(b2s(f.value.of(raw)))
		}
	}
	dst = xff.End(r.Peer())
	dst = engine.AppendField(dst, "X-Forwarded-Proto", "http")
	if hh := h.host.of(raw); len(hh) > 0 {
		dst = engine.AppendField(dst, "X-Forwarded-Host", hh)
	}
	for i := range r.fwd.Add {
		dst = engine.AppendField(dst, r.fwd.Add[i].Name, r.fwd.Add[i].Value)
	}
	if h.upgrade {
		dst = append(dst, "Connection: Upgrade\r\n"...)
	}
	switch b := &r.body; {
	case b.done && !r.streamed:
		if n := len(b.buf); n > 0 || h.hasLength || h.chunked {
			dst = engine.AppendLength(dst, int64(n))
		}
	case b.mode == bodyLength:
		dst = engine.AppendLength(dst, h.length)
	default:
		dst = append(dst, "Transfer-Encoding: chunked\r\n"...)
	}
	return append(dst, "\r\n"...)
}

// retryable reports whether the request may be sent again after a stale
// upstream connection (engine.Retryable).
func (r *request) retryable() bool {
	_, n := r.Header("Idempotency-Key")
	return engine.Retryable(r.Method(), n > 0)
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
