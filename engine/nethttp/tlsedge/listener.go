package tlsedge

import (
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/preforkd/preforkd/engine"
)

// listener is an Edge's TLS listener. It makes the handshakes itself,
// each in a goroutine of its own, bounded by the Server's
// read_header_timeout: an HTTP/2 connection it serves there, and an
// HTTP/1.1 one it hands to net/http (Accept) with its handshake done, as
// a connection net/http may wrap like a cleartext one, so that the
// Server's checks of what a client sends (nethttp's clientConn) see the
// bytes past TLS. (net/http makes the handshake itself only of a
// *tls.Conn it is given unwrapped.)
//
// A connection is reported to the Server's ConnState hook as new when it
// is accepted, so that the drain rule sees it during its handshake;
// net/http reports the same *tls.Conn (under its wrapper) for HTTP/1.1,
// HTTP/2's server its own wrapper of it, and a connection that never got
// that far is reported closed here.
type listener struct {
	net.Listener
	e     *edge
	ready chan net.Conn // HTTP/1.1 connections, handshake done, for Accept
	ended chan struct{} // closed once the accept loop ended and no connection it accepted is on its way to Accept

	mu       sync.Mutex
	err      error                  // why the accept loop ended
	loopDone bool                   // the accept loop ended
	closed   bool                   // Close was called
	pending  map[*tls.Conn]*pending // accepted, not yet served nor closed
}

// pending is a connection on its way to Accept or the HTTP/2 server.
type pending struct {
	accepted  time.Time
	handshake bool // its handshake is under way
}

// Accept returns the HTTP/1.1 connections whose handshake is done. Once
// the listener under it stopped accepting (a drain closed it), Accept
// still returns those accepted before, as their handshakes end: each may
// carry a request, which the drain rule serves (engine.DrainNewGrace).
func (l *listener) Accept() (net.Conn, error) {
	select {
	case c := <-l.ready:
		return c, nil
	case <-l.ended:
		l.mu.Lock()
		defer l.mu.Unlock()
		if l.err != nil && !l.closed {
			return nil, l.err
		}
		return nil, net.ErrClosed
	}
}

func (l *listener) Close() error {
	l.mu.Lock()
	l.closed = true
	l.mu.Unlock()
	return l.Listener.Close()
}

// acceptLoop accepts until the listener fails or is closed (the
// listener under it retries what is transient), a handshake for each.
// A handshake still under way when it ends has until
// engine.DrainNewGrace from its accept, as a connection that sent no
// request has in a drain, if read_header_timeout would give it more.
func (l *listener) acceptLoop() {
	for {
		raw, err := l.Listener.Accept()
		if err != nil {
			l.mu.Lock()
			l.err, l.loopDone = err, true
			for c, p := range l.pending {
				if p.handshake && engine.DrainNewGrace < l.e.limits.ReadHeaderTimeout {
					_ = c.SetDeadline(p.accepted.Add(engine.DrainNewGrace))
				}
			}
			l.endIfDone()
			l.mu.Unlock()
			return
		}
		c := tls.Server(raw, l.e.conf)
		l.state(c, http.StateNew)
		now := time.Now()
		if d := l.e.limits.ReadHeaderTimeout; d > 0 {
			_ = c.SetDeadline(now.Add(d)) // before the end of the loop may move it
		}
		l.mu.Lock()
		if l.pending == nil {
			l.pending = make(map[*tls.Conn]*pending)
		}
		l.pending[c] = &pending{accepted: now, handshake: true}
		l.mu.Unlock()
		go l.handshake(c)
	}
}

// endIfDone ends Accept once the accept loop ended and nothing it
// accepted is on its way (l.mu is held).
func (l *listener) endIfDone() {
	if l.loopDone && len(l.pending) == 0 {
		select {
		case <-l.ended:
		default:
			close(l.ended)
		}
	}
}

// done takes c off the connections on their way.
func (l *listener) done(c *tls.Conn) {
	l.mu.Lock()
	delete(l.pending, c)
	l.endIfDone()
	l.mu.Unlock()
}

// state reports c's state to the Server's ConnState hook.
func (l *listener) state(c net.Conn, st http.ConnState) {
	if h := l.e.srv.ConnState; h != nil {
		h(c, st)
	}
}

// handshake makes c's handshake, then serves it over HTTP/2 or hands it
// to Accept, as the client chose.
func (l *listener) handshake(c *tls.Conn) {
	srv := l.e.srv
	err := c.Handshake()
	l.mu.Lock()
	// Its deadline is its own from now on: the accept loop's end moves
	// only those of handshakes under way.
	l.pending[c].handshake = false
	accepted := l.pending[c].accepted
	l.mu.Unlock()
	if err != nil {
		reason := err.Error()
		var re tls.RecordHeaderError
		if errors.As(err, &re) && re.Conn != nil && looksLikeHTTP(re.RecordHeader) {
			// As net/http answers a cleartext request on its TLS port.
			_, _ = io.WriteString(re.Conn, "HTTP/1.0 400 Bad Request\r\n\r\nClient sent an HTTP request to an HTTPS server.\n")
			reason = "client sent an HTTP request to an HTTPS server"
		}
		if srv.ErrorLog != nil {
			// The words net/http logs a failed handshake with: the
			// Server's log gates them by these.
			srv.ErrorLog.Printf("http: TLS handshake error from %s: %v", c.RemoteAddr(), reason)
		}
		c.Close()
		l.state(c, http.StateClosed)
		l.done(c)
		return
	}
	_ = c.SetDeadline(time.Time{})
	if c.ConnectionState().NegotiatedProtocol == "h2" && l.e.h2 != nil {
		l.done(c)
		l.e.serveH2(srv, c, srv.Handler, accepted)
		c.Close()
		l.state(c, http.StateClosed)
		return
	}
	// Accept takes it: it cannot end before.
	l.ready <- acceptedConn{Conn: c, at: accepted}
	l.done(c)
}

// acceptedConn is an HTTP/1.1 connection as Accept returns it: with when
// it was accepted, from which its first header section is due
// (nethttp.Edge).
type acceptedConn struct {
	*tls.Conn
	at time.Time
}

func (a acceptedConn) Accepted() (net.Conn, time.Time) { return a.Conn, a.at }

// looksLikeHTTP reports whether a TLS record header is the start of a
// cleartext HTTP request.
func looksLikeHTTP(hdr [5]byte) bool {
	switch string(hdr[:]) {
	case "GET /", "HEAD ", "POST ", "PUT /", "OPTIO":
		return true
	}
	return false
}
