//go:build linux

package loop

import (
	"net/netip"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// An event a connecting upstream connection gets before its connect
// ended is one of the descriptor it replaced: a connection closed and its
// number reused by the dial in the same batch of events (a pooled
// connection found closed by its upstream, whose EOF is further on in
// the batch). It must not be taken for the end of the connect, or a
// connect that then fails is an upstream's failure, not a dial's: no
// next address is tried.
func TestConnectingTakesNoStaleEvent(t *testing.T) {
	// A listener whose accept queue is full: a connect to it stays in
	// SYN_SENT, its SYNs dropped.
	lfd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(lfd)
	if err := unix.Bind(lfd, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	if err := unix.Listen(lfd, 0); err != nil {
		t.Fatal(err)
	}
	sa, err := unix.Getsockname(lfd)
	if err != nil {
		t.Fatal(err)
	}
	ap := netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 0, 0, 1}), uint16(sa.(*unix.SockaddrInet4).Port))
	for range 4 { // what fills the queue
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Close(fd)
		_ = unix.Connect(fd, &unix.SockaddrInet4{Port: int(ap.Port()), Addr: [4]byte{127, 0, 0, 1}})
	}
	time.Sleep(50 * time.Millisecond)

	s := &Server{}
	s.o.client.ConnectTimeout = 10 * time.Second
	s.addrs.Store(&[]netip.AddrPort{ap})
	l, err := newLoop(s)
	if err != nil {
		t.Fatal(err)
	}
	defer l.poller.close()
	u, err := l.dial()
	if err != nil {
		t.Fatal(err)
	}
	defer u.close()
	if u.state != upConnecting {
		t.Skipf("the connect did not wait (state %d): the accept queue took it", u.state)
	}
	if _, err := unix.Getpeername(u.fd); err != unix.ENOTCONN {
		t.Skipf("the connect went through: %v", err)
	}
	u.event(unix.EPOLLIN) // the replaced descriptor's
	if u.state != upConnecting {
		t.Errorf("a stale EPOLLIN ended a connect still under way: state %d", u.state)
	}
}
