//lint:file-ignore SA1019 x/net's http2.Server is the one HTTP/2 server that serves a connection handed to it (ServeConn), which the flood guard (h2guard.go) needs; net/http's own HTTP/2, which its deprecation points to, takes none.

// Package tlsedge is the net/http engine's TLS, and HTTP/2 over it: an
// nethttp.Edge. It is a package of its own so that a program serving
// cleartext HTTP/1.1 with the engine links neither TLS serving nor
// x/net's HTTP/2 server (about 1.1 MB of an embedding binary).
//
// HTTP/2 is x/net's server, each connection read through a guard that
// cuts off the known floods (rapid reset, CONTINUATION, HPACK bombs:
// h2guard.go), with MaxConcurrentStreams streams at most, the Server's
// idle timeout and send_timeout on each write.
package tlsedge

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/textproto"
	"slices"
	"strings"
	"time"

	"golang.org/x/net/http2"

	"github.com/preforkd/preforkd/engine"
	"github.com/preforkd/preforkd/engine/nethttp"
)

// Options configures an Edge.
type Options struct {
	// Config is the TLS configuration (required, with a certificate:
	// Certificates, GetCertificate or GetConfigForClient): its certificates, and
	// with "h2" in its NextProtos, HTTP/2 for the clients that ask for it.
	// The handshake is bounded by the Server's ReadHeaderTimeout. The edge
	// serves this Config itself, not a copy, so that what changes it while
	// it serves takes effect (its session ticket keys: tlsconf.Rotate);
	// New adds "http/1.1" to its NextProtos.
	Config *tls.Config
	// MaxConcurrentStreams bounds the streams of one HTTP/2 connection.
	// 0 means DefaultMaxConcurrentStreams.
	MaxConcurrentStreams uint32
}

// DefaultMaxConcurrentStreams is Options.MaxConcurrentStreams's default
// (nginx's http2_max_concurrent_streams).
const DefaultMaxConcurrentStreams = 128

// New returns an Edge for one nethttp.Server (ServerOptions.Edge); a second
// Server given it is refused by its NewServer.
func New(o Options) (nethttp.Edge, error) {
	if o.Config == nil {
		return nil, errors.New("tlsedge: Options.Config is nil")
	}
	if c := o.Config; len(c.Certificates) == 0 && c.GetCertificate == nil && c.GetConfigForClient == nil {
		// Every handshake would fail.
		return nil, errors.New("tlsedge: Options.Config has no certificate: set its Certificates (or GetCertificate)")
	}
	e := &edge{conf: o.Config, streams: o.MaxConcurrentStreams}
	if e.streams == 0 {
		e.streams = DefaultMaxConcurrentStreams
	}
	// HTTP/1.1 is always served: offered after what the configuration
	// prefers (as net/http's ServeTLS offers it).
	if !slices.Contains(e.conf.NextProtos, "http/1.1") {
		e.conf.NextProtos = append(e.conf.NextProtos, "http/1.1")
	}
	return e, nil
}

type edge struct {
	srv     *http.Server // the Server's, which serves the HTTP/1.1 connections
	conf    *tls.Config
	streams uint32
	limits  engine.Limits
	log     *slog.Logger

	// HTTP/2: its server, the settings it takes from the Server's
	// (h2base), and a server that has nothing but the HTTP/2 server's
	// graceful shutdown to run (goaway).
	h2     *http2.Server
	h2base *http.Server
	goaway *http.Server
	cuts   [floodKinds]engine.WarnGate // log lines about flooding clients cut off, by kind
}

func (e *edge) Configure(srv *http.Server, lim engine.Limits, log *slog.Logger) error {
	if e.srv != nil {
		// The first Server's HTTP/2 connections would be served by srv's
		// handler, and its Shutdown would not drain them.
		return errors.New("tlsedge: the Edge serves another Server already: build one with tlsedge.New for each")
	}
	e.srv, e.limits, e.log = srv, lim, log
	// Never net/http's own HTTP/2: the floods are bounded here.
	srv.TLSNextProto = map[string]func(*http.Server, *tls.Conn, http.Handler){}
	if !slices.Contains(e.conf.NextProtos, http2.NextProtoTLS) {
		return nil
	}
	e.h2 = &http2.Server{
		MaxConcurrentStreams: e.streams,
		IdleTimeout:          lim.IdleTimeout,
		// A client that stops reading blocks the connection's writer:
		// past send_timeout without progress, the connection is closed.
		WriteByteTimeout: lim.SendTimeout,
	}
	// srv's settings, but max_header_bytes doubled: the HTTP/2 server
	// makes its header list bound of it (and of HPACK strings, whose
	// excess is a connection error) with a padding of its own, and
	// answers a list over it with a 431 of its own, before any handler
	// runs. Doubled, that bound is past the guard's (an HPACK bomb's):
	// every list the guard lets through reaches the nethttp.Server,
	// which refuses one over max_header_bytes as on HTTP/1.1.
	e.h2base = &http.Server{
		TLSConfig:         srv.TLSConfig,
		ReadTimeout:       srv.ReadTimeout,
		ReadHeaderTimeout: srv.ReadHeaderTimeout,
		WriteTimeout:      srv.WriteTimeout,
		IdleTimeout:       srv.IdleTimeout,
		MaxHeaderBytes:    2 * lim.MaxHeaderBytes,
		ConnState:         srv.ConnState,
		ErrorLog:          srv.ErrorLog,
		BaseContext:       srv.BaseContext,
		ConnContext:       srv.ConnContext,
		HTTP2:             srv.HTTP2,
	}
	e.goaway = &http.Server{}
	if err := http2.ConfigureServer(e.goaway, e.h2); err != nil {
		return fmt.Errorf("tlsedge: HTTP/2: %w", err)
	}
	srv.TLSNextProto[http2.NextProtoTLS] = func(hs *http.Server, c *tls.Conn, h http.Handler) {
		e.serveH2(hs, c, h, time.Now())
	}
	return nil
}

func (e *edge) Listener(ln net.Listener) net.Listener {
	l := &listener{Listener: ln, e: e, ready: make(chan net.Conn), ended: make(chan struct{})}
	go l.acceptLoop()
	return l
}

func (e *edge) Shutdown(ctx context.Context) error {
	if e.goaway == nil {
		return nil
	}
	return e.goaway.Shutdown(ctx)
}

// serveH2 serves an HTTP/2 connection accepted at accepted, through its
// flood guard, with hs's settings and hooks.
func (e *edge) serveH2(hs *http.Server, c *tls.Conn, h http.Handler, accepted time.Time) {
	g := newH2Guard(c, e.limits.MaxHeaderBytes, e.limits.ReadHeaderTimeout, func(err *errFlood) {
		if args, ok := e.cuts[err.kind].Args(time.Now(), "client", c.RemoteAddr().String(), "why", err.why); ok {
			e.log.Warn("HTTP/2 client cut off", args...)
		}
	})
	if d := e.limits.ReadHeaderTimeout; d > 0 {
		// The guard awaits the first header block from now; it is due
		// from the accept, as an HTTP/1.1 connection's first section:
		// the handshake took part of read_header_timeout.
		_ = c.SetReadDeadline(accepted.Add(d))
	}
	// net/http does not tell the ConnState hook that the connection is
	// active, and the HTTP/2 server tells it of Active and Idle only once
	// it serves: the drain rule must not take it meanwhile for one that
	// never sent a request.
	if hs.ConnState != nil {
		hs.ConnState(g, http.StateActive)
	}
	e.h2.ServeConn(g, &http2.ServeConnOpts{BaseConfig: e.h2base, Handler: trimmed{h}})
}

// trimmed serves HTTP/2 streams with h, each field value without the
// whitespace around it: net/http strips it from HTTP/1 fields, x/net's
// HTTP/2 server passes it on (RFC 9113 §8.2.1 makes such a value
// malformed), and the upstream, which gets the field over HTTP/1.1,
// reads it stripped. Seen as sent by the core, " k" and "k" would be two
// clients of a rule by header and one of the application.
type trimmed struct{ h http.Handler }

func (t trimmed) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	for name, vs := range r.Header {
		for i, v := range vs {
			if name == "Cookie" {
				v = trimCrumbs(v)
				vs[i] = v
			}
			if v != "" && (blank(v[0]) || blank(v[len(v)-1])) {
				vs[i] = textproto.TrimString(v)
			}
		}
	}
	t.h.ServeHTTP(w, r)
}

// trimCrumbs is a Cookie value that x/net's server joined with "; " from
// the crumbs a client split it into (RFC 9113 §8.2.3), each crumb without
// the whitespace around it, as any field value: "a=1 " and " b=2" make
// "a=1; b=2", the Cookie line of the same pairs over HTTP/1.1, not
// "a=1 ;  b=2", which the upstream got and which varied a cached answer
// by Cookie apart from the line's. A crumb of whitespace alone is none.
// One field spaced so is rewritten alike: a cookie-string has no
// whitespace around its ';' (RFC 6265 §4.2.1), and the joint cannot be
// told from it.
func trimCrumbs(v string) string {
	if !strings.Contains(v, " ;") && !strings.Contains(v, "\t;") && !strings.Contains(v, ";  ") && !strings.Contains(v, "; \t") {
		return v
	}
	var b strings.Builder
	for c := range strings.SplitSeq(v, ";") {
		if c = textproto.TrimString(c); c != "" {
			if b.Len() > 0 {
				b.WriteString("; ")
			}
			b.WriteString(c)
		}
	}
	return b.String()
}

func blank(c byte) bool { return c == ' ' || c == '\t' }
