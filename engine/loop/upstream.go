//go:build linux

package loop

import (
	"errors"
	"fmt"
	"net/netip"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/preforkd/preforkd/core"
	"github.com/preforkd/preforkd/engine"
)

// The upstream side: connections to the application, registered on the
// same loop as the clients they serve, and pooled per loop. A pooled
// connection stays polled while it waits: a byte or an EOF on it closes
// it at once, and every reuse peeks at it once more (SPEC "One request,
// one truth": a connection is reused only when clean).

type upState uint8

const (
	upConnecting upState = iota
	upBusy
	upIdle
	upClosed
)

type upConn struct {
	l     *loop
	fd    int
	have  uint8
	state upState
	t     timer
	r     *request

	reused bool // it served a request before this one
	// idleFor bounds its wait for the next request, from its last
	// response's Keep-Alive (engine.ResponseHead's IdleFor); 0: the
	// upstream_idle_timeout.
	idleFor time.Duration
	keep    bool // it may serve another after this response
	got     bool // a byte of the response arrived
	paused  bool // not read: the client's output is full

	parts  [2][]byte // what send writes: a field, so that it does not escape per call
	in     []byte    // a response head read in part
	out    []byte    // request bytes not yet sent, from outOff
	outOff int

	tun      *tunnel // the tunnel it carries, once upgraded
	writeErr error   // a write failed: the failure is handled by a task

	// The dial's addresses, the one it began with, and how many it tried:
	// one that refuses or does not answer in time gives way to the next,
	// until dialDue, the tick at which the connect timeout of the whole
	// dial has passed.
	addrs        []netip.AddrPort
	first, tried int
	dialDue      int64

	resp     respHead
	headDone bool
	interims int
	mode     uint8 // how the response body is framed (frame*)
	left     int64
	dec      chunkDecoder
}

// dialError is a failure to connect to the upstream: 502.
type dialError struct{ err error }

func (e *dialError) Error() string { return "loop: connecting to the upstream: " + e.err.Error() }
func (e *dialError) Unwrap() error { return e.err }

var (
	errUnresolved     = errors.New("the upstream's name is not resolved (yet)")
	errConnectTimeout = errors.New("no connection within the connect timeout")
	errUpstreamSilent = errors.New("loop: no response from the upstream within the timeout")
)

// upPool is a loop's idle upstream connections, the most recent first.
type upPool struct {
	l    *loop
	idle []*upConn
	max  int
}

func (p *upPool) init(l *loop) { p.l = l }

// get returns a clean idle connection, or a new one.
func (p *upPool) get() (*upConn, error) {
	for n := len(p.idle); n > 0; n = len(p.idle) {
		u := p.idle[n-1]
		p.idle[n-1] = nil
		p.idle = p.idle[:n-1]
		if u.clean() {
			u.state, u.reused = upBusy, true
			return u, nil
		}
		u.drop()
	}
	return p.l.dial()
}

// put keeps u for another request, or closes it.
// A connection with request bytes still queued (an upstream that answered
// before it read the whole body) is closed: the next request's head would
// go out behind them, inside this one's body.
func (p *upPool) put(u *upConn) {
	if !u.keep || u.backlog() > 0 || len(p.idle) >= p.max || p.l.draining && p.l.s.closing() {
		u.close()
		return
	}
	u.r = nil
	u.state = upIdle
	u.resetResponse()
	_ = p.l.interest(u.fd, &u.have, wantRead)
	idle := p.l.s.o.client.IdleTimeout
	if u.idleFor > 0 {
		idle = min(idle, u.idleFor)
	}
	p.l.wheel.arm(&u.t, idle)
	p.idle = append(p.idle, u)
}

// remove takes u out of the idle list.
func (p *upPool) remove(u *upConn) {
	for i, v := range p.idle {
		if v == u {
			copy(p.idle[i:], p.idle[i+1:])
			p.idle[len(p.idle)-1] = nil
			p.idle = p.idle[:len(p.idle)-1]
			return
		}
	}
}

func (p *upPool) closeIdle() {
	for len(p.idle) > 0 {
		p.idle[len(p.idle)-1].close()
	}
}

// dial opens a connection to the upstream, without waiting for it.
func (l *loop) dial() (*upConn, error) {
	addrs, first := l.s.upstreamAddrs()
	if len(addrs) == 0 {
		return nil, &dialError{errUnresolved}
	}
	u := &upConn{l: l, state: upBusy, addrs: addrs, first: first, dialDue: l.wheel.due(l.s.o.client.ConnectTimeout)}
	u.t.f = u
	if err := u.connect(); err != nil {
		return nil, err
	}
	l.upstreams++
	return u, nil
}

// connect begins a connection to the next of the dial's addresses not
// tried yet, passing over those that fail at once; the error is the last
// one's.
func (u *upConn) connect() error {
	var err error
	for u.tried < len(u.addrs) {
		ap := u.addrs[(u.first+u.tried)%len(u.addrs)]
		u.tried++
		if err = u.connectTo(ap); err == nil {
			return nil
		}
	}
	return &dialError{err}
}

// connectTo begins a connection to ap on a new socket.
func (u *upConn) connectTo(ap netip.AddrPort) error {
	l := u.l
	var sa unix.Sockaddr
	family := unix.AF_INET
	if ap.Addr().Is4() {
		sa = &unix.SockaddrInet4{Port: int(ap.Port()), Addr: ap.Addr().As4()}
	} else {
		family = unix.AF_INET6
		sa = &unix.SockaddrInet6{Port: int(ap.Port()), Addr: ap.Addr().As16()}
	}
	fd, err := unix.Socket(family, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("socket: %w", err)
	}
	_ = unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1)
	u.state = upBusy
	want := wantRead
	switch err = unix.Connect(fd, sa); err {
	case nil:
	case unix.EINPROGRESS:
		u.state, want = upConnecting, wantWrite
	default:
		_ = unix.Close(fd)
		return err
	}
	if err := l.register(fd, u, &u.have, want); err != nil {
		_ = unix.Close(fd)
		return err
	}
	u.fd = fd
	if u.state == upConnecting {
		l.wheel.armAt(&u.t, u.connectDue())
	}
	return nil
}

// minConnectShare is the least of the connect timeout an address gets
// while that much is left (net.Dialer's "sane minimum").
const minConnectShare = 2 * time.Second

// connectDue is the tick by which the attempt just begun must connect:
// an equal share of what is left of the dial's connect timeout for each
// address not tried yet (but at least minConnectShare of it), as
// net.Dialer, which the other engines dial with, shares it. However many
// addresses a name has, the dial ends within upstream_connect_timeout.
func (u *upConn) connectDue() int64 {
	w := &u.l.wheel
	at := w.at()
	left := u.dialDue - at
	share := left / int64(len(u.addrs)-u.tried+1)
	return at + max(share, min(left, ticks(minConnectShare)))
}

// redial moves a connection attempt that failed (refused, or no answer
// within its share of the connect timeout) on to the dial's next address,
// keeping what is queued for it; false when none is left, the dial's
// connect timeout has passed, or none can be tried.
func (u *upConn) redial() bool {
	if u.tried >= len(u.addrs) || u.l.wheel.at() >= u.dialDue {
		return false
	}
	u.l.wheel.unlink(&u.t)
	u.l.forget(u.fd, &u.have)
	if err := u.connect(); err != nil {
		// Not even a socket: the connection is closed as failed, and
		// close forgets no descriptor twice.
		u.fd = -1
		return false
	}
	if u.state == upBusy {
		u.connected() // connected at once: what is queued goes
	}
	return true
}

// drop closes an idle connection that is not clean, counting bytes the
// upstream sent on it unasked (strayFound); an EOF or an error is no
// fault of a response.
func (u *upConn) drop() {
	if n, e := u.peek(); e == 0 && n > 0 {
		u.l.s.strayFound()
	}
	u.close()
}

// peek looks at the socket without blocking or reading: n is 1 when a
// byte waits, 0 at EOF; e is EAGAIN when nothing does. Raw, as rw's
// calls: MSG_DONTWAIT returns at once.
func (u *upConn) peek() (n uintptr, e unix.Errno) {
	var b [1]byte
	n, _, e = unix.RawSyscall6(unix.SYS_RECVFROM, uintptr(u.fd), uintptr(unsafe.Pointer(&b[0])), 1,
		unix.MSG_PEEK|unix.MSG_DONTWAIT, 0, 0)
	return n, e
}

// clean reports, without blocking, whether an idle connection has nothing
// to read and is still open: any byte or an EOF means it must not carry
// another request — bytes an upstream sent after a response (a body to a
// HEAD, a 204 or a 304; more than its Content-Length said) would
// otherwise be read as the response to the next request, another
// client's.
func (u *upConn) clean() bool {
	_, e := u.peek()
	return e == unix.EAGAIN
}

// start sends r on u.
func (u *upConn) start(r *request) {
	u.r = r
	u.got, u.keep, u.writeErr = false, false, nil
	u.resetResponse()
	if r.streamed {
		u.queueRaw(r.sent)
		u.queueBody(r.body.buf, r.body.mode == bodyChunked)
		r.body.buf = r.body.buf[:0]
		r.body.sink, r.body.limit = sinkUpstream, 0
	} else if u.state == upConnecting {
		u.queueRaw(r.sent)
		u.queueRaw(r.body.buf)
	} else {
		u.send(r.sent, r.body.buf) // the usual case: at once, without a copy
	}
	if u.state == upConnecting {
		return
	}
	u.l.wheel.arm(&u.t, u.l.s.o.client.Timeout)
	u.flush()
	if r.streamed && u.state != upClosed && r.c != nil && !r.c.processing {
		r.c.process(nil)
	}
}

func (u *upConn) resetResponse() {
	u.headDone, u.interims, u.mode, u.left, u.paused = false, 0, frameNone, 0, false
	u.dec = chunkDecoder{}
	u.l.release(&u.in)
}

// send writes head and body at once, in one system call, and queues
// what the socket did not take. Nothing may be queued before.
func (u *upConn) send(head, body []byte) {
	l := u.l
	u.parts = [2][]byte{head, body}
	n, err := l.writev(u.fd, u.parts[:])
	u.parts = [2][]byte{}
	switch {
	case err == unix.EAGAIN:
		n = 0
	case err != nil:
		u.writeErr = err
		_ = l.interest(u.fd, &u.have, 0)
		_ = l.run1(l.onUpFail, u)
		return
	}
	if n < len(head) {
		u.queueRaw(head[n:])
		u.queueRaw(body)
	} else if n-len(head) < len(body) {
		u.queueRaw(body[n-len(head):])
	}
}

// queueRaw adds p to what is sent.
func (u *upConn) queueRaw(p []byte) {
	if len(p) == 0 {
		return
	}
	if u.out == nil {
		u.out = u.l.getBuf(len(p))
	}
	u.out = u.l.grow(u.out, p)
}

// queueBody adds a piece of the body, as a chunk when chunked.
func (u *upConn) queueBody(p []byte, chunked bool) {
	if len(p) == 0 {
		return
	}
	if chunked {
		var h [20]byte
		u.queueRaw(appendChunkHead(h[:0], len(p)))
		u.queueRaw(p)
		u.queueRaw(crlf)
		return
	}
	u.queueRaw(p)
}

var crlf = []byte("\r\n")

func (u *upConn) backlog() int { return len(u.out) - u.outOff }

// flush sends what is queued as far as the socket takes it.
func (u *upConn) flush() {
	l := u.l
	if u.state != upBusy || u.writeErr != nil {
		return
	}
	for u.backlog() > 0 {
		n, err := write(u.fd, u.out[u.outOff:])
		switch {
		case err == unix.EAGAIN:
			_ = l.interest(u.fd, &u.have, u.have|wantWrite)
			return
		case err != nil:
			// Handled by a task of its own: flush runs in the middle
			// of what the client's bytes set off.
			u.writeErr = err
			_ = l.interest(u.fd, &u.have, 0)
			_ = l.run1(l.onUpFail, u)
			return
		}
		u.outOff += n
		if !u.headDone {
			l.wheel.arm(&u.t, l.s.o.client.Timeout)
		}
	}
	l.putBuf(u.out)
	u.out, u.outOff = nil, 0
	_ = l.interest(u.fd, &u.have, u.have&^wantWrite|wantRead)
	if r := u.r; r != nil && r.body.sink == sinkUpstream {
		if c := r.c; c != nil && !c.processing && c.inLen() > 0 {
			c.process(nil)
		} else if c != nil && !c.processing {
			if r.body.taking() {
				// The client's turn again (bodyProgress stopped its
				// clock while the upstream had highWater queued), and
				// not the upstream's: its clock stops until the next
				// bytes go (a slow client is client_body_timeout's).
				c.setRead(l.s.o.limits.ClientBodyTimeout)
				if !u.headDone {
					l.wheel.disarm(&u.t)
				}
			}
			c.checkInput()
		}
	}
}

// writeFailed handles a failed write (a task).
func (l *loop) upFail(arg any) error {
	u := arg.(*upConn)
	if u.state != upBusy || u.writeErr == nil {
		return nil
	}
	if u.tun != nil {
		u.tun.close()
		return nil
	}
	u.failed(u.writeErr)
	return nil
}

// event handles what the poller says of the connection.
func (u *upConn) event(ev uint32) {
	if u.tun != nil {
		u.tun.upEvent(ev)
		return
	}
	switch u.state {
	case upConnecting:
		u.connected()
		return
	case upIdle:
		// Bytes, an EOF or an error on a connection nobody asked
		// anything: it is not clean any more.
		u.l.pool.remove(u)
		u.drop()
		return
	}
	if ev&(unix.EPOLLOUT|unix.EPOLLERR|unix.EPOLLHUP) != 0 && u.backlog() > 0 {
		u.flush()
		if u.state != upBusy {
			return
		}
	}
	if ev&(unix.EPOLLIN|unix.EPOLLERR|unix.EPOLLHUP) != 0 && u.have&wantRead != 0 {
		u.readable()
	}
}

// connected: a connection attempt ended.
func (u *upConn) connected() {
	soerr, err := unix.GetsockoptInt(u.fd, unix.SOL_SOCKET, unix.SO_ERROR)
	if err == nil && soerr != 0 {
		err = unix.Errno(soerr)
	}
	if err == nil {
		if _, perr := unix.Getpeername(u.fd); perr == unix.ENOTCONN {
			// Not connected yet: the event was the descriptor's this one
			// replaced, closed and its number reused by the dial in the
			// same batch of events. The connect's own end comes later.
			return
		}
	}
	if err != nil {
		if !u.redial() {
			u.failed(&dialError{err})
		}
		return
	}
	u.state = upBusy
	u.l.wheel.arm(&u.t, u.l.s.o.client.Timeout)
	_ = u.l.interest(u.fd, &u.have, wantRead)
	r := u.r
	u.flush()
	if r != nil && r.streamed && u.state == upBusy && r.c != nil && !r.c.processing {
		r.c.process(nil)
	}
}

// readable reads the response.
func (u *upConn) readable() {
	l := u.l
	n, err := read(u.fd, l.rbuf)
	switch {
	case err == unix.EAGAIN:
		return
	case err != nil:
		u.ended(err)
		return
	case n == 0:
		u.ended(nil)
		return
	}
	if u.headDone {
		l.wheel.arm(&u.t, l.s.o.client.Timeout)
	}
	u.got = true
	u.data(l.rbuf[:n])
}

// data handles bytes of the response.
func (u *upConn) data(p []byte) {
	l := u.l
	l.head = l.head[:0] // what this read queues for the client is composed afresh
	held := u.in        // given back at the end: p may point into it
	u.in = nil
	if len(held) > 0 {
		held = l.grow(held, p)
		p = held
	}
	for !u.headDone {
		end, _ := scanHead(p, 0)
		if end == 0 {
			switch {
			case bareLF(p) >= 0:
				u.failed(engine.ErrRespBareLF)
			case len(p) > engine.MaxResponseHead:
				u.failed(engine.ErrRespTooLarge)
			default:
				u.in = append(l.getBuf(len(p)), p...) // the rest of the head is to come
			}
			l.putBuf(held)
			return
		}
		if end > engine.MaxResponseHead {
			u.failed(engine.ErrRespTooLarge)
			l.putBuf(held)
			return
		}
		if err := u.resp.parse(p[:end]); err != nil {
			u.failed(err)
			l.putBuf(held)
			return
		}
		p = p[end:]
		if st := u.resp.Status; st < 200 && st != 101 {
			// An interim response: passed on (but 100), not recorded.
			if u.interims++; u.interims > engine.MaxInterims {
				u.failed(engine.ErrRespInterims)
				l.putBuf(held)
				return
			}
			u.r.interim(&u.resp)
			if len(p) == 0 {
				l.putBuf(held)
				return
			}
			continue
		}
		u.headDone = true
		if !u.r.onHead(u, p) {
			l.putBuf(held)
			return // u was let go (a tunnel, a replacement, a failure)
		}
	}
	u.relay(p)
	l.putBuf(held)
}

// bareLF returns where a line of p ends with a bare LF, or -1.
func bareLF(p []byte) int {
	for i, c := range p {
		if c == '\n' && (i == 0 || p[i-1] != '\r') {
			return i
		}
	}
	return -1
}

// relay passes body bytes to the client.
func (u *upConn) relay(p []byte) {
	r := u.r
	done := false
	for !done {
		var data []byte
		k := 0
		switch u.mode {
		case frameNone:
			done = true
		case frameLength:
			k = int(min(u.left, int64(len(p))))
			data = p[:k]
			u.left -= int64(k)
			done = u.left == 0
		case frameChunked:
			var err error
			data, k, done, err = u.dec.decode(p)
			if err != nil {
				r.sendQueued()
				u.broken(errChunk)
				return
			}
		case frameClose:
			data, k = p, len(p)
		}
		p = p[k:]
		r.relayData(data)
		if len(p) == 0 {
			break
		}
	}
	if done {
		u.end(len(p) > 0)
		return
	}
	if (r.discarded || r.refresh) && !r.ex.Keep() {
		// Its client is gone, or it is a background refresh, which has
		// none, and the core keeps it no more (a cache fill over
		// max_body): nothing is left to read it for.
		u.close()
		r.up = nil
		r.finish(errClientGone)
		return
	}
	r.sendQueued()
	if c := r.c; c != nil && !r.discarded && c.backlog() >= highWater {
		u.pauseRead()
	}
}

// end: the response reached its end. The connection goes back to the
// pool, or closes; stray bytes past the end close it, are counted as a
// response failure, and the response is not stored: its framing cannot
// be trusted. The exchange ends before
// the response's last bytes go, which relay only queued: a client that
// has the whole response finds what it left (a cached entry, an
// idempotency key's stored response) from any connection.
func (u *upConn) end(stray bool) {
	r := u.r
	var err error
	if stray {
		err = engine.ErrRespStray
		u.l.s.strayFound()
	}
	r.endExchange(err)
	r.endBody()
	r.up = nil
	u.r = nil
	if stray {
		u.close()
	} else {
		u.l.pool.put(u)
	}
	r.finish(err)
}

// ended: the upstream closed the connection, or it failed.
func (u *upConn) ended(err error) {
	r := u.r
	switch {
	case r == nil:
		u.close()
	case u.headDone && u.mode == frameClose && err == nil:
		u.keep = false
		u.end(false)
	case u.headDone:
		if err == nil {
			err = errRespCut
		}
		u.broken(err)
	default:
		if err == nil {
			err = errRespClosed
		}
		u.failed(err)
	}
}

// broken: the response broke off after its head went to the client.
func (u *upConn) broken(err error) {
	r := u.r
	s := u.l.s
	s.count.UpstreamAborts.Add(1)
	s.o.Core.UpstreamFailed(core.UpstreamBroken, s.o.target.Addr, err)
	u.close()
	r.up = nil
	if c := r.c; c != nil {
		c.closeAfter = true // the client cannot tell the response is whole
	}
	r.sendQueued()
	r.finish(errRespCut)
}

// failed: no usable response. A request sent on a pooled connection
// that the upstream had just closed goes again on a new one, once; any
// other failure is the core's to answer (502, 504, or a stale response).
func (u *upConn) failed(err error) {
	r := u.r
	wasReused, got := u.reused, u.got
	u.close()
	if r == nil {
		return
	}
	r.up = nil
	if u.headDone {
		u.broken(err)
		return
	}
	if wasReused && !got && !r.retried && !r.streamed && r.retryable() && staleConn(err) {
		r.retried = true
		nu, derr := u.l.dial()
		if derr == nil {
			r.up = nu
			nu.start(r)
			return
		}
		err = derr
	}
	s := u.l.s
	if r.refresh {
		s.warn(warnRefresh, "upstream failed a cache refresh", "upstream", s.o.target.Addr, "err", err)
		r.finish(err)
		return
	}
	kind := core.UpstreamResponse
	var de *dialError
	switch {
	case errors.As(err, &de):
		kind = core.UpstreamConnect
		s.count.UpstreamErrors.Add(1)
	case err == errUpstreamSilent:
		kind = core.UpstreamTimeout
		s.count.UpstreamTimeouts.Add(1)
	default:
		s.count.UpstreamErrors.Add(1)
	}
	if r.body.sink == sinkUpstream {
		r.body.sink = sinkNone
		if c := r.c; c != nil && !r.body.done {
			c.closeAfter = true
		}
	}
	r.respondCore(r.ex.Failed(kind, s.o.target.Addr, err))
}

// strayFound counts bytes an upstream sent past a response, or
// unasked on an idle connection, as a response failure, as the other
// engines count them.
func (s *Server) strayFound() {
	s.o.Core.UpstreamFailed(core.UpstreamResponse, s.o.target.Addr, engine.ErrRespStray)
}

// staleConn reports whether err is what a request sent on a connection
// the upstream had just closed meets: nothing came back.
func staleConn(err error) bool {
	return err == errRespClosed || err == unix.ECONNRESET || err == unix.EPIPE
}

// expire handles the connection's timer.
func (u *upConn) expire() {
	if u.tun != nil {
		return // a tunnel's idle timeout is the client's (startTunnel)
	}
	switch u.state {
	case upConnecting:
		if !u.redial() {
			u.failed(&dialError{errConnectTimeout})
		}
	case upIdle:
		u.l.pool.remove(u)
		u.close()
	case upBusy:
		if u.headDone {
			u.broken(errUpstreamSilent)
		} else {
			u.failed(errUpstreamSilent)
		}
	}
}

func (u *upConn) pauseRead() {
	if u.paused {
		return
	}
	u.paused = true
	u.l.wheel.disarm(&u.t) // the client's send timeout watches meanwhile
	_ = u.l.interest(u.fd, &u.have, u.have&^wantRead)
}

func (u *upConn) resumeRead() {
	if !u.paused || u.state != upBusy {
		return
	}
	u.paused = false
	u.l.wheel.arm(&u.t, u.l.s.o.client.Timeout)
	_ = u.l.interest(u.fd, &u.have, u.have|wantRead)
}

// fail closes u for a server that stops.
func (u *upConn) fail(err error) {
	if u.r != nil {
		u.failed(err)
		return
	}
	u.close()
}

// close closes the connection at once.
func (u *upConn) close() {
	if u.state == upClosed {
		return
	}
	l := u.l
	if u.state == upIdle {
		l.pool.remove(u)
	}
	u.state = upClosed
	l.wheel.unlink(&u.t)
	l.forget(u.fd, &u.have)
	l.upstreams--
	l.release(&u.in)
	l.release(&u.out)
}
