//go:build unix

package upconn

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// peekFD is recv(fd, 1 byte, MSG_PEEK|MSG_DONTWAIT), called by hand:
// unix.Recvfrom allocates the peer's address it returns.
func (c *Conn) peekFD(fd uintptr) {
	var b [1]byte
	n, _, errno := unix.Syscall6(unix.SYS_RECVFROM, fd, uintptr(unsafe.Pointer(&b[0])), 1,
		unix.MSG_PEEK|unix.MSG_DONTWAIT, 0, 0)
	c.peekN, c.peekErr = int(n), nil
	if errno != 0 {
		c.peekN, c.peekErr = 0, errno
	}
}
