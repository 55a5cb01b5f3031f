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

	"golang.org/x/sys/unix"
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
	// probeIdle is how long a connection must have been idle for its
	// liveness to be checked before reuse: applications close idle
	// keep-alive connections after a few seconds (Node.js 5 s, gunicorn
	// 2 s), and a request sent on one that is closing fails.
	probeIdle = time.Second
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
		dialer:  net.Dialer{Timeout: o.UpstreamConnectTimeout, KeepAlive: 30 * time.Second},
		timeout: o.UpstreamTimeout,
		maxIdle: o.UpstreamMaxIdle,
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
// the deadline: UpstreamTimeout is the longest wait for the next bytes.
type upConn struct {
	net.Conn                // the connection (TLS over tcp for https)
	tcp       *net.TCPConn  // the TCP connection under it
	u         *upstream     //
	br        *bufio.Reader // response bytes
	idleSince time.Time     // when it was last put back
	reused    bool          // it served a request before this one
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

// get returns an idle connection that looks alive, or a new one.
func (u *upstream) get(ctx context.Context, now time.Time) (*upConn, error) {
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
		if now.Sub(c.idleSince) < probeIdle || c.alive() {
			c.reused = true
			return c, nil
		}
		c.Conn.Close()
	}
	return u.dial(ctx)
}

// dial opens a new connection within UpstreamConnectTimeout.
func (u *upstream) dial(ctx context.Context) (*upConn, error) {
	nc, err := u.dialer.DialContext(ctx, "tcp", u.t.addr)
	if err != nil {
		return nil, &dialError{err}
	}
	tcp, _ := nc.(*net.TCPConn)
	if u.tls != nil {
		// TLS 1.3 servers send session tickets after the handshake: bytes
		// on an idle connection are no sign of trouble there, so such
		// connections are not probed.
		tcp = nil
		tc := tls.Client(nc, u.tls)
		hs, cancel := context.WithTimeout(ctx, u.dialer.Timeout)
		err := tc.HandshakeContext(hs)
		cancel()
		if err != nil {
			nc.Close()
			return nil, &dialError{fmt.Errorf("TLS handshake: %w", err)}
		}
		nc = tc
	}
	c := &upConn{Conn: nc, tcp: tcp, u: u}
	c.br = bufio.NewReaderSize(c, upstreamReadBuffer)
	return c, nil
}

// put gives a connection whose last response was read to its end back to
// the pool, or closes it.
func (u *upstream) put(c *upConn, now time.Time) {
	if c.br.Buffered() > 0 {
		c.Conn.Close() // the upstream sent more than its response: not reusable
		return
	}
	c.idleSince = now
	u.mu.Lock()
	if u.closed || len(u.idle) >= u.maxIdle {
		u.mu.Unlock()
		c.Conn.Close()
		return
	}
	u.idle = append(u.idle, c)
	u.mu.Unlock()
}

// alive reports whether the upstream has not closed (or written on) an
// idle connection, without blocking. A TLS connection is taken as alive.
func (c *upConn) alive() bool {
	if c.tcp == nil {
		return true
	}
	rc, err := c.tcp.SyscallConn()
	if err != nil {
		return false
	}
	ok := false
	var b [1]byte
	_ = rc.Read(func(fd uintptr) bool {
		_, _, err := unix.Recvfrom(int(fd), b[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
		// Nothing to read is the only healthy answer: EOF means closed,
		// and bytes on an idle connection mean garbage.
		ok = errors.Is(err, syscall.EAGAIN)
		return true
	})
	return ok
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
