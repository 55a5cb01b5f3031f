//go:build linux

package loop

import (
	"strconv"

	"github.com/preforkd/preforkd/core"
	"github.com/preforkd/preforkd/engine"
)

// The upstream's response on its way to the client: its head checked and
// told to the core (which may send a stale response instead), rewritten
// without the hop-by-hop fields, and its body passed on as it arrives —
// with its length, or chunked anew, or up to the close for an HTTP/1.0
// client — written with the head in one system call when they came in
// one read.

// onHead handles the response head in u.resp; rest is what followed it in
// the same read. It reports whether the body is to be relayed from u.
func (r *request) onHead(u *upConn, rest []byte) bool {
	h := &u.resp
	status := h.Status
	if status == 101 && !r.h.upgrade {
		u.headDone = false
		u.failed(engine.ErrRespUnasked)
		return false
	}
	if status == 101 && !engine.SwitchAsked(r.h.upgrades(), h.upgrades()) {
		u.headDone = false
		u.failed(engine.ErrRespSwitch)
		return false
	}
	if r.body.sink == sinkUpstream && !r.body.done {
		// An early answer (a 413, a 401) before the whole body was sent:
		// the rest is not sent, the connection not reused, and the
		// client's connection ends after the answer (its body is unread),
		// lingering: a reset would drop what the client has not yet read.
		r.body.sink = sinkNone
		u.out, u.outOff = u.out[:0], 0
		if r.c != nil {
			r.c.closeAfter, r.c.linger = true, true
		}
	}
	if replaced := r.ex.Head(status, h); replaced != nil {
		// stale-if-error, or the entry a 304 refreshed: the cache's
		// response goes instead; the upstream's body is not read, nor its
		// connection kept. Bytes already past a 304 are stray.
		if len(rest) > 0 && engine.Bodyless(status, r.h.isHead) {
			u.l.s.strayFound()
			r.ex.Stray()
		}
		u.close()
		r.up = nil
		r.respondCore(replaced)
		return false
	}
	r.keep = r.ex.Keep()
	u.keep = !h.Close && !r.h.isHead && r.body.done && r.body.err == nil
	u.idleFor = h.IdleFor
	switch {
	case status == 101:
		r.startTunnel(u, rest)
		return false
	case engine.Bodyless(status, r.h.isHead):
		// No body, whatever the head says (RFC 9112 §6.3). A connection
		// that answered HEAD is not reused (u.keep): applications that run
		// HEAD as GET write the body anyway, and it may come after the
		// head, past the check at reuse, as the answer to another request.
		u.mode, r.respMode = frameNone, frameNone
	case h.Chunked:
		u.mode = frameChunked
	case h.HasLength:
		u.mode, u.left = frameLength, h.Length
	default:
		u.mode = frameClose
		u.keep = false
	}
	if u.mode != frameNone {
		switch {
		case h.HasLength:
			r.respMode, r.respLeft = frameLength, h.Length
		case r.h.minor == 1:
			r.respMode = frameChunked
		default:
			// An HTTP/1.0 client cannot read chunks: the body ends with
			// the connection.
			r.respMode = frameClose
			if r.c != nil {
				r.c.closeAfter = true
			}
		}
	}
	r.phase = phRelay
	r.headSent = true
	r.responded(status)
	if c := r.c; c != nil {
		c.queue(r.composeHead(h))
	}
	return true
}

// composeHead makes the client's response head from the upstream's:
// without the hop-by-hop fields and those the core hides, its Date
// included (RFC 9110 §6.6.1: a cache serves the Date it stored).
func (r *request) composeHead(h *respHead) []byte {
	l := r.l
	var reason []byte
	if h.Reason.To > h.Reason.From {
		reason = h.Reason.Of(h.Raw)
	}
	dst := appendStatusLine(l.head[:0], h.Status, reason)
	hide := len(r.fwd.Hide) > 0
	for i := range h.Fields {
		if f := &h.Fields[i]; h.Passed(f) && !(hide && r.fwd.Hidden(b2s(f.Name.Of(h.Raw)))) {
			dst = append(dst, h.Raw[f.Name.From:f.Value.To]...)
			dst = append(dst, "\r\n"...)
		}
	}
	for _, f := range r.ex.Fields() {
		dst = engine.AppendField(dst, f.Name, f.Value)
	}
	if !h.HasDate {
		dst = append(dst, l.dateLine...) // the upstream's own, else now
	}
	switch {
	case r.respMode == frameLength:
		dst = append(dst, "Content-Length: "...)
		dst = strconv.AppendInt(dst, r.respLeft, 10)
		dst = append(dst, "\r\n"...)
	case r.respMode == frameChunked:
		dst = append(dst, "Transfer-Encoding: chunked\r\n"...)
	case r.respMode == frameNone && r.h.isHead && h.HasLength && h.Status != 204 && h.Status != 304:
		// HEAD: the length the body would have had. A 304 goes without,
		// as the other engines and the cache's own 304 send it.
		dst = append(dst, "Content-Length: "...)
		dst = strconv.AppendInt(dst, h.Length, 10)
		dst = append(dst, "\r\n"...)
	}
	if h.Status != 101 {
		dst = r.appendConnection(dst)
	} else {
		dst = engine.AppendField(dst, "Connection", engine.SwitchedConnection)
	}
	dst = append(dst, "\r\n"...)
	l.head = dst
	return dst
}

// interim passes the upstream's interim response h (102 Processing,
// 103 Early Hints) on to the client, as RFC 9110 §15.2 asks of a proxy:
// its status line and end-to-end fields. 100 is not (the server answers
// Expect itself), nor is any to an HTTP/1.0 client (§15.2). Each response
// is written out before the next request is read, so an interim one
// never overtakes the answer to a previous request.
func (r *request) interim(h *respHead) {
	c := r.c
	if c == nil || h.Status == 100 || r.h.minor == 0 || r.headSent {
		return
	}
	l := r.l
	dst := appendStatusLine(l.head[:0], h.Status, nil)
	hide := len(r.fwd.Hide) > 0
	for i := range h.Fields {
		// The end-to-end fields, but those the core hides from every
		// response (core.Forward.Hide: the reset header, ...).
		if f := &h.Fields[i]; f.Kind == engine.FieldOther && !(hide && r.fwd.Hidden(b2s(f.Name.Of(h.Raw)))) {
			dst = append(dst, h.Raw[f.Name.From:f.Value.To]...)
			dst = append(dst, "\r\n"...)
		}
	}
	dst = append(dst, "\r\n"...)
	l.head = dst
	c.write(dst)
}

// relayData passes a piece of the body on, and tells the core.
func (r *request) relayData(p []byte) {
	if len(p) == 0 {
		return
	}
	if r.ex != nil {
		r.ex.Body(p)
	}
	c := r.c
	if c == nil || r.discarded {
		return
	}
	if r.respMode == frameChunked {
		l := r.l
		from := len(l.head)
		l.head = appendChunkHead(l.head, len(p))
		c.queue(l.head[from:])
		c.queue(p)
		c.queue(crlf)
		return
	}
	c.queue(p)
}

// sendQueued writes what was queued for the client.
func (r *request) sendQueued() {
	if c := r.c; c != nil {
		c.send()
	}
}

// endBody ends the body for the client, and sends what is queued.
func (r *request) endBody() {
	if c := r.c; c != nil && !r.discarded && r.respMode == frameChunked {
		c.queue(lastChunkBytes)
	}
	r.sendQueued()
}

var lastChunkBytes = []byte(lastChunk)

var _ core.Header = (*respHead)(nil)
