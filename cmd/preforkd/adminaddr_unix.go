//go:build unix

package main

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/preforkd/preforkd/persist"
)

// checkAdminListen refuses an admin.listen socket whose directory does
// not exist, is not a directory or cannot take a new file, or whose path
// holds something that is not a socket (listenAdmin never replaces it),
// at start and in check (exit 2), as persist.path's (persist.CheckDirs):
// the bind would fail only once the supervisor runs, after check called
// the file ok. A socket there is left to listenAdmin: check runs beside
// the instance that serves on it.
func checkAdminListen(addr string) error {
	path, ok := strings.CutPrefix(addr, adminUnix)
	if !ok {
		return nil
	}
	err := persist.CheckDir(filepath.Dir(path), filepath.Base(path)+".check-*")
	if err == nil {
		_, err = socketAt(path)
	}
	if err != nil {
		return fmt.Errorf("admin.listen %q: %w", addr, err)
	}
	return nil
}

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
