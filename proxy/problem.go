package proxy

import (
	"errors"
	"net"
	"net/http"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/preforkd/preforkd/core"
	"github.com/preforkd/preforkd/engine"
)

// Answers of the server's own, and what it tells the operator about them.

// Stats are the server's counters since New.
type Stats = engine.Stats

// Stats returns the server's counters.
func (s *Server) Stats() Stats {
	s.mu.Lock()
	open := int64(len(s.conns))
	s.mu.Unlock()
	return s.count.Stats(open)
}

// warnKind is a kind of warning; each is rate-limited on its own.
type warnKind int

const (
	warnUpstreamDown warnKind = iota
	warnUpstreamTimeout
	warnUpstreamAbort
	warnAccept
	warnKinds
)

func (s *Server) warn(k warnKind, msg string, args ...any) {
	if args, ok := s.warns[k].Args(time.Now(), args...); ok {
		s.opts.Logger.Warn(msg, args...)
	}
}

// problemScratch holds the bytes of one problem answer being built.
type problemScratch struct {
	body   []byte
	fields []core.Field
	vals   []byte
}

var problemPool = sync.Pool{New: func() any { return new(problemScratch) }}

// answer writes an RFC 9457 problem as the response to ctx, in place of
// anything written so far, closing the connection afterwards when
// closeConn. extra fields (the core's) are added.
func (s *Server) answer(ctx *fasthttp.RequestCtx, status int, detail string, closeConn bool, extra []core.Field) {
	p := core.Problem{Status: status, Detail: detail}
	sc := problemPool.Get().(*problemScratch)
	sc.body = p.AppendJSON(sc.body[:0])
	sc.fields, sc.vals = core.ProblemFields(sc.fields[:0], sc.vals[:0], 0, len(sc.body))
	resp := &ctx.Response
	resp.Reset()
	setStatus(&resp.Header, status)
	setFields(resp, sc.fields)
	setFields(resp, extra)
	resp.SetBody(sc.body)
	problemPool.Put(sc)
	if closeConn {
		ctx.SetConnectionClose()
		if c, ok := ctx.Conn().(*conn); ok {
			c.linger = true
		}
	}
}

// refuse answers a request that will not be forwarded.
func (s *Server) refuse(ctx *fasthttp.RequestCtx, b *engine.BadRequest, extra []core.Field) {
	s.count.BadRequests.Add(1)
	s.answer(ctx, b.Status, b.Detail, b.CloseConn, extra)
}

// respond writes the core's own answer.
func (s *Server) respond(ctx *fasthttp.RequestCtx, r *core.Response) {
	resp := &ctx.Response
	var date []byte // a stored response's own (a cache hit), else now
	for _, f := range r.Fields {
		if f.Name == "Date" {
			date = f.Value
			break
		}
	}
	primeDate(&resp.Header, date)
	setStatus(&resp.Header, r.Status)
	setFields(resp, r.Fields)
	resp.SetBody(r.Body)
	if r.Body == nil && ctx.IsHead() {
		// A HEAD answered from the cache: the length GET would have had.
		for _, f := range r.Fields {
			if f.Name == "Content-Length" {
				if n, err := strconv.Atoi(b2s(f.Value)); err == nil {
					resp.Header.SetContentLength(n)
				}
			}
		}
	}
	if r.Close {
		ctx.SetConnectionClose()
		if c, ok := ctx.Conn().(*conn); ok {
			c.linger = true
		}
	}
}

// setFields adds fields to resp. Content-Length is fasthttp's to write:
// it frames the body it is given.
func setFields(resp *fasthttp.Response, fields []core.Field) {
	for _, f := range fields {
		if f.Name == "Content-Length" {
			continue
		}
		resp.Header.AddBytesV(f.Name, f.Value)
	}
}

// onError is fasthttp's ErrorHandler: the request could not be read. Its
// answer is counted here, as done counts the server's own answers: no
// handler runs for it.
func (s *Server) onError(ctx *fasthttp.RequestCtx, err error) {
	if s.bodyUnread(ctx, err) {
		return
	}
	if isConnReset(err) {
		// The client reset its connection: nobody to answer. One whose
		// head came whole (fasthttp then waited for its body's first
		// bytes) went away before its response began: 499, as on the
		// other engines, with no access line (fasthttp dropped the head).
		ctx.SetConnectionClose()
		if c, _ := ctx.Conn().(*conn); c != nil {
			c.mute = true
			if c.head.Whole() {
				s.opts.Core.Responded(core.StatusClientClosed, 0)
			}
		}
		return
	}
	bad := s.unread(ctx, err)
	if bad == nil {
		return
	}
	s.refuse(ctx, bad, nil)
	s.opts.Core.Responded(bad.Status, 0)
	if s.opts.OnResponse != nil {
		s.opts.OnResponse(bad.Status)
	}
}

// bodyUnread answers a request that expect let go on but whose body
// fasthttp could not begin to read: it reads a body's first bytes itself,
// after expect and before the handler, under client_body_timeout. The
// answer is the body's (a 408 for a body that never came, not the
// head's), and the exchange expect began ends with it: logged and
// counted once, with the status sent and the request id; a client that
// reset its connection is sent nothing, and counted 499 (bodyFailed). It
// reports false when no such request waits.
func (s *Server) bodyUnread(ctx *fasthttp.RequestCtx, err error) bool {
	c, _ := ctx.Conn().(*conn)
	if c == nil || c.early == nil || c.early.ex == nil {
		return false
	}
	r := c.early
	c.early = nil
	r.ctx = ctx
	s.bodyFailed(r, r.ex, err)
	s.done(r)
	return true
}

// unread is the refusal of a request fasthttp could not read, or nil when
// there is nobody to answer.
func (s *Server) unread(ctx *fasthttp.RequestCtx, err error) *engine.BadRequest {
	if errors.Is(err, errBareLFRead) {
		// Bytes of a request arrived, whatever state fasthttp reported.
		return engine.ErrBareLF
	}
	if c, _ := ctx.Conn().(*conn); c != nil {
		c.mu.Lock()
		quiet := c.state != stateActive
		c.mu.Unlock()
		if quiet {
			// Not one byte of a request arrived (an idle timeout, a
			// drain): there is nobody to answer.
			c.mute = true
			return nil
		}
	}
	var small *fasthttp.ErrSmallBuffer
	switch {
	case errors.As(err, &small), errors.Is(err, fasthttp.ErrSmallReadBuffer):
		return engine.ErrTooLarge
	case isTimeout(err):
		if c, _ := ctx.Conn().(*conn); c != nil && c.head.Whole() {
			// The head came: fasthttp waited for the first byte of a
			// body of a known length (it reads one before the handler,
			// and drops the head when it cannot).
			return engine.ErrBodyTimeout
		}
		return engine.ErrHeadTimeout
	}
	return &engine.BadRequest{Status: http.StatusBadRequest, Detail: "malformed request", CloseConn: true}
}

// isConnReset reports whether err is the peer resetting or having closed
// the connection.
func isConnReset(err error) bool {
	return errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// isGone reports whether err, from reading a request, says its client is
// gone: it reset the connection, or the server closed it (a drain cut at
// its deadline). Nobody reads an answer.
func isGone(err error) bool {
	return isConnReset(err) || errors.Is(err, net.ErrClosed)
}

// setStatus sets a response's status, with the reason phrase the other
// engines write (core.StatusText) where fasthttp's differs: its 413 and
// 422 are RFC 2616's Request Entity Too Large and Unprocessable Entity.
func setStatus(h *fasthttp.ResponseHeader, status int) {
	h.SetStatusCode(status)
	if status == fasthttp.StatusRequestEntityTooLarge || status == fasthttp.StatusUnprocessableEntity {
		h.SetStatusMessage(s2b(core.StatusText(status)))
	} else if len(h.StatusMessage()) > 0 {
		h.SetStatusMessage(nil)
	}
}
