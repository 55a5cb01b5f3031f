//go:build linux

package loop

import (
	"net/netip"
	"strconv"
	"strings"

	"github.com/preforkd/preforkd/core"
	"github.com/preforkd/preforkd/engine"
)

// App is an application served in the worker's own process: the
// daemon's demo, a small handler of an embedding program. It runs on the
// event loop, after the core let the request through, with the request's
// body read whole (up to 1 MiB: a larger one is a 413): it must return
// at once — no I/O, no lock held for long, nothing that waits — since
// every connection of its loop waits for it. What it writes to w is sent
// with the core's fields added and a Content-Length. Neither w nor r may
// be kept after it returns, nor what r returns: its strings and bytes
// (the path, a header's value, the body) are views of the loop's buffers,
// which the next request overwrites; copy (strings.Clone) what is kept.
type App func(w *AppResponse, r *AppRequest)

// AppRequest is the request an App serves, as the core passed it on.
type AppRequest struct{ r *request }

// Method is the request method.
func (q *AppRequest) Method() string { return q.r.Method() }

// Path is the path the core passes on: with dot segments removed and
// slashes merged, percent-encoded as sent.
func (q *AppRequest) Path() string { return q.r.fwd.Path }

// Query is the raw query, without the '?'.
func (q *AppRequest) Query() string { return q.r.Query() }

// Header is the first value of the field called name (canonical form,
// "X-Api-Key") and how many lines have that name, as the core sees it:
// without the hop-by-hop fields, and with the fields it adds (the
// request id) in place of the client's.
func (q *AppRequest) Header(name string) (first string, lines int) {
	for i := range q.r.fwd.Add {
		if f := &q.r.fwd.Add[i]; strings.EqualFold(f.Name, name) {
			return b2s(f.Value), 1
		}
	}
	if q.r.fwd.Dropped(name) {
		return "", 0
	}
	return q.r.Header(name)
}

// Body is the request body.
func (q *AppRequest) Body() []byte { return q.r.body.buf }

// Peer is the client's address (the TCP peer).
func (q *AppRequest) Peer() netip.Addr { return q.r.peer }

// AppResponse is what an App answers: a status (200 unless set), header
// fields and a body.
type AppResponse struct {
	status int
	lines  []byte // "Name: value\r\n" each
	fields []span // name, then value, of each line
	body   []byte
	own    []byte // the body's memory reused from request to request
	// hasDate: the App set its own Date, which the server sends instead
	// of its own.
	hasDate bool
	lent    bool // Body was called: what SetBody gets is made from it
	foreign bool // SetBody gave memory of the App's own: never written
}

func (w *AppResponse) reset() {
	if !w.foreign {
		w.own = w.body // written here, or appended to from Body
	}
	w.status, w.hasDate, w.lent, w.foreign = 0, false, false, false
	w.lines, w.fields, w.body = w.lines[:0], w.fields[:0], w.own[:0]
}

// WriteHeader sets the status.
func (w *AppResponse) WriteHeader(status int) { w.status = status }

// Header adds the field line "name: value". Content-Length and the
// hop-by-hop fields are the server's to send: they are ignored.
func (w *AppResponse) Header(name, value string) {
	switch engine.ClassifyField(s2b(name)) {
	case engine.FieldOther, engine.FieldHost, engine.FieldForwardedFor, engine.FieldForwardedOther:
	default:
		return
	}
	if !engine.FieldValueOK(s2b(value)) || len(name) == 0 {
		return
	}
	if len(name) == 4 && engine.EqualFold(s2b(name), "date") {
		w.hasDate = true
	}
	from := int32(len(w.lines))
	w.lines = append(w.lines, name...)
	w.fields = append(w.fields, span{from, int32(len(w.lines))})
	w.lines = append(w.lines, ": "...)
	vfrom := int32(len(w.lines))
	w.lines = append(w.lines, value...)
	w.fields = append(w.fields, span{vfrom, int32(len(w.lines))})
	w.lines = append(w.lines, "\r\n"...)
}

// Write appends p to the body.
func (w *AppResponse) Write(p []byte) (int, error) {
	w.body = append(w.body, p...)
	return len(p), nil
}

// WriteString appends s to the body.
func (w *AppResponse) WriteString(s string) (int, error) {
	w.body = append(w.body, s...)
	return len(s), nil
}

// Body returns the body so far, for an App that appends to it in place
// (SetBody gives it back): the memory is reused from request to request.
func (w *AppResponse) Body() []byte {
	w.lent = true
	return w.body
}

// SetBody makes b the body. Unless b was made from Body in the same call,
// it stays the App's: the next requests' bodies are not written into it
// (a body kept for every request, say).
func (w *AppResponse) SetBody(b []byte) {
	w.body = b
	w.foreign = w.foreign || !w.lent
}

// Each implements core.Header.
func (w *AppResponse) Each(f func(name, value []byte)) {
	for i := 0; i+1 < len(w.fields); i += 2 {
		f(w.fields[i].of(w.lines), w.fields[i+1].of(w.lines))
	}
}

var _ core.Header = (*AppResponse)(nil)

// runApp serves a request that passed the core with Options.App.
func (r *request) runApp() {
	l := r.l
	w := &l.appResp
	w.reset()
	l.appReq.r = r
	r.ex.Sending()
	l.s.o.App(w, &l.appReq)
	l.appReq.r = nil
	status := w.status
	if status == 0 {
		status = 200
	}
	if replaced := r.ex.Head(status, w); replaced != nil {
		r.respondCore(replaced)
		return
	}
	bodyOK := core.BodyAllowed(status)
	if bodyOK && !r.h.isHead { // what is sent: no body to HEAD
		r.ex.Body(w.body)
	}
	c := r.c
	r.responded(status)
	r.headSent = true
	dst := appendStatusLine(l.head[:0], status, nil)
	if len(r.fwd.Hide) == 0 {
		dst = append(dst, w.lines...)
	} else {
		for i := 0; i+1 < len(w.fields); i += 2 {
			name, value := w.fields[i], w.fields[i+1]
			if !r.fwd.Hidden(b2s(name.of(w.lines))) {
				dst = append(dst, w.lines[name.from:value.to+2]...) // with its CRLF
			}
		}
	}
	for _, f := range r.ex.Fields() {
		dst = engine.AppendField(dst, f.Name, f.Value)
	}
	if !w.hasDate {
		dst = append(dst, l.dateLine...)
	}
	if bodyOK {
		dst = append(dst, "Content-Length: "...)
		dst = strconv.AppendInt(dst, int64(len(w.body)), 10)
		dst = append(dst, "\r\n"...)
	}
	dst = r.appendConnection(dst)
	dst = append(dst, "\r\n"...)
	l.head = dst
	c.queue(dst)
	if bodyOK && !r.h.isHead {
		c.queue(w.body)
	}
	r.endExchange(nil) // before the response goes, as upConn.end
	c.send()
	r.finish(nil)
}
