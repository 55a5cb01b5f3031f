package main

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	preforkdengine "github.com/preforkd/preforkd/engine"
)

// adminLimits bound what clients of the admin listener can hold. The
// supervisor serves it, so its connections are the supervisor's
// descriptors: without a bound, idle keep-alive connections from one local
// client once held all 20,000 of them, and the supervisor noticed a crashed
// worker late and took seconds to reload.
type adminLimits struct {
	maxConns          int           // open connections; see cappedListener for one more
	readHeaderTimeout time.Duration // to read a request's header
	readTimeout       time.Duration // to read a whole request
	writeTimeout      time.Duration // to write a response
	idleTimeout       time.Duration // a keep-alive connection between requests
}

// defaultAdminLimits: a scrape or a status request is small and local; a
// Prometheus server keeps one connection per target.
var defaultAdminLimits = adminLimits{
	maxConns:          64,
	readHeaderTimeout: 5 * time.Second,
	readTimeout:       10 * time.Second,
	writeTimeout:      10 * time.Second,
	idleTimeout:       30 * time.Second,
}

// newAdminServer is the admin endpoint's http.Server, with lim's timeouts,
// for the connections of ln.
func newAdminServer(h http.Handler, lim adminLimits, ln *cappedListener, log *slog.Logger) *http.Server {
	return &http.Server{
		Handler:           ln.bodyLeft(h),
		ConnContext:       withCappedConn,
		ConnState:         ln.connState,
		ReadHeaderTimeout: lim.readHeaderTimeout,
		ReadTimeout:       lim.readTimeout,
		WriteTimeout:      lim.writeTimeout,
		IdleTimeout:       lim.idleTimeout,
		MaxHeaderBytes:    16 << 10,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelDebug),
	}
}

// cappedListener accepts at most max open connections. When they are
// all open, a new one takes the slot of the connection that has waited
// longest for a request (a client that connected and sends its header a
// byte at a time, or a keep-alive connection gone quiet): so that
// connections that hold slots without asking anything (slowloris) cannot
// keep /healthz from answering, whoever opens them. Only when every
// connection has a request in progress is the new one closed at once,
// rather than left in the kernel's backlog: its client learns now that
// the endpoint is busy, and the accept loop never stops.
type cappedListener struct {
	net.Listener
	max int
	log *slog.Logger

	mu   sync.Mutex
	open map[*cappedConn]struct{}
	// epoch, with its monotonic reading, is what waiting times count
	// from: a wall-clock step does not reorder them.
	epoch time.Time

	// Only the accepting goroutine touches these.
	refused, evicted int
	lastWarn         time.Time
	// acceptWarn gates the line about a failed accept, which net/http
	// retries (up to a second apart) and logs only at debug.
	acceptWarn preforkdengine.WarnGate
}

// adminNow is the clock the admin listener's connections wait by; a test
// steps it.
var adminNow = time.Now

// refusedLogEvery bounds the warnings about refused connections.
const refusedLogEvery = time.Minute

func capListener(ln net.Listener, max int, log *slog.Logger) *cappedListener {
	return &cappedListener{Listener: ln, max: max, log: log, open: make(map[*cappedConn]struct{}, max), epoch: adminNow()}
}

// since is the time since l's epoch, in ns, at least 1.
func (l *cappedListener) since() int64 { return max(int64(adminNow().Sub(l.epoch)), 1) }

func (l *cappedListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			if preforkdengine.TransientAcceptError(err) {
				if args, ok := l.acceptWarn.Args(time.Now(), "err", err); ok {
					l.log.Warn("admin: accepting a connection failed; retrying", args...)
				}
				return nil, retryAccept{err}
			}
			return nil, err
		}
		cc := &cappedConn{Conn: c, l: l}
		cc.waiting.Store(l.since())
		l.mu.Lock()
		var victim *cappedConn
		if len(l.open) >= l.max {
			if victim = l.longestWaiting(); victim != nil {
				delete(l.open, victim) // its slot is the new connection's
			}
		}
		full := len(l.open) >= l.max
		if !full {
			l.open[cc] = struct{}{}
		}
		l.mu.Unlock()
		if victim != nil {
			victim.Conn.Close() // its server goroutine sees the error and lets go
			l.evicted++
		}
		if full {
			c.Close()
			l.refused++
		}
		if (victim != nil || full) && time.Since(l.lastWarn) >= refusedLogEvery {
			l.log.Warn("admin: connection limit reached; closing the connections that waited longest for a request, or new ones while every connection has one in progress",
				"limit", l.max, "closed_waiting", l.evicted, "closed_new", l.refused)
			l.lastWarn, l.evicted, l.refused = time.Now(), 0, 0
		}
		if !full {
			return cc, nil
		}
	}
}

// retryAccept is an accept error that a moment cures, which http.Server
// waits out (up to a second apart) instead of ending Serve: it takes
// only an error whose Temporary says so, and syscall.Errno's does not
// for ENOBUFS, ENOMEM, nor the errors of the connection accept took.
type retryAccept struct{ error }

func (retryAccept) Temporary() bool { return true }
func (retryAccept) Timeout() bool   { return false }

func (e retryAccept) Unwrap() error { return e.error }

// longestWaiting is the open connection that has waited longest for a
// request, nil when every one has a request in progress. l.mu is held.
func (l *cappedListener) longestWaiting() *cappedConn {
	var oldest *cappedConn
	var since int64
	for c := range l.open {
		if w := c.waiting.Load(); w != 0 && (oldest == nil || w < since) {
			oldest, since = c, w
		}
	}
	return oldest
}

// connState is the server's ConnState hook (http.Server.ConnState): a
// connection waits for a request from its start and between two
// requests, until the whole header of the next was read.
func (l *cappedListener) connState(c net.Conn, s http.ConnState) {
	cc, ok := c.(*cappedConn)
	if !ok {
		return
	}
	switch s {
	case http.StateNew, http.StateIdle:
		cc.waiting.Store(cc.l.since())
	case http.StateActive, http.StateHijacked:
		cc.waiting.Store(0)
	}
}

// cappedConnKey is the context key of a request's *cappedConn.
type cappedConnKey struct{}

func withCappedConn(ctx context.Context, c net.Conn) context.Context {
	return context.WithValue(ctx, cappedConnKey{}, c)
}

// bodyLeft serves h, then deals with a request body h left unread (every
// endpoint but an authorized purge ignores one): net/http reads what is
// left of it, up to 256 KiB, before it writes the answer and again
// before the connection serves another request, and a client that
// declared a body and sends it a byte at a time (or never) would hold
// its slot as a request in progress until the read timeout, so that a
// few such clients kept every other one out. A request with a body is
// answered with Connection: close (net/http then writes the answer at
// once), and when h left some of the body, its connection waits on its
// client as between two requests: a new connection may take its slot.
func (l *cappedListener) bodyLeft(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ContentLength == 0 {
			h.ServeHTTP(w, r)
			return
		}
		w.Header().Set("Connection", "close")
		body := &eofBody{ReadCloser: r.Body}
		r.Body = body
		h.ServeHTTP(w, r)
		if cc, ok := r.Context().Value(cappedConnKey{}).(*cappedConn); ok && !body.eof {
			cc.waiting.Store(l.since())
		}
	})
}

// eofBody records whether its body was read to the end.
type eofBody struct {
	io.ReadCloser
	eof bool
}

func (b *eofBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF {
		b.eof = true
	}
	return n, err
}

// cappedConn gives its slot back when it is closed, once.
type cappedConn struct {
	net.Conn
	l       *cappedListener
	once    sync.Once
	waiting atomic.Int64 // when it began to wait for a request's header (cappedListener.since); 0 while one is in progress
}

func (c *cappedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() {
		c.l.mu.Lock()
		delete(c.l.open, c)
		c.l.mu.Unlock()
	})
	return err
}
