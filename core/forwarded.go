package core

import (
	"context"
	"log/slog"
	"net/netip"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/preforkd/preforkd/metrics"
	"github.com/preforkd/preforkd/shm"
)

// forwardedLog warns that requests from a peer that is not a trusted
// proxy carry X-Forwarded-For or Forwarded: a load balancer left out of
// trusted_proxies, behind which every client has the balancer's address
// and all of them share one budget. Once per peer across the workers,
// and at most one line a second (any client may send the fields).
//
// The peers warned about are remembered in the marks of a few region
// gates, one peer per gate by a hash of its address: a peer whose gate
// another peer took since may be warned about again, never more than one
// line a second in all. A peer held back by that second is not marked,
// and is warned about at its next such request.
type forwardedLog struct {
	rate  shm.Gate                        // one line a second
	peers [metrics.PeerGates - 1]shm.Gate // marks: the hash of a peer warned about
}

func newForwardedLog(r *shm.Region) forwardedLog {
	var f forwardedLog
	f.rate = metrics.PeerGate(r, 0)
	for i := range f.peers {
		f.peers[i] = metrics.PeerGate(r, i+1)
	}
	return f
}

// peerMark is what a gate's mark holds for peer: never 0, which is no
// peer.
func peerMark(peer netip.Addr) uint64 {
	a := peer.As16()
	return xxhash.Sum64(a[:]) | 1
}

// untrustedForwarding notes that the request comes from peer, which is
// not a trusted proxy: it is warned about when the request carries a
// forwarding field and peer was not warned about yet.
func (ex *Exchange) untrustedForwarding(peer netip.Addr) {
	if !peer.IsValid() {
		return
	}
	field := "X-Forwarded-For"
	if _, n := ex.req.Header(field); n == 0 {
		field = "Forwarded"
		if _, n := ex.req.Header(field); n == 0 {
			return
		}
	}
	f := &ex.c.forwarded
	h := peerMark(peer)
	g := f.peers[h%uint64(len(f.peers))]
	m := g.Mark()
	if m == h || !f.rate.Pass(ex.clock(), time.Second) || !g.CompareAndSwapMark(m, h) {
		return // warned about already, or not now: a later request tries again
	}
	p := peer.String()
	ex.c.logger().LogAttrs(context.Background(), slog.LevelWarn,
		"requests from "+p+" carry "+field+", but "+p+" is not in trusted_proxies: every client behind it shares one budget",
		slog.String("peer", p), slog.String("field", field))
}
