package nethttp

import (
	"context"
	"crypto/tls"
	"log/slog"
	"net"
	"net/http"

	"github.com/preforkd/preforkd/engine"
)

// Edge is what a Server speaks to its clients besides cleartext HTTP/1.1:
// TLS, and HTTP/2 over it. Package tlsedge builds one (tlsedge.New); a
// Server without one (ServerOptions.Edge nil) serves cleartext HTTP/1.1,
// and a program that never builds one links neither TLS serving nor an
// HTTP/2 server: an embedding binary is about 1.1 MB smaller for it.
// An Edge serves one Server.
type Edge interface {
	// Configure readies srv, once, before it serves, and keeps it:
	// lim are the Server's limits (defaults applied) and log where to
	// warn of clients cut off. An HTTP/2 connection is served with
	// srv's handler, and reported to srv.ConnState as a net.Conn with a
	// method TLSConn() *tls.Conn naming the TLS connection under it; its
	// streams count as requests in progress.
	Configure(srv *http.Server, lim engine.Limits, log *slog.Logger) error
	// Listener returns ln speaking TLS. It makes each handshake itself,
	// within lim.ReadHeaderTimeout (a failed one is logged on
	// srv.ErrorLog in net/http's words), serves the HTTP/2 connections
	// (their first header block due lim.ReadHeaderTimeout from the
	// accept, as on HTTP/1.1), and returns from Accept the HTTP/1.1
	// ones, handshake done, each as a net.Conn with a method Accepted()
	// (net.Conn, time.Time) that gives the connection, with a method
	// ConnectionState() tls.ConnectionState, and when ln accepted it:
	// the Server wraps the connection as it wraps cleartext ones, has
	// its first header section whole within lim.ReadHeaderTimeout of
	// that time, and gives its state to each request as Request.TLS. Each connection is reported to
	// srv.ConnState as the TLS connection: new when accepted, closed
	// if it ends before net/http or the HTTP/2 server serves it.
	Listener(ln net.Listener) net.Listener
	// Shutdown tells every HTTP/2 connection to finish (GOAWAY) and
	// returns once they did or ctx is done: the drain rule's step 2
	// for HTTP/2.
	Shutdown(ctx context.Context) error
}

// h2Conn is an Edge's HTTP/2 connection as the ConnState hook sees it.
type h2Conn interface{ TLSConn() *tls.Conn }
