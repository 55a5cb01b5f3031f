//go:build linux

package loop

import (
	"net/netip"
	"time"

	"golang.org/x/sys/unix"
)

// FailAccepts makes s's next n accepts fail with errno, taking no
// connection; before Serve.
func FailAccepts(s *Server, n int, errno unix.Errno) {
	s.failAccept = &acceptFailures{errno: errno}
	s.failAccept.n.Store(int64(n))
}

// SetDrainGraces shortens the drain rule's graces for a test.
func SetDrainGraces(s *Server, idle, fresh time.Duration) {
	s.drainIdleGrace, s.drainNewGrace = idle, fresh
}

// SetUpstreamAddrs replaces what the upstream's name resolved to.
func SetUpstreamAddrs(s *Server, addrs []netip.AddrPort) { s.addrs.Store(&addrs) }

// PollerWaits is how many times the server's loops called epoll_wait.
func PollerWaits(s *Server) uint64 {
	var n uint64
	for _, l := range s.loops {
		n += l.poller.waits.Load()
	}
	return n
}
