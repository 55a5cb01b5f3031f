package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/preforkd/preforkd/config"
)

// adminUnix marks an admin address that is a unix socket: "unix:/run/preforkd/admin.sock".
const adminUnix = config.AdminUnix

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

// removeStaleSocket removes the socket file at path if no process accepts
// on it: what a supervisor killed with -9 leaves behind.
func removeStaleSocket(path string) error {
	fi, err := os.Lstat(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil
	case err != nil:
		return err
	case fi.Mode().Type() != fs.ModeSocket:
		return fmt.Errorf("%s exists and is not a socket (%v): not replaced", path, fi.Mode().Type())
	}
	c, err := net.DialTimeout("unix", path, time.Second)
	if err == nil {
		c.Close()
		return fmt.Errorf("%s: another process serves on this socket", path)
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		return fmt.Errorf("%s: cannot tell whether the socket is in use: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

// adminClient is an HTTP client of the admin endpoint at addr (what
// admin.listen says: host:port or unix:PATH), and the base URL of its
// paths.
func adminClient(addr string, timeout time.Duration) (*http.Client, string) {
	tr := &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 1}
	base := "http://" + addr
	if path, ok := strings.CutPrefix(addr, adminUnix); ok {
		tr.DialContext = func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", path)
		}
		base = "http://admin"
	}
	return &http.Client{Timeout: timeout, Transport: tr}, base
}

// adminExposure says why addr, an admin.listen, may be reachable from
// other hosts ("" when it is a unix socket or a loopback address): the
// health, metrics and status paths answer without a token.
func adminExposure(addr string) string {
	if addr == "" || strings.HasPrefix(addr, adminUnix) {
		return ""
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return ""
	}
	if host == "localhost" {
		return ""
	}
	ip := net.ParseIP(host)
	if ip != nil && ip.IsLoopback() {
		return ""
	}
	if host == "" || ip != nil && ip.IsUnspecified() {
		return "it listens on every interface"
	}
	return "it is not a loopback address"
}
