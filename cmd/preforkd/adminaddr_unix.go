//go:build unix

package main

import (
	"net"
	"os"
	"strings"
	"syscall"
)

// listenAdmin opens the admin listener on addr, a host:port or
// unix:PATH. A unix socket is created with mode 0600 (the service's user
// alone may connect), and removed when the listener is closed. A socket
// file left at PATH by a process that died is replaced; one that a live
// process still accepts on, or anything that is not a socket, is never
// touched: the start fails instead.
func listenAdmin(addr string) (net.Listener, error) {
	path, ok := strings.CutPrefix(addr, adminUnix)
	if !ok {
		return net.Listen("tcp", addr)
	}
	if err := removeStaleSocket(path); err != nil {
		return nil, err
	}
	// The socket's file is created by bind with the umask's mode: a
	// umask that keeps group and others out, during the bind alone, so
	// that no other user can connect in the instant before the chmod.
	// Nothing else of this process creates files meanwhile: the admin
	// listener is opened before the first worker starts.
	old := syscall.Umask(0o177)
	ln, err := net.Listen("unix", path)
	syscall.Umask(old)
	if err != nil {
		return nil, err
	}
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return nil, err
	}
	return ln, nil
}
