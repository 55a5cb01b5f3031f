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

// socketAt reports whether a socket file is at path; what is there and
// is not a socket is an error: the admin listener never replaces it.
func socketAt(path string) (bool, error) {
	fi, err := os.Lstat(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return false, nil
	case err != nil:
		return false, err
	case fi.Mode().Type() != fs.ModeSocket:
		return false, fmt.Errorf("%s exists and is not a socket (%v): not replaced", path, fi.Mode().Type())
	}
	return true, nil
}

// removeStaleSocket removes the socket file at path if no process accepts
// on it: what a supervisor killed with -9 leaves behind.
func removeStaleSocket(path string) error {
	if there, err := socketAt(path); !there {
		return err
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
