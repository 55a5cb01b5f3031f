package nethttp

import (
	"bytes"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/preforkd/preforkd/core"
	"github.com/preforkd/preforkd/engine"
)

// clientConn is an HTTP/1 client connection as net/http serves it. It
// does for the Server what net/http leaves undone, so that a client gets
// from this engine what it gets from the others:
//
//   - a header section with a line ended by a bare LF is refused 400
//     (net/http takes it), and so is one with ambiguous framing:
//     Content-Length with Transfer-Encoding, Transfer-Encoding in
//     HTTP/1.0 (net/http frames the body by the one, or ignores it, and
//     serves what follows as the next request), obs-fold (net/http
//     unfolds it);
//   - net/http's own answers to requests it refuses before any handler
//     runs (400, 431, 501, 505, 417) become the server's: problem+json
//     with a Date, counted by status (Core.Responded), the connection
//     closed after a moment of reading (engine.LingerClose);
//   - a header section cut short by read_header_timeout (or the idle
//     timeout, once a byte of it came) gets 408, where net/http closes
//     quietly.
//
// net/http reads from two goroutines, one at a time (the one serving
// the connection, and one watching for the client to leave while a
// handler runs), and the handler marks the connection from a third: mu
// orders them.
type clientConn struct {
	net.Conn
	s *Server

	mu     sync.Mutex
	head   engine.HeadScan
	served bool // a handler runs or ran for the request now read (ServeHTTP); StateIdle clears it
	// refused is what Read refused: answered at once, or, when a
	// handler ran, for the answer net/http writes next.
	refused *engine.BadRequest
	// answered: the server's own answer was written in place of
	// net/http's; what net/http writes after it is dropped, and the close
	// lingers.
	answered bool
	// headDue is when the header section now begun must be whole:
	// read_header_timeout from its first byte. net/http starts that
	// clock on a keep-alive connection only once four bytes came, and
	// waits for them with the idle timeout; SetReadDeadline keeps its
	// deadlines within headDue. Zero between sections.
	headDue time.Time
	readDue time.Time // the read deadline net/http last set
	kept    bool      // a request was served: the sections now come after an idle wait
	// firstDue is when an Edge's connection's first header section must
	// be whole: read_header_timeout from its accept, of which its
	// handshake took part (net/http's clock starts after it). Zero in
	// cleartext, where net/http's starts at the accept.
	firstDue time.Time
	// linger: the close lingers (the client's body was left unread
	// after an early answer of the upstream's).
	linger bool
	// writeFailed: a write to the client failed (a reset, send_timeout).
	writeFailed atomic.Bool

	// tls is the connection's TLS state over an Edge, nil in cleartext:
	// ServeHTTP gives it each request as Request.TLS, as net/http gives
	// a *tls.Conn's (one per connection).
	tls *tls.ConnectionState
}

// errRefused is what Read gives net/http for a header section it refuses
// (clientConn.refused says why). With no handler running, Read wrote the
// server's answer already, and what net/http writes after it (a 400 of
// its own) is dropped; else net/http's 400 becomes that answer (Write).
var errRefused = errors.New("nethttp: the header section is refused")

// clientListener hands net/http its connections as clientConns.
type clientListener struct {
	net.Listener
	s *Server
}

func (l clientListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	var accepted time.Time
	if a, ok := c.(acceptedConn); ok {
		c, accepted = a.Accepted()
	}
	cc := &clientConn{Conn: c, s: l.s}
	if d := l.s.limits.ReadHeaderTimeout; d > 0 && !accepted.IsZero() {
		cc.firstDue = accepted.Add(d)
	}
	cc.head.Start()
	if cs, ok := c.(connectionStater); ok {
		st := cs.ConnectionState() // the handshake is done
		cc.tls = &st
	}
	return cc, nil
}

// acceptedConn is a connection as an Edge's Accept returns it: the
// connection, and when the listener under the Edge accepted it.
type acceptedConn interface {
	Accepted() (net.Conn, time.Time)
}

// connectionStater is a connection over TLS: an Edge's.
type connectionStater interface {
	ConnectionState() tls.ConnectionState
}

func (c *clientConn) Read(p []byte) (int, error) {
	c.mu.Lock()
	answered := c.answered
	c.mu.Unlock()
	if answered {
		return 0, io.EOF // nothing more is served
	}
	n, err := c.Conn.Read(p)
	c.mu.Lock()
	defer c.mu.Unlock()
	// Every read is scanned, a request's body too (HeadScan follows
	// where sections end, and soon stops following a body): a byte of
	// the next section may come in a read made while a handler runs.
	if n > 0 {
		switch {
		case c.head.Scan(p[:n]):
			c.refused = engine.ErrBareLF
		case c.head.Framing() != nil:
			c.refused = c.head.Framing()
		case c.head.Len() > c.s.limits.MaxHeaderBytes:
			// net/http's own bound has 4 KiB of slack.
			c.refused = engine.ErrTooLarge
		}
		if c.refused != nil {
			if !c.served {
				// Answered here: on a kept connection net/http waits for
				// the next section with a read whose failure it takes for
				// the client leaving, and writes no 400 of its own.
				c.answer(c.refused.Status, c.refused.Detail)
			}
			return 0, errRefused
		}
	}
	if n > 0 && !c.served && c.headDue.IsZero() && c.head.Begun() {
		if d := c.s.limits.ReadHeaderTimeout; d > 0 {
			c.headDue = time.Now().Add(d)
			if !c.kept && !c.readDue.IsZero() && c.readDue.Before(c.headDue) {
				c.headDue = c.readDue // the first request's runs from the accept
			}
			if !c.kept && !c.firstDue.IsZero() && c.firstDue.Before(c.headDue) {
				c.headDue = c.firstDue // and an Edge's from before its handshake
			}
			_ = c.Conn.SetReadDeadline(c.headDue)
		}
	}
	if ne, ok := errors.AsType[net.Error](err); ok && ne.Timeout() && c.head.Begun() && !c.served && !c.answered {
		// net/http closes a section cut short by its timeout without a
		// word; the other engines answer 408.
		c.answer(engine.ErrHeadTimeout.Status, engine.ErrHeadTimeout.Detail)
	}
	return n, err
}

// SetReadDeadline sets the read deadline, within read_header_timeout
// of the first byte of a header section not yet whole (headDue).
func (c *clientConn) SetReadDeadline(t time.Time) error {
	c.mu.Lock()
	c.readDue = t
	due := c.headDue
	if c.served || !c.head.Begun() {
		due = time.Time{}
		if !c.served && !c.kept && c.head.Len() == 0 {
			due = c.firstDue // nothing of an Edge's first section yet: due from its accept
		}
	}
	c.mu.Unlock()
	if !due.IsZero() && (t.IsZero() || t.After(due)) {
		t = due
	}
	return c.Conn.SetReadDeadline(t)
}

// Write writes to the client. What net/http writes while no handler runs
// for the request being read is its own answer to a request it refused:
// an error status is answered the server's way instead.
func (c *clientConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	if c.answered {
		c.mu.Unlock()
		return len(p), nil
	}
	if !c.served {
		if status, reason, ok := ownStatus(p); ok && status >= 400 {
			defer c.mu.Unlock()
			if r := c.refused; r != nil {
				c.answer(r.Status, r.Detail)
			} else {
				c.answer(status, ownDetail(status, reason))
			}
			return len(p), nil
		}
	}
	c.mu.Unlock()
	n, err := c.Conn.Write(p)
	if err != nil {
		c.writeFailed.Store(true)
	}
	return n, err
}

// writeFailed reports whether a write to r's connection failed: the 100
// Continue net/http writes as the body is first read, say.
func writeFailed(r *http.Request) bool {
	c, ok := r.Context().Value(connKey{}).(*clientConn)
	return ok && c.writeFailed.Load()
}

// ReadFrom hands a response body to the connection's own ReadFrom
// (sendfile, splice), as net/http does with a connection it is given.
func (c *clientConn) ReadFrom(r io.Reader) (int64, error) { return io.Copy(c.Conn, r) }

// CloseWrite half-closes the connection where it can: net/http does so
// before it closes a connection whose request body it did not read.
func (c *clientConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// Close closes the connection, first lingering after an answer of the
// server's own. (net/http closes it once; the drain closes what is under
// it.)
func (c *clientConn) Close() error {
	c.mu.Lock()
	linger := c.answered || c.linger
	c.mu.Unlock()
	if linger {
		engine.LingerClose(c.Conn)
	}
	return c.Conn.Close()
}

// began marks the request whose head net/http read as served: a handler
// runs for it. bodyless says that it has no body, so what was read after
// its head is the next request's. It reports false when the connection
// was answered already: the request, which net/http parsed from what it
// had read ahead, must not be served.
func (c *clientConn) began(bodyless bool) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.answered {
		return false
	}
	c.served, c.kept = true, true
	c.headDue = time.Time{}
	c.head.Bodyless = bodyless
	return true
}

// idle readies the connection for its next request (StateIdle). A next
// section already read, with the request before it, is refused at once
// if it has a bare LF or is too large: net/http would parse it from its
// buffer without another read.
func (c *clientConn) idle() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.served = false
	c.headDue = time.Time{}
	c.head.Start()
	if d := c.s.limits.ReadHeaderTimeout; d > 0 && c.head.Begun() {
		// The next section began in what was read with the request
		// before: its clock starts now, and net/http's wait for its
		// first bytes with the idle timeout (SetReadDeadline, which it
		// calls next) is kept within it.
		c.headDue = time.Now().Add(d)
	}
	switch {
	case c.answered:
		return
	case c.head.Refuse():
		c.refused = engine.ErrBareLF
	case c.head.Framing() != nil:
		c.refused = c.head.Framing()
	case c.head.Len() > c.s.limits.MaxHeaderBytes:
		c.refused = engine.ErrTooLarge
	default:
		return
	}
	c.answer(c.refused.Status, c.refused.Detail)
}

// answer writes the server's own answer (c.mu is held): a problem with
// status and detail, the connection closing after it.
func (c *clientConn) answer(status int, detail string) {
	c.answered = true
	p := core.Problem{Status: status, Detail: detail}
	body := p.AppendJSON(nil)
	fields, _ := core.ProblemFields(nil, nil, 0, len(body))
	b := make([]byte, 0, 256+len(body))
	b = append(b, "HTTP/1.1 "...)
	b = append(b, byte('0'+status/100), byte('0'+status/10%10), byte('0'+status%10), ' ')
	b = append(b, core.StatusText(status)...)
	b = append(b, "\r\nDate: "...)
	b = time.Now().UTC().AppendFormat(b, http.TimeFormat)
	b = append(b, "\r\n"...)
	for _, f := range fields {
		b = engine.AppendField(b, f.Name, f.Value)
	}
	b = append(b, "Connection: close\r\n\r\n"...)
	b = append(b, body...)
	_ = c.Conn.SetWriteDeadline(time.Now().Add(c.s.limits.SendTimeout))
	_, _ = c.Conn.Write(b)
	c.s.h.c.Responded(status, 0)
}

// ownDetail is the problem detail of net/http's own answer of status,
// whose status line says reason after the code: the one the other
// engines give for the same fault where it is known, else net/http's
// words.
func ownDetail(status int, reason []byte) string {
	switch status {
	case http.StatusRequestHeaderFieldsTooLarge:
		return engine.ErrTooLarge.Detail
	case http.StatusHTTPVersionNotSupported:
		return engine.ErrVersion.Detail
	case http.StatusNotImplemented:
		return engine.ErrCoding.Detail
	case http.StatusExpectationFailed:
		return "an Expect other than 100-continue"
	}
	// "Bad Request: missing required Host header"
	if _, why, ok := bytes.Cut(reason, []byte(": ")); ok && len(why) > 0 {
		return string(why)
	}
	return "malformed request"
}

// ownStatus reads the status line at the start of p, which net/http
// writes whole in its first write of an answer: the code, and what
// follows it on the line.
func ownStatus(p []byte) (status int, reason []byte, ok bool) {
	if len(p) < 12 || !bytes.HasPrefix(p, []byte("HTTP/1.")) || p[8] != ' ' {
		return 0, nil, false
	}
	for _, d := range p[9:12] {
		if d < '0' || d > '9' {
			return 0, nil, false
		}
		status = status*10 + int(d-'0')
	}
	line, _, _ := bytes.Cut(p[12:], []byte("\r\n"))
	return status, line, true
}

// lingerAtClose makes the close linger: what the client still sends
// would otherwise reset the connection, and a reset drops what it has
// not yet read of the answer.
func (c *clientConn) lingerAtClose() {
	c.mu.Lock()
	c.linger = true
	c.mu.Unlock()
}
