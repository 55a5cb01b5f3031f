//go:build !unix

package main

import (
	"fmt"
	"net"

	"github.com/preforkd/preforkd/shm"
)

// listenAdmin answers an error that wraps shm.ErrNeedsLinux: the admin
// listener is the supervisor's, and a supervisor needs Linux.
func listenAdmin(addr string) (net.Listener, error) {
	return nil, fmt.Errorf("admin.listen %s: %w", addr, shm.ErrNeedsLinux)
}

// checkAdminListen has nothing to check where no supervisor runs.
func checkAdminListen(string) error { return nil }
