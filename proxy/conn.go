package proxy

import (
	"errors"
	"io"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/preforkd/preforkd/core"
	"github.com/preforkd/preforkd/engine"
	"github.com/preforkd/preforkd/metrics"
	"github.com/valyala/fasthttp"
)

// The server's own bookkeeping of client connections. fasthttp serves
// them, but the deadlines are set here, at every state change and around
// every read of a body and every write, so that each timeout of Options
// means what it says (between two reads, between two writes) and so that
// a drain can tell an idle connection from a busy one.

// connState is where a client connection is in its life.
type connState uint8

const (
	stateNew      connState = iota // accepted; no byte of a request yet
	stateActive                    // a request is being read or answered
	stateIdle                      // between two requests
	stateHijacked                  // upgraded: a tunnel owns it
)

// conn is a client connection as fasthttp sees it.
type conn struct {
	net.Conn
	s    *Server
	peer netip.Addr // the client's address; zero for a non-IP connection

	// bodyTimeout, when positive, is set as the read deadline before
	// every read: the request body is being read. Touched only by the
	// goroutine that serves the connection.
	bodyTimeout time.Duration
	// readMu orders the deadline a body read sets and stopReading, which
	// another goroutine calls while a sender reads the body (readStopped).
	readMu      sync.Mutex
	readStopped bool
	// mute drops what is written: an error response to a connection that
	// sent no byte of a request (an idle timeout, a drain) would be read
	// as the answer to the client's next request.
	mute bool
	// head scans a header section being read (Read).
	head engine.HeadScan
	// early is the request expect parsed and began deciding, until the
	// handler serves it. Touched only by the serving goroutine.
	early *request
	// linger makes Close read what the client still sends for a moment
	// before closing, so that the error response it was sent is not lost
	// to a TCP reset.
	linger bool

	// reads counts the reads that returned bytes (the serving goroutine's,
	// and a request body's sender's); readsAtDone is reads when the last
	// handler ended, set by the serving goroutine (interim.go).
	reads       atomic.Uint64
	readsAtDone uint64

	mu        sync.Mutex // guards state, metric, served, idleSince and switching against Shutdown
	switching io.Closer  // the upstream's connection of a 101 not yet handed to its tunnel
	state     connState
	metric    metrics.ConnState // the state the worker's row counts it in
	served    int               // requests begun on this connection
	idleSince time.Time

	closeOnce sync.Once
	closeErr  error
}

// Read reads from the client, first moving the read deadline when a body
// is being read: ClientBodyTimeout is the longest wait between two reads.
// While a header section is awaited, what is read is scanned for a line
// ended by a bare LF: fasthttp waits for a CRLF CRLF that such a section
// never sends, until ReadHeaderTimeout; it is refused at once instead.
func (c *conn) Read(p []byte) (int, error) {
	if c.bodyTimeout > 0 {
		c.readMu.Lock()
		err := errReadStopped
		if !c.readStopped {
			err = c.Conn.SetReadDeadline(time.Now().Add(c.bodyTimeout))
		}
		c.readMu.Unlock()
		if err != nil {
			return 0, err
		}
	}
	if c.head.Refuse() {
		// The section now awaited came whole with the request before
		// it, and has a bare LF: fasthttp would wait for the CRLF CRLF.
		return 0, errBareLFRead
	}
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.reads.Add(1)
	}
	if n > 0 && c.head.Scan(p[:n]) {
		// The bytes go with the error: fasthttp takes a read of none
		// on a kept connection for the client leaving, and closes it
		// without the 400.
		return n, errBareLFRead
	}
	return n, err
}

// errReadStopped is a read of a body whose reading was stopped.
var errReadStopped = errors.New("proxy: the request body is no longer read")

// stopReading ends a read of the request body that waits for the client,
// and every later one: the upstream answered before it had the whole body
// (engine.SendWhileReading). The connection closes after the answer.
func (c *conn) stopReading() {
	c.readMu.Lock()
	defer c.readMu.Unlock()
	c.readStopped = true
	_ = c.Conn.SetReadDeadline(time.Now())
}

// errBareLFRead is a header section with a line ended by a bare LF.
var errBareLFRead = errors.New("proxy: a header line ended by a bare LF")

// Write writes to the client with SendTimeout as the longest wait.
func (c *conn) Write(p []byte) (int, error) {
	if c.mute {
		return len(p), nil
	}
	if err := c.Conn.SetWriteDeadline(time.Now().Add(c.s.opts.SendTimeout)); err != nil {
		return 0, err
	}
	return c.Conn.Write(p)
}

// ReadFrom writes what r gives to the client as it comes, each write
// through Write (SendTimeout, mute). fasthttp's writer hands a streamed
// body to it once the head is flushed: a piece of the body is then on its
// way at once, as on the other engines, rather than held in the writer's
// 4 KiB buffer, which a body the upstream cuts short dropped with the
// connection.
func (c *conn) ReadFrom(r io.Reader) (int64, error) {
	bp := copyBufPool.Get().(*[]byte)
	defer copyBufPool.Put(bp)
	return io.CopyBuffer(writeOnly{c}, r, *bp)
}

// CloseWrite half-closes the client's connection: a tunnel passes the
// upstream's end on so (engine.Tunnel).
func (c *conn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return errors.ErrUnsupported
}

// writeOnly hides its writer's ReadFrom from io.CopyBuffer.
type writeOnly struct{ io.Writer }

// switch101 makes up the upstream connection c closes with it, until the
// tunnel takes it (nil).
func (c *conn) switch101(up io.Closer) {
	c.mu.Lock()
	c.switching = up
	c.mu.Unlock()
}

// Close closes the connection once and forgets it.
func (c *conn) Close() error {
	c.closeOnce.Do(func() {
		if r := c.early; r != nil && r.ex != nil {
			// A request that expect let go on, whose handler never ran
			// and whose body's failure bodyUnread did not answer: the
			// 100 Continue could not be written, so the client went
			// away before its response began (499, as on the other
			// engines; a 400 nobody was sent counted among client
			// errors).
			c.early = nil
			r.ex.Finish(core.ErrClientGone)
		}
		if c.linger && !c.mute {
			engine.LingerClose(c.Conn)
		}
		c.mu.Lock()
		c.setMetric(metrics.ConnClosed)
		up := c.switching
		c.switching = nil
		c.mu.Unlock()
		if up != nil {
			// fasthttp could not send the 101, and never ran the tunnel.
			up.Close()
		}
		// Forgotten before the close frees its slot: the next connection
		// the slot lets in is never counted beside it (Stats().Open).
		c.s.forget(c)
		c.closeErr = c.Conn.Close()
	})
	return c.closeErr
}

// setState is the fasthttp ConnState hook: it moves the read deadline to
// what the new state allows.
func (s *Server) setState(nc net.Conn, st fasthttp.ConnState) {
	c, ok := nc.(*conn)
	if !ok {
		return
	}
	switch st {
	case fasthttp.StateActive:
		c.mu.Lock()
		c.state = stateActive
		c.setMetric(metrics.ConnReading) // a request's head is read
		c.served++
		if c.served > 1 {
			// The header must be complete ReadHeaderTimeout after its
			// first byte. A new connection keeps the deadline it got at
			// the accept.
			_ = c.Conn.SetReadDeadline(time.Now().Add(s.opts.ReadHeaderTimeout))
		}
		c.mu.Unlock()
	case fasthttp.StateIdle:
		c.bodyTimeout = 0
		c.head.Start()
		c.mu.Lock()
		c.state = stateIdle
		c.setMetric(metrics.ConnIdle)
		c.idleSince = time.Now()
		wait := s.opts.IdleTimeout
		if s.draining.Load() {
			wait = min(wait, s.opts.DrainIdleGrace)
		}
		_ = c.Conn.SetReadDeadline(c.idleSince.Add(wait))
		c.mu.Unlock()
	case fasthttp.StateHijacked:
		c.mu.Lock()
		c.state = stateHijacked
		c.mu.Unlock()
	}
}

// setMetric moves c to state st in the worker's row (c.mu is held); a
// tunnel stays counted as writing until it closes.
func (c *conn) setMetric(st metrics.ConnState) {
	c.s.cm.Move(c.metric, st)
	c.metric = st
}

// listener hands fasthttp the connections of the server's listener, at
// most MaxConnections at a time (engine.Listener: a connection's slot is
// free again when it closes), each tracked by the server.
type listener struct {
	*engine.Listener
	s *Server
}

func (l *listener) Accept() (net.Conn, error) {
	nc, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return l.s.track(nc, l), nil
}
