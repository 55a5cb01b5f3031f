package main

import (
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"
)

// adminLimits bound what clients of the admin listener can hold. The
// supervisor serves it, so its connections are the supervisor's
// descriptors: without a bound, idle keep-alive connections from one local
// client once held all 20,000 of them, and the supervisor noticed a crashed
// worker late and took seconds to reload.
type adminLimits struct {
	maxConns          int           // open connections; more are closed as soon as accepted
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

// newAdminServer is the admin endpoint's http.Server, with lim's timeouts.
func newAdminServer(h http.Handler, lim adminLimits, log *slog.Logger) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: lim.readHeaderTimeout,
		ReadTimeout:       lim.readTimeout,
		WriteTimeout:      lim.writeTimeout,
		IdleTimeout:       lim.idleTimeout,
		MaxHeaderBytes:    16 << 10,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelDebug),
	}
}

// cappedListener accepts at most max open connections. One more is closed
// at once rather than left in the kernel's backlog: its client learns now
// that the endpoint is busy, instead of waiting behind whoever holds the
// connections, and the accept loop never stops.
type cappedListener struct {
	net.Listener
	slots chan struct{} // one token per open connection
	log   *slog.Logger

	// Only the accepting goroutine touches these.
	refused  int
	lastWarn time.Time
}

// refusedLogEvery bounds the warnings about refused connections.
const refusedLogEvery = time.Minute

func capListener(ln net.Listener, max int, log *slog.Logger) *cappedListener {
	return &cappedListener{Listener: ln, slots: make(chan struct{}, max), log: log}
}

func (l *cappedListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		select {
		case l.slots <- struct{}{}:
			return &cappedConn{Conn: c, release: func() { <-l.slots }}, nil
		default:
		}
		c.Close()
		l.refused++
		if now := time.Now(); now.Sub(l.lastWarn) >= refusedLogEvery {
			l.log.Warn("admin: connection limit reached; closing new connections", "limit", cap(l.slots), "closed", l.refused)
			l.lastWarn, l.refused = now, 0
		}
	}
}

// cappedConn gives its slot back when it is closed, once.
type cappedConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *cappedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}
