//go:build linux

package loop

import (
	"errors"
	"fmt"
	"net/netip"
	"time"

	"golang.org/x/sys/unix"

	"github.com/preforkd/preforkd/core"
	"github.com/preforkd/preforkd/engine"
	"github.com/preforkd/preforkd/metrics"
)

// A client connection on its loop: its bytes in and out, its state, its
// one timer. An idle connection holds no buffer: what a read brings is
// handled from the loop's read buffer, and only what is left over (a
// partial head, a pipelined request) is kept with the connection.

type connState uint8

const (
	csNew    connState = iota // accepted; no byte of a request yet
	csHead                    // a head is being read
	csBusy                    // a request is in progress
	csIdle                    // between two requests
	csTunnel                  // upgraded: a tunnel carries its bytes
	csLinger                  // closing: the answer is sent, what the client still sends is read and dropped
	csClosed
)

// gauges are the states as the worker's connection gauges count them
// (metrics.Conns, nginx's stub_status): a new connection waits for its
// first header, an upgraded or closing one is still in its request.
var gauges = [...]metrics.ConnState{
	csNew: metrics.ConnReading, csHead: metrics.ConnReading,
	csBusy: metrics.ConnWriting, csTunnel: metrics.ConnWriting, csLinger: metrics.ConnWriting,
	csIdle:   metrics.ConnIdle,
	csClosed: metrics.ConnClosed,
}

// setState moves c to st, and its count in the gauges with it: one atomic
// add when the gauge changes, none when it does not.
func (c *conn) setState(st connState) {
	c.l.s.conns.Move(gauges[c.state], gauges[st])
	c.state = st
}

var (
	// errServerClosed ends what the loop still held when it stopped (a
	// drain past its deadline): no response reaches those clients, which
	// the core counts as it counts a client gone (499), not as a 500 it
	// was never sent.
	errServerClosed = fmt.Errorf("loop: the server closed the connection: %w", core.ErrClientGone)
	errClientGone   = core.ErrClientGone
	errSendTimeout  = errors.New("loop: the client read nothing for the send timeout")
)

type conn struct {
	l     *loop
	fd    int
	have  uint8
	state connState
	// closeAfter: the connection closes once its output is sent.
	closeAfter bool
	linger     bool // ... after a half-close and a moment of reading
	eof        bool // the client half-closed
	noDelay    bool // TCP_NODELAY is set
	processing bool // process is running: what ends a request leaves the input to it
	broken     bool // a write failed: the connection closes at the next task
	peer       netip.Addr
	t          timer
	since      int64 // the tick of the accept, or of the end of the last response
	readDue    int64 // the tick a read wait ends at (header, body, idle), 0 for none
	writeDue   int64 // the tick the output must have moved by, 0 for none
	lingered   int   // bytes read while lingering
	scanned    int   // bytes of a head in the input already scanned for its end

	in     []byte // read and not yet taken, from inOff
	inOff  int
	out    []byte // not yet sent, from outOff
	outOff int

	r    *request
	tun  *tunnel
	prev *conn
	next *conn
}

// connList is a loop's client connections, intrusive.
type connList struct{ head conn }

func (cl *connList) init() { cl.head.prev, cl.head.next = &cl.head, &cl.head }
func (cl *connList) add(c *conn) {
	c.prev, c.next = cl.head.prev, &cl.head
	cl.head.prev.next = c
	cl.head.prev = c
}
func (cl *connList) remove(c *conn) {
	c.prev.next, c.next.prev = c.next, c.prev
	c.prev, c.next = nil, nil
}
func (cl *connList) first() *conn {
	if cl.head.next == &cl.head {
		return nil
	}
	return cl.head.next
}

// newConn starts serving an accepted connection.
func (l *loop) newConn(fd int, peer netip.Addr) {
	c := &conn{l: l, fd: fd, peer: peer, since: l.wheel.at()}
	c.t.f = c
	if err := l.register(fd, c, &c.have, wantRead); err != nil {
		_ = unix.Close(fd)
		l.s.connClosed()
		return
	}
	l.conns.add(c)
	l.s.conns.Move(metrics.ConnClosed, gauges[csNew])
	wait := l.s.o.limits.ReadHeaderTimeout
	if l.draining {
		wait = min(wait, l.s.drainNewGrace)
	}
	c.readDue = l.wheel.due(wait)
	c.rearm()
}

// rearm sets the timer to the nearest of the connection's waits.
func (c *conn) rearm() {
	due := c.readDue
	if c.writeDue != 0 && (due == 0 || c.writeDue < due) {
		due = c.writeDue
	}
	w := &c.l.wheel
	if due == 0 {
		w.disarm(&c.t)
		return
	}
	w.armAt(&c.t, due)
}

func (c *conn) setRead(d time.Duration) {
	c.readDue = c.l.wheel.due(d)
	c.rearm()
}

func (c *conn) clearRead() {
	if c.readDue != 0 {
		c.readDue = 0
		c.rearm()
	}
}

// event handles what the poller says of the connection.
func (c *conn) event(ev uint32) {
	if ev&(unix.EPOLLOUT|unix.EPOLLERR|unix.EPOLLHUP) != 0 && c.outLen() > 0 {
		c.flush()
		if c.state == csClosed {
			return
		}
	}
	if ev&(unix.EPOLLIN|unix.EPOLLERR|unix.EPOLLHUP) != 0 && c.have&wantRead != 0 {
		c.readable()
	} else if ev&(unix.EPOLLERR|unix.EPOLLHUP) != 0 && c.have&wantRead == 0 && c.outLen() == 0 {
		c.close(errClientGone)
	}
}

// readable reads what the client sent.
func (c *conn) readable() {
	l := c.l
	switch c.state {
	case csTunnel:
		c.tun.fromClient()
		return
	case csLinger:
		c.drainLinger()
		return
	}
	n, err := read(c.fd, l.rbuf)
	switch {
	case c.stopped(err):
		return
	case n == 0:
		c.readEOF()
		return
	}
	c.feed(l.rbuf[:n])
}

// stopped reports whether a read or write of the client's socket went
// no further: it would block (the loop calls again when it is ready), or
// it failed, and the connection is closed.
func (c *conn) stopped(err error) bool {
	if err != nil && err != unix.EAGAIN {
		c.close(errClientGone)
	}
	return err != nil
}

// readEOF: the client will send nothing more.
func (c *conn) readEOF() {
	c.eof = true
	switch c.state {
	case csNew, csIdle, csHead:
		// Nothing, or half a head: nobody to answer. But the answers
		// to the requests before go out first: the connection closes
		// once they were sent (drained), under send_timeout.
		if c.outLen() > 0 {
			c.closeAfter = true
			c.readDue = 0
			c.rearm()
			_ = c.l.interest(c.fd, &c.have, c.have&^wantRead)
			return
		}
		c.close(nil)
		return
	}
	r := c.r
	_ = c.l.interest(c.fd, &c.have, c.have&^wantRead)
	if r != nil && !r.body.done && r.body.err == nil {
		r.bodyFailed(engine.ErrBodyEnded)
		return
	}
	c.closeAfter = true
	if r != nil && r.phase < phRelay {
		// Nothing was answered yet: the client may be gone, or may have
		// half-closed after its request. Either way no request follows.
		r.gone.Store(true)
	}
}

// feed handles p, just read.
func (c *conn) feed(p []byte) {
	if c.inLen() > 0 {
		c.in = c.l.grow(c.in, p)
		c.process(nil)
		return
	}
	c.process(p)
}

// process handles p, or when p is nil the connection's input: heads are
// read and requests begun, body bytes taken; what is left is kept in the
// input, and the connection is not read while the input is full.
func (c *conn) process(p []byte) {
	fromIn := p == nil
	if fromIn {
		p = c.in[c.inOff:]
	}
	c.processing = true
	for len(p) > 0 && c.state != csClosed && !c.broken {
		if c.r == nil {
			if c.state == csTunnel || c.state == csLinger || c.closeAfter {
				break
			}
			if c.outLen() >= highWater {
				// The client does not read its answers: the next request
				// waits in the input until they drain (drained), however
				// fast the core answers them (cache hits, refusals).
				break
			}
			n := c.readHead(p)
			if n == 0 {
				break
			}
			p = p[n:]
			continue
		}
		r := c.r
		if !r.body.taking() || r.upstreamFull() {
			// Nothing more is wanted now, or the upstream has highWater
			// queued: the rest waits in the input buffer, and reading
			// stops when that fills (checkInput) until flush drains the
			// queue and processes again.
			break
		}
		n := r.feedBody(p)
		p = p[n:]
		r.bodyProgress()
	}
	c.processing = false
	if c.state == csClosed {
		return
	}
	c.keep(p, fromIn)
	c.checkInput()
}

// keep keeps p, the part of what was handled that is left, as the input.
func (c *conn) keep(p []byte, fromIn bool) {
	l := c.l
	switch {
	case len(p) == 0:
		if c.in != nil {
			l.putBuf(c.in)
			c.in, c.inOff = nil, 0
		}
	case fromIn:
		c.inOff = len(c.in) - len(p)
		if c.inOff > len(c.in)/2 {
			copy(c.in, p)
			c.in = c.in[:len(p)]
			c.inOff = 0
		}
	default:
		c.in = append(l.getBuf(len(p)), p...)
		c.inOff = 0
	}
}

func (c *conn) inLen() int { return len(c.in) - c.inOff }

// maxInput bounds the input kept: a head being read (MaxHeaderBytes), or
// what arrived while a request is in progress.
func (c *conn) maxInput() int {
	if c.r == nil {
		return c.l.s.o.limits.MaxHeaderBytes
	}
	return readAheadBytes
}

// checkInput pauses reading a connection whose input is full, and
// resumes one that has room again; a head over the limit is a 431.
func (c *conn) checkInput() {
	if c.state == csClosed || c.state == csTunnel || c.state == csLinger {
		return
	}
	full := c.inLen() >= c.maxInput()
	// Between requests, a client with highWater of answers unread is not
	// read either: what it sends waits in the socket, and what it sent
	// waits in the input, unread for heads (process), however much.
	held := c.r == nil && (c.closeAfter || c.outLen() >= highWater)
	if full && !held && c.r == nil && (c.state == csHead || c.state == csNew || c.state == csIdle) {
		c.refuse(engine.ErrTooLarge)
		return
	}
	want := c.have &^ wantRead
	if !full && !c.eof && !c.broken && !held {
		want |= wantRead
	}
	_ = c.l.interest(c.fd, &c.have, want)
}

// readHead reads a head from p: it returns how many bytes of p it took,
// 0 when the head is not whole yet.
func (c *conn) readHead(p []byte) int {
	l := c.l
	if c.state != csHead {
		// Empty lines before a request line (a CRLF some clients send
		// after a body, RFC 9112 §2.2) begin no head: the connection stays
		// as it was, under its idle wait, and is never answered a 408.
		if skip := skipEmptyLines(p); skip > 0 {
			return skip
		}
		if len(p) == 1 && p[0] == '\r' {
			// An empty line's CR whose LF comes in the next read: still
			// before the request line, which scanHead would take it for.
			return 0
		}
	}
	switch c.state {
	case csIdle:
		// The header must be whole ReadHeaderTimeout after its first
		// byte. A new connection keeps the wait it got at the accept.
		c.setRead(l.s.o.limits.ReadHeaderTimeout)
		fallthrough
	case csNew:
		c.setState(csHead)
		c.scanned = 0
	}
	end, bad := scanHead(p, max(c.scanned-3, 0))
	switch {
	case bad != nil:
		c.refuse(bad)
		return len(p)
	case end == 0:
		c.scanned = len(p)
		if len(p) > l.s.o.limits.MaxHeaderBytes {
			c.refuse(engine.ErrTooLarge)
			return len(p)
		}
		return 0
	case end > l.s.o.limits.MaxHeaderBytes:
		c.refuse(engine.ErrTooLarge)
		return len(p)
	}
	c.scanned = 0
	c.startRequest(p[:end])
	return end
}

// outLen is how many bytes wait to be sent.
func (c *conn) outLen() int { return len(c.out) - c.outOff }

// queue adds p to what the next send writes. p is not copied: it must
// stay as it is until send.
func (c *conn) queue(p []byte) {
	if len(p) == 0 {
		return
	}
	l := c.l
	l.iov = append(l.iov, p)
	if len(l.iov) >= 256 {
		c.send()
	}
}

// send writes what was queued: at once when nothing waits before it, and
// what the socket does not take into the output, sent as it drains.
func (c *conn) send() {
	l := c.l
	iov := l.iov
	l.iov = l.iov[:0]
	if c.state == csClosed || c.broken || len(iov) == 0 {
		return
	}
	if c.outLen() == 0 {
		n, err := l.writev(c.fd, iov)
		switch {
		case err == unix.EAGAIN:
			n = 0
		case err != nil:
			c.breakOff()
			return
		}
		for len(iov) > 0 && n >= len(iov[0]) {
			n -= len(iov[0])
			iov = iov[1:]
		}
		if len(iov) == 0 {
			return
		}
		iov[0] = iov[0][n:]
	}
	if c.out == nil {
		c.out = l.getBuf(smallBuf)
	} else if c.outOff > 0 && c.outOff == len(c.out) {
		c.out, c.outOff = c.out[:0], 0
	}
	for _, p := range iov {
		c.out = l.grow(c.out, p)
	}
	if c.have&wantWrite == 0 {
		_ = l.interest(c.fd, &c.have, c.have|wantWrite)
		c.writeDue = l.wheel.due(l.s.o.limits.SendTimeout)
		c.rearm()
	}
}

// write queues p and sends.
func (c *conn) write(p []byte) {
	c.queue(p)
	c.send()
}

// flush sends the output as far as the socket takes it.
func (c *conn) flush() {
	l := c.l
	for c.outLen() > 0 {
		n, err := write(c.fd, c.out[c.outOff:])
		if c.stopped(err) {
			return
		}
		c.outOff += n
		c.writeDue = l.wheel.due(l.s.o.limits.SendTimeout)
		c.rearm()
	}
	l.putBuf(c.out)
	c.out, c.outOff = nil, 0
	c.writeDue = 0
	c.rearm()
	_ = l.interest(c.fd, &c.have, c.have&^wantWrite)
	c.drained()
}

// drained runs when the output was all sent: a paused upstream goes on,
// a connection that ends after its response closes.
func (c *conn) drained() {
	switch {
	case c.state == csTunnel:
		c.tun.clientDrained()
	case c.r != nil:
		c.r.clientDrained()
	case c.closeAfter:
		c.shut()
	case c.state == csIdle && c.inLen() > 0 && !c.processing:
		// A pipelined request waits for this output to go (endRequest
		// leaves it while the output is over highWater): its turn. What
		// began no head (empty lines) leaves the connection idle, and its
		// idle wait begins now, as below.
		c.process(nil)
		if c.state == csIdle && c.readDue == 0 {
			c.since = c.l.wheel.at()
			c.setRead(c.idleWait())
		}
	case !c.processing:
		// Between requests with nothing in the input: the idle wait
		// begins now that the last answer was sent (endRequest), and
		// the client is read again if reading stopped while highWater
		// of answers waited (checkInput).
		if c.state == csIdle && c.readDue == 0 {
			c.since = c.l.wheel.at()
			c.setRead(c.idleWait())
		}
		c.checkInput()
	}
}

// idleWait is how long a connection with no request in progress is
// kept: idle_timeout, or during a drain its grace.
func (c *conn) idleWait() time.Duration {
	s := c.l.s
	if c.l.draining {
		return min(s.drainIdleGrace, s.o.limits.IdleTimeout)
	}
	return s.o.limits.IdleTimeout
}

// backlog is how much output waits.
func (c *conn) backlog() int { return c.outLen() }

// breakOff marks a connection whose write failed: what is under way goes
// on without it, and the connection closes at the next task.
func (c *conn) breakOff() {
	if c.broken {
		return
	}
	c.broken = true
	if c.r != nil {
		c.r.gone.Store(true)
	}
	_ = c.l.run1(c.l.onClose, c)
}

// shut closes a connection whose last response was sent: at once, or
// after a half-close and a moment of reading what the client still sends
// (after an error answer), so that the answer is not lost to a reset.
func (c *conn) shut() {
	if !c.linger {
		c.close(nil)
		return
	}
	if unix.Shutdown(c.fd, unix.SHUT_WR) != nil {
		c.close(nil)
		return
	}
	c.setState(csLinger)
	c.writeDue = 0
	c.setRead(engine.LingerTime)
	_ = c.l.interest(c.fd, &c.have, wantRead)
}

func (c *conn) drainLinger() {
	for {
		n, err := read(c.fd, c.l.rbuf)
		switch {
		case err == unix.EAGAIN:
			return
		case err != nil || n == 0:
			c.close(nil)
			return
		}
		if c.lingered += n; c.lingered >= engine.LingerBytes {
			c.close(nil)
			return
		}
	}
}

// expire handles the connection's timer.
func (c *conn) expire() {
	l := c.l
	now := l.wheel.now
	if c.writeDue != 0 && c.writeDue <= now {
		c.close(errSendTimeout) // a client that reads nothing
		return
	}
	if c.readDue == 0 || c.readDue > now {
		c.rearm()
		return
	}
	c.readDue = 0
	switch c.state {
	case csIdle:
		if c.outLen() > 0 {
			// Its last answer is still being sent, under send_timeout:
			// the idle wait begins once it was (drained).
			c.rearm()
			return
		}
		c.close(nil) // nobody to answer
	case csNew, csLinger:
		c.close(nil) // nobody to answer
	case csHead:
		c.refuse(engine.ErrHeadTimeout)
	case csBusy:
		if r := c.r; r != nil && r.body.taking() {
			r.bodyFailed(engine.ErrBodyTimeout)
			return
		}
		c.rearm()
	case csTunnel:
		c.tun.expire()
	}
}

// close closes the connection at once. A request in progress ends: its
// upstream is let go, unless the core keeps its response, which is then
// read to its end for the retry or the cache.
func (c *conn) close(err error) {
	if c.state == csClosed {
		return
	}
	l := c.l
	c.setState(csClosed)
	l.wheel.unlink(&c.t)
	l.conns.remove(c)
	l.forget(c.fd, &c.have)
	l.release(&c.in)
	l.release(&c.out)
	if c.tun != nil {
		c.tun.close()
	}
	if r := c.r; r != nil {
		c.r = nil
		if err == nil {
			err = errClientGone
		}
		r.clientClosed(err)
	}
	l.s.connClosed()
}

// endRequest makes the connection ready for the next request once a
// response was handed over whole: it is kept alive or closed, and a
// request already read is begun.
func (c *conn) endRequest() {
	if c.state == csClosed {
		return
	}
	c.r = nil
	l := c.l
	if c.broken {
		return // the close task ends it
	}
	if c.closeAfter {
		// It said Connection: close (always, once the drain began
		// before its head was written).
		if c.outLen() == 0 {
			c.shut()
		}
		return
	}
	// A response whose head went out before the drain began did not say
	// Connection: close: the client may send another request at once,
	// which is answered with it. The connection waits the drain's grace.
	c.setState(csIdle)
	c.since = l.wheel.at()
	if !c.noDelay {
		// A connection that stays: its next response must not wait for
		// the acknowledgement of this one (nginx's tcp_nodelay).
		_ = unix.SetsockoptInt(c.fd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1)
		c.noDelay = true
	}
	// Idle: a head in the input is begun by process, which readHead gives
	// read_header_timeout from there (empty lines begin none).
	if c.outLen() == 0 {
		c.setRead(c.idleWait())
	} else {
		// The answer is still being sent, under send_timeout: the wait
		// for the next request begins once it was (drained), or when
		// its head is begun.
		c.clearRead()
	}
	if c.processing {
		return // process goes on with the input
	}
	if c.inLen() > 0 && c.outLen() < highWater {
		c.process(nil)
		return
	}
	c.checkInput()
}

// write is write(2) for one buffer, without allocating for an error.
func write(fd int, p []byte) (int, error) {
	return rw(unix.SYS_WRITE, fd, unsafePointer(p), len(p))
}
