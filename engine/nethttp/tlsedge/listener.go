package tlsedge

import (
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"sync"
	"time"
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
	done  chan struct{} // closed by Close

	closeOnce sync.Once
	errMu     sync.Mutex
	err       error // why the accept loop ended
}

func (l *listener) Accept() (net.Conn, error) {
	select {
	case c := <-l.ready:
		return c, nil
	case <-l.done:
		l.errMu.Lock()
		defer l.errMu.Unlock()
		if l.err != nil {
			return nil, l.err
		}
		return nil, net.ErrClosed
	}
}

func (l *listener) Close() error {
	err := l.Listener.Close()
	l.end(net.ErrClosed)
	return err
}

// end stops Accept with err (the first reason given).
func (l *listener) end(err error) {
	l.closeOnce.Do(func() {
		l.errMu.Lock()
		l.err = err
		l.errMu.Unlock()
		close(l.done)
	})
}

// acceptLoop accepts until the listener fails or is closed (the
// listener under it retries what is transient), a handshake for each.
func (l *listener) acceptLoop() {
	for {
		raw, err := l.Listener.Accept()
		if err != nil {
			l.end(err)
			return
		}
		c := tls.Server(raw, l.e.conf)
		l.state(c, http.StateNew)
		go l.handshake(c)
	}
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
	if d := l.e.limits.ReadHeaderTimeout; d > 0 {
		_ = c.SetDeadline(time.Now().Add(d))
	}
	if err := c.Handshake(); err != nil {
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
		return
	}
	_ = c.SetDeadline(time.Time{})
	if c.ConnectionState().NegotiatedProtocol == "h2" && l.e.h2 != nil {
		l.e.serveH2(srv, c, srv.Handler)
		c.Close()
		l.state(c, http.StateClosed)
		return
	}
	select {
	case l.ready <- c:
	case <-l.done:
		c.Close()
		l.state(c, http.StateClosed)
	}
}

// looksLikeHTTP reports whether a TLS record header is the start of a
// cleartext HTTP request.
func looksLikeHTTP(hdr [5]byte) bool {
	switch string(hdr[:]) {
	case "GET /", "HEAD ", "POST ", "PUT /", "OPTIO":
		return true
	}
	return false
}
