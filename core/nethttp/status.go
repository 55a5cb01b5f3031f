package nethttp

import (
	"bufio"
	"io"
	"net"
	"net/http"
)

// statusWriter passes a response through and notes its final status, for
// the statistics (core.Exchange.Done). Flush, Hijack, ReadFrom (sendfile)
// and http.ResponseController reach the connection as they would without
// it.
type statusWriter struct {
	w      http.ResponseWriter
	status int // final status; 0 before one was sent
}

func (s *statusWriter) Header() http.Header { return s.w.Header() }

// WriteHeader notes the first final status; informational ones (1xx but
// 101) are not final.
func (s *statusWriter) WriteHeader(code int) {
	if s.status == 0 && (code >= 200 || code == http.StatusSwitchingProtocols) {
		s.status = code
	}
	s.w.WriteHeader(code)
}

func (s *statusWriter) Write(p []byte) (int, error) {
	if s.status == 0 {
		s.status = http.StatusOK
	}
	return s.w.Write(p)
}

// ReadFrom keeps net/http's sendfile path for a handler that copies a file.
func (s *statusWriter) ReadFrom(r io.Reader) (int64, error) {
	if s.status == 0 {
		s.status = http.StatusOK
	}
	if rf, ok := s.w.(io.ReaderFrom); ok {
		return rf.ReadFrom(r)
	}
	return io.Copy(struct{ io.Writer }{s.w}, r)
}

func (s *statusWriter) Flush() { _ = s.FlushError() }

// FlushError is Flush for http.ResponseController.
func (s *statusWriter) FlushError() error {
	if s.status == 0 {
		s.status = http.StatusOK
	}
	return http.NewResponseController(s.w).Flush()
}

// Hijack hands the connection over: an upgrade, whose 101 the handler
// writes itself (httputil.ReverseProxy does).
func (s *statusWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	c, brw, err := http.NewResponseController(s.w).Hijack()
	if err == nil && s.status == 0 {
		s.status = http.StatusSwitchingProtocols
	}
	return c, brw, err
}

// Unwrap lets http.ResponseController reach the connection's deadlines.
func (s *statusWriter) Unwrap() http.ResponseWriter { return s.w }

// final is the status the client got: 200 when the handler wrote nothing
// (net/http sends that).
func (s *statusWriter) final() int {
	if s.status == 0 {
		return http.StatusOK
	}
	return s.status
}
