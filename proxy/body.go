package proxy

import (
	"errors"
	"io"
	"net"
	"sync"

	"github.com/preforkd/preforkd/core"
	"github.com/preforkd/preforkd/engine"
)

// readAheadBytes is how much of a request body is read before anything is
// sent upstream. A body that ends within it (most do) is checked whole —
// a bad chunk is answered 400 and the upstream never hears of the request
// — and sent with a Content-Length on a connection that may be retried;
// a slow client holds no upstream connection while it sends it. A longer
// body streams: the upstream gets it as it arrives, and a bad chunk past
// this point aborts the upstream connection, so it never sees a complete
// request.
const readAheadBytes = 64 << 10

// maxPooledBody is the largest body buffer kept for reuse.
const maxPooledBody = 1 << 20

var bodyPool = sync.Pool{New: func() any { b := make([]byte, 0, 4<<10); return &b }}

// body is what the server has read of a request body.
type body struct {
	stream io.Reader // fasthttp's body stream; nil when there is no body
	length int64     // Content-Length; -1 for chunked
	buf    *[]byte   // what was read, from bodyPool; nil before any read
	done   bool      // buf holds the whole body
	err    error     // reading it failed
}

// reset prepares b for the request r.
func (b *body) reset(r *request) {
	b.release()
	*b = body{length: int64(r.ctx.Request.Header.ContentLength())}
	switch {
	case b.length == 0 || b.length < -1:
		b.length, b.done = 0, true
	default:
		b.stream = r.ctx.RequestBodyStream()
		if b.stream == nil {
			b.length, b.done = 0, true
		}
	}
}

// release gives the buffer back.
func (b *body) release() {
	if b.buf != nil {
		if cap(*b.buf) <= maxPooledBody {
			*b.buf = (*b.buf)[:0]
			bodyPool.Put(b.buf)
		}
		b.buf = nil
	}
}

// bytes is what was read so far.
func (b *body) bytes() []byte {
	if b.buf == nil {
		return nil
	}
	return *b.buf
}

// readAhead reads until the body ends or limit bytes are held.
func (b *body) readAhead(r *request, limit int) error {
	if b.done || b.err != nil {
		return b.err
	}
	if b.buf == nil {
		b.buf = bodyPool.Get().(*[]byte)
	}
	r.c.bodyTimeout = r.s.opts.ClientBodyTimeout
	buf := *b.buf
	for len(buf) < limit {
		if cap(buf)-len(buf) < 512 {
			// Grow to what a known length needs, at most the limit.
			want := min(2*cap(buf)+4<<10, limit)
			if b.length > 0 {
				want = min(max(want, int(b.length)), limit)
			}
			grown := make([]byte, len(buf), want)
			copy(grown, buf)
			buf = grown
		}
		n, err := b.stream.Read(buf[len(buf):min(cap(buf), limit)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			b.done = true
			break
		}
		if err != nil {
			b.err = err
			break
		}
	}
	*b.buf = buf
	if b.done && b.length >= 0 && int64(len(buf)) != b.length {
		b.err = io.ErrUnexpectedEOF
	}
	return b.err
}

// readAll is core.Request.Body: the whole body, at most max bytes.
func (b *body) readAll(r *request, max int64) ([]byte, error) {
	if b.length > max {
		return nil, core.ErrBodyTooLarge
	}
	limit := int(min(max, int64(maxInt)-1)) + 1
	if err := b.readAhead(r, limit); err != nil {
		return nil, err
	}
	if !b.done {
		return nil, core.ErrBodyTooLarge
	}
	return b.bytes(), nil
}

const maxInt = int(^uint(0) >> 1)

// bodyProblem is the answer to a request whose body could not be read.
func bodyProblem(err error) *engine.BadRequest {
	switch {
	case isTimeout(err):
		return engine.ErrBodyTimeout
	case errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, io.EOF), errors.Is(err, net.ErrClosed), isConnReset(err):
		return engine.ErrBodyEnded
	default:
		return engine.ErrBadChunk
	}
}
