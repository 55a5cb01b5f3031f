package proxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/preforkd/preforkd/core"
	"github.com/preforkd/preforkd/engine"
	"github.com/preforkd/preforkd/internal/upconn"
	"github.com/preforkd/preforkd/internal/waitfor"
	"github.com/preforkd/preforkd/metrics"
)

// Server is an HTTP/1.1 server that forwards requests to one upstream (or
// serves them with Options.App) after asking a decision core. It is safe for
// concurrent use; Serve may be called for several listeners.
type Server struct {
	opts Options
	up   *upconn.Pool // nil with App
	srv  *fasthttp.Server

	draining atomic.Bool

	mu       sync.Mutex
	conns    map[*conn]*listener // open client connections, by the listener that accepted them
	lns      map[*listener]struct{}
	drained  chan struct{} // closed when conns empties during a drain; nil before
	shutdown bool

	closeOnce  sync.Once
	background sync.WaitGroup // cache refreshes (refresh)

	count engine.Counters
	warns [warnKinds]engine.WarnGate // one line a second per kind
	cm    metrics.Conns              // the worker's connections by state, in its row

	requests sync.Pool // *request
}

// New returns a Server for opts, or an error for options that make no
// sense.
func New(opts Options) (*Server, error) {
	opts, up, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	s := &Server{
		opts:  opts,
		conns: make(map[*conn]*listener),
		lns:   make(map[*listener]struct{}),
		cm:    opts.Core.Conns(),
	}
	if opts.Upstream != "" {
		s.up = upconn.New(up, opts.Client)
		s.up.Stray = func() { opts.Core.UpstreamFailed(core.UpstreamResponse, up.Addr, engine.ErrRespStray) }
	}
	s.requests.New = func() any {
		r := &request{s: s}
		r.up.DisableNormalizing()
		return r
	}
	s.srv = &fasthttp.Server{
		Handler:        s.serve,
		ErrorHandler:   s.onError,
		HeaderReceived: s.headerReceived,
		ExpectHandler:  s.expect,
		ConnState:      s.setState,
		Logger:         fasthttpLogger{opts.Logger},
		// The header section is read into this buffer whole: its size is
		// the bound on the header.
		ReadBufferSize: opts.MaxHeaderBytes,
		// Bodies stream. fasthttp reads ahead at most MaxRequestBodySize
		// bytes of one before the handler runs, under the deadline
		// headerReceived sets; the rest is read by the handler, with
		// ClientBodyTimeout between two reads.
		StreamRequestBody:            true,
		MaxRequestBodySize:           1,
		DisablePreParseMultipartForm: true,
		// Header fields go upstream and back as they were sent.
		DisableHeaderNamesNormalizing: true,
		NoDefaultServerHeader:         true,
		NoDefaultContentType:          true,
		// Date is the server's to write (date.go): a response keeps its own.
		NoDefaultDate: true,
		// The connection's own goroutine closes an upgraded connection
		// when its tunnel ends.
		KeepHijackedConns:     true,
		SecureErrorLogMessage: true,
	}
	return s, nil
}

// headerReceived runs once a request's header section is read, before
// fasthttp waits for the first byte of its body (MaxRequestBodySize):
// from here the body timeout applies.
func (s *Server) headerReceived(h *fasthttp.RequestHeader) fasthttp.RequestConfig {
	if h.ConnectionClose() && h.IsHTTP11() && h.Peek(fasthttp.HeaderUpgrade) != nil {
		// fasthttp takes the close of a request it sees now for its
		// connection, and would never run the tunnel of a 101 to it
		// (nginx tunnels it): done closes after any other answer.
		h.ResetConnectionClose()
	}
	if n := h.ContentLength(); n > 0 || n == -1 {
		expectAnyCase(h)
		return fasthttp.RequestConfig{ReadTimeout: s.opts.ClientBodyTimeout}
	}
	// No body to continue to: no 100 Continue either (RFC 9110 §10.1.1
	// lets a server omit it; the event loop does). Expect is never
	// forwarded.
	h.Del("Expect")
	return fasthttp.RequestConfig{}
}

// expectAnyCase makes an Expect: 100-continue sent in another case
// ("expect") one fasthttp sees: it keeps field names as sent and looks
// for "Expect" alone, and a client waiting for 100 Continue would wait in
// vain (a field name is case-insensitive, RFC 9110 §5.1). It costs a
// request with a body one scan of its header section, which is short and
// in the cache; it allocates nothing unless it finds one.
func expectAnyCase(h *fasthttp.RequestHeader) {
	if !h.IsHTTP11() || h.Peek(fasthttp.HeaderExpect) != nil {
		return
	}
	for raw := h.RawHeaders(); len(raw) > 0; {
		var line []byte
		line, raw, _ = bytes.Cut(raw, strLF)
		name, value, ok := bytes.Cut(line, strColon)
		if ok && engine.EqualFold(name, "expect") {
			if engine.EqualFold(bytes.TrimSpace(value), "100-continue") {
				h.Set(fasthttp.HeaderExpect, "100-continue")
			}
			return
		}
	}
}

var (
	strLF    = []byte("\n")
	strColon = []byte(":")
)

// Serve serves the connections of ln until ln is closed, Shutdown or
// Close. It returns nil then, and the listener's error otherwise. The
// server closes ln when it is done with it.
func (s *Server) Serve(ln net.Listener) error {
	l := &listener{s: s, Listener: engine.NewListener(ln, s.opts.MaxConnections, func(err error, wait time.Duration) {
		s.warn(warnAccept, "accepting a connection failed; retrying", "err", err, "retry_in", wait)
	})}
	l.OnFull = s.cm.MaxReached
	s.mu.Lock()
	if s.shutdown {
		s.mu.Unlock()
		ln.Close()
		return nil
	}
	s.lns[l] = struct{}{}
	s.mu.Unlock()
	err := s.srv.Serve(l)
	l.Close()
	s.mu.Lock()
	delete(s.lns, l)
	shut := s.shutdown
	s.checkDrained()
	s.mu.Unlock()
	if shut || errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}

// track registers a connection just accepted by l.
func (s *Server) track(nc net.Conn, l *listener) *conn {
	now := time.Now()
	c := &conn{Conn: nc, s: s, idleSince: now}
	c.head.Start()
	if ap, err := netip.ParseAddrPort(nc.RemoteAddr().String()); err == nil {
		c.peer = ap.Addr().Unmap().WithZone("")
	}
	wait := s.opts.ReadHeaderTimeout
	if s.draining.Load() {
		wait = min(wait, s.opts.DrainNewGrace)
	}
	_ = nc.SetReadDeadline(now.Add(wait))
	s.count.Accepted.Add(1)
	s.cm.Accepted()
	c.setMetric(metrics.ConnReading) // waiting for its first request
	s.mu.Lock()
	s.conns[c] = l
	s.mu.Unlock()
	return c
}

// checkDrained closes drained, during a drain, once no connection is open
// and no listener is served any more. Both: a listener that is being
// closed may still hand over a connection it accepted a moment before,
// and a drain that ended at an instant with no connection open would
// close that one unserved. Requires s.mu.
func (s *Server) checkDrained() {
	if s.drained == nil || len(s.conns) > 0 || len(s.lns) > 0 {
		return
	}
	select {
	case <-s.drained:
	default:
		close(s.drained)
	}
}

// forget unregisters a closed connection and frees its slot.
func (s *Server) forget(c *conn) {
	s.mu.Lock()
	delete(s.conns, c)
	s.checkDrained()
	s.mu.Unlock()
}

// Shutdown drains the server: it stops accepting, lets every request in
// flight finish, and closes each keep-alive connection either after its
// next response (which says Connection: close) or once it has been idle
// for DrainIdleGrace (DrainNewGrace if it never sent a request), so that
// no request that was on its way meets a closed connection. It returns
// when every connection is closed, or when ctx is done; then it closes
// the remaining ones (upgraded connections among them) and returns ctx's
// error.
func (s *Server) Shutdown(ctx context.Context) error {
	s.draining.Store(true)
	s.mu.Lock()
	s.shutdown = true
	if s.drained == nil {
		s.drained = make(chan struct{})
		s.checkDrained()
	}
	lns, conns := s.open()
	drained := s.drained
	s.mu.Unlock()
	for _, l := range lns {
		l.Close()
	}
	now := time.Now()
	for _, c := range conns {
		c.mu.Lock()
		switch c.state {
		case stateNew:
			_ = c.Conn.SetReadDeadline(latest(c.idleSince.Add(min(s.opts.DrainNewGrace, s.opts.ReadHeaderTimeout)), now))
		case stateIdle:
			_ = c.Conn.SetReadDeadline(latest(c.idleSince.Add(min(s.opts.DrainIdleGrace, s.opts.IdleTimeout)), now))
		}
		c.mu.Unlock()
	}
	var err error
	select {
	case <-drained:
	case <-ctx.Done():
		err = ctx.Err()
	}
	if err == nil {
		err = s.waitBackground(ctx)
	}
	s.close(err != nil)
	return err
}

// Close closes the listeners and every connection at once, the idle
// upstream connections and those a response body is still read from (a
// stream, a response the core keeps, a cache refresh); it returns once
// the connections' serving goroutines let them go and the refreshes
// ended (within a bound).
func (s *Server) Close() error { return s.close(false) }

// close is Close; cut (the drain's deadline passed) also cuts the core's
// Redis decisions (core.Core.Cut) once the connections are closed, so
// that the requests waiting on one end with them rather than when
// redis.timeout would.
func (s *Server) close(cut bool) error {
	s.draining.Store(true)
	s.mu.Lock()
	s.shutdown = true
	lns, conns := s.open()
	s.mu.Unlock()
	for _, l := range lns {
		l.Close()
	}
	for _, c := range conns {
		c.Conn.Close() // the serving goroutine then closes c itself
	}
	if cut {
		s.opts.Core.Cut()
	}
	if s.up != nil {
		s.up.Cut()
	}
	s.closeOnce.Do(func() {
		if s.up != nil {
			s.up.Close()
		}
	})
	refreshed := make(chan struct{})
	go func() { s.background.Wait(); close(refreshed) }()
	deadline := time.Now().Add(engine.CloseWait)
	waitfor.Cond(engine.CloseWait, s.closed)
	select {
	case <-refreshed:
	case <-time.After(time.Until(deadline)):
	}
	return nil
}

// closed reports whether every connection was closed by its serving
// goroutine.
func (s *Server) closed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.conns) == 0
}

// open returns the listeners being served and the connections open, for
// Shutdown and Close to act on outside the lock. Requires s.mu.
func (s *Server) open() ([]*listener, []*conn) {
	lns := make([]*listener, 0, len(s.lns))
	for l := range s.lns {
		lns = append(lns, l)
	}
	conns := make([]*conn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	return lns, conns
}

func latest(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// expect runs for a request with Expect: 100-continue before fasthttp
// answers 100 Continue and reads its body: the core decides what needs no
// body first (RFC 9110 §10.1.1), and a refusal goes out as the final
// status, the body never read (fasthttp then closes the connection, as
// the client may have begun sending it anyway). A request that goes on
// is handed to serve with its exchange.
func (s *Server) expect(ctx *fasthttp.RequestCtx) int {
	r := s.requests.Get().(*request)
	r.ctx, r.c = ctx, ctx.Conn().(*conn)
	r.readsAtStart = r.c.reads.Load()
	if bad := r.parse(); bad != nil {
		s.refuseHead(ctx, bad)
		s.done(r)
		return ctx.Response.StatusCode()
	}
	ex := s.opts.Core.Begin(r)
	r.begun = true
	if ex.DecideHead() == core.Respond {
		s.respond(ctx, ex.Response())
		s.finish(r, ex, nil)
		s.done(r)
		return ctx.Response.StatusCode()
	}
	// fasthttp resets the head when the body then fails to arrive
	// (bodyUnread answers it): the access log still names the target.
	r.keepTarget()
	r.ex = ex
	r.c.early = r
	r.c.mu.Lock()
	r.c.setMetric(metrics.ConnWriting) // its body comes: the request is in progress, as on the loop
	r.c.mu.Unlock()
	return fasthttp.StatusContinue
}

// serve is the fasthttp handler: every request that could be read.
func (s *Server) serve(ctx *fasthttp.RequestCtx) {
	c := ctx.Conn().(*conn)
	c.linger = false // the request before was answered, and the connection kept
	// What was read after its section is the next request's if it has no
	// body (engine.HeadScan): fasthttp's length is 0, or -2 (no Content-Length
	// nor Transfer-Encoding: no body, in a request; another coding is
	// refused by parse).
	n := ctx.Request.Header.ContentLength()
	c.head.Bodyless = n == 0 || n == -2
	c.mu.Lock()
	c.setMetric(metrics.ConnWriting) // the request is in progress
	c.mu.Unlock()
	if r := c.early; r != nil {
		// Parsed, and decided as far as its head goes, by expect.
		c.early = nil
		defer s.done(r)
		s.serveParsed(r, r.ex)
		return
	}
	r := s.requests.Get().(*request)
	r.ctx, r.c = ctx, c
	r.readsAtStart = c.reads.Load()
	defer s.done(r)
	if bad := r.parse(); bad != nil {
		s.refuseHead(ctx, bad)
		return
	}
	r.begun = true
	s.serveParsed(r, s.opts.Core.Begin(r))
}

// refuseHead answers a request whose head parse refused, but for OPTIONS
// *, which asks about the server, not a resource: answered here, never
// forwarded.
func (s *Server) refuseHead(ctx *fasthttp.RequestCtx, bad *engine.BadRequest) {
	if bad == engine.ErrTarget && isOptionsAsterisk(ctx) {
		primeDate(&ctx.Response.Header, nil)
		ctx.Response.SetStatusCode(fasthttp.StatusOK)
		ctx.Response.Header.Set("Allow", "GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS")
		return
	}
	s.refuse(ctx, bad, nil)
}

// serveParsed runs a request whose head was parsed through the core: its
// answer, or the application's.
func (s *Server) serveParsed(r *request, ex *core.Exchange) {
	r.ex = nil
	r.body.reset(r)
	if ex.Decide() == core.Respond {
		if ex.Gone() {
			// The client reset its connection as the core read its body
			// (Body): an answer nobody reads.
			s.clientGone(r, ex)
			return
		}
		if !r.body.done {
			// A body left unread may close the connection (fasthttp drops
			// a short one): closed at once, it would be reset, and a
			// reset can destroy the answer before the client read it.
			r.c.linger = true
		}
		resp := ex.Response()
		s.respond(r.ctx, resp)
		if resp.Stream != nil {
			s.sendStream(r, ex, resp.Stream)
			return
		}
		s.finish(r, ex, nil)
		return
	}
	r.fwd = ex.Forward()
	if s.up == nil {
		s.runApp(r, ex)
		return
	}
	s.forward(r, ex)
}

// done ends a request's handler. A response of the server's own, to a
// request refused before the core saw it, is counted here; the core
// counts the others when their exchange ends.
func (s *Server) done(r *request) {
	if c := r.c; c != nil {
		c.readsAtDone = c.reads.Load()
	}
	if !r.begun {
		s.opts.Core.Responded(r.ctx.Response.StatusCode(), time.Since(r.ctx.Time()))
	}
	if s.opts.OnResponse != nil && !r.gone {
		s.opts.OnResponse(r.ctx.Response.StatusCode())
	}
	if !r.ctx.Hijacked() && (s.draining.Load() || r.upgradeClose) {
		// Not a 101's: its connection is the tunnel's, which the drain
		// waits for; fasthttp would send it and close, never tunnelling.
		r.ctx.SetConnectionClose()
	}
	r.body.release()
	if r.streaming {
		// The response body streams after the handler returned, and the
		// exchange it ends still reads the request (a Vary variant's
		// key): the request goes back to the pool with it
		// (upBody.CloseWithError). fasthttp keeps the request's bytes
		// until the response is written.
		return
	}
	s.recycle(r)
}

// recycle puts a request whose exchange is over back in the pool.
func (s *Server) recycle(r *request) {
	r.ctx, r.c, r.ex = nil, nil, nil
	r.raw, r.fields, r.method, r.path, r.query, r.host = nil, nil, nil, nil, nil, nil
	r.target = r.target[:0]
	r.fwd = core.Forward{}
	r.upgrade, r.upgradeClose, r.absolute, r.begun, r.streaming, r.gone = false, false, false, false, false, false
	s.requests.Put(r)
}

// keepTarget copies the target as sent, and the path and query views of
// it, out of fasthttp's head into the request's own buffer.
func (r *request) keepTarget() {
	r.target = append(r.target[:0], r.ctx.Request.Header.RequestURI()...)
	n := len(r.target)
	r.target = append(append(r.target, r.path...), r.query...)
	p := n + len(r.path)
	r.path = r.target[n:p:p]
	if r.query != nil {
		r.query = r.target[p:len(r.target):len(r.target)]
	}
	r.target = r.target[:n:n] // an append moves it, never over the copies
}

func isOptionsAsterisk(ctx *fasthttp.RequestCtx) bool {
	return string(ctx.Request.Header.Method()) == fasthttp.MethodOptions &&
		string(ctx.Request.Header.RequestURI()) == "*"
}

// runApp serves a request that passed the core with Options.App.
func (s *Server) runApp(r *request, ex *core.Exchange) {
	ctx := r.ctx
	primeDate(&ctx.Response.Header, nil) // the application may set its own
	if r.absolute {
		// An absolute-form target's authority is the request's host (RFC
		// 9112 §3.2.2), as the core read it and a forward sends it: the
		// App gets it as Host, not the client's Host line. r.host is kept
		// in that copy, as the target it was cut from is rewritten below.
		ctx.Request.Header.SetHostBytes(r.host)
		r.host = ctx.Request.Header.Host()
	}
	if r.fwd.Path != b2s(r.path) {
		// The application gets the path the core passes on.
		r.head = append(r.head[:0], r.fwd.Path...)
		if r.query != nil {
			r.head = append(r.head, '?')
			r.head = append(r.head, r.query...)
		}
		// The target as sent, and the path and query the request view
		// says (the access log reads them after the App), are views of
		// the buffer the new target is written over: they move to a copy.
		r.keepTarget()
		ctx.Request.SetRequestURIBytes(r.head)
	}
	if r.body.done && r.body.buf != nil {
		// The core read the body: the application gets it from memory.
		ctx.Request.SetBodyRaw(r.body.bytes())
	} else if r.body.stream != nil {
		r.c.bodyTimeout = s.opts.ClientBodyTimeout
	}
	if len(r.fwd.Drop) > 0 || len(r.fwd.Add) > 0 {
		// By the names as sent: fasthttp's Del matches a name exactly
		// (DisableHeaderNamesNormalizing), and a client's
		// "preforkd-reset" would reach the application past
		// Del("Preforkd-Reset"); and by the core's, for the fields
		// fasthttp keeps apart whatever their case (Cookie, Host).
		for i := range r.fields {
			if name := r.raw[r.fields[i].name.from:r.fields[i].name.to]; r.fwd.Dropped(b2s(name)) {
				ctx.Request.Header.DelBytes(name)
			}
		}
		for _, n := range r.fwd.Drop {
			ctx.Request.Header.Del(n)
		}
		for _, f := range r.fwd.Add {
			ctx.Request.Header.Del(f.Name)
		}
	}
	for _, f := range r.fwd.Add {
		ctx.Request.Header.AddBytesV(f.Name, f.Value)
	}
	// X-Forwarded-Proto and -Host as a forward writes them, and as the
	// core read them (its cache key leaves them out): a client's, which
	// frameworks build redirects and links from, never reach the App. By
	// the names as sent, as above.
	for i := range r.fields {
		if f := &r.fields[i]; f.kind == engine.FieldForwardedOther {
			ctx.Request.Header.DelBytes(r.raw[f.name.from:f.name.to])
		}
	}
	ctx.Request.Header.Set("X-Forwarded-Proto", "http")
	if len(r.host) > 0 {
		ctx.Request.Header.SetBytesV("X-Forwarded-Host", r.host)
	}
	ex.Sending()
	s.opts.App(ctx)
	resp := &ctx.Response
	if ctx.Hijacked() {
		ex.Head(fasthttp.StatusSwitchingProtocols, nil)
		s.finish(r, ex, nil)
		return
	}
	if replaced := ex.Head(resp.StatusCode(), (*upHeader)(&resp.Header)); replaced != nil {
		resp.Reset()
		s.respond(ctx, replaced)
		s.finish(r, ex, nil)
		return
	}
	if len(r.fwd.Hide) > 0 {
		r.head = hideFields(&resp.Header, &r.fwd, r.head)
	}
	setFields(resp, ex.Fields())
	if resp.IsBodyStream() {
		// The application streams: the exchange ends with its stream.
		ab := &appBody{s: s, r: r, ex: ex, body: resp.BodyStream()}
		r.streaming = true
		resp.SetBodyStream(ab, resp.Header.ContentLength())
		return
	}
	ex.Body(resp.Body())
	s.finish(r, ex, nil)
}

// hideFields deletes the fields of h that the core hides (in any case),
// with buf as scratch for a name; it returns buf for reuse. The server
// keeps field names as they were written (DisableHeaderNamesNormalizing)
// and fasthttp's Del matches a name exactly: an application's
// "preforkd-reset" would reach the client past Del("Preforkd-Reset").
// One pass over h when nothing is hidden.
func hideFields(h *fasthttp.ResponseHeader, fwd *core.Forward, buf []byte) []byte {
	for range 16 { // a bound, for a field fasthttp makes up and DelBytes cannot take away
		found := false
		for k := range h.All() {
			if fwd.Hidden(b2s(k)) {
				buf, found = append(buf[:0], k...), true
				break
			}
		}
		if !found {
			return buf
		}
		h.DelBytes(buf)
	}
	return buf
}

// appBody is an application's streamed response body, told to the core
// as fasthttp sends it.
type appBody struct {
	s    *Server
	r    *request
	ex   *core.Exchange
	body io.Reader
	err  error
}

func (b *appBody) Read(p []byte) (int, error) {
	n, err := b.body.Read(p)
	if n > 0 {
		b.ex.Body(p[:n])
	}
	if err != nil && err != io.EOF {
		b.err = err
	}
	return n, err
}

// CloseWithError ends the exchange once fasthttp sent the body (or the
// client failed).
func (b *appBody) CloseWithError(werr error) error {
	if c, ok := b.body.(interface{ CloseWithError(error) error }); ok {
		_ = c.CloseWithError(werr)
	} else if c, ok := b.body.(io.Closer); ok {
		_ = c.Close()
	}
	err := b.err
	if err == nil {
		err = werr
	}
	if err != nil {
		err = errAppStream
	}
	b.s.finish(b.r, b.ex, err)
	b.s.recycle(b.r)
	return nil
}

// fasthttpLogger sends fasthttp's own log lines (errors it met serving a
// connection) to the debug level: the operator hears of what matters
// through the server's warnings.
type fasthttpLogger struct{ l *slog.Logger }

func (f fasthttpLogger) Printf(format string, args ...any) {
	if f.l.Enabled(context.Background(), slog.LevelDebug) {
		f.l.Debug("fasthttp", "msg", fmt.Sprintf(format, args...))
	}
}
