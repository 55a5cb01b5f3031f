//go:build linux

package loop

import (
	"net/netip"
	"time"
)

// SetDrainGraces shortens the drain rule's graces for a test.
func SetDrainGraces(s *Server, idle, fresh time.Duration) {
	s.drainIdleGrace, s.drainNewGrace = idle, fresh
}

// SetUpstreamAddrs replaces what the upstream's name resolved to.
func SetUpstreamAddrs(s *Server, addrs []netip.AddrPort) { s.addrs.Store(&addrs) }
