package engine_test

import (
	"errors"
	"net"
	"os"
	"syscall"
	"testing"

	"github.com/preforkd/preforkd/engine"
)

// failingListener fails its first Accepts with errs, then accepts.
type failingListener struct {
	net.Listener
	errs []error
}

func (l *failingListener) Accept() (net.Conn, error) {
	if len(l.errs) > 0 {
		err := l.errs[0]
		l.errs = l.errs[1:]
		return nil, err
	}
	return l.Listener.Accept()
}

func acceptError(errno syscall.Errno) error {
	return &net.OpError{Op: "accept", Net: "tcp", Err: os.NewSyscallError("accept4", errno)}
}

// An accept that failed for the connection it took (Linux passes the new
// connection's pending network error on, accept(2)), or for a moment
// (out of descriptors), is retried: the listener goes on serving. One
// that says the listener is gone is returned.
func TestListenerRetriesAcceptErrors(t *testing.T) {
	for _, tc := range []struct {
		errno syscall.Errno
		retry bool
	}{
		{syscall.EMFILE, true},
		{syscall.ENFILE, true},
		{syscall.ENOBUFS, true},
		{syscall.ENOMEM, true},
		{syscall.ECONNABORTED, true},
		{syscall.EPROTO, true},
		{syscall.ENETDOWN, true},
		{syscall.ENETUNREACH, true},
		{syscall.EHOSTUNREACH, true},
		{syscall.EHOSTDOWN, true},
		{syscall.ENOPROTOOPT, true},
		{syscall.EOPNOTSUPP, true},
		{syscall.EPERM, true},
		{syscall.EBADF, false},
		{syscall.EINVAL, false},
		{syscall.ENOTSOCK, false},
	} {
		t.Run(tc.errno.Error(), func(t *testing.T) {
			inner, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			l := engine.NewListener(&failingListener{Listener: inner, errs: []error{acceptError(tc.errno)}}, 1, nil)
			defer l.Close()
			c, err := net.Dial("tcp", inner.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			nc, err := l.Accept()
			if !tc.retry {
				if !errors.Is(err, tc.errno) {
					t.Fatalf("Accept: %v, want the error", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Accept after %v: %v, want the connection", tc.errno, err)
			}
			nc.Close()
		})
	}
}
