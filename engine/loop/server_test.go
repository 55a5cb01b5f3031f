//go:build linux

package loop_test

import (
	"net"
	"strings"
	"testing"

	"github.com/preforkd/preforkd/engine/loop"
)

// The stories every engine tells (streaming, back-pressure, pipelining,
// timeouts, limits, upgrades, stale connections, the drain) are package
// proxy's, told once over each engine, this one included; so are the
// tables of exchanges (its conformance tests). What is here is the
// loop's own.

// TestNotAListener: Serve needs a socket to accept from.
func TestNotAListener(t *testing.T) {
	s, err := loop.New(loop.Options{Upstream: "http://127.0.0.1:1", Core: configCore(t, ""), Logger: quietLog})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Serve(&fakeListener{}); err == nil || !strings.Contains(err.Error(), "descriptor") {
		t.Errorf("Serve on a listener without a descriptor: %v", err)
	}
}

type fakeListener struct{}

func (fakeListener) Accept() (net.Conn, error) { return nil, net.ErrClosed }
func (fakeListener) Close() error              { return nil }
func (fakeListener) Addr() net.Addr            { return &net.TCPAddr{} }
