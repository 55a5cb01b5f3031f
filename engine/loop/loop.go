//go:build linux

package loop

import (
	"net/http"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/panjf2000/gnet/v2/pkg/queue"
	"golang.org/x/sys/unix"

	"github.com/preforkd/preforkd/core"
)

// A loop is one goroutine that owns a poller (epoll, level triggered,
// with an eventfd wake-up and a task queue: poller.go) and everything
// registered on it: its share of the client connections, its upstream
// connections and their pool, its timers. Nothing of a loop is touched
// from another goroutine but through its task queue (run), so none of it
// is locked.

// Interest in a descriptor's events.
const (
	wantRead  uint8 = 1
	wantWrite uint8 = 2
)

// pollable is what a loop dispatches a descriptor's events to.
type pollable interface {
	event(ev uint32)
}

// Buffer sizes.
const (
	readSize   = 64 << 10 // one read from a socket
	smallBuf   = 4 << 10  // a head being read, a short output backlog
	highWater  = 256 << 10
	backlogBuf = highWater + 2*readSize // a backlog's buffer: it stops growing at highWater
	freeBufMax = 64                     // buffers of each size a loop keeps for reuse
)

type loop struct {
	s      *Server
	poller *poller
	epfd   int        // the poller's epoll descriptor
	fds    []pollable // by descriptor
	wheel  wheel

	rbuf   []byte   // what one read brings, handled before the next read
	head   []byte   // a response head being composed
	iov    [][]byte // the pieces of one write
	iovecs []unix.Iovec

	// A problem answer being composed.
	pbody   []byte
	pfields []core.Field
	pvals   []byte

	dateLine []byte // "Date: ...\r\n", remade each second (catchUp)
	date     []byte // "Date: ...\r\n" of a core's answer with its own
	dateSec  int64

	conns     connList // client connections, for the drain
	upstreams int      // upstream connections open
	pool      upPool
	acceptors []*acceptor
	requests  []*request                // free
	free      [len(bufClasses)][][]byte // free buffers, by size class

	// Bound once, so that queueing them allocates nothing.
	onTick, onResume, onStop, onDrain, onAccept, onClose, onResumeAccept, onUpFail queue.Func

	appResp AppResponse // an App's answer being made
	appReq  AppRequest

	// The wheel's clock: tick 1 is at start, tick n (n-1)*tick later.
	// The ticker triggers tick at the tick wakeAt holds (never: it
	// waits), and from there at every tick. A tick that finds nothing
	// happened since the one before (no event, no task: stirred unset)
	// sets wakeAt to the earliest timer's tick, and the loop sleeps
	// (asleep) until then; the first event or task wakes it (stir): the
	// wheel and the Date line catch up with the clock before it is
	// handled, and the ticker ticks again.
	start      time.Time
	stirred    bool
	asleep     bool
	wakeAt     atomic.Int64
	wakeUp     chan struct{} // wakeAt changed
	tickerStop chan struct{}
	done       chan struct{} // closed when the loop returned
	draining   bool
}

func newLoop(s *Server) (*loop, error) {
	p, err := openPoller()
	if err != nil {
		return nil, err
	}
	l := &loop{
		s:          s,
		poller:     p,
		epfd:       p.fd,
		fds:        make([]pollable, 1024),
		rbuf:       make([]byte, readSize),
		start:      time.Now(),
		wakeUp:     make(chan struct{}, 1),
		tickerStop: make(chan struct{}),
		done:       make(chan struct{}),
	}
	l.wheel.init()
	l.wakeAt.Store(l.wheel.now + 1)
	l.conns.init()
	l.pool.init(l)
	l.onTick = l.tick
	l.onResume = l.task(l.resume)
	l.onStop = func(any) error { return errStop }
	l.onDrain = l.task(l.drain)
	l.onAccept = l.task(l.addAcceptor)
	l.onResumeAccept = l.task(l.resumeAccept)
	l.onUpFail = l.task(l.upFail)
	l.onClose = l.task(func(arg any) error {
		arg.(*conn).close(errClientGone)
		return nil
	})
	l.updateDate(time.Now())
	return l, nil
}

// run is the loop's goroutine: it polls until stop.
func (l *loop) run() {
	defer close(l.done)
	go l.ticker()
	_ = l.poller.polling(l.round, l.dispatch)
	close(l.tickerStop)
	l.closeAll()
	_ = l.poller.close()
}

// round reads the clock as a round of events begins, so that what they
// arm counts from now (wheel.at), though the ticks that fire the timers
// run after them: one clock reading a round, as nginx updates its time
// after each epoll_wait.
func (l *loop) round() { l.wheel.clock = l.clock() }

// dispatch hands an event to the descriptor's owner.
func (l *loop) dispatch(fd int, ev uint32) {
	if !l.stirred {
		l.stir()
	}
	if fd < len(l.fds) {
		if p := l.fds[fd]; p != nil {
			p.event(ev)
		}
	}
}

// task is f as a task of the loop's, which wakes it as an event does.
func (l *loop) task(f queue.Func) queue.Func {
	return func(arg any) error {
		if !l.stirred {
			l.stir()
		}
		return f(arg)
	}
}

// stir notes an event or a task, the first since the last tick: a loop
// asleep catches up with the clock before it handles it, and its ticker
// ticks again.
func (l *loop) stir() {
	l.stirred = true
	if l.asleep {
		l.asleep = false
		l.catchUp(time.Now())
		l.setWake(l.wheel.now + 1)
	}
}

// setWake makes the ticker trigger tick at the tick at, and tick by tick
// after.
func (l *loop) setWake(at int64) {
	l.wakeAt.Store(at)
	select {
	case l.wakeUp <- struct{}{}:
	default: // one is pending
	}
}

// sleepMost bounds a ticker's sleep, which a timeout of years would make
// overflow a Duration: it wakes, and sleeps again.
const sleepMost = int64(time.Hour / tick)

// ticker moves the loop's wheel on, from a goroutine of its own: it
// triggers tick at the tick wakeAt says, and at each tick after unless
// the loop said otherwise meanwhile.
func (l *loop) ticker() {
	t := time.NewTimer(time.Hour)
	t.Stop()
	defer t.Stop()
	for {
		at := l.wakeAt.Load()
		var fired <-chan time.Time
		if at != never {
			n := min(at, l.clock()+sleepMost) - 1
			t.Reset(time.Until(l.start.Add(time.Duration(n) * tick)))
			fired = t.C
		}
		select {
		case <-l.tickerStop:
			return
		case <-l.wakeUp:
			t.Stop()
		case <-fired:
			if l.poller.trigger(l.onTick, nil) != nil {
				return
			}
			l.wakeAt.CompareAndSwap(at, l.clock()+1)
		}
	}
}

// clock is the tick of the wheel's clock now.
func (l *loop) clock() int64 { return l.clockAt(time.Now()) }

func (l *loop) clockAt(now time.Time) int64 { return 1 + int64(now.Sub(l.start)/tick) }

// tick fires the timers due. After a tick in which nothing happened, the
// loop sleeps until the earliest timer is due: an idle worker wakes for
// its timeouts, not 40 times a second.
func (l *loop) tick(any) error {
	l.catchUp(time.Now())
	if l.stirred {
		l.stirred = false
		return nil
	}
	l.asleep = true
	l.setWake(l.wheel.next())
	return nil
}

// catchUp brings the Date line and the wheel to now, firing the timers
// due by then.
func (l *loop) catchUp(now time.Time) {
	if sec := now.Unix(); sec != l.dateSec {
		l.updateDate(now)
	}
	l.wheel.advanceTo(l.clockAt(now))
}

func (l *loop) updateDate(now time.Time) {
	l.dateSec = now.Unix()
	l.dateLine = append(l.dateLine[:0], "Date: "...)
	l.dateLine = now.UTC().AppendFormat(l.dateLine, http.TimeFormat)
	l.dateLine = append(l.dateLine, "\r\n"...)
}

// run queues f(arg) on the loop, from any goroutine.
func (l *loop) run1(f queue.Func, arg any) error {
	return l.poller.trigger(f, arg)
}

// stop makes the loop return once it has run what is queued.
func (l *loop) stop() {
	if l.poller.trigger(l.onStop, nil) != nil {
		return // stopped already
	}
}

// register enters fd in the loop's table with interest want.
func (l *loop) register(fd int, p pollable, have *uint8, want uint8) error {
	for fd >= len(l.fds) {
		l.fds = append(l.fds, make([]pollable, len(l.fds))...)
	}
	l.fds[fd] = p
	*have = 0
	return l.interest(fd, have, want)
}

// interest changes what fd is polled for. A descriptor that stops
// reading while it writes is entered anew, as with gnet's poller, whose
// calls these were. That is the rare case (a paused stream with a
// backlog the other way); the usual changes are one epoll_ctl.
func (l *loop) interest(fd int, have *uint8, want uint8) error {
	if *have == want {
		return nil
	}
	var err error
	switch {
	case *have == 0 && want == wantRead:
		err = l.poller.add(fd, readEvents)
	case *have == 0 && want == wantWrite:
		err = l.poller.add(fd, writeEvents)
	case *have == 0:
		err = l.poller.add(fd, readEvents|writeEvents)
	case want == 0:
		err = l.poller.del(fd)
	case want == wantRead:
		err = l.poller.mod(fd, readEvents)
	case want == wantRead|wantWrite:
		err = l.poller.mod(fd, readEvents|writeEvents)
	default: // write only, from read (and write)
		if err = l.poller.del(fd); err == nil {
			err = l.poller.add(fd, writeEvents)
		}
	}
	if err == nil {
		*have = want
	}
	return err
}

// forget takes fd out of the table and closes it, which takes it out of
// the poller: a connection's descriptor is this process's alone (the
// listener, shared with the other workers, is taken out by hand).
func (l *loop) forget(fd int, have *uint8) {
	*have = 0
	if fd < 0 {
		return // none (an upstream connection whose every address failed)
	}
	if fd < len(l.fds) {
		l.fds[fd] = nil
	}
	_ = unix.Close(fd)
}

// closeAll closes what is left when the loop ends.
func (l *loop) closeAll() {
	for c := l.conns.first(); c != nil; c = l.conns.first() {
		c.close(errServerClosed)
	}
	l.pool.closeIdle()
	for _, a := range l.acceptors {
		a.stop()
	}
	for fd, p := range l.fds {
		if u, ok := p.(*upConn); ok {
			u.fail(errServerClosed)
		}
		_ = fd
	}
}

// getBuf returns an empty buffer of at least size bytes, of the smallest
// size class that holds it: a head being read, one read's worth, a
// stream's backlog. The classes are kept for reuse, so that a long
// transfer allocates nothing as its backlog comes and goes.
func (l *loop) getBuf(size int) []byte {
	for i, class := range bufClasses {
		if size <= class {
			free := &l.free[i]
			if n := len(*free); n > 0 {
				b := (*free)[n-1]
				*free = (*free)[:n-1]
				return b[:0]
			}
			return make([]byte, 0, class)
		}
	}
	return make([]byte, 0, size)
}

// putBuf keeps b for reuse, if it is of a size class.
func (l *loop) putBuf(b []byte) {
	for i, class := range bufClasses {
		if cap(b) == class {
			poison(b)
			if free := &l.free[i]; len(*free) < freeBufMax {
				*free = append(*free, b[:0])
			}
			return
		}
	}
}

// release gives *b back to the loop, if it holds a buffer, and forgets it.
func (l *loop) release(b *[]byte) {
	if *b != nil {
		l.putBuf(*b)
		*b = nil
	}
}

// bufClasses are the sizes of the buffers a loop keeps.
var bufClasses = [...]int{smallBuf, readSize, backlogBuf}

// grow appends p to b, taking a larger buffer from the loop when b is
// full (the old one goes back).
func (l *loop) grow(b, p []byte) []byte {
	if len(b)+len(p) <= cap(b) {
		return append(b, p...)
	}
	// Twice as large at least: a backlog that grows by one answer at a
	// time is copied a logarithmic number of times, not once per answer.
	nb := l.getBuf(max(len(b)+len(p), 2*cap(b)))
	nb = append(nb, b...)
	nb = append(nb, p...)
	if cap(b) > 0 {
		l.putBuf(b)
	}
	return nb
}

// writev writes the pieces of iov to fd in one system call, and returns
// how many bytes went. (unix.Writev allocates its iovecs per call.)
func (l *loop) writev(fd int, iov [][]byte) (int, error) {
	vs := l.iovecs[:0]
	for _, b := range iov {
		if len(b) > 0 {
			v := unix.Iovec{Base: &b[0]}
			v.SetLen(len(b))
			vs = append(vs, v)
		}
	}
	l.iovecs = vs
	if len(vs) == 0 {
		return 0, nil
	}
	return rw(unix.SYS_WRITEV, fd, unsafe.Pointer(&vs[0]), len(vs))
}

func unsafePointer(p []byte) unsafe.Pointer {
	if len(p) == 0 {
		return nil
	}
	return unsafe.Pointer(&p[0])
}

// read reads from fd into p, without allocating for an error.
func read(fd int, p []byte) (int, error) {
	return rw(unix.SYS_READ, fd, unsafe.Pointer(&p[0]), len(p))
}

// rw makes the system call trap (read, write, writev) on fd with the n
// bytes or iovecs at p, again when a signal interrupts it, without
// allocating for an error. p is an unsafe.Pointer up to the call, so
// that what it points to stays put until then.
//
// The call is raw, without telling the scheduler (entersyscall,
// exitsyscall): every descriptor the loop reads and writes is a socket of
// its own opened non-blocking (accept4, socket with SOCK_NONBLOCK), so the
// call returns as soon as the kernel has copied what fits, and the P has
// nothing to hand over meanwhile. The loop makes four or five of these
// calls a proxied request; only epoll_wait, which sleeps, goes through
// the scheduler.
func rw(trap uintptr, fd int, p unsafe.Pointer, n int) (int, error) {
	for {
		r, _, e := unix.RawSyscall(trap, uintptr(fd), uintptr(p), uintptr(n))
		switch e {
		case 0:
			return int(r), nil
		case unix.EINTR:
			continue
		}
		return 0, e
	}
}
