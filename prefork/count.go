package prefork

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"sync"
)

// counter wraps a worker's handler: it hands the status of every
// response to respond (Worker.Responded) before the response leaves the
// handler.
type counter struct {
	next    http.Handler
	respond func(status int)
}

// The status is the one sent to the client: the final status given to
// WriteHeader, 200 for a handler that wrote without it (or wrote nothing),
// and 500 for one that panicked before sending anything (net/http then
// drops the connection: to the client, a server error).
func (c *counter) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	sw := statusWriters.Get().(*statusWriter)
	sw.ResponseWriter, sw.status = w, 0
	returned := false
	defer func() {
		status := sw.status
		switch {
		case status != 0:
		case returned:
			status = http.StatusOK
		default:
			status = http.StatusInternalServerError
		}
		sw.ResponseWriter = nil
		statusWriters.Put(sw)
		c.respond(status)
	}()
	c.next.ServeHTTP(sw, r)
	returned = true
}

var statusWriters = sync.Pool{New: func() any { return new(statusWriter) }}

// statusWriter remembers the status of a response. It passes Flush,
// Hijack and ReadFrom through (a handler asserts http.Flusher, a reverse
// proxy flushes a stream, a file is sent with sendfile), and unwraps for
// http.ResponseController.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	// 1xx are informational (101 ends the response: a protocol switch).
	if w.status == 0 && (code >= 200 || code == http.StatusSwitchingProtocols) {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

func (w *statusWriter) ReadFrom(r io.Reader) (int64, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	if rf, ok := w.ResponseWriter.(io.ReaderFrom); ok {
		return rf.ReadFrom(r)
	}
	return io.Copy(writerOnly{w.ResponseWriter}, r)
}

// writerOnly hides a writer's ReadFrom, so that io.Copy does not recurse.
type writerOnly struct{ io.Writer }

func (w *statusWriter) Flush() {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (w *statusWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	hj, ok := w.ResponseWriter.(http.Hijacker)
	if !ok {
		return nil, nil, http.ErrNotSupported
	}
	if w.status == 0 {
		w.status = http.StatusSwitchingProtocols
	}
	return hj.Hijack()
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
