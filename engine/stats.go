package engine

import "sync/atomic"

// Stats are an engine server's counters since it was made.
type Stats struct {
	Accepted uint64 // client connections accepted
	Open     int64  // client connections open now
	// BadRequests counts requests refused before anything was forwarded
	// (400, 405, 408, 413, 431, 501, 505).
	BadRequests uint64
	// UpstreamErrors counts 502s: the upstream refused, was unreachable,
	// or broke off before a whole response header.
	UpstreamErrors uint64
	// UpstreamTimeouts counts 504s: no response header within the
	// upstream timeout.
	UpstreamTimeouts uint64
	// UpstreamAborts counts responses cut off mid-body: the upstream
	// stalled or broke off after the header was sent on.
	UpstreamAborts uint64
}

// Counters are what a server counts for its Stats, safe for concurrent
// use; it knows the connections open itself.
type Counters struct {
	Accepted, BadRequests, UpstreamErrors, UpstreamTimeouts, UpstreamAborts atomic.Uint64
}

// Stats returns the counts, with open the connections open now.
func (c *Counters) Stats(open int64) Stats {
	return Stats{
		Accepted:         c.Accepted.Load(),
		Open:             open,
		BadRequests:      c.BadRequests.Load(),
		UpstreamErrors:   c.UpstreamErrors.Load(),
		UpstreamTimeouts: c.UpstreamTimeouts.Load(),
		UpstreamAborts:   c.UpstreamAborts.Load(),
	}
}
