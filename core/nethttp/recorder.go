package nethttp

import (
	"bufio"
	"net"
	"net/http"
	"sync"
	"unsafe"

	"github.com/preforkd/preforkd/core"
)

// recorder is the ResponseWriter a reserved request runs with: a tee that
// passes everything through to the client as it comes (streaming keeps
// working) and keeps a copy of what a retry will be given: the final
// status, Content-Type, Location and up to max bytes of body.
//
// The copy outlives the client. When a write to the client fails (it went
// away), the recorder stops writing to it but keeps recording and reports
// success to the handler, so that the handler (a reverse proxy copying the
// upstream's body) runs to the end and the response is stored for the
// retry the client is about to send.
//
// The final status is held back until the first byte of body, a Flush or
// the end of the handler, as net/http itself does: when the handler set no
// Content-Type, the recorder sniffs it from the first write
// (http.DetectContentType) and sets it on the response, so that the client
// and every replay see the same one.
type recorder struct {
	w   http.ResponseWriter
	max int64
	// fallback, if set, is asked for a response to send instead of a
	// failed one (core.Exchange.Fallback); replaced is what it gave.
	fallback func(status int) *core.Response
	replaced *core.Response
	header   []core.Field // the response's fields, as sent

	status     int // final status: as given to WriteHeader, 0 before
	sent       bool
	ct, loc    string
	body       []byte
	overflow   bool  // the body went over max: not kept
	clientGone error // the first failed write or flush to the client
	hijacked   bool
}

// bodyPool recycles the recorders' body buffers: a keyed request's body is
// copied into the table by Complete, and the buffer is free again.
var bodyPool = sync.Pool{New: func() any { return new([]byte) }}

// maxPooledBody bounds the buffers kept in bodyPool.
const maxPooledBody = 64 << 10

func newRecorder(w http.ResponseWriter, max int64, fallback func(int) *core.Response) *recorder {
	bp := bodyPool.Get().(*[]byte)
	return &recorder{w: w, max: max, body: (*bp)[:0], fallback: fallback}
}

// release gives the body buffer back; the recorder must not be used after.
func (rec *recorder) release() {
	if b := rec.body; cap(b) > 0 && cap(b) <= maxPooledBody {
		b = b[:0]
		bodyPool.Put(&b)
	}
	rec.body = nil
}

func (rec *recorder) Header() http.Header { return rec.w.Header() }

// WriteHeader records the final status. Informational statuses (1xx but
// 101) go to the client at once and are not recorded; a second final
// status is ignored, as net/http ignores it.
func (rec *recorder) WriteHeader(code int) {
	if code >= 100 && code < 200 && code != http.StatusSwitchingProtocols {
		if !rec.sent && rec.status == 0 && rec.clientGone == nil {
			rec.w.WriteHeader(code)
		}
		return
	}
	if rec.status == 0 {
		rec.status = code
	}
}

// Write records p and passes it on. It never reports a failure of the
// client's connection: see the type's comment.
func (rec *recorder) Write(p []byte) (int, error) {
	if !rec.sent {
		rec.sendHeader(p)
	}
	if !bodyAllowed(rec.status) {
		return 0, http.ErrBodyNotAllowed
	}
	if rec.replaced != nil {
		return len(p), nil // the client gets the fallback instead
	}
	if !rec.overflow {
		if int64(len(rec.body))+int64(len(p)) > rec.max {
			rec.overflow = true
			rec.release()
		} else {
			rec.body = append(rec.body, p...)
		}
	}
	if rec.clientGone == nil {
		if _, err := rec.w.Write(p); err != nil {
			rec.clientGone = err
		}
	}
	return len(p), nil
}

// sendHeader fixes the final status and headers and sends them; first is
// the first write of body, if any, for sniffing.
func (rec *recorder) sendHeader(first []byte) {
	rec.sent = true
	if rec.status == 0 {
		rec.status = http.StatusOK
	}
	if rec.status >= 500 && rec.fallback != nil {
		if rec.replaced = rec.fallback(rec.status); rec.replaced != nil {
			return // nothing goes to the client: ServeHTTP sends the fallback
		}
	}
	h := rec.w.Header()
	if _, set := h["Content-Type"]; !set && len(first) > 0 && bodyAllowed(rec.status) {
		h.Set("Content-Type", http.DetectContentType(first))
	}
	rec.ct, rec.loc = h.Get("Content-Type"), h.Get("Location")
	for name, vs := range h {
		for _, v := range vs {
			rec.header = append(rec.header, core.Field{Name: name, Value: unsafe.Slice(unsafe.StringData(v), len(v))})
		}
	}
	rec.w.WriteHeader(rec.status)
}

// finish sends the header if the handler wrote nothing.
func (rec *recorder) finish() {
	if !rec.sent && !rec.hijacked {
		rec.sendHeader(nil)
	}
}

// Flush sends what was written so far; a failure counts as the client gone.
func (rec *recorder) Flush() { _ = rec.FlushError() }

// FlushError is Flush for http.ResponseController. It reports no failure
// of the client's connection, for the same reason as Write.
func (rec *recorder) FlushError() error {
	if !rec.sent {
		rec.sendHeader(nil)
	}
	if rec.clientGone == nil && rec.replaced == nil {
		if err := http.NewResponseController(rec.w).Flush(); err != nil {
			rec.clientGone = err
		}
	}
	return nil
}

// Hijack hands the connection to the handler. What it then sends is not
// seen: the request is completed unreplayable (it did run).
func (rec *recorder) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	c, brw, err := http.NewResponseController(rec.w).Hijack()
	if err == nil {
		rec.hijacked = true
	}
	return c, brw, err
}

// Unwrap lets http.ResponseController reach the connection's deadlines.
func (rec *recorder) Unwrap() http.ResponseWriter { return rec.w }

// recorded is what the recorder saw, for core.Exchange.Complete.
func (rec *recorder) recorded() *core.Recorded {
	return &core.Recorded{
		Status:      rec.status,
		ContentType: rec.ct,
		Location:    rec.loc,
		Header:      rec.header,
		Body:        rec.body,
		Overflow:    rec.overflow,
		Hijacked:    rec.hijacked,
		Failed:      rec.replaced != nil,
	}
}

// bodyAllowed reports whether a response with status may have a body.
func bodyAllowed(status int) bool { return core.BodyAllowed(status) }
