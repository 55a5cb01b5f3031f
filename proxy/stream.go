package proxy

import (
	"errors"
	"io"
	"sync"

	"github.com/preforkd/preforkd/core"
	"github.com/preforkd/preforkd/engine"
	"github.com/preforkd/preforkd/internal/upconn"
)

// upBody is an upstream response body as fasthttp copies it to the client:
// every Read returns what one read of the upstream brought, so that each
// piece goes out as it came (fasthttp flushes a chunked body at every
// Read; a body with a Content-Length is flushed whenever its write buffer
// fills). fasthttp calls CloseWithError once the body was written, or the
// client failed.
type upBody struct {
	s        *Server
	uc       *upconn.Conn
	reusable bool // the connection may serve another request after the body
	ex       *core.Exchange
	req      *request // recycled with the body; nil for a background refresh

	left       int64 // bytes left of a body of known length
	chunked    bool
	chunks     engine.ChunkedReader // a chunked body's decoder
	untilClose bool                 // the body ends when the upstream closes
	eof        bool                 // the body was read to its end
	err        error
	failed     error // why the response was not whole, once ended
}

var bodyPool2 = sync.Pool{New: func() any { return new(upBody) }}

// Read implements io.Reader.
func (b *upBody) Read(p []byte) (int, error) {
	if b.eof {
		return 0, io.EOF
	}
	if b.err != nil {
		return 0, b.err
	}
	n, err := b.read(p)
	if n > 0 {
		b.ex.Body(p[:n])
	}
	switch {
	case err == io.EOF:
		b.eof = true
	case err != nil:
		b.err = err
		b.s.count.UpstreamAborts.Add(1)
		b.s.opts.Core.UpstreamFailed(core.UpstreamBroken, b.s.up.Target.Addr, err)
	}
	return n, err
}

func (b *upBody) read(p []byte) (int, error) {
	br := b.uc.Buf
	switch {
	case b.untilClose:
		n, err := br.Read(p)
		return n, err
	case !b.chunked:
		if b.left == 0 {
			return 0, io.EOF
		}
		if int64(len(p)) > b.left {
			p = p[:b.left]
		}
		n, err := br.Read(p)
		b.left -= int64(n)
		if err == io.EOF {
			return n, io.ErrUnexpectedEOF
		}
		if err == nil && b.left == 0 {
			err = io.EOF
		}
		return n, err
	}
	return b.chunks.Read(p)
}

// CloseWithError ends the body: the connection goes back to the pool if
// the body was read to its end, and the exchange ends. A response the
// core keeps is read to its end even when the client went away (werr):
// the client's retry (or the cache) will be answered with it.
func (b *upBody) CloseWithError(werr error) error {
	if werr != nil && b.ex.Keep() && !b.eof && b.err == nil {
		b.drain()
	}
	b.end()
	if b.req != nil {
		b.s.finish(b.req, b.ex, b.failed)
		b.s.recycle(b.req)
	}
	*b = upBody{}
	bodyPool2.Put(b)
	return nil
}

// copyBufPool holds the buffers of the copies the engine makes itself:
// a streamed body to the client (conn.ReadFrom, sendUntilClose), a body
// read and dropped.
var copyBufPool = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

// drain reads the rest of the body, telling the core, while the core
// keeps it (a cache fill over max_body it keeps no more).
func (b *upBody) drain() {
	bp := copyBufPool.Get().(*[]byte)
	for b.err == nil && !b.eof && b.ex.Keep() {
		_, _ = b.Read(*bp)
	}
	copyBufPool.Put(bp)
}

// end gives the connection back when the body was read to its end, or
// closes it, and notes in b.failed whether the response was whole.
func (b *upBody) end() {
	b.s.up.Relayed(b.uc)
	if b.eof {
		b.failed = b.s.upDone(b.uc, b.reusable)
	} else {
		b.uc.Conn.Close()
		b.failed = errIncomplete
	}
}

var errIncomplete = errors.New("proxy: the response did not reach its end")

// isTimeout reports whether err is a timeout (a deadline that passed;
// fasthttp's own timeout errors are not net.Errors).
func isTimeout(err error) bool {
	var te interface{ Timeout() bool }
	return errors.As(err, &te) && te.Timeout()
}

// cacheBody is a large cached body (core.BodyStream) as fasthttp copies
// it to the client: a piece at a time, each read from the region as the
// one before was written, so that a client that reads slowly holds a
// piece of it, not the whole. A body cut off (the entry changed) fails
// the copy, and fasthttp closes the connection: the client's body is
// short of its Content-Length, never wrong.
type cacheBody struct {
	s   *Server
	req *request
	ex  *core.Exchange
	st  core.BodyStream
	p   []byte // what is left of the piece
	err error
}

// sendStream has the body of the core's answer st sent after the handler
// returns; the exchange ends, and the request is recycled, once it was.
func (s *Server) sendStream(r *request, ex *core.Exchange, st core.BodyStream) {
	b := &cacheBody{s: s, req: r, ex: ex, st: st}
	r.ctx.Response.SetBodyStream(b, st.Len())
	r.streaming = true
}

// Read implements io.Reader.
func (b *cacheBody) Read(p []byte) (int, error) {
	for len(b.p) == 0 {
		if b.err != nil {
			return 0, b.err
		}
		b.p, b.err = b.st.Next()
	}
	n := copy(p, b.p)
	b.p = b.p[n:]
	return n, nil
}

// CloseWithError ends the exchange once the body was written, cut, or
// the client failed (werr).
func (b *cacheBody) CloseWithError(werr error) error {
	err := werr
	if b.err != nil && b.err != io.EOF {
		err = b.err
	}
	b.s.finish(b.req, b.ex, err)
	b.s.recycle(b.req)
	*b = cacheBody{}
	return nil
}
