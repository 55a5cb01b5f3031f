//go:build linux

package loop

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/preforkd/preforkd/engine"
	"github.com/preforkd/preforkd/metrics"
)

// Server is the event-loop engine: HTTP/1.1 on loops of its own, in
// front of which the core runs every request, forwarding to one upstream
// or serving an in-process App. It is safe for concurrent use; Serve may
// be called for several listeners.
type Server struct {
	o       settings
	loops   []*loop
	waiters waiters // Redis rules' round trips
	long    waiters // waits on other requests (core.Exchange.LongWait)

	// drainNewGrace and drainIdleGrace are the drain rule's graces
	// (package engine); tests shorten them.
	drainNewGrace, drainIdleGrace time.Duration
	// failAccept, set by a test before Serve, is an errno the next
	// accepts fail with, while it counts down; nil in a worker.
	failAccept *acceptFailures

	open      atomic.Int64 // client connections open, and slots taken for an accept under way
	in        atomic.Int64 // client connections accepted and open (open less those slots)
	refreshes atomic.Int64 // background refreshes under way
	count     engine.Counters
	conns     metrics.Conns // the worker's connection counts, in the region (core.Core.Conns)
	draining  atomic.Bool

	addrs    atomic.Pointer[[]netip.AddrPort] // the upstream's, resolved
	nextAddr atomic.Uint32                    // where the next dial starts in addrs (round robin)
	resolve  chan struct{}                    // closed by Close: ends the resolver
	resolver sync.WaitGroup
	warnerWG sync.WaitGroup

	mu      sync.Mutex
	lns     map[*listener]struct{}
	shut    bool          // Shutdown or Close began
	stopped bool          // the loops were told to stop: nothing may be queued on them
	drained chan struct{} // closed when a drain is done
	once    sync.Once

	warnings chan warning
	gates    [warnKinds]engine.WarnGate
}

// New returns a Server for o, or an error for options that make no sense
// (a *engine.FieldError for a bad limit). Its loops run from now on:
// Close (or Shutdown) stops them.
func New(o Options) (*Server, error) {
	so, err := o.withDefaults()
	if err != nil {
		return nil, err
	}
	s := &Server{
		o:              so,
		drainNewGrace:  engine.DrainNewGrace,
		drainIdleGrace: engine.DrainIdleGrace,
		resolve:        make(chan struct{}),
		lns:            make(map[*listener]struct{}),
		drained:        make(chan struct{}),
		warnings:       make(chan warning, 16),
		conns:          so.Core.Conns(),
	}
	if so.Core.Redis() != nil {
		reserveP(so.Loops)
	}
	s.waiters.init(so.Waiters)
	s.long.init(so.Waiters)
	if so.Upstream != "" {
		s.startResolver()
	}
	s.warnerWG.Add(1)
	go s.warner()
	// upstream_max_idle is the worker's: shared out among its loops, the
	// first ones taking one more of what does not divide.
	maxIdle := max(so.client.MaxIdle, 0)
	for i := range so.Loops {
		l, err := newLoop(s)
		if err != nil {
			s.Close()
			return nil, fmt.Errorf("loop: %w", err)
		}
		l.pool.max = maxIdle / so.Loops
		if i < maxIdle%so.Loops {
			l.pool.max++
		}
		s.loops = append(s.loops, l)
	}
	for _, l := range s.loops {
		go l.run()
	}
	return s, nil
}

// Serve serves the connections of ln until Shutdown or Close, and then
// returns nil. ln must be a listener with a descriptor (a TCP or Unix
// socket): the loops accept from a duplicate of it, and Serve closes ln
// itself at once.
func (s *Server) Serve(ln net.Listener) error {
	fd, err := dupListener(ln)
	// ln itself is closed at once: Go's poller watches its descriptor,
	// and would wake a thread of the runtime at every connection that
	// arrives, for nobody (the loops accept from the duplicate).
	ln.Close()
	if err != nil {
		return err
	}
	lst := &listener{fd: fd, loops: len(s.loops), done: make(chan struct{})}
	s.mu.Lock()
	if s.shut {
		s.mu.Unlock()
		unix.Close(fd)
		return nil
	}
	s.lns[lst] = struct{}{}
	for _, l := range s.loops {
		_ = l.run1(l.onAccept, lst)
	}
	s.mu.Unlock()
	<-lst.done
	return nil
}

// dupListener is a descriptor of ln's socket of the server's own.
func dupListener(ln net.Listener) (int, error) {
	sc, ok := ln.(syscall.Conn)
	if !ok {
		return -1, fmt.Errorf("loop: a %T has no descriptor to accept from", ln)
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return -1, fmt.Errorf("loop: %w", err)
	}
	fd := -1
	cerr := rc.Control(func(f uintptr) {
		fd, err = unix.FcntlInt(f, unix.F_DUPFD_CLOEXEC, 0)
	})
	if cerr != nil {
		return -1, fmt.Errorf("loop: %w", cerr)
	}
	if err != nil {
		return -1, fmt.Errorf("loop: duplicating the listener: %w", err)
	}
	return fd, nil
}

// releaseListener: a loop let go of ln; the last one closes it.
func (s *Server) releaseListener(ln *listener) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if ln.loops--; ln.loops > 0 {
		return
	}
	unix.Close(ln.fd)
	delete(s.lns, ln)
	close(ln.done)
	s.checkDrained()
}

// atCapacity reports whether the worker has MaxConnections open.
func (s *Server) atCapacity() bool {
	max := s.o.limits.MaxConnections
	return max > 0 && s.open.Load() >= int64(max)
}

// takeSlot counts a connection about to be accepted, unless the worker
// has MaxConnections open. The slot goes back by slotBack if the accept
// fails, and is the connection's if connIn counts it in.
func (s *Server) takeSlot() bool {
	max := int64(s.o.limits.MaxConnections)
	for {
		n := s.open.Load()
		if max > 0 && n >= max {
			return false
		}
		if s.open.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// connIn counts an accepted connection in its slot; full says that the
// worker now has MaxConnections connections, the bound reached. It is
// judged on the connections in, not on the slots: the loops all poll
// the listener, and a slot taken by one whose accept finds nothing
// (another loop took the connection) would make the bound seem reached
// with a connection fewer.
func (s *Server) connIn() (full bool) {
	n := s.in.Add(1)
	return n == int64(s.o.limits.MaxConnections)
}

// connClosed counts a client connection gone.
func (s *Server) connClosed() {
	s.in.Add(-1)
	s.slotBack()
}

// slotBack gives a slot back; the loops paused at the bound accept again.
func (s *Server) slotBack() {
	n := s.open.Add(-1)
	if max := s.o.limits.MaxConnections; max > 0 && n == int64(max)-1 {
		for _, l := range s.loops {
			_ = s.queue(l, l.onResumeAccept, nil)
		}
	}
	if n == 0 && s.draining.Load() {
		s.mu.Lock()
		s.checkDrained()
		s.mu.Unlock()
	}
}

func (s *Server) refreshDone() {
	if s.refreshes.Add(-1) == 0 && s.draining.Load() {
		s.mu.Lock()
		s.checkDrained()
		s.mu.Unlock()
	}
}

// checkDrained closes drained once a drain has nothing left: no
// connection, no listener polled, no refresh. Requires s.mu.
func (s *Server) checkDrained() {
	if !s.draining.Load() || s.open.Load() > 0 || len(s.lns) > 0 || s.refreshes.Load() > 0 {
		return
	}
	select {
	case <-s.drained:
	default:
		close(s.drained)
	}
}

// queue runs f(arg) on l, unless the loops were stopped.
func (s *Server) queue(l *loop, f func(any) error, arg any) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return errServerClosed
	}
	return l.run1(f, arg)
}

// closing reports whether the server stops.
func (s *Server) closing() bool { return s.draining.Load() }

// Shutdown drains by the rule of a retiring worker (package engine's
// drain rule): it stops accepting, answers every request from now on with
// Connection: close, closes each connection with no request in progress
// once it has been idle for engine.DrainIdleGrace (engine.DrainNewGrace
// when it never sent one), and returns once none is left and the
// background refreshes ended — or when ctx is done, having closed the
// rest, with ctx's error (so too when a Redis decision of a connection
// already gone was still in flight then: it is cut, core.Core.Cut).
func (s *Server) Shutdown(ctx context.Context) error {
	s.draining.Store(true)
	s.mu.Lock()
	s.shut = true
	s.mu.Unlock()
	for _, l := range s.loops {
		_ = s.queue(l, l.onDrain, nil)
	}
	s.mu.Lock()
	s.checkDrained()
	s.mu.Unlock()
	select {
	case <-s.drained:
	case <-ctx.Done():
		s.close(true)
		return ctx.Err()
	}
	// No connection is left, but a waiter may still hold the Redis
	// decision of one whose client reset it: ctx ending cuts it as it
	// cuts those of connections still open, rather than close waiting
	// for it as long as redis.timeout lets it.
	stop := context.AfterFunc(ctx, s.o.Core.Cut)
	s.close(false)
	if !stop() {
		return ctx.Err()
	}
	return nil
}

// Close closes the listeners and every connection at once.
func (s *Server) Close() error { return s.close(false) }

// close is Close; cut (the drain's deadline passed) also cuts the core's
// Redis decisions (core.Core.Cut) once the loops stopped, so that the
// waiters holding them, whose requests are cut with the rest, end now
// rather than when redis.timeout would.
func (s *Server) close(cut bool) error {
	s.once.Do(func() {
		s.draining.Store(true)
		s.mu.Lock()
		s.shut = true
		s.stopped = true
		for _, l := range s.loops {
			l.stop()
		}
		s.mu.Unlock()
		for _, l := range s.loops {
			<-l.done
		}
		s.mu.Lock()
		for ln := range s.lns {
			unix.Close(ln.fd)
			delete(s.lns, ln)
			close(ln.done)
		}
		s.mu.Unlock()
		close(s.resolve)
		s.resolver.Wait()
		if cut {
			s.o.Core.Cut()
		}
		s.waiters.wait()
		s.long.wait()
		close(s.warnings)
		s.warnerWG.Wait()
	})
	return nil
}

// drain begins the drain on the loop (a task): no more accepting, and the
// connections with no request in progress get their graces.
func (l *loop) drain(any) error {
	l.draining = true
	for _, a := range l.acceptors {
		a.stop()
	}
	s := l.s
	now := l.wheel.at()
	for c := l.conns.first(); c != nil; {
		next := c.next
		if next == &l.conns.head {
			next = nil
		}
		var due int64
		switch c.state {
		case csNew:
			due = c.since + 1 + ticks(min(s.drainNewGrace, s.o.limits.ReadHeaderTimeout))
		case csIdle:
			if c.outLen() > 0 {
				break // its last answer is being sent: drained gives it the grace after
			}
			due = c.since + 1 + ticks(min(s.drainIdleGrace, s.o.limits.IdleTimeout))
		}
		if due != 0 {
			c.readDue = max(due, now+1)
			c.rearm()
		}
		c = next
	}
	l.pool.closeIdle()
	return nil
}

// resumeAccept polls the listeners again (a task), below MaxConnections.
func (l *loop) resumeAccept(any) error {
	for _, a := range l.acceptors {
		if a.t.due == 0 { // not backing off an error
			a.resume()
		}
	}
	return nil
}

// Stats are the server's counters since New.
type Stats = engine.Stats

// Stats returns the server's counters.
func (s *Server) Stats() Stats { return s.count.Stats(s.in.Load()) }

// The upstream's address: resolved at New and every 30 seconds after
// (every second while it is not), on a goroutine of the server's: a loop
// never waits for DNS.

const (
	resolveEvery = 30 * time.Second
	resolveRetry = time.Second
)

func (s *Server) startResolver() {
	t := s.o.target
	if a, err := netip.ParseAddr(t.Hostname); err == nil {
		addrs := []netip.AddrPort{netip.AddrPortFrom(a.Unmap(), t.Port)}
		s.addrs.Store(&addrs)
		return
	}
	ok := s.lookup()
	s.resolver.Add(1)
	go func() {
		defer s.resolver.Done()
		wait := resolveEvery
		if !ok {
			wait = resolveRetry
		}
		for {
			select {
			case <-s.resolve:
				return
			case <-time.After(wait):
			}
			if s.lookup() {
				wait = resolveEvery
			} else {
				wait = resolveRetry
			}
		}
	}()
}

// lookup resolves the upstream's name, and keeps what it found.
func (s *Server) lookup() bool {
	t := s.o.target
	ctx, cancel := context.WithTimeout(context.Background(), s.o.client.ConnectTimeout)
	defer cancel()
	ips, err := net.DefaultResolver.LookupNetIP(ctx, "ip", t.Hostname)
	if err != nil || len(ips) == 0 {
		s.warn(warnResolve, "resolving the upstream failed", "upstream", t.Addr, "err", err)
		return false
	}
	addrs := make([]netip.AddrPort, len(ips))
	for i, ip := range ips {
		addrs[i] = netip.AddrPortFrom(ip.Unmap(), t.Port)
	}
	s.addrs.Store(&addrs)
	return true
}

// upstreamAddrs are the addresses a dial tries, and where it starts:
// each dial one further on (round robin over a name's addresses, as the
// fasthttp engine dials), each next one tried when one fails.
func (s *Server) upstreamAddrs() (addrs []netip.AddrPort, first int) {
	p := s.addrs.Load()
	if p == nil || len(*p) == 0 {
		return nil, 0
	}
	if len(*p) == 1 {
		return *p, 0
	}
	return *p, int((s.nextAddr.Add(1) - 1) % uint32(len(*p)))
}

// Warnings: at most one line a second per kind, the next saying how many
// were suppressed, written by the warner goroutine: a loop never writes
// to a file.

type warnKind int

const (
	warnAccept warnKind = iota
	warnRefresh
	warnResolve
	warnKinds
)

type warning struct {
	msg  string
	args []any
}

func (s *Server) warn(k warnKind, msg string, args ...any) {
	args, ok := s.gates[k].Args(time.Now(), args...)
	if !ok {
		return
	}
	select {
	case s.warnings <- warning{msg, args}:
	default: // the warner is behind: this line is lost, not waited for
	}
}

func (s *Server) warner() {
	defer s.warnerWG.Done()
	for w := range s.warnings {
		s.o.Logger.Warn(w.msg, w.args...)
	}
}
