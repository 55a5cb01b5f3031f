//go:build linux

package loop

import (
	"net/netip"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/preforkd/preforkd/engine"
)

// Accepting: the listening socket is the supervisor's (inherited by every
// worker, handed on by socket activation and a binary upgrade), and the
// loops accept from it themselves. Each loop polls a duplicate of the descriptor and
// accepts, without blocking, when the kernel says a connection waits:
// one accept4 a connection, nothing handed between goroutines.

// listener is one listening socket a Server serves.
type listener struct {
	fd    int           // a duplicate of the socket, shared by the loops
	loops int           // loops that still poll it
	done  chan struct{} // closed when every loop let go of it
}

// acceptor is a listener as one loop polls it.
type acceptor struct {
	l      *loop
	ln     *listener
	have   uint8
	paused bool // at MaxConnections, or waiting out an error
	// exclusive: registered with EPOLLEXCLUSIVE on the loop's epoll
	// descriptor (poll), not through the poller.
	exclusive bool
	t         timer
	wait      time.Duration // the back-off after a failed accept
}

// addAcceptor polls ln on the loop (a task: run1).
func (l *loop) addAcceptor(arg any) error {
	a := &acceptor{l: l, ln: arg.(*listener)}
	a.t.f = a
	l.acceptors = append(l.acceptors, a)
	if l.draining {
		a.stop()
		return nil
	}
	// In the table before anything polls it: an acceptor paused at the
	// bound is polled by resume, whose events must find it.
	for a.ln.fd >= len(l.fds) {
		l.fds = append(l.fds, make([]pollable, len(l.fds))...)
	}
	l.fds[a.ln.fd] = a
	if l.s.atCapacity() {
		a.paused = true
		return nil
	}
	if err := a.poll(); err != nil {
		l.s.warn(warnAccept, "polling the listener failed", "err", err)
		a.stop()
	}
	return nil
}

// poll starts polling the listener. Every worker's loops poll the one
// socket: with EPOLLEXCLUSIVE (as nginx does), a connection that arrives
// wakes one of them, not all — the others would each wake for an accept
// that fails. With MaxConnections the listener is polled as any
// descriptor (level triggered, every loop woken): a registration that is taken out at
// the bound and made again later lost the wake-up of a connection that
// arrived after, under load (TestSlowloris, one run in two), and a
// connection must never wait for one that does not come.
func (a *acceptor) poll() error {
	l := a.l
	if l.epfd >= 0 && l.s.o.limits.MaxConnections == 0 {
		ev := unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLEXCLUSIVE, Fd: int32(a.ln.fd)}
		if unix.EpollCtl(l.epfd, unix.EPOLL_CTL_ADD, a.ln.fd, &ev) == nil {
			a.have, a.exclusive = wantRead, true
			return nil
		}
	}
	return l.interest(a.ln.fd, &a.have, wantRead)
}

// event accepts a connection that waits: one per event, as nginx does by
// default (multi_accept off), since level-triggered polling brings the
// loop back for the next, with the other descriptors' events; a batch
// would end in an accept4 that fails (EAGAIN) for every wake-up.
func (a *acceptor) event(uint32) {
	l := a.l
	for range acceptBatch {
		if !l.s.takeSlot() {
			a.pause()
			return
		}
		fd, peer, err := l.s.accept(a.ln.fd)
		if err != nil {
			l.s.slotBack()
		}
		switch {
		case err == unix.EAGAIN:
			return
		case err == unix.ECONNABORTED || err == unix.EINTR:
			continue
		case err != nil:
			if engine.TransientAcceptError(err) {
				// Out of descriptors or memory: wait it out, as net/http
				// does, doubling from 5 ms to a second.
				a.wait = min(max(2*a.wait, 5*time.Millisecond), time.Second)
				l.s.warn(warnAccept, "accepting a connection failed; retrying", "err", err, "retry_in", a.wait)
				a.pause()
				l.wheel.arm(&a.t, a.wait)
				return
			}
			l.s.warn(warnAccept, "accepting a connection failed", "err", err)
			a.stop()
			return
		}
		a.wait = 0
		l.s.count.Accepted.Add(1)
		l.s.conns.Accepted()
		if l.s.connIn() {
			l.s.conns.MaxReached()
		}
		l.newConn(fd, peer)
		a.rotate()
	}
}

// rotate sends the loop's exclusive registration to the back of the
// listener's queue of waiters, after it accepted: the kernel wakes the
// first waiter of the queue that is idle in epoll_wait, so that without
// it the loop registered first takes nearly every connection while it
// keeps up, and one registered last — a canary, a worker that replaced
// another — nearly none (27 of 1,700 requests in a canary's window with
// four workers). Taken out and made again, it is last, and connections
// go round the workers as they go round a blocking accept's waiters.
// What arrives in between is not missed: a registration made while a
// connection waits reports it at once.
func (a *acceptor) rotate() {
	l := a.l
	if !a.exclusive || a.paused || a.ln == nil {
		return
	}
	ev := unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLEXCLUSIVE, Fd: int32(a.ln.fd)}
	if unix.EpollCtl(l.epfd, unix.EPOLL_CTL_DEL, a.ln.fd, nil) != nil ||
		unix.EpollCtl(l.epfd, unix.EPOLL_CTL_ADD, a.ln.fd, &ev) != nil {
		// Never left unpolled: as any descriptor, from now on.
		a.exclusive, a.have = false, 0
		if err := l.interest(a.ln.fd, &a.have, wantRead); err != nil {
			l.s.warn(warnAccept, "polling the listener failed", "err", err)
			a.stop()
		}
	}
}

// acceptBatch is how many connections an event accepts at most.
const acceptBatch = 1

// expire ends a back-off.
func (a *acceptor) expire() { a.resume() }

// pause stops polling the listener (the other workers accept meanwhile).
func (a *acceptor) pause() {
	if a.paused || a.ln == nil {
		return
	}
	a.paused, a.exclusive = true, false
	_ = a.l.interest(a.ln.fd, &a.have, 0)
}

// resume polls the listener again, unless the server is at capacity.
func (a *acceptor) resume() {
	if !a.paused || a.ln == nil || a.l.draining || a.l.s.atCapacity() {
		return
	}
	if a.poll() == nil {
		a.paused = false
	}
}

// stop lets go of the listener; the last loop to do so closes it.
func (a *acceptor) stop() {
	if a.ln == nil {
		return
	}
	a.l.wheel.unlink(&a.t)
	if a.have != 0 {
		_ = a.l.poller.del(a.ln.fd)
		a.have, a.exclusive = 0, false
	}
	if int(a.ln.fd) < len(a.l.fds) && a.l.fds[a.ln.fd] == a {
		a.l.fds[a.ln.fd] = nil
	}
	a.l.s.releaseListener(a.ln)
	a.ln = nil
}

// acceptFailures makes accepts fail with errno while n counts down.
type acceptFailures struct {
	n     atomic.Int64
	errno unix.Errno
}

// accept is accept(lfd), unless a test makes it fail.
func (s *Server) accept(lfd int) (int, netip.Addr, error) {
	if f := s.failAccept; f != nil && f.n.Add(-1) >= 0 {
		return -1, netip.Addr{}, f.errno
	}
	return accept(lfd)
}

// accept is accept4(2) without the allocation of a Sockaddr: the new
// descriptor, non-blocking and close-on-exec, and the peer's address.
func accept(lfd int) (int, netip.Addr, error) {
	var rsa unix.RawSockaddrAny
	n := uint32(unix.SizeofSockaddrAny)
	for {
		fd, _, e := unix.Syscall6(unix.SYS_ACCEPT4, uintptr(lfd), uintptr(unsafe.Pointer(&rsa)), uintptr(unsafe.Pointer(&n)),
			unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0, 0)
		switch e {
		case 0:
			return int(fd), peerOf(&rsa), nil
		case unix.EINTR:
			continue
		}
		return -1, netip.Addr{}, e
	}
}

// peerOf is the address in rsa, unmapped; the zero Addr for a Unix
// socket.
func peerOf(rsa *unix.RawSockaddrAny) netip.Addr {
	switch rsa.Addr.Family {
	case unix.AF_INET:
		p := (*unix.RawSockaddrInet4)(unsafe.Pointer(rsa))
		return netip.AddrFrom4(p.Addr)
	case unix.AF_INET6:
		p := (*unix.RawSockaddrInet6)(unsafe.Pointer(rsa))
		return netip.AddrFrom16(p.Addr).Unmap()
	}
	return netip.Addr{}
}
