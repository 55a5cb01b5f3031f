package engine

import (
	"errors"
	"io"
	"net"
	"sync"
	"syscall"
	"time"
)

// Listener hands out the connections of a listener at most max at a time
// (Limits.MaxConnections; 0: no bound): at the bound, Accept waits until
// one closes, and the other workers on a shared listener accept
// meanwhile. Errors that a moment cures (out of descriptors, a connection
// aborted before it was accepted) are waited out, doubling from 5 ms to
// a second, as net/http does, instead of ending the server; each is
// reported to onRetry, when set.
type Listener struct {
	net.Listener
	slots   chan struct{} // a token per open connection; nil without a bound
	done    chan struct{} // closed by Close
	once    sync.Once
	onRetry func(err error, wait time.Duration)

	// OnFull, when set, is called when an accepted connection takes the
	// last slot: the bound is reached, and Accept waits until one closes.
	OnFull func()
}

// NewListener wraps ln.
func NewListener(ln net.Listener, max int, onRetry func(err error, wait time.Duration)) *Listener {
	l := &Listener{Listener: ln, done: make(chan struct{}), onRetry: onRetry}
	if max > 0 {
		l.slots = make(chan struct{}, max)
	}
	return l
}

// Accept waits for a free slot, then for a connection. The connection
// frees its slot when it is closed.
func (l *Listener) Accept() (net.Conn, error) {
	if l.slots != nil {
		select {
		case l.slots <- struct{}{}:
		case <-l.done:
			return nil, net.ErrClosed
		}
	}
	var wait time.Duration
	for {
		nc, err := l.Listener.Accept()
		if err == nil {
			if l.slots == nil {
				return nc, nil
			}
			if l.OnFull != nil && len(l.slots) == cap(l.slots) {
				l.OnFull()
			}
			return &slotConn{Conn: nc, l: l}, nil
		}
		if !TransientAcceptError(err) {
			l.release()
			select {
			case <-l.done:
				return nil, net.ErrClosed
			default:
				return nil, err
			}
		}
		wait = min(max(2*wait, 5*time.Millisecond), time.Second)
		if l.onRetry != nil {
			l.onRetry(err, wait)
		}
		select {
		case <-time.After(wait):
		case <-l.done:
			l.release()
			return nil, net.ErrClosed
		}
	}
}

// Close stops Accept, including one waiting for a slot.
func (l *Listener) Close() error {
	var err error
	l.once.Do(func() {
		close(l.done)
		err = l.Listener.Close()
	})
	return err
}

func (l *Listener) release() {
	if l.slots != nil {
		<-l.slots
	}
}

// slotConn gives its listener's slot back when it is closed, once.
type slotConn struct {
	net.Conn
	l    *Listener
	once sync.Once
}

func (c *slotConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.l.release)
	return err
}

// TransientAcceptError reports whether Accept may succeed if tried again:
// out of descriptors or memory for a moment, or a failure of the
// connection it took, not of the listener (Linux passes a new
// connection's pending network error on, and a firewall's refusal,
// accept(2): to be retried as EAGAIN).
func TransientAcceptError(err error) bool {
	for ; err != nil; err = errors.Unwrap(err) {
		// On the errno itself, not the interface: a switch on integers
		// is a few bytes of code, which every embedding program links.
		if e, ok := err.(syscall.Errno); ok {
			switch e {
			case syscall.EMFILE, syscall.ENFILE, syscall.ENOBUFS, syscall.ENOMEM, syscall.ECONNABORTED,
				syscall.ENETDOWN, syscall.EPROTO, syscall.ENOPROTOOPT, syscall.EHOSTDOWN,
				syscall.EHOSTUNREACH, syscall.EOPNOTSUPP, syscall.ENETUNREACH, syscall.EPERM:
				return true
			}
			return false
		}
	}
	return false
}

// CloseWrite half-closes the connection when it can (a server's lingering
// close after an error response).
func (c *slotConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// ReadFrom keeps the connection's sendfile path.
func (c *slotConn) ReadFrom(r io.Reader) (int64, error) {
	if rf, ok := c.Conn.(io.ReaderFrom); ok {
		return rf.ReadFrom(r)
	}
	return io.Copy(struct{ io.Writer }{c.Conn}, r)
}
