package nethttp

import (
	"bufio"
	"io"
	"net"
	"net/http"

	"github.com/preforkd/preforkd/core"
)

// writer is the ResponseWriter the next handler runs with: it tells the
// core the response's head before the client gets it (core.Exchange.Head,
// which may replace a failure with a stale response) and each piece of
// its body (Body, which records what the core keeps). Flush, Hijack,
// ReadFrom (sendfile) and http.ResponseController reach the connection as
// they would without it.
//
// When the core keeps the response (Exchange.Keep: it is stored for a
// retry or the cache), the response outlives the client: a write to a
// client that went away is reported as a success to the handler (a
// reverse proxy copying an upstream's body), so that it runs to the end
// and the response is stored. The final status is then held back until
// the first byte of body, a Flush or the end of the handler, as net/http
// itself does, and a missing Content-Type is sniffed from the first
// write and set on the response, so that the client and every replay see
// the same one.
type writer struct {
	w    http.ResponseWriter
	ex   *core.Exchange
	keep bool
	hide []string // fields of the handler's response the client must not get (core.Forward.Hide)
	h1   bool     // an HTTP/1 request: a core answer's Close closes the connection

	status     int            // final status given; 0 before
	sent       bool           // the head was sent (or replaced)
	replaced   *core.Response // what the core sent instead
	clientGone error          // the first failed write to the client, when keeping
	hijacked   bool
	// body is the request's body as the Server reads it, or nil; gone:
	// its read failed because the client went away (bodyReader.gone)
	// before the head was sent, which then goes nowhere (replaced by
	// noAnswer): the exchange ends as the client gone (499), as the
	// forwarder's does.
	body *bodyReader
	gone bool
	// tunnel, set by the forwarder after an upgrade's 101, carries the
	// upgraded connection once the exchange has ended.
	tunnel func()
}

func (rw *writer) Header() http.Header { return rw.w.Header() }

// WriteHeader takes the final status; informational ones (1xx but 101)
// go to the client at once. A second final status is ignored, as net/http
// ignores it.
func (rw *writer) WriteHeader(code int) {
	if code >= 100 && code < 200 && code != http.StatusSwitchingProtocols {
		if !rw.sent && rw.status == 0 && rw.clientGone == nil {
			rw.w.WriteHeader(code)
		}
		return
	}
	if rw.status != 0 {
		return
	}
	rw.status = code
	if !rw.keep {
		rw.sendHeader(nil)
	}
}

// sendHeader tells the core the head and sends it, or what the core sends
// instead; first is the first write of body, if any, for sniffing.
func (rw *writer) sendHeader(first []byte) {
	rw.sent = true
	if !rw.keep && rw.body != nil && rw.body.gone() {
		rw.gone, rw.replaced = true, &noAnswer // what the handler writes is dropped
		return
	}
	if rw.status == 0 {
		rw.status = http.StatusOK
	}
	h := rw.w.Header()
	if _, set := h["Content-Type"]; rw.keep && !set && len(first) > 0 && core.BodyAllowed(rw.status) {
		h.Set("Content-Type", http.DetectContentType(first))
	}
	if rw.replaced = rw.ex.Head(rw.status, header(h)); rw.replaced != nil {
		clear(h)
		writeResponse(rw.w, rw.replaced, rw.h1)
		return
	}
	for _, n := range rw.hide {
		delete(h, n)
	}
	rw.w.WriteHeader(rw.status)
}

func (rw *writer) Write(p []byte) (int, error) {
	if !rw.sent {
		rw.sendHeader(p)
	}
	switch {
	case rw.replaced != nil:
		return len(p), nil // the client got the core's answer instead
	case !core.BodyAllowed(rw.status):
		return 0, http.ErrBodyNotAllowed
	}
	rw.ex.Body(p)
	if !rw.keep {
		return rw.w.Write(p)
	}
	if rw.clientGone == nil {
		if _, err := rw.w.Write(p); err != nil {
			rw.clientGone = err
		}
	}
	if rw.clientGone != nil && !rw.ex.Keep() {
		// The client is gone and the core keeps the response no more (a
		// cache fill over max_body): nothing is left to read it for.
		return 0, rw.clientGone
	}
	return len(p), nil
}

// ReadFrom keeps net/http's sendfile path for a handler that copies a
// file, when nothing of the body is kept.
func (rw *writer) ReadFrom(r io.Reader) (int64, error) {
	if !rw.sent {
		rw.sendHeader(nil)
	}
	rf, ok := rw.w.(io.ReaderFrom)
	if rw.keep || rw.replaced != nil || !ok {
		return io.Copy(struct{ io.Writer }{rw}, r)
	}
	return rf.ReadFrom(r)
}

func (rw *writer) Flush() { _ = rw.FlushError() }

// FlushError is Flush for http.ResponseController. When the response is
// kept it reports no failure of the client's connection, as Write.
func (rw *writer) FlushError() error {
	if !rw.sent {
		rw.sendHeader(nil)
	}
	if rw.replaced != nil || rw.clientGone != nil {
		return nil
	}
	err := http.NewResponseController(rw.w).Flush()
	if err != nil && rw.keep {
		rw.clientGone, err = err, nil
	}
	return err
}

// Hijack hands the connection over: an upgrade, whose 101 the handler
// writes itself (httputil.ReverseProxy does). What it then sends is not
// seen.
func (rw *writer) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	c, brw, err := http.NewResponseController(rw.w).Hijack()
	if err == nil {
		rw.hijacked = true
		if !rw.sent {
			rw.sent, rw.status = true, http.StatusSwitchingProtocols
			rw.ex.Head(rw.status, nil)
		}
	}
	return c, brw, err
}

// Unwrap lets http.ResponseController reach the connection's deadlines.
func (rw *writer) Unwrap() http.ResponseWriter { return rw.w }

// finish sends the head if the handler wrote nothing: net/http sends 200.
func (rw *writer) finish() {
	if !rw.sent && !rw.hijacked {
		rw.sendHeader(nil)
	}
}

// noAnswer stands in writer.replaced for the head of a client gone.
var noAnswer core.Response

// header is a net/http header as the core reads a response's.
type header http.Header

func (h header) Each(f func(name, value []byte)) {
	for name, vs := range h {
		for _, v := range vs {
			f([]byte(name), []byte(v))
		}
	}
}
