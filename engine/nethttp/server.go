package nethttp

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/preforkd/preforkd/core"
	"github.com/preforkd/preforkd/engine"
	"github.com/preforkd/preforkd/internal/httpfield"
	"github.com/preforkd/preforkd/internal/waitfor"
	"github.com/preforkd/preforkd/metrics"
)

// ServerOptions configures a [Server].
type ServerOptions struct {
	// Core runs each request (required).
	Core *core.Core
	// Handler is the application: it serves what the core lets through.
	// Exactly one of Handler and Upstream is set.
	Handler http.Handler
	// Upstream is the application the Server forwards what the core lets
	// through to itself (NewUpstream, over the same Core), over HTTP/1.1
	// on pooled keep-alive connections, by the fast engine's rules (see
	// forward.go). What a TLS or HTTP/2 listener of the daemon is served
	// with.
	Upstream Upstream
	// Edge, when set, makes every listener speak TLS, and HTTP/2 over it
	// to the clients that ask (package tlsedge), each stream a request to
	// the core. nil: cleartext HTTP/1.1.
	Edge Edge
	// Limits are the timeouts and limits of the worker's clients
	// (engine.Limits: the [server] keys); zero values are the defaults.
	Limits engine.Limits
	// Options tune the adapter in front of Handler.
	Options Options
	// Logger receives net/http's own error lines, at warn. nil means
	// slog.Default().
	Logger *slog.Logger
}

// Server is the net/http engine: an http.Server in front of which the
// core runs every request, honouring engine.Limits and draining by
// engine's rule. It serves any number of listeners, each bounded by
// Limits.MaxConnections on its own.
type Server struct {
	h      *Handler
	srv    *http.Server
	limits engine.Limits
	conns  connTracker
	log    *slog.Logger
	edge   Edge // TLS and HTTP/2, or nil
	// acceptWarn lets a failed accept's line through once a second: out
	// of descriptors, each listener retries up to a second apart, and
	// from 5 ms again after every connection it could take.
	acceptWarn engine.WarnGate

	mu  sync.Mutex
	lns []net.Listener
	wg  sync.WaitGroup // Serve calls

	// Upgraded connections are no longer net/http's: the Server counts
	// the handlers running and keeps the hijacked connections, so that
	// Shutdown returns only once no handler can touch the core.
	handlers atomic.Int64
	hjMu     sync.Mutex
	hijacked map[*hijackedConn]struct{}
}

// NewServer returns a Server for o, or an error for options that make no
// sense (a *engine.FieldError for a bad limit).
func NewServer(o ServerOptions) (*Server, error) {
	switch {
	case o.Core == nil:
		return nil, errors.New("nethttp: ServerOptions.Core is nil")
	case o.Handler == nil && o.Upstream == nil:
		return nil, errors.New("nethttp: ServerOptions: neither Handler nor Upstream is set")
	case o.Handler != nil && o.Upstream != nil:
		return nil, errors.New("nethttp: ServerOptions: both Handler and Upstream are set")
	}
	lim, err := o.Limits.WithDefaults()
	if err != nil {
		return nil, err
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	s := &Server{h: newHandler(o.Core, o.Handler, o.Options), limits: lim, log: o.Logger}
	s.conns.cm = o.Core.Conns()
	s.h.fwd = o.Upstream
	s.srv = &http.Server{
		Handler:           s,
		ReadHeaderTimeout: lim.ReadHeaderTimeout,
		IdleTimeout:       lim.IdleTimeout,
		// net/http reads up to MaxHeaderBytes plus 4 KiB of slack before
		// it answers 431: the slack is taken off, so that the bound is the
		// one every engine keeps.
		MaxHeaderBytes: max(lim.MaxHeaderBytes-4<<10, 1),
		ConnState:      s.trackConn,
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			return context.WithValue(ctx, connKey{}, c)
		},
		ErrorLog: log.New(&errorLog{log: o.Logger}, "", 0),
	}
	// OPTIONS * is ServeHTTP's: refuseUnforwardable's when forwarding,
	// else answered as net/http answers it, but as a request the Server
	// saw (clientConn, counted).
	s.srv.DisableGeneralOptionsHandler = true
	if s.edge = o.Edge; s.edge != nil {
		if err := s.edge.Configure(s.srv, lim, o.Logger); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// Handler is the adapter the Server serves with.
func (s *Server) Handler() *Handler { return s.h }

// Serve serves the connections of ln until Shutdown (it returns nil then)
// or a failure of ln. At most Limits.MaxConnections of ln's connections
// are open at once: the bound is each listener's. (Shared by several,
// the slot a listener takes before it accepts would sit idle while other
// listeners' clients waited for one.)
func (s *Server) Serve(ln net.Listener) error {
	l := engine.NewListener(ln, s.limits.MaxConnections, func(err error, wait time.Duration) {
		if args, ok := s.acceptWarn.Args(time.Now(), "err", err, "retry_in", wait); ok {
			s.log.Warn("accepting a connection failed; retrying", args...)
		}
	})
	l.OnFull = s.conns.cm.MaxReached
	s.mu.Lock()
	if s.conns.draining.Load() {
		s.mu.Unlock()
		l.Close()
		return nil
	}
	s.lns = append(s.lns, l)
	s.wg.Add(1)
	s.mu.Unlock()
	defer s.wg.Done()
	var sl net.Listener = l
	if s.edge != nil {
		sl = s.edge.Listener(l)
	}
	sl = clientListener{sl, s}
	err := s.srv.Serve(sl)
	if errors.Is(err, http.ErrServerClosed) || errors.Is(err, net.ErrClosed) || s.conns.draining.Load() {
		return nil
	}
	return err
}

// ServeHTTP applies the per-read and per-write timeouts, and the drain's
// Connection: close, around the adapter.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.handlers.Add(1)
	defer s.handlers.Add(-1)
	var cc *clientConn
	if r.ProtoMajor == 1 {
		// Every HTTP/1 connection is a clientConn (clientListener).
		cc, _ = r.Context().Value(connKey{}).(*clientConn)
		if cc != nil {
			s.conns.writing(cc.Conn)
			if !cc.began(r.Body == http.NoBody) {
				// Refused already (clientConn.idle): what net/http writes
				// for it goes nowhere, and the connection closes.
				w.Header().Set("Connection", "close")
				return
			}
			if r.TLS == nil {
				r.TLS = cc.tls
			}
		}
	} else if headLen(r) > s.limits.MaxHeaderBytes {
		// An HTTP/2 stream's header list, which an Edge's server lets
		// through up to twice the bound: refused as net/http's reader
		// refuses an HTTP/1 section over it (clientConn), the
		// connection kept.
		s.h.c.Responded(writeOwnProblem(w, r, engine.ErrTooLarge.Status, engine.ErrTooLarge.Detail), 0)
		return
	}
	// net/http keeps an HTTP/1.0 connection whose Connection says
	// keep-alive beside close (it reads the first line only, and finds
	// keep-alive there); close wins (RFC 9112 §9.6), as r.Close says.
	closing := r.ProtoMajor == 1 && r.Close
	if s.conns.draining.Load() || closing {
		w.Header().Set("Connection", "close") // the drain rule's step 2 (and limitWriter's)
	}
	if s.h.fwd != nil {
		start := time.Now()
		if status, ok := s.h.fwd.unforwardable(w, r); ok {
			s.h.c.Responded(status, time.Since(start)) // no exchange counts it
			return
		}
	} else if r.RequestURI == "*" && r.Method == http.MethodOptions {
		// What net/http's own handler of it does: 200, no body, and at
		// most 4 KiB of the request's read (more closes the connection).
		w.Header().Set("Content-Length", "0")
		if r.ContentLength != 0 {
			_, _ = io.Copy(io.Discard, http.MaxBytesReader(w, r.Body, 4<<10))
		}
		s.h.c.Responded(http.StatusOK, 0)
		return
	}
	var body *bodyReader
	if r.Body != nil && r.Body != http.NoBody {
		body = &bodyReader{ReadCloser: r.Body, r: r, w: w, timeout: s.limits.ClientBodyTimeout,
			expect: httpfield.HasToken(r.Header["Expect"], "100-continue"), h2: r.ProtoMajor == 2, cc: cc}
		r.Body = body
	}
	lw := limitWriterPool.Get().(*limitWriter)
	*lw = limitWriter{w: w, timeout: s.limits.SendTimeout, s: s, h2: r.ProtoMajor == 2, closing: closing}
	if r.ProtoMajor == 1 {
		lw.body = body
	}
	s.h.ServeHTTP(lw, r)
	lw.head() // net/http writes the head of a response the handler left unwritten
	if !lw.hijacked {
		// net/http writes what the handler left buffered (and the HTTP/2
		// server the end of the stream) once it returns: within
		// send_timeout from now, not from the handler's last write, which
		// may have been long before (work done after a short answer).
		lw.deadline(true)
	}
	*lw = limitWriter{}
	limitWriterPool.Put(lw)
}

// headLen is the size of r's header section as its HTTP/1.1 twin sends
// it: the request line, Host, a line per field value, the empty line.
func headLen(r *http.Request) int {
	n := len(r.Method) + len(r.RequestURI) + len(r.Host) + len("  HTTP/1.1\r\nHost: \r\n\r\n")
	for name, vs := range r.Header {
		if name != "Host" {
			for _, v := range vs {
				n += len(name) + len(": \r\n") + len(v)
			}
		}
	}
	return n
}

// Shutdown drains by the rule of a retiring worker (engine's drain rule):
// it stops accepting, answers every request from now on with Connection:
// close, closes each connection with no request in progress once it has
// been idle for engine.DrainIdleGrace (engine.DrainNewGrace when it never
// sent one), and returns once none is left, no handler runs (an upgraded
// connection's ends with it) and the background refreshes ended — or
// when ctx is done, having closed the rest, with ctx's error.
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	s.conns.draining.Store(true) // step 2, for every request that starts now
	lns := s.lns
	s.mu.Unlock()
	for _, l := range lns {
		l.Close() // step 1
	}
	if s.edge != nil {
		// Step 2 for HTTP/2: GOAWAY on every connection served now; each
		// closes once its streams in flight are answered. One whose
		// handshake ends later is told by its first response's
		// Connection: close, as an HTTP/1.1 one (a GOAWAY before it sent
		// anything would refuse what it is about to send).
		go s.edge.Shutdown(ctx)
	}
	served := make(chan struct{})
	go func() { s.wg.Wait(); close(served) }()
	select {
	case <-served: // every connection accepted is tracked
	case <-ctx.Done():
		// An Edge's Serve returns once the handshakes under way when its
		// listener closed have ended (each may carry a request): those
		// are cut now.
		s.conns.closeIdle(time.Now(), 0, 0, true)
	}
	s.conns.drain(ctx, engine.DrainIdleGrace, engine.DrainNewGrace) // step 3
	err := s.srv.Shutdown(ctx)                                      // nothing left, or cut (step 4)
	if err != nil || ctx.Err() != nil {
		s.srv.Close()
		// The requests waiting on a Redis decision end with their
		// connections, not when redis.timeout would.
		s.h.c.Cut()
		// net/http closes only what it serves: an Edge's connections in
		// their handshake and its HTTP/2 ones, which the drain waited
		// for, are the tracker's to cut.
		s.conns.closeIdle(time.Now(), 0, 0, true)
		if s.h.fwd != nil {
			// A body read on for the core, its client gone, waits on
			// the upstream only: its handler ends once it is cut.
			s.h.fwd.cut()
		}
		err = cmp.Or(err, ctx.Err())
	}
	gone := waitfor.Cond(engine.CloseWait, s.conns.gone)
	// Handlers still running serve upgraded connections (or were cut
	// above): they have until ctx is done, then their connections are
	// closed under them. When the connections cut did not let go, a
	// handler that ignores its request's end holds one: it is the same
	// handler, and is not waited for twice, so that what the worker
	// defers runs within one CloseWait past ctx (the supervisor's
	// patience is longer).
	noHandler := func() bool { return s.handlers.Load() == 0 }
	if !waitfor.Until(ctx, noHandler) {
		// One may wait on a Redis decision, its connection gone before
		// the drain ended (an HTTP/2 client's reset): cut too.
		s.h.c.Cut()
		err = cmp.Or(err, ctx.Err())
		s.closeHijacked()
		if gone {
			waitfor.Cond(engine.CloseWait, noHandler)
		}
	}
	refreshed := make(chan struct{})
	go func() { s.h.Wait(); close(refreshed) }()
	select {
	case <-refreshed:
	case <-ctx.Done():
		err = errors.Join(err, ctx.Err())
		if s.h.fwd != nil {
			// A refresh waits on the upstream only: cut, it ends.
			s.h.fwd.cut()
			select {
			case <-refreshed:
			case <-time.After(engine.CloseWait):
			}
		}
	}
	if s.h.fwd != nil {
		s.h.fwd.close()
	}
	return err
}

// bodyReader moves the connection's read deadline before each read of a
// request body: Limits.ClientBodyTimeout is the longest wait between two.
type bodyReader struct {
	io.ReadCloser
	r       *http.Request // the request whose body it is
	w       http.ResponseWriter
	timeout time.Duration
	ended   bool        // read to its end
	failed  bool        // a read failed (client_body_timeout): the rest will not come in time
	err     error       // what the failed read returned; under mu (gone)
	expect  bool        // the client waits for 100 Continue before it sends the body
	read    bool        // Read was called: a 100 Continue went, if expected
	h2      bool        // the body is an HTTP/2 stream's
	cc      *clientConn // an HTTP/1 request's connection, or nil

	mu      sync.Mutex // orders deadline and StopReading, which run in two goroutines, and err's write and read
	stopped bool       // StopReading was called: no read waits any more
}

func (b *bodyReader) Read(p []byte) (int, error) {
	b.read = true
	if !b.deadline(time.Now().Add(b.timeout)) {
		b.failed = true
		return 0, errReadStopped
	}
	n, err := b.ReadCloser.Read(p)
	if b.h2 {
		// On HTTP/2 the deadline is a timer of the stream's that ends its
		// body when it fires, a read pending or not: left armed, it would
		// fail the body of a client that sent all it was let send while
		// the reader paused (an upstream slow to take an upload) for
		// longer than client_body_timeout. On HTTP/1 it is the
		// connection's, which only a read in progress meets.
		b.deadline(time.Time{})
	}
	switch {
	case err == io.EOF:
		b.ended = true
	case err != nil:
		b.mu.Lock()
		b.failed, b.err = true, err
		b.mu.Unlock()
	}
	return n, err
}

// gone reports whether a read of the body failed because its client went
// away (bodyGone), not because the body ended short or came too slowly.
// The response's writer asks, perhaps on another goroutine than the
// reader's (a full-duplex handler): err is read under mu.
func (b *bodyReader) gone() bool {
	b.mu.Lock()
	err := b.err
	b.mu.Unlock()
	return err != nil && !errors.Is(err, os.ErrDeadlineExceeded) && bodyGone(b.r, err)
}

// deadline sets the read deadline (zero: none), unless reading was
// stopped.
func (b *bodyReader) deadline(at time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.stopped {
		return false
	}
	if d, ok := b.w.(interface{ SetReadDeadline(time.Time) error }); ok {
		_ = d.SetReadDeadline(at)
	}
	return true
}

// errReadStopped is a read of a body whose reading was stopped.
var errReadStopped = errors.New("nethttp: the request body is no longer read")

// StopReading ends a read of the body that waits for the client, and
// every later one: the upstream answered before it had the whole body
// (engine.SendWhileReading). The response then closes the connection
// (limitWriter.head: the read failed).
func (b *bodyReader) StopReading() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.stopped = true
	if d, ok := b.w.(interface{ SetReadDeadline(time.Time) error }); ok {
		_ = d.SetReadDeadline(time.Now())
	}
	if b.cc != nil {
		b.cc.lingerAtClose()
	}
}

// limitWriter moves the connection's write deadline before each write to
// the client: Limits.SendTimeout is the longest wait between two. It also
// keeps the drain rule's step 2: a response head written once the drain
// began says Connection: close, whenever its request came and whatever
// fields the application or the forwarder set before it.
type limitWriter struct {
	w       http.ResponseWriter
	timeout time.Duration
	s       *Server
	body    *bodyReader // an HTTP/1 request's, or nil
	headed  bool        // the final response head was written
	h2      bool        // the response is an HTTP/2 stream's
	closing bool        // the client closes the connection after the response
	// hijacked: Hijack handed the connection over; its deadlines are
	// the hijacker's.
	hijacked bool
}

// maxDrop is how much of a request body the application left unread is
// read and dropped before the response, so that the connection can carry
// the next request (net/http's own bound); past it, or past
// client_body_timeout, the connection closes after the response.
const maxDrop = 256 << 10

var limitWriterPool = sync.Pool{New: func() any { return new(limitWriter) }}

// deadline sets the write deadline send_timeout from now (before a
// write), or ends it (after one, on HTTP/2). There the deadline is a
// timer of the stream's that resets the stream when it fires, a write
// pending or not: left armed, it would cut a response whose application
// pauses between two writes (server-sent events, an upstream within
// upstream_timeout) longer than send_timeout. On HTTP/1 it is the
// connection's, which only a write in progress meets.
func (lw *limitWriter) deadline(before bool) {
	var at time.Time
	if before {
		at = time.Now().Add(lw.timeout)
	} else if !lw.h2 {
		return
	}
	if d, ok := lw.w.(interface{ SetWriteDeadline(time.Time) error }); ok {
		_ = d.SetWriteDeadline(at)
	}
}

// head is called before what writes the final response head. What is
// left of a request body is read and dropped here, each read bounded by
// client_body_timeout (net/http would read it itself, unbounded, before
// the head); a body that does not end soon enough closes the connection
// after the response.
func (lw *limitWriter) head() {
	if lw.headed {
		return
	}
	lw.headed = true
	h := lw.w.Header()
	if lw.closing || lw.s.conns.draining.Load() || lw.body != nil && (lw.body.failed || lw.body.expect && !lw.body.read) {
		// A body whose read failed is not drained: that would wait out
		// client_body_timeout once more before the answer went. Nor is
		// one the client has not sent, waiting for 100 Continue: the
		// drain's first read would send it, and the answer (a refusal,
		// most likely) would wait for the whole body (RFC 9110 §10.1.1;
		// net/http closes after such an answer too).
		h.Set("Connection", "close")
	}
	if lw.body != nil && !lw.body.ended && h.Get("Connection") != "close" {
		if _, err := io.CopyN(io.Discard, lw.body, maxDrop+1); err != io.EOF {
			h.Set("Connection", "close")
		}
	}
}

func (lw *limitWriter) Header() http.Header { return lw.w.Header() }
func (lw *limitWriter) WriteHeader(code int) {
	switch {
	case code == http.StatusSwitchingProtocols:
		lw.headed = true // the connection is the tunnel's now
	case code >= 200:
		lw.head()
	}
	lw.deadline(true)
	lw.w.WriteHeader(code)
	lw.deadline(false)
}
func (lw *limitWriter) Write(p []byte) (int, error) {
	lw.head()
	lw.deadline(true)
	n, err := lw.w.Write(p)
	lw.deadline(false)
	return n, err
}

// FlushError is Flush for http.ResponseController.
func (lw *limitWriter) FlushError() error {
	lw.head()
	lw.deadline(true)
	err := http.NewResponseController(lw.w).Flush()
	lw.deadline(false)
	return err
}

func (lw *limitWriter) Flush() { _ = lw.FlushError() }

// Unwrap lets http.ResponseController reach the connection (its
// deadlines); a hijacker owns the connection's deadlines from then on.
func (lw *limitWriter) Unwrap() http.ResponseWriter { return lw.w }

// Hijack hands the connection over, kept by the Server until it is
// closed (Shutdown closes it past its deadline).
func (lw *limitWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	c, brw, err := http.NewResponseController(lw.w).Hijack()
	if err != nil {
		return nil, nil, err
	}
	lw.headed, lw.hijacked = true, true // the connection is the hijacker's now
	hc := &hijackedConn{Conn: c, s: lw.s}
	lw.s.hjMu.Lock()
	if lw.s.hijacked == nil {
		lw.s.hijacked = make(map[*hijackedConn]struct{})
	}
	lw.s.hijacked[hc] = struct{}{}
	lw.s.hjMu.Unlock()
	return hc, brw, nil
}

// hijackedConn is an upgraded connection: it leaves the Server's set,
// and the worker's connection counts, when closed.
type hijackedConn struct {
	net.Conn
	s *Server
}

func (c *hijackedConn) Close() error {
	c.s.hjMu.Lock()
	_, open := c.s.hijacked[c]
	delete(c.s.hijacked, c)
	c.s.hjMu.Unlock()
	if open {
		c.s.conns.cm.Move(metrics.ConnWriting, metrics.ConnClosed)
	}
	return c.Conn.Close()
}

// CloseWrite half-closes the connection where it can (TCP, TLS).
func (c *hijackedConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// closeHijacked closes every upgraded connection still open.
func (s *Server) closeHijacked() {
	s.hjMu.Lock()
	cs := make([]net.Conn, 0, len(s.hijacked))
	for c := range s.hijacked {
		cs = append(cs, c)
	}
	s.hjMu.Unlock()
	for _, c := range cs {
		c.Close()
	}
}

// errorLog takes net/http's own log lines for the Server at warn: a
// handler's panic, an accept error, an HTTP/2 connection's error. Those a
// client makes at will, a failed TLS handshake (a port scanner fails one
// on every connection), an HTTP/2 connection without its preface, and
// one the client broke (a frame the protocol forbids, its GOAWAY with an
// error, no SETTINGS), go at most one a second each, the next saying how
// many were held back; the others all go.
type errorLog struct {
	log     *slog.Logger
	gate    engine.WarnGate // TLS handshakes
	preface engine.WarnGate // HTTP/2 connections that sent no preface
	broken  engine.WarnGate // HTTP/2 connections the client broke
}

func (e *errorLog) Write(p []byte) (int, error) {
	msg := strings.TrimSuffix(string(p), "\n")
	var g *engine.WarnGate
	switch {
	case strings.HasPrefix(msg, "http: TLS handshake error"):
		g = &e.gate
	case strings.HasPrefix(msg, "http2: server: error reading preface"):
		// A client that negotiated h2 and sent something else.
		g = &e.preface
	case strings.HasPrefix(msg, "http2: server connection error"),
		strings.HasPrefix(msg, "http2: received GOAWAY"),
		strings.HasPrefix(msg, "timeout waiting for SETTINGS"):
		g = &e.broken
	default:
		e.log.Warn(msg)
		return len(p), nil
	}
	if args, ok := g.Args(time.Now()); ok {
		e.log.Warn(msg, args...)
	}
	return len(p), nil
}

// connTracker follows the server's connections through http.Server's
// ConnState hook, and closes them as the drain rule says.
type connTracker struct {
	draining atomic.Bool   // set once: responses carry Connection: close
	cm       metrics.Conns // the worker's connections by state, in its row

	mu      sync.Mutex
	conns   map[net.Conn]connInfo
	changed chan struct{} // closed and replaced at every change while draining
}

type connInfo struct {
	state  http.ConnState
	since  time.Time         // when it entered state
	closed bool              // closed by the drain; the hook removes it
	metric metrics.ConnState // the state the worker's row counts it in
}

// track is an http.Server ConnState hook; h2 says that conn serves
// HTTP/2, whose requests are streams: active, it is counted as writing.
func (c *connTracker) track(conn net.Conn, st http.ConnState, h2 bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.conns == nil {
		c.conns = make(map[net.Conn]connInfo)
		c.changed = make(chan struct{})
	}
	old := c.conns[conn]
	metric := metrics.ConnClosed
	switch st {
	case http.StateNew:
		if _, seen := c.conns[conn]; !seen {
			c.cm.Accepted() // an Edge reported it before net/http did
		}
		metric = metrics.ConnReading
	case http.StateActive:
		// HTTP/1: the first byte of a request came; its head is read
		// (ServeHTTP moves it on to writing). HTTP/2: streams run, but
		// for the edge's Active on a new connection (net/http reported
		// none since StateNew), which awaits the client's preface.
		metric = metrics.ConnReading
		if h2 && old.state != http.StateNew {
			metric = metrics.ConnWriting
		}
	case http.StateIdle:
		metric = metrics.ConnIdle
	case http.StateHijacked:
		// An upgraded connection is writing until its tunnel closes it
		// (hijackedConn), as on the other engines: not gone from the
		// counts, nor from a cut drain's.
		metric = metrics.ConnWriting
	}
	c.cm.Move(old.metric, metric)
	switch st {
	case http.StateClosed, http.StateHijacked:
		delete(c.conns, conn)
	default:
		c.conns[conn] = connInfo{state: st, since: time.Now(), closed: old.closed, metric: metric}
	}
	if c.draining.Load() {
		close(c.changed)
		c.changed = make(chan struct{})
	}
}

// gone reports whether the ConnState hook saw every connection close.
func (c *connTracker) gone() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.conns) == 0
}

// writing counts conn's HTTP/1 request as in progress: its head was read.
func (c *connTracker) writing(conn net.Conn) {
	c.mu.Lock()
	if ci, ok := c.conns[conn]; ok && ci.metric == metrics.ConnReading {
		c.cm.Move(ci.metric, metrics.ConnWriting)
		ci.metric = metrics.ConnWriting
		c.conns[conn] = ci
	}
	c.mu.Unlock()
}

// connKey is the context key of a request's connection (ConnContext).
type connKey struct{}

// drain closes every connection that has been idle for idleGrace, or new
// for newGrace, until none is left or ctx is done.
func (c *connTracker) drain(ctx context.Context, idleGrace, newGrace time.Duration) {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		left, next, changed := c.closeIdle(time.Now(), idleGrace, newGrace, false)
		if left == 0 {
			return
		}
		var wake <-chan time.Time
		if !next.IsZero() {
			timer.Reset(time.Until(next))
			wake = timer.C
		}
		select {
		case <-ctx.Done():
			return
		case <-changed:
		case <-wake:
		}
	}
}

// closeIdle closes the connections that are past their grace at now;
// with all, also those with a request in progress (a drain past its
// deadline). It returns how many connections are left, when the next one
// will be past its grace (zero if none is idle), and a channel closed at
// the next change of state.
func (c *connTracker) closeIdle(now time.Time, idleGrace, newGrace time.Duration, all bool) (left int, next time.Time, changed <-chan struct{}) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.changed == nil {
		c.changed = make(chan struct{})
	}
	for conn, ci := range c.conns {
		var grace time.Duration
		switch ci.state {
		case http.StateIdle:
			grace = idleGrace
		case http.StateNew:
			grace = newGrace
		default:
			if !all {
				continue // a request in progress: its response says Connection: close
			}
		}
		if ci.closed {
			continue
		}
		due := ci.since.Add(grace)
		if !now.Before(due) {
			conn.Close() // the server's goroutine sees it and reports StateClosed
			ci.closed = true
			c.conns[conn] = ci
			continue
		}
		if next.IsZero() || due.Before(next) {
			next = due
		}
	}
	return len(c.conns), next, c.changed
}

// trackConn is the ConnState hook. A connection is tracked as the one
// under its wrappers: net/http reports a clientConn, an Edge's HTTP/2
// server its own wrapper of the TLS connection, and the Edge the TLS
// connection itself, from its accept on.
func (s *Server) trackConn(c net.Conn, st http.ConnState) {
	g, h2 := c.(h2Conn)
	switch cc, _ := c.(*clientConn); {
	case h2:
		c = g.TLSConn()
	case cc != nil:
		if st == http.StateIdle {
			cc.idle()
		}
		c = cc.Conn
	}
	s.conns.track(c, st, h2)
}
