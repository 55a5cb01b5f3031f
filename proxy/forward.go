package proxy

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/preforkd/preforkd/core"
	"github.com/preforkd/preforkd/engine"
	"github.com/preforkd/preforkd/internal/upconn"
)

// forward sends r upstream and makes the upstream's response the answer.
func (s *Server) forward(r *request, ex *core.Exchange) {
	ctx := r.ctx
	if err := r.body.readAhead(r, readAheadBytes); err != nil {
		s.bodyFailed(r, ex, err)
		return
	}
	if r.upgrade && !r.body.done {
		s.refuseAfter(r, ex, engine.ErrUpgradeBody)
		return
	}
	ex.Sending()
	r.head = r.appendHead(r.head[:0])
	streamed := !r.body.done
	if !streamed {
		r.head = append(r.head, r.body.bytes()...)
	}
	up := &r.up
	var uc *upconn.Conn
	for attempt := 0; ; attempt++ {
		var err error
		if r.upgrade || attempt > 0 {
			// A tunnel will not come back to the pool; a retry goes on a
			// new connection, not on the next idle one, which the same
			// idle close may have met.
			uc, err = s.up.Dial(context.Background())
		} else {
			uc, err = s.up.Get(context.Background())
		}
		if err == nil {
			err = uc.AwaitHead()
		}
		if err == nil {
			if streamed {
				err = s.exchangeStreamed(r, uc)
			} else {
				_, err = uc.Write(r.head)
				if err == nil {
					err = readResponseHead(uc, up, interimTo(r))
				}
			}
			uc.HeadRead()
		}
		if err == nil {
			break
		}
		if uc != nil {
			uc.Conn.Close()
		}
		var be *engine.BodyReadError
		switch {
		case errors.As(err, &be):
			s.bodyFailed(r, ex, be.Err)
		case attempt == 0 && uc != nil && uc.Reused && !uc.Got() && !streamed && r.retryable() && staleConn(err):
			// The upstream had closed the idle connection: nothing was
			// done with the request, which goes on a new one.
			continue
		default:
			s.respond(ctx, ex.Failed(s.upstreamFailed(err), s.up.Target.Addr, err))
			s.finish(r, ex, nil)
		}
		return
	}
	s.relay(r, ex, uc)
}

// refuseAfter answers a request that passed the core with a problem of
// the server's own, when its body cannot be read.
func (s *Server) refuseAfter(r *request, ex *core.Exchange, b *engine.BadRequest) {
	s.count.BadRequests.Add(1)
	s.respond(r.ctx, ex.Refuse(b.Status, b.Detail, b.CloseConn))
	s.finish(r, ex, nil)
}

// bodyFailed ends the exchange of a request whose body could not be
// read. A client that reset its connection went away before its response
// began: it is sent nothing, and the core counts and logs 499
// (core.ErrClientGone), as on the other engines; a 400 nobody was sent
// would count among client errors. So is one the drain cut at its
// deadline (the read sees the connection closed). Any other failure (a
// FIN short of the body, a timeout, a bad chunk) is answered with the
// body's problem: a client that only closed its sending side may still
// read it.
func (s *Server) bodyFailed(r *request, ex *core.Exchange, err error) {
	if !isGone(err) {
		s.refuseAfter(r, ex, bodyProblem(err))
		return
	}
	s.clientGone(r, ex)
}

// clientGone ends the exchange of a request whose client went away
// before its response began: nothing is sent, and the core counts 499.
func (s *Server) clientGone(r *request, ex *core.Exchange) {
	r.gone = true
	r.c.mute = true // fasthttp writes a response once the handler returns
	r.ctx.SetConnectionClose()
	s.finish(r, ex, core.ErrClientGone)
}

// relay makes the upstream response read into r.up the answer, and streams
// its body from uc unless it is already read.
func (s *Server) relay(r *request, ex *core.Exchange, uc *upconn.Conn) {
	ctx, up := r.ctx, &r.up
	status := up.StatusCode()
	if status == http.StatusSwitchingProtocols && (!r.upgrade || !switchAsked(r, up)) {
		uc.Conn.Close()
		s.count.UpstreamErrors.Add(1)
		err := engine.ErrRespUnasked
		if r.upgrade {
			err = engine.ErrRespSwitch
		}
		s.respond(ctx, ex.Failed(core.UpstreamResponse, s.up.Target.Addr, err))
		s.finish(r, ex, nil)
		return
	}
	if replaced := ex.Head(status, (*upHeader)(up)); replaced != nil {
		// stale-if-error, or the entry a 304 refreshed: the cache's
		// response goes instead; the upstream's body is not read, nor its
		// connection kept. Bytes already past a 304 are stray.
		if engine.Bodyless(status, r.ctx.IsHead()) && s.upDone(uc, false) != nil {
			ex.Stray()
		}
		uc.Conn.Close()
		s.respond(ctx, replaced)
		s.finish(r, ex, nil)
		return
	}
	resp := &ctx.Response
	reusable := !up.ConnectionClose()
	length := up.ContentLength()
	copyResponseHeader(&resp.Header, up, status == http.StatusSwitchingProtocols, r.fwd.Hide)
	setFields(resp, ex.Fields())

	if status == http.StatusSwitchingProtocols {
		// fasthttp writes the 101 after the handler returns, then hands
		// over the client connection: its bytes are read through the
		// hijacked connection, which holds what fasthttp read past the
		// request; deadlines, writes and closing go to the conn itself,
		// whose Close does the bookkeeping (fasthttp's own Close of a
		// hijacked connection does nothing).
		// Whatever the upstream's head said of reusing the connection,
		// it is the tunnel's now: fasthttp skips the hijack of a
		// response that says close, which would send the client a 101
		// and then close under it (and leave the upstream's open).
		resp.Header.ResetConnectionClose()
		resp.Header.Set("Connection", engine.SwitchedConnection)
		// fasthttp runs the tunnel only once the 101 is written: until
		// then the client's connection holds the upstream's, and closes
		// it if it closes first (the 101 could not be sent).
		c := r.c
		c.switch101(uc.Conn)
		r.ctx.Hijack(func(client net.Conn) {
			c.switch101(nil)
			engine.Tunnel(c, client, uc.Conn, uc.Buf, s.opts.Client.Timeout, s.opts.SendTimeout)
		})
		s.finish(r, ex, nil)
		return
	}
	if engine.Bodyless(status, r.ctx.IsHead()) {
		// No body, whatever the header says (RFC 9112 §6.3). A connection
		// that answered HEAD is not reused: applications that run HEAD as
		// GET write the body anyway, and it may come after the head, past
		// the check at reuse (get), as the answer to another request.
		if r.ctx.IsHead() {
			reusable = false
		}
		if length >= 0 {
			resp.Header.SetContentLength(length)
		}
		s.finish(r, ex, s.upDone(uc, reusable))
		return
	}
	if length >= 0 && length <= uc.Buf.Buffered() {
		// The whole body is here: one write to the client, and the
		// connection is free for another request at once.
		b, _ := uc.Buf.Peek(length)
		resp.SetBody(b)
		ex.Body(b)
		_, _ = uc.Buf.Discard(length)
		s.finish(r, ex, s.upDone(uc, reusable))
		return
	}
	ub := bodyPool2.Get().(*upBody)
	*ub = upBody{s: s, uc: uc, reusable: reusable, ex: ex, req: r}
	s.up.Relaying(uc)
	r.streaming = true
	switch {
	case length >= 0:
		ub.left = int64(length)
	case length == -1:
		ub.chunked = true
		ub.chunks.Reset(uc.Buf)
	default:
		ub.untilClose, ub.reusable = true, false
	}
	if length < 0 && !ctx.Request.Header.IsHTTP11() {
		s.sendUntilClose(r, ub)
		return
	}
	if length < 0 {
		length = -1
	}
	// The head goes out before the body is read: a body the upstream cuts
	// short then ends the connection after the head and what came of the
	// body, as nginx does, rather than before anything reached the client.
	resp.ImmediateHeaderFlush = true
	resp.SetBodyStream(ub, length)
}

// switchAsked reports whether the 101 in up switches only to protocols
// r asked for (engine.SwitchAsked).
func switchAsked(r *request, up *fasthttp.ResponseHeader) bool {
	var asked, switched []byte
	for _, v := range r.HeaderLines("Upgrade", nil) {
		asked = append(append(asked, ','), v...)
	}
	for _, v := range up.PeekAll("Upgrade") {
		switched = append(append(switched, ','), v...)
	}
	return engine.SwitchAsked(asked, switched)
}

// upHeader is the upstream's response header as the core reads it.
type upHeader fasthttp.ResponseHeader

func (h *upHeader) Each(f func(name, value []byte)) {
	for k, v := range (*fasthttp.ResponseHeader)(h).All() {
		f(k, v)
	}
}

// finish ends the exchange of r (core.Exchange.Finish): err is nil when
// the response reached its end. A stale response the cache served is then
// refreshed in the background.
func (s *Server) finish(r *request, ex *core.Exchange, err error) {
	if ex.Finish(err) {
		s.refresh(r, ex)
	}
}

// sendUntilClose sends a response of unknown length to an HTTP/1.0
// client, which cannot read chunks: its end is the connection's close.
// fasthttp cannot frame a response so, so the connection is taken over
// once the handler returns.
func (s *Server) sendUntilClose(r *request, ub *upBody) {
	h := &r.ctx.Response.Header
	h.SetContentLength(-2)
	h.SetConnectionClose()
	head := h.AppendBytes(nil)
	c := r.c
	r.ctx.HijackSetNoResponse(true)
	r.ctx.Hijack(func(hc net.Conn) {
		_, err := hc.Write(head)
		bp := copyBufPool.Get().(*[]byte)
		for err == nil {
			var n int
			n, err = ub.Read(*bp)
			if n > 0 {
				if _, werr := hc.Write((*bp)[:n]); werr != nil {
					err = werr
				}
			}
		}
		copyBufPool.Put(bp)
		if err == io.EOF {
			err = nil
		}
		ub.CloseWithError(err)
		c.Close()
	})
}

// upDone puts a connection whose response was read back in the pool. It
// returns engine.ErrRespStray when the upstream sent more than the
// response: what it sent cannot be trusted, and is not stored, and the
// core counts it as a response failure, as every engine does (the
// client, which has the whole response, keeps it).
func (s *Server) upDone(uc *upconn.Conn, reusable bool) error {
	if !s.up.Done(uc, reusable, time.Now()) {
		s.opts.Core.UpstreamFailed(core.UpstreamResponse, s.up.Target.Addr, engine.ErrRespStray)
		return engine.ErrRespStray
	}
	return nil
}

// readResponseHead reads the final response's header section into h,
// giving interim (1xx) responses but 101 to to, when not nil, as
// they come: engine.MaxInterims of them, and one more is
// engine.ErrRespInterims, not given first. Each head is checked first by the rules every engine applies
// (engine.ResponseHead): one with a line ended by a bare LF, or a status
// outside 100-599, is refused at once (502), where fasthttp would wait for
// a CRLF CRLF that never comes, or take "099" for an interim response and
// wait for the next, until UpstreamTimeout. Where those rules say the
// connection ends after the response (a Transfer-Encoding with a
// Content-Length, which fasthttp takes and keeps the connection for), h
// says Connection: close; where the upstream's Keep-Alive bounds the
// connection's idle time, uc's IdleFor says so.
func readResponseHead(uc *upconn.Conn, h *fasthttp.ResponseHeader, to interimSink) error {
	br := uc.Buf
	// What the upstream did not send is not sent: no default Content-Type.
	h.SetNoDefaultContentType(true)
	for interims := 0; ; interims++ {
		closes, idleFor, coding, err := checkHead(br)
		if err != nil {
			return err
		}
		if err := h.Read(br); err != nil {
			return err
		}
		uc.IdleFor = idleFor
		if closes {
			h.SetConnectionClose()
		}
		if coding != nil {
			h.SetContentEncodingBytes(coding)
		}
		if st := h.StatusCode(); st >= 200 || st == http.StatusSwitchingProtocols {
			return nil
		}
		if interims == engine.MaxInterims {
			return engine.ErrRespInterims // refused, not passed on first
		}
		if to != nil {
			to.interim(h)
		}
	}
}

// checkHead waits until br holds a whole header section, or as much as it
// can hold, and refuses one with a line ended by a bare LF or that
// engine.ResponseHead refuses; closes and idleFor are the head's Close
// and IdleFor. coding is the
// head's codings as one list when they come in several Content-Encoding
// lines (RFC 9110 §8.4), else nil: fasthttp keeps the last line alone,
// and a body whose first coding is lost cannot be decoded.
func checkHead(br *bufio.Reader) (closes bool, idleFor time.Duration, coding []byte, err error) {
	for want := 1; ; {
		b, err := br.Peek(want)
		if len(b) < want {
			return false, 0, nil, err // fasthttp's read reports it
		}
		b, _ = br.Peek(br.Buffered())
		for i, c := range b {
			if c != '\n' {
				continue
			}
			if i == 0 || b[i-1] != '\r' {
				return false, 0, nil, engine.ErrRespBareLF
			}
			if i >= 3 && b[i-2] == '\n' && b[i-3] == '\r' {
				// CRLF CRLF: the section is whole.
				var fields [32]engine.Field
				h, err := engine.ParseResponseHead(b[:i+1], fields[:0])
				if err == nil && h.Minor > 1 {
					// A higher minor version is HTTP/1.1 (RFC 9112
					// §2.3), as the other engines read it; fasthttp
					// takes it for HTTP/1.0, drops its
					// Transfer-Encoding and closes. Its status line
					// is rewritten where fasthttp reads it, in br's
					// buffer: the client gets a status line of the
					// server's own.
					b[7] = '1'
				}
				return h.Close, h.IdleFor, codings(&h), err
			}
		}
		if len(b) == br.Size() {
			return false, 0, nil, nil // too large: fasthttp's read says so
		}
		want = len(b) + 1
	}
}

// codings is h's Content-Encoding lines joined in one list (a copy), when
// there are several; nil otherwise.
func codings(h *engine.ResponseHead) []byte {
	var list []byte
	n := 0
	for i := range h.Fields {
		f := &h.Fields[i]
		if !bytes.EqualFold(f.Name.Of(h.Raw), []byte("Content-Encoding")) {
			continue
		}
		if n++; n > 1 {
			list = append(list, ", "...)
		}
		list = append(list, f.Value.Of(h.Raw)...)
	}
	if n < 2 {
		return nil
	}
	return list
}

// staleConn reports whether err is what a request sent on a connection the
// upstream had just closed meets: nothing came back.
func staleConn(err error) bool {
	return errors.Is(err, io.EOF) || isConnReset(err)
}

// retryable reports whether the request may be sent again after a stale
// upstream connection (engine.Retryable).
func (r *request) retryable() bool {
	_, n := r.Header("Idempotency-Key")
	return engine.Retryable(r.method, n > 0)
}

// upstreamFailed counts a request the upstream gave no response to in the
// server's own statistics and says what kind of failure it was.
func (s *Server) upstreamFailed(err error) core.UpstreamError {
	var de *upconn.DialError
	switch {
	case errors.As(err, &de):
		s.count.UpstreamErrors.Add(1)
		return core.UpstreamConnect
	case isTimeout(err):
		s.count.UpstreamTimeouts.Add(1)
		return core.UpstreamTimeout
	}
	s.count.UpstreamErrors.Add(1)
	return core.UpstreamResponse
}

// exchangeStreamed sends the head and a body too long to read ahead, and
// reads the response head meanwhile: an upstream may answer before it has
// the whole body (a 413, a 401). Then the rest of the body is not sent,
// and the connection is not reused.
func (s *Server) exchangeStreamed(r *request, uc *upconn.Conn) error {
	stopped := false
	reuse, err := engine.SendWhileReading(uc.Conn,
		func() error { return engine.SendBody(uc, r.head, r.body.bytes(), r.body.stream, r.body.length) },
		func() error { return readResponseHead(uc, &r.up, interimTo(r)) },
		func() {
			// The client's body is left unread: its connection closes
			// after the answer.
			stopped = true
			r.c.stopReading()
		})
	if stopped {
		r.ctx.SetConnectionClose()
		r.c.linger = true // a reset would drop what the client has not yet read
	}
	if err == nil && !reuse {
		r.up.SetConnectionClose()
	}
	return err
}

// copyResponseHeader copies the upstream's response header to the client's,
// without the hop-by-hop fields (but Upgrade and Connection on a 101; every
// field Connection names, however many), its Date included (the server
// adds one only to a response without), and without the fields
// the core hides (core.Forward.Hide). Content-Length and
// Transfer-Encoding are the server's to write: they frame the body it
// sends.
func copyResponseHeader(dst, src *fasthttp.ResponseHeader, upgraded bool, hide []string) {
	primeDate(dst, src.Peek("Date")) // the upstream's own Date, else now
	dst.SetStatusCode(src.StatusCode())
	dst.SetStatusMessage(src.StatusMessage()) // the upstream's reason phrase, as the event loop passes it
	named := connectionNamed(src)
	for k, v := range src.All() {
		if !engine.ResponseFieldPassed(engine.ClassifyField(k), upgraded) ||
			named.Has(k) || len(hide) > 0 && isHidden(k, hide) {
			continue
		}
		dst.AddBytesKV(k, v)
	}
}

// connectionNamed is the set of fields h's Connection names (hop-by-hop:
// never passed on), but its own options.
func connectionNamed(h *fasthttp.ResponseHeader) (named engine.NameSet) {
	for k, v := range h.All() {
		if engine.ClassifyField(k) == engine.FieldConnection {
			named.AddOptions(v)
		}
	}
	return named
}

func isHidden(k []byte, hide []string) bool {
	for _, h := range hide {
		if len(h) == len(k) && engine.EqualFold(k, h) {
			return true
		}
	}
	return false
}
