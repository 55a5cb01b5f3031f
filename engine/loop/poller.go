//go:build linux

package loop

import (
	"errors"
	"os"
	"runtime"
	"sync/atomic"
	"unsafe"

	"github.com/panjf2000/gnet/v2/pkg/queue"
	"golang.org/x/sys/unix"
)

// A poller is a loop's epoll instance (level triggered), with an eventfd
// that wakes it to run the tasks other goroutines queue (gnet's lock-free
// queue). It is gnet's netpoll.Poller less one system call: gnet's
// Polling, after a round that found events, polls once more without
// waiting and waits only when that finds nothing, an epoll_wait that
// returns empty before every wait; this one waits at once, which returns
// at once when events are ready.
type poller struct {
	fd     int // epoll
	efd    int // eventfd: tasks are queued
	woken  atomic.Int32
	tasks  queue.AsyncTaskQueue
	waits  atomic.Uint64 // epoll_wait calls, for the tests
	events []unix.EpollEvent
}

// errStop, returned by a task, ends polling.
var errStop = errors.New("loop stopped")

// readEvents is EPOLLIN alone, as nginx asks: not gnet's EPOLLPRI, which
// a client's urgent byte (TCP out-of-band data, which nothing reads)
// holds up until it is read, so that every wait would return at once.
const (
	readEvents  = unix.EPOLLIN
	writeEvents = unix.EPOLLOUT
	maxEvents   = 1024 // events taken by one wait, at most
)

func openPoller() (*poller, error) {
	fd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, os.NewSyscallError("epoll_create1", err)
	}
	p := &poller{fd: fd, efd: -1, tasks: queue.NewLockFreeQueue(), events: make([]unix.EpollEvent, 128)}
	if p.efd, err = unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC); err != nil {
		_ = p.close()
		return nil, os.NewSyscallError("eventfd", err)
	}
	// Edge triggered: each write is one event, and the count is never read.
	if err = p.ctl(unix.EPOLL_CTL_ADD, p.efd, unix.EPOLLIN|unix.EPOLLET); err != nil {
		_ = p.close()
		return nil, err
	}
	return p, nil
}

func (p *poller) close() error {
	if p.efd >= 0 {
		_ = unix.Close(p.efd)
	}
	return os.NewSyscallError("close", unix.Close(p.fd))
}

func (p *poller) ctl(op, fd int, events uint32) error {
	ev := unix.EpollEvent{Fd: int32(fd), Events: events}
	return os.NewSyscallError("epoll_ctl", unix.EpollCtl(p.fd, op, fd, &ev))
}

func (p *poller) add(fd int, events uint32) error { return p.ctl(unix.EPOLL_CTL_ADD, fd, events) }
func (p *poller) mod(fd int, events uint32) error { return p.ctl(unix.EPOLL_CTL_MOD, fd, events) }
func (p *poller) del(fd int) error                { return p.ctl(unix.EPOLL_CTL_DEL, fd, 0) }

var one = uint64(1)

// trigger queues f(arg) on the poller's goroutine, from any goroutine.
func (p *poller) trigger(f queue.Func, arg any) error {
	t := queue.GetTask()
	t.Exec, t.Param = f, arg
	p.tasks.Enqueue(t)
	return p.wake()
}

// wake writes the eventfd, unless a wake-up is pending already.
func (p *poller) wake() error {
	if !p.woken.CompareAndSwap(0, 1) {
		return nil
	}
	b := (*[8]byte)(unsafe.Pointer(&one))[:]
	for {
		_, err := unix.Write(p.efd, b)
		if err == unix.EAGAIN { // the count is full: empty it
			var buf [8]byte
			_, _ = unix.Read(p.efd, buf[:])
			continue
		}
		return os.NewSyscallError("write", err)
	}
}

// polling waits for events and hands each to dispatch, and runs the
// queued tasks, until a task returns errStop or epoll fails.
func (p *poller) polling(round func(), dispatch func(fd int, ev uint32)) error {
	for {
		// Let the process's other goroutines have the P before the wait
		// (the loop holds it while it waits in the kernel).
		runtime.Gosched()
		p.waits.Add(1)
		n, err := unix.EpollWait(p.fd, p.events, -1)
		if err != nil {
			if err == unix.EINTR {
				continue
			}
			return os.NewSyscallError("epoll_wait", err)
		}
		round()
		chores := false
		for i := range n {
			ev := &p.events[i]
			if fd := int(ev.Fd); fd == p.efd {
				chores = true
			} else {
				dispatch(fd, ev.Events)
			}
		}
		if chores {
			if err := p.runTasks(); err != nil {
				return err
			}
		}
		if n == len(p.events) && n < maxEvents {
			p.events = make([]unix.EpollEvent, 2*n)
		}
	}
}

// runTasks runs what is queued.
func (p *poller) runTasks() error {
	for t := p.tasks.Dequeue(); t != nil; t = p.tasks.Dequeue() {
		err := t.Exec(t.Param)
		queue.PutTask(t)
		if errors.Is(err, errStop) {
			return err
		}
	}
	p.woken.Store(0)
	if !p.tasks.IsEmpty() { // queued after the last Dequeue, before the Store
		_ = p.wake()
	}
	return nil
}
