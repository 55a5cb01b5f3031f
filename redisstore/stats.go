package redisstore

import (
	"context"
	"errors"
	"net"
	"sync/atomic"
	"time"

	"github.com/preforkd/preforkd/shm"
)

// counters are a Store's counts in this process.
type counters struct {
	calls, errors, timeouts, noscript, shortCircuits, denyHits atomic.Uint64
	latency                                                    atomic.Uint64 // ns, summed over calls
	flushes, flushErrors, flushedCounts                        atomic.Uint64
	slotReloads                                                atomic.Uint64
}

// Observer is told, as they happen, what a Store's calls to Redis came
// to: the daemon counts them in its worker's statistics row (package
// metrics). It is called on the request path, from any goroutine: its
// methods must be quick, never block and allocate nothing.
type Observer interface {
	// Call is a round trip made for a request: one per request decided
	// in Redis (whatever its number of rules, or of Cluster slots with
	// their refund), and a reset on a request's path; d is how long it
	// took, failed or not.
	Call(r Result, d time.Duration)
	// Flush is a sync-mode flush (one pipeline).
	Flush(r Result)
	// ShortCircuit is a request that made no call because the breaker
	// was open (Available said so, or Decide or a request's reset found
	// it open): its Redis rules answered by their OnUnavailable.
	ShortCircuit()
	// DenyHit is a decision the deny cache answered, with no call.
	DenyHit()
	// NoScript is a call or flush that found the script missing and sent
	// it again.
	NoScript()
}

// Result is what a call to Redis came to.
type Result uint8

// The results of a call.
const (
	CallOK      Result = iota // Redis answered
	CallError                 // the call failed: refused, reset, an error reply, an answer not understood
	CallTimeout               // no answer within its time
)

// resultOf is the result of a call that returned err.
func resultOf(err error) Result {
	var ne net.Error
	switch {
	case err == nil:
		return CallOK
	case errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout():
		return CallTimeout
	}
	return CallError
}

// noObserver observes nothing.
type noObserver struct{}

func (noObserver) Call(Result, time.Duration) {}
func (noObserver) Flush(Result)               {}
func (noObserver) ShortCircuit()              {}
func (noObserver) DenyHit()                   {}
func (noObserver) NoScript()                  {}

// Stats are what a Store did in this process since New, and the shared
// breaker's state. Every worker counts its own; the breaker is the
// host's.
type Stats struct {
	// Calls counts round trips to Redis made for requests (one per
	// request decided in Redis; a Cluster request over several slots
	// counts one per pipeline).
	Calls uint64
	// Errors and Timeouts count calls that failed, by kind.
	Errors, Timeouts uint64
	// NoScript counts calls that found the script missing (a restart,
	// a failover, SCRIPT FLUSH) and sent it again.
	NoScript uint64
	// ShortCircuits counts requests that made no call because the
	// breaker was open (Available, Decide, a request's Reset).
	ShortCircuits uint64
	// DenyHits counts decisions answered by the deny cache: a refusal
	// that still stood, with no call.
	DenyHits uint64
	// Latency is the time spent in calls, summed.
	Latency time.Duration
	// Flushes and FlushErrors count the sync-mode flushes (one pipeline
	// each) and those that failed; Flushed is the count they added.
	Flushes, FlushErrors, Flushed uint64
	// SlotReloads counts the reloads of a Cluster's slot map this Store
	// asked for (while calls failed or the breaker was open).
	SlotReloads uint64
	// Breaker is the shared breaker's state.
	Breaker BreakerState
}

// Stats reports the Store's counts at now (region time, for the breaker).
func (s *Store) Stats(now time.Duration) Stats {
	st := &s.st
	return Stats{
		Calls: st.calls.Load(), Errors: st.errors.Load(), Timeouts: st.timeouts.Load(),
		NoScript: st.noscript.Load(), ShortCircuits: st.shortCircuits.Load(), DenyHits: st.denyHits.Load(),
		Latency: time.Duration(st.latency.Load()),
		Flushes: st.flushes.Load(), FlushErrors: st.flushErrors.Load(), Flushed: st.flushedCounts.Load(),
		SlotReloads: st.slotReloads.Load(),
		Breaker:     DecodeBreaker(s.br.word(now), now),
	}
}

// Available reports whether a request may count on Redis now: false while
// the shared breaker is open or a probe is in flight. Sync-mode rules,
// which never wait on Redis, answer by OnUnavailable then, as the others.
// Meanwhile a Cluster's slot map is reloaded, in the background, at most
// every SlotReloadInterval, so that the probe after a failover finds the
// new master.
//
// A request told false makes no call: it is counted as a short circuit,
// as one that Decide (or a reset on its path) finds the breaker open for.
func (s *Store) Available(now time.Duration) bool {
	if s.br.open(now) {
		s.st.shortCircuits.Add(1)
		s.obs.ShortCircuit()
		s.reloadSlots(now)
		return false
	}
	return true
}

// ReadBreaker is the state of the breaker of the Redis o names, read from
// region without joining it: what a supervisor's status page shows.
func ReadBreaker(region *shm.Region, o Options, now time.Duration) BreakerState {
	c := region.Counters()
	w, _ := c.Peek(c.KeyOfString(breakerNS, target(o)), now)
	return DecodeBreaker(w, now)
}
