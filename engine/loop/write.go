//go:build linux

package loop

import (
	"bytes"
	"io"
	"strconv"

	"github.com/preforkd/preforkd/core"
	"github.com/preforkd/preforkd/engine"
)

// Response heads as the client gets them: composed in the loop's head
// buffer and written with the body in one system call.

// appendStatusLine appends "HTTP/1.1 code reason"; reason nil means the
// status's text.
func appendStatusLine(dst []byte, code int, reason []byte) []byte {
	dst = append(dst, "HTTP/1.1 "...)
	dst = strconv.AppendInt(dst, int64(code), 10)
	dst = append(dst, ' ')
	if reason == nil {
		dst = append(dst, core.StatusText(code)...)
	} else {
		dst = append(dst, reason...)
	}
	return append(dst, "\r\n"...)
}

// appendConnection appends the Connection field the response needs: close
// when the connection ends after it (always while the server drains:
// the drain rule's step 2), keep-alive for an HTTP/1.0 client that keeps
// it.
func (r *request) appendConnection(dst []byte) []byte {
	c := r.c
	if c.l.draining {
		c.closeAfter = true
	}
	switch {
	case c.closeAfter:
		return append(dst, "Connection: close\r\n"...)
	case r.h.minor == 0:
		return append(dst, "Connection: keep-alive\r\n"...)
	}
	return dst
}

// responded tells OnResponse of the response about to be sent, once.
func (r *request) responded(status int) {
	r.status = status
	if r.counted {
		return
	}
	r.counted = true
	if f := r.l.s.o.OnResponse; f != nil {
		f(status)
	}
}

// writeCore writes a complete answer of the core's own (or the server's,
// through the core): its fields as given but Date, which is the server's,
// and a Content-Length of its body. A HEAD answered from the cache
// carries the length GET would have had. It is queued: the caller sends it
// (c.send).
func (r *request) writeCore(resp *core.Response) {
	c, l := r.c, r.l
	r.responded(resp.Status)
	bodyOK := core.BodyAllowed(resp.Status)
	sendBody := bodyOK && !r.h.isHead
	dst := appendStatusLine(l.head[:0], resp.Status, nil)
	length := -1
	switch {
	case bodyOK && resp.Stream != nil:
		length = resp.Stream.Len()
	case bodyOK && (resp.Body != nil || !r.h.isHead):
		length = len(resp.Body)
	}
	date := l.dateLine // a stored response's own Date (a cache hit), else now
	for _, f := range resp.Fields {
		switch f.Name {
		case "Date":
			if len(f.Value) <= 64 && !bytes.ContainsAny(f.Value, "\r\n") {
				date = engine.AppendField(l.date[:0], "Date", f.Value)
				l.date = date
			}
			continue
		case "Content-Length":
			if length >= 0 || !bodyOK {
				continue
			}
		}
		dst = engine.AppendField(dst, f.Name, f.Value)
	}
	dst = append(dst, date...)
	if length >= 0 {
		dst = append(dst, "Content-Length: "...)
		dst = strconv.AppendInt(dst, int64(length), 10)
		dst = append(dst, "\r\n"...)
	}
	dst = r.appendConnection(dst)
	dst = append(dst, "\r\n"...)
	switch {
	case sendBody && resp.Stream != nil:
		r.stream = resp.Stream // sent by pump
	case sendBody:
		// Copied: the exchange whose memory it is may end before it goes.
		dst = append(dst, resp.Body...)
	}
	l.head = dst
	c.queue(dst)
}

// pump sends the pieces of a streamed body (r.stream) while the client
// takes them: it stops while output waits, and the output's draining
// (clientDrained) calls it again, so that the connection holds a piece of
// the body at most. The exchange ends once the last piece was sent; an
// entry that changed meanwhile (core.ErrBodyCut) cuts the connection, so
// that the client's body is short of its Content-Length, never wrong.
func (r *request) pump() {
	for {
		c := r.c
		if c == nil || c.broken || c.state == csClosed || c.outLen() > 0 {
			return // clientDrained or the close goes on
		}
		p, err := r.stream.Next()
		switch {
		case err == io.EOF:
			r.stream = nil
			r.finish(nil)
			return
		case err != nil:
			r.stream = nil
			r.c, c.r = nil, nil
			c.close(nil)
			r.finish(err)
			return
		}
		c.write(p)
	}
}

// refuse answers a request the server will not pass on, before the core
// saw it (a malformed head, one too large or too slow), with a problem;
// the connection closes after it when its framing cannot be trusted.
func (c *conn) refuse(bad *engine.BadRequest) {
	l := c.l
	l.s.count.BadRequests.Add(1)
	r := c.r
	if r == nil || r.h.raw == nil || bad.CloseConn {
		c.closeAfter, c.linger = true, true
	}
	p := core.Problem{Status: bad.Status, Detail: bad.Detail}
	l.pbody = p.AppendJSON(l.pbody[:0])
	l.pfields, l.pvals = core.ProblemFields(l.pfields[:0], l.pvals[:0], 0, len(l.pbody))
	resp := core.Response{Status: bad.Status, Fields: l.pfields, Body: l.pbody}
	l.s.o.Core.Responded(bad.Status, 0)
	if r == nil {
		// No request: the head itself was wrong. Answered as to a GET.
		r = l.getRequest(c)
		r.h.minor = 1
		c.r = r
		c.setState(csBusy)
		r.writeCore(&resp)
		c.send()
		c.r = nil
		l.recycle(r)
		if c.outLen() == 0 {
			c.shut()
		} else {
			_ = l.interest(c.fd, &c.have, wantWrite)
		}
		return
	}
	r.settleBody()
	r.writeCore(&resp)
	c.send()
	r.phase = phDone
	r.done()
}
