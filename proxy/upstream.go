package proxy

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"sync"
	"syscall"
	"time"
)

// The upstream side: a pool of keep-alive connections to the one upstream
// of a Server, per process. Requests are written on them by the server
// itself (forward.go), from the client's raw header lines, so that nothing
// but the hop-by-hop fields is changed on the way.

const (
	// upstreamReadBuffer bounds the upstream's response header section
	// (a larger one is a 502, like nginx's proxy_buffer_size) and is the
	// unit of body reads.
	upstreamReadBuffer = 16 << 10
	// upstreamIdleTime is how long an idle upstream connection is kept at
	// least (nginx's upstream keepalive_timeout); the reaper, every quarter
	// of it, closes those idle longer, so up to 75 s.
	upstreamIdleTime = 60 * time.Second
)

// upstream is the connection pool to one upstream.
type upstream struct {
	t       target
	dialer  net.Dialer
	tls     *tls.Config // nil for http
	timeout time.Duration
	maxIdle int

	mu     sync.Mutex
	idle   []*upConn // LIFO: the most recently used connection is reused first
	closed bool

	stop chan struct{} // closed by close: ends the reaper
	done chan struct{} // closed when the reaper has returned
}

func newUpstream(t target, o Options) *upstream {
	u := &upstream{
		t:       t,
		dialer:  net.Dialer{Timeout: o.Client.ConnectTimeout, KeepAlive: 30 * time.Second},
		timeout: o.Client.Timeout,
		maxIdle: o.Client.MaxIdle,
		stop:    make(chan struct{}),
		done:    make(chan struct{}),
	}
	if t.tls {
		u.tls = &tls.Config{ServerName: t.host, MinVersion: tls.VersionTLS12}
	}
	go u.reap()
	return u
}

// upConn is a connection to the upstream. Every read and write first moves
// the deadline: Client.Timeout is the longest wait for the next bytes.
type upConn struct {
	net.Conn                  // the connection (TLS over tcp for https)
	raw       syscall.RawConn // the TCP socket under it, to peek at; nil if not TCP
	tls       *tls.Conn       // the TLS connection, for https
	u         *upstream       //
	br        *bufio.Reader   // response bytes
	idleSince time.Time       // when it was last put back
	reused    bool            // it served a request before this one

	// peekFn is peekFD bound once, so that a peek allocates nothing;
	// peekN and peekErr are its results.
	peekFn  func(fd uintptr) bool
	peekN   int
	peekErr error
}

func (c *upConn) Read(p []byte) (int, error) {
	if err := c.Conn.SetReadDeadline(time.Now().Add(c.u.timeout)); err != nil {
		return 0, err
	}
	return c.Conn.Read(p)
}

func (c *upConn) Write(p []byte) (int, error) {
	if err := c.Conn.SetWriteDeadline(time.Now().Add(c.u.timeout)); err != nil {
		return 0, err
	}
	return c.Conn.Write(p)
}

// dialError is a failure to connect to the upstream: 502.
type dialError struct{ err error }

func (e *dialError) Error() string { return "proxy: connecting to the upstream: " + e.err.Error() }
func (e *dialError) Unwrap() error { return e.err }

// get returns an idle connection that is clean, or a new one. Every idle
// connection is checked before it is reused, however briefly it was idle
// (nginx's upstream keepalive does the same): bytes that an upstream sent
// after the end of a response (a body to a HEAD, a 204 or a 304; more
// than its Content-Length said) would otherwise be read as the response
// to the next request, another client's. One non-blocking peek, a fraction
// of a microsecond (BenchmarkCleanCheck).
func (u *upstream) get(ctx context.Context) (*upConn, error) {
	for {
		u.mu.Lock()
		n := len(u.idle)
		if n == 0 {
			u.mu.Unlock()
			break
		}
		c := u.idle[n-1]
		u.idle[n-1] = nil
		u.idle = u.idle[:n-1]
		u.mu.Unlock()
		if c.clean() {
			c.reused = true
			return c, nil
		}
		c.Conn.Close()
	}
	return u.dial(ctx)
}

// dial opens a new connection within Client.ConnectTimeout.
func (u *upstream) dial(ctx context.Context) (*upConn, error) {
	nc, err := u.dialer.DialContext(ctx, "tcp", u.t.addr)
	if err != nil {
		return nil, &dialError{err}
	}
	c := &upConn{u: u}
	c.peekFn = c.peekFD
	if tcp, ok := nc.(*net.TCPConn); ok {
		if c.raw, err = tcp.SyscallConn(); err != nil {
			nc.Close()
			return nil, &dialError{err}
		}
	}
	if u.tls != nil {
		tc := tls.Client(nc, u.tls)
		hs, cancel := context.WithTimeout(ctx, u.dialer.Timeout)
		err := tc.HandshakeContext(hs)
		cancel()
		if err != nil {
			nc.Close()
			return nil, &dialError{fmt.Errorf("TLS handshake: %w", err)}
		}
		nc, c.tls = tc, tc
	}
	c.Conn = nc
	c.br = bufio.NewReaderSize(c, upstreamReadBuffer)
	return c, nil
}

// put gives a connection whose last response was read to its end back to
// the pool, or closes it: it is not kept when the upstream sent more than
// that response (bytes already read past its end). It reports whether
// the connection was clean: when it was not, the response's framing
// cannot be trusted either, and nothing of it may be stored.
func (u *upstream) put(c *upConn, now time.Time) (clean bool) {
	if c.br.Buffered() > 0 {
		c.Conn.Close()
		return false
	}
	c.idleSince = now
	u.mu.Lock()
	if u.closed || len(u.idle) >= u.maxIdle {
		u.mu.Unlock()
		c.Conn.Close()
		return true
	}
	u.idle = append(u.idle, c)
	u.mu.Unlock()
	return true
}

// clean reports, without blocking, whether an idle connection has nothing
// to read and is still open: any byte or an EOF means it must not carry
// another request. A TLS connection may hold records that are no
// application data (TLS 1.3 session tickets, sent after the handshake):
// they are read through TLS, which consumes them, and only application
// data or a close counts.
func (c *upConn) clean() bool {
	if c.raw == nil {
		return true // not TCP: nothing to peek at
	}
	pending, open := c.peek()
	switch {
	case !open:
		return false
	case !pending:
		return true
	case c.tls == nil:
		return false
	}
	// Records are waiting: read them with a deadline already passed, so
	// that a read finding no application data returns at once.
	if c.tls.SetReadDeadline(time.Now()) != nil {
		return false
	}
	var b [1]byte
	n, err := c.tls.Read(b[:])
	if n > 0 || !isTimeout(err) {
		return false // application data, a close, or an error
	}
	pending, open = c.peek()
	return open && !pending
}

// peek looks at the TCP socket without blocking: pending when bytes wait
// to be read, open unless the peer closed it (or it failed).
func (c *upConn) peek() (pending, open bool) {
	if c.raw.Read(c.peekFn) != nil {
		return false, false
	}
	switch {
	case errors.Is(c.peekErr, syscall.EAGAIN):
		return false, true
	case c.peekErr != nil, c.peekN == 0: // an error, or EOF
		return false, false
	}
	return true, true
}

// reap closes connections idle for longer than upstreamIdleTime, until
// close.
func (u *upstream) reap() {
	defer close(u.done)
	tick := time.NewTicker(upstreamIdleTime / 4)
	defer tick.Stop()
	for {
		select {
		case <-u.stop:
			return
		case now := <-tick.C:
			u.mu.Lock()
			// The oldest are at the bottom of the stack.
			n := 0
			for n < len(u.idle) && now.Sub(u.idle[n].idleSince) > upstreamIdleTime {
				u.idle[n].Conn.Close()
				n++
			}
			u.idle = append(u.idle[:0], u.idle[n:]...)
			u.mu.Unlock()
		}
	}
}

// close closes the idle connections and stops the reaper; connections in
// use are closed when they are put back.
func (u *upstream) close() {
	u.mu.Lock()
	if u.closed {
		u.mu.Unlock()
		return
	}
	u.closed = true
	for _, c := range u.idle {
		c.Conn.Close()
	}
	u.idle = nil
	u.mu.Unlock()
	close(u.stop)
	<-u.done
}
