//go:build linux

package loop

import (
	"strconv"
	"testing"

	"github.com/panjf2000/gnet/v2/pkg/netpoll"
	"golang.org/x/sys/unix"
)

// The loop finds its poller's epoll descriptor (gnet keeps it private),
// which the listener is registered in with EPOLLEXCLUSIVE: with another
// version of gnet that hides it elsewhere, this fails and says so (the
// engine still works, each worker woken for every connection).
func TestPollerFD(t *testing.T) {
	p, err := netpoll.OpenPoller()
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	fd := pollerFD(p)
	if fd < 0 {
		t.Fatal("the poller's epoll descriptor is not found: gnet changed; listeners are polled without EPOLLEXCLUSIVE")
	}
	var buf [32]byte
	n, _ := unix.Readlink("/proc/self/fd/"+strconv.Itoa(fd), buf[:])
	if string(buf[:n]) != "anon_inode:[eventpoll]" {
		t.Errorf("descriptor %d is %q", fd, buf[:n])
	}
}
