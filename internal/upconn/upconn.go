// Package upconn is the pool of keep-alive connections to the upstream
// that the engines which forward on blocking connections share (package
// proxy's fasthttp engine, engine/nethttp's forwarder): the same reuse
// rules, written once. A connection is reused only when clean, checked
// before each reuse by one non-blocking peek, and so every second while
// idle (sweepEvery), so that one the upstream closes is closed too; its
// reads and writes move their deadline, so that the upstream's timeout is
// the longest wait for the next bytes. (The event loop keeps connections
// of its own, on its poller.)
package upconn

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/preforkd/preforkd/engine"
)

const (
	// ReadBuffer bounds the upstream's response header section
	// (a larger one is a 502, like nginx's proxy_buffer_size) and is the
	// unit of body reads.
	ReadBuffer = 16 << 10
)

// Pool is the connection pool to one upstream.
type Pool struct {
	Target  engine.Target // what it connects to
	dialer  net.Dialer
	tls     *tls.Config // nil for http
	timeout time.Duration
	maxIdle int
	// idleTime is how long an idle connection is kept (the Upstream's
	// IdleTimeout, nginx's upstream keepalive_timeout): one idle longer is
	// not reused, and the reaper closes it within a quarter of it, or
	// sweepEvery if that is shorter.
	idleTime time.Duration

	// Stray, when set, is called when Get or the reaper finds bytes the
	// upstream sent unasked on an idle connection (which it closes), for
	// the engine to count them as the bytes past a response Put and Done
	// report.
	Stray func()

	mu       sync.Mutex
	idle     []*Conn // LIFO: the most recently used connection is reused first
	closed   bool
	relaying map[*Conn]struct{} // connections a body is read from (Relaying)

	stop    chan struct{} // closed by close: ends the reaper
	done    chan struct{} // closed when the reaper has returned
	wake    chan struct{} // Put's word to the reaper resting
	resting bool          // the reaper waits for wake: no connection is idle
}

// sweepEvery is the longest time between two looks of the reaper at the
// idle connections while there are any: one the upstream closed meanwhile
// (its own idle timeout, often a few seconds) would otherwise wait in
// CLOSE_WAIT, holding a descriptor, until it is next taken or its idle
// time runs out. nginx's upstream keepalive closes it at once, as the
// event loop does: it watches its idle connections on its poller. A look
// is one non-blocking peek per idle connection (a fraction of a
// microsecond: BenchmarkCleanCheck).
const sweepEvery = time.Second

// New starts the pool of connections to t; o has its defaults.
func New(t engine.Target, o engine.Upstream) *Pool {
	u := &Pool{
		Target:   t,
		dialer:   net.Dialer{Timeout: o.ConnectTimeout, KeepAlive: 30 * time.Second},
		timeout:  o.Timeout,
		maxIdle:  o.MaxIdle,
		idleTime: o.IdleTimeout,
		stop:     make(chan struct{}),
		done:     make(chan struct{}),
		wake:     make(chan struct{}, 1),
	}
	if t.TLS {
		u.tls = &tls.Config{ServerName: t.Hostname, MinVersion: tls.VersionTLS12}
	}
	go u.reap()
	return u
}

// Conn is a connection to the upstream. Every read and write first moves
// the deadline: the Upstream's Timeout is the longest wait for the next
// bytes.
type Conn struct {
	net.Conn                  // the connection (TLS over tcp for https)
	raw       syscall.RawConn // the TCP socket under it, to peek at; nil if not TCP
	tls       *tls.Conn       // the TLS connection, for https
	u         *Pool           //
	Buf       *bufio.Reader   // response bytes
	idleSince time.Time       // when it was last put back
	// IdleFor bounds how long it may wait idle for its next request, from
	// its last response's Keep-Alive timeout (engine.ResponseHead's
	// IdleFor); 0: the pool's idle time. The engine sets it with each
	// response.
	IdleFor time.Duration
	Reused  bool // it served a request before this one
	got     bool // a byte of a response came since Get handed it out (Got)

	// peekFn is peekFD bound once, so that a peek allocates nothing;
	// peekN and peekErr are its results.
	peekFn  func(fd uintptr)
	peekN   int
	peekErr error

	// awaiting: the response head is awaited (AwaitHead). Its wait runs
	// from the last byte of the request sent, and reads do not move it:
	// an upstream that trickles its head a line at a time is cut off at
	// the timeout as the event loop does it (504), not fed on.
	awaiting atomic.Bool
}

// AwaitHead starts the wait for the response head: the Upstream's Timeout
// from now, then from each write of the request (a body may still be
// sent meanwhile), never moved by the head's own bytes. HeadRead ends it.
func (c *Conn) AwaitHead() error {
	c.awaiting.Store(true)
	return c.Conn.SetReadDeadline(time.Now().Add(c.u.timeout))
}

// ClientTurn stops the wait for the response head while the request's
// next bytes are the client's to send (a body streamed as it comes): a
// slow client is client_body_timeout's to judge, not the upstream's. The
// next Write starts the wait again.
func (c *Conn) ClientTurn() {
	if c.awaiting.Load() {
		_ = c.Conn.SetReadDeadline(time.Time{})
	}
}

// HeadRead ends the wait AwaitHead began: reads move their deadline again.
func (c *Conn) HeadRead() { c.awaiting.Store(false) }

func (c *Conn) Read(p []byte) (int, error) {
	if !c.awaiting.Load() {
		if err := c.Conn.SetReadDeadline(time.Now().Add(c.u.timeout)); err != nil {
			return 0, err
		}
	}
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.got = true
	}
	return n, err
}

// Got reports whether any of a response to the request it carries came
// back (an interim response, a piece of a head): the upstream took that
// request, and a failure after is no stale connection's (engine.Retryable
// is for a request nothing came back to).
func (c *Conn) Got() bool { return c.got }

func (c *Conn) Write(p []byte) (int, error) {
	deadline := time.Now().Add(c.u.timeout)
	if err := c.Conn.SetWriteDeadline(deadline); err != nil {
		return 0, err
	}
	if c.awaiting.Load() {
		if err := c.Conn.SetReadDeadline(deadline); err != nil {
			return 0, err
		}
	}
	return c.Conn.Write(p)
}

// DialError is a failure to connect to the upstream (a 502).
type DialError struct{ Err error }

func (e *DialError) Error() string { return "connecting to the upstream: " + e.Err.Error() }
func (e *DialError) Unwrap() error { return e.Err }

// Get returns an idle connection that is clean, or a new one. Every idle
// connection is checked before it is reused, however briefly it was idle
// (nginx's upstream keepalive does the same): bytes that an upstream sent
// after the end of a response (a body to a HEAD, a 204 or a 304; more
// than its Content-Length said) would otherwise be read as the response
// to the next request, another client's. One non-blocking peek, a fraction
// of a microsecond (BenchmarkCleanCheck).
func (u *Pool) Get(ctx context.Context) (*Conn, error) {
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
		if c.fresh(time.Now()) {
			clean, stray := c.clean()
			if clean {
				c.Reused, c.got = true, false
				return c, nil
			}
			if stray && u.Stray != nil {
				u.Stray()
			}
		}
		c.Conn.Close()
	}
	return u.Dial(ctx)
}

// Dial opens a new connection within the Upstream's ConnectTimeout (as
// for a tunnel, which will not go back to the pool).
func (u *Pool) Dial(ctx context.Context) (*Conn, error) {
	nc, err := u.dialer.DialContext(ctx, "tcp", u.Target.Addr)
	if err != nil {
		return nil, &DialError{err}
	}
	c := &Conn{u: u}
	c.peekFn = c.peekFD
	if tcp, ok := nc.(*net.TCPConn); ok {
		if c.raw, err = tcp.SyscallConn(); err != nil {
			nc.Close()
			return nil, &DialError{err}
		}
	}
	if u.tls != nil {
		tc := tls.Client(nc, u.tls)
		hs, cancel := context.WithTimeout(ctx, u.dialer.Timeout)
		err := tc.HandshakeContext(hs)
		cancel()
		if err != nil {
			nc.Close()
			return nil, &DialError{fmt.Errorf("TLS handshake: %w", err)}
		}
		nc, c.tls = tc, tc
	}
	c.Conn = nc
	c.Buf = bufio.NewReaderSize(c, ReadBuffer)
	return c, nil
}

// Put gives a connection whose last response was read to its end back to
// the pool, or closes it: it is not kept when the upstream sent more than
// that response (bytes already read past its end). It reports whether
// the connection was clean: when it was not, the response's framing
// cannot be trusted either, and nothing of it may be stored.
func (u *Pool) Put(c *Conn, now time.Time) (clean bool) {
	if c.Buf.Buffered() > 0 {
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
	if u.resting {
		u.resting = false
		u.wake <- struct{}{} // never blocks: one word a rest
	}
	u.mu.Unlock()
	return true
}

// Done ends the use of a connection whose response was read: back to the
// pool when reusable (Put), else closed. Either way it reports whether the
// connection was clean, as Put does.
func (u *Pool) Done(c *Conn, reusable bool, now time.Time) (clean bool) {
	if reusable {
		return u.Put(c, now)
	}
	clean = c.Buf.Buffered() == 0
	c.Conn.Close()
	return clean
}

// fresh reports whether an idle connection was idle for less than its
// bound at now: the pool's idle time, or less as the upstream's
// Keep-Alive said.
func (c *Conn) fresh(now time.Time) bool {
	idle := now.Sub(c.idleSince)
	return idle < c.u.idleTime && (c.IdleFor == 0 || idle < c.IdleFor)
}

// clean reports, without blocking, whether an idle connection has nothing
// to read and is still open: any byte or an EOF means it must not carry
// another request; stray says it was bytes (of a TLS connection, only
// application data read). A TLS connection may hold
// records that are no application data (TLS 1.3 session tickets, sent
// after the handshake): they are read through TLS, which consumes them,
// and only application data or a close counts.
func (c *Conn) clean() (clean, stray bool) {
	if c.raw == nil {
		return true, false // not TCP: nothing to peek at
	}
	pending, open := c.peek()
	switch {
	case !open:
		return false, false
	case !pending:
		return true, false
	case c.tls == nil:
		return false, true
	}
	// Records are waiting: read them with a deadline already passed, so
	// that a read finding no application data returns at once.
	if c.tls.SetReadDeadline(time.Now()) != nil {
		return false, false
	}
	var b [1]byte
	n, err := c.tls.Read(b[:])
	if n > 0 || !isTimeout(err) {
		return false, n > 0 // application data, a close, or an error
	}
	pending, open = c.peek()
	return open && !pending, false // bytes through TLS may be a close_notify
}

// peek looks at the TCP socket without blocking: pending when bytes wait
// to be read, open unless the peer closed it (or it failed). It peeks
// through Control, not the RawConn's Read, which fails once the read
// deadline has passed: the deadline the last read set (the upstream
// timeout, often shorter than the idle time), or the one clean sets to
// read TLS records without waiting. Through Read, every connection idle
// longer than the timeout was judged closed, and never reused.
func (c *Conn) peek() (pending, open bool) {
	if c.raw.Control(c.peekFn) != nil {
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

// reap looks at the idle connections (sweep) every sweepEvery, or a
// quarter of the pool's idle time if that is shorter, while there are
// any; it rests while none is idle, until Put wakes it, and returns at
// close.
func (u *Pool) reap() {
	defer close(u.done)
	every := min(u.idleTime/4, sweepEvery)
	t := time.NewTimer(every)
	defer t.Stop()
	for {
		select {
		case <-u.stop:
			return
		case <-u.wake:
			t.Reset(every)
		case now := <-t.C:
			if u.sweep(now) {
				t.Reset(every)
			}
		}
	}
}

// sweep closes the idle connections idle longer than their bound (fresh)
// and those that are no longer clean: closed by the upstream, or holding
// bytes it sent unasked (counted as Get counts them). It reports whether
// any is left; when none is, the reaper rests (resting). The checks do
// not block (one peek each; of a TLS connection with records waiting, a
// read whose deadline has passed), and run under the lock, so that no
// connection is handed out while it is checked.
func (u *Pool) sweep(now time.Time) (left bool) {
	stray := 0
	u.mu.Lock()
	kept := u.idle[:0]
	for _, c := range u.idle {
		if c.fresh(now) {
			clean, s := c.clean()
			if clean {
				kept = append(kept, c)
				continue
			}
			if s {
				stray++
			}
		}
		c.Conn.Close()
	}
	clear(u.idle[len(kept):])
	u.idle = kept
	left = len(kept) > 0
	u.resting = !left
	u.mu.Unlock()
	for ; stray > 0 && u.Stray != nil; stray-- {
		u.Stray()
	}
	return left
}

// Close closes the idle connections and stops the reaper; connections in
// use are closed when they are put back.
func (u *Pool) Close() {
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

// Relaying notes that a response body is read from c until Relayed: Cut
// closes it under its reader.
func (u *Pool) Relaying(c *Conn) {
	u.mu.Lock()
	if u.relaying == nil {
		u.relaying = map[*Conn]struct{}{}
	}
	u.relaying[c] = struct{}{}
	u.mu.Unlock()
}

// Relayed ends what Relaying began.
func (u *Pool) Relayed(c *Conn) {
	u.mu.Lock()
	delete(u.relaying, c)
	u.mu.Unlock()
}

// Cut closes the connections bodies are read from (Relaying): an engine
// that stops ends the goroutines that wait on them, rather than leave
// them to run into what it then lets go (a core's region unmapped) when
// the upstream ends their responses later, or never.
func (u *Pool) Cut() {
	u.mu.Lock()
	for c := range u.relaying {
		c.Conn.Close()
	}
	u.mu.Unlock()
}

// isTimeout reports whether err is a deadline passing.
func isTimeout(err error) bool {
	var te interface{ Timeout() bool }
	return errors.As(err, &te) && te.Timeout()
}
