package proxy

import (
	"net/http"

	"github.com/preforkd/preforkd/engine"
	"github.com/valyala/fasthttp"
)

// Interim responses (1xx but 100 and 101: 102 Processing, 103 Early
// Hints) are forwarded to the client as they come, before the final
// response, as RFC 9110 §15.2 asks of a proxy; they are never recorded
// or stored.
//
// fasthttp writes a response once the handler returns, through a buffer
// it flushes only when no other request of the connection is waiting to
// be read: with pipelined requests, the response to the previous one may
// still be in that buffer while this one is handled. An interim response
// written to the connection then would overtake it. So one is written
// only when the connection was read after the previous request's handler
// ended (fasthttp flushes its buffer before it waits to read), which is
// the case for every request that was not pipelined; a pipelined one
// gets its final response only, as before. An HTTP/1.0 client gets none
// (RFC 9110 §15.2).

// interimSink is what readResponseHead gives interim responses to.
type interimSink interface {
	interim(h *fasthttp.ResponseHeader)
}

// interimTo is r when its client may be sent interim responses now (see
// above), else nil.
func interimTo(r *request) interimSink {
	if r.c == nil || !r.ctx.Request.Header.IsHTTP11() || r.readsAtStart == r.c.readsAtDone {
		return nil
	}
	return r
}

// interim writes the interim response h to r's client: its status line
// and its end-to-end fields.
func (r *request) interim(h *fasthttp.ResponseHeader) {
	st := h.StatusCode()
	if st == http.StatusContinue {
		return // the server answers Expect itself
	}
	b := r.interimBuf[:0]
	b = append(b, "HTTP/1.1 "...)
	b = fasthttp.AppendUint(b, st)
	b = append(b, ' ')
	b = append(b, fasthttp.StatusMessage(st)...)
	b = append(b, "\r\n"...)
	named := connectionNamed(h)
	hide := r.fwd.Hide
	for k, v := range h.All() {
		if engine.ClassifyField(k) != engine.FieldOther || named.Has(k) || len(hide) > 0 && isHidden(k, hide) {
			continue // hop-by-hop (named so by Connection too), framing, or the core's own (core.Forward.Hide)
		}
		b = append(b, k...)
		b = append(b, ": "...)
		b = append(b, v...)
		b = append(b, "\r\n"...)
	}
	b = append(b, "\r\n"...)
	r.interimBuf = b
	_, _ = r.c.Write(b) // a client gone is the final response's to find
}
