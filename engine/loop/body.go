//go:build linux

package loop

import "github.com/preforkd/preforkd/engine"

// A request body as the client sends it: bytes are taken from what the
// connection read (in place), decoded (length or chunked), and handed to
// where the request needs them — kept in memory (for the core's
// fingerprint, the application, or the read-ahead before forwarding),
// written upstream as they come, or dropped. While nobody takes them,
// they wait in the connection's input, and a connection whose input is
// full is not read: the client's TCP window closes. That is the
// back-pressure of an upload.

// readAheadBytes is how much of a body is read before anything is sent
// upstream. A body that ends within it (most do) is checked whole — a
// bad chunk is answered 400 and the upstream never hears of the request
// — and sent with a Content-Length on a connection that may be retried;
// a slow client holds no upstream connection while it sends it. A longer
// body streams, and a bad chunk past this point aborts the upstream
// connection, so it never sees a whole request.
const readAheadBytes = 64 << 10

// maxAppBody bounds a body read for an in-process application.
const maxAppBody = 1 << 20

// Body framings.
const (
	bodyNone uint8 = iota
	bodyLength
	bodyChunked
)

// Where body bytes go.
const (
	sinkNone     uint8 = iota // nowhere yet: they wait in the input
	sinkKeep                  // into buf, up to limit
	sinkUpstream              // written upstream
	sinkDiscard               // dropped
)

type bodyIn struct {
	mode  uint8
	sink  uint8
	done  bool               // the body ended
	err   *engine.BadRequest // it cannot be read (the connection closes after)
	left  int64              // bytes of a length-framed body left
	dec   chunkDecoder
	limit int    // sinkKeep stops taking once buf holds this many
	buf   []byte // what sinkKeep took
	// expect: 100 Continue is owed before the body is read.
	expect bool
}

// start sets the body up from the request's head.
func (b *bodyIn) start(h *head) {
	*b = bodyIn{buf: b.buf[:0]}
	switch {
	case h.chunked:
		b.mode = bodyChunked
	case h.length > 0:
		b.mode, b.left = bodyLength, h.length
	default:
		b.done = true
	}
	b.expect = h.expect && !b.done
}

func (b *bodyIn) release(l *loop) {
	if cap(b.buf) > 0 {
		l.putBuf(b.buf)
	}
	*b = bodyIn{}
}

// taking reports whether bytes of the body are wanted now.
func (b *bodyIn) taking() bool {
	return !b.done && b.err == nil && b.sink != sinkNone && !(b.sink == sinkKeep && len(b.buf) >= b.limit)
}

// upstreamFull reports whether the body goes upstream and highWater of it
// waits there to be written: no more is taken until that drains.
func (r *request) upstreamFull() bool {
	return r.body.sink == sinkUpstream && r.up != nil && r.up.backlog() >= highWater
}

// feedBody takes what it can of the body from p and returns how many
// bytes of p it took; what follows the body is left.
func (r *request) feedBody(p []byte) int {
	b := &r.body
	n := 0
	for n < len(p) && b.taking() {
		var data []byte
		var k int
		switch b.mode {
		case bodyLength:
			k = int(min(b.left, int64(len(p)-n)))
			if b.sink == sinkKeep {
				k = min(k, b.limit-len(b.buf))
			}
			data = p[n : n+k]
			b.left -= int64(k)
			b.done = b.left == 0
		case bodyChunked:
			var err error
			data, k, b.done, err = b.dec.decode(p[n:])
			if err != nil {
				b.err = engine.ErrBadChunk
			}
		}
		n += k
		if len(data) > 0 {
			switch b.sink {
			case sinkKeep:
				b.buf = r.l.grow(b.buf, data)
			case sinkUpstream:
				r.up.queueBody(data, b.mode == bodyChunked)
			}
		}
		if b.err != nil {
			break
		}
		if r.upstreamFull() {
			break // the upstream takes its time: so does the client
		}
	}
	if r.up != nil && b.sink == sinkUpstream {
		if b.done && b.err == nil && b.mode == bodyChunked {
			r.up.queueRaw(lastChunkBytes)
		}
		r.up.flush()
	}
	return n
}
