package redisstore

import (
	"fmt"
	"time"

	"github.com/preforkd/preforkd/internal/textvalue"
)

// The circuit breaker's state machine: pure functions over one state word
// (time is a parameter), like package bucket's policies. The word is a
// 48-bit payload of the shared counter table, so every worker of the host
// sees one breaker and each transition is one CAS (see sharedBreaker).
//
//	bits 46-47  phase: closed, open, half-open
//	bits 30-45  closed: consecutive failures (saturating)
//	            half-open: the probing worker's index (mod 2^16)
//	bits  0-29  open: the region time it opens until; half-open: the
//	            probe's deadline. Milliseconds, modulo 2^30 (12.4 days).
//
// A closed breaker with no failures is the word 0: the table's freshness
// judgement treats its slot as a fresh key's, so reclaiming that slot for
// another key loses nothing. Every other word is kept.
//
// Times are stored modulo 2^30 ms and compared as a distance: a stored
// time is in the future when it is at most maxAhead ahead of now, else in
// the past. Every time written is at most maxAhead ahead, so the reading
// is right as long as a breaker is touched at least once every 12.4 days
// minus maxAhead; one left open and untouched longer may wait up to
// maxAhead more before it probes.

// Phase is a breaker's state.
type Phase uint8

const (
	// Closed: calls go to Redis; consecutive failures are counted.
	Closed Phase = iota
	// Open: no call goes to Redis until the backoff has passed.
	Open
	// HalfOpen: one worker's call (the probe) decides: success closes
	// the breaker, failure opens it again. A probe that outlives its
	// deadline (its worker died or hung) is taken over by the next one.
	HalfOpen
)

// phaseNames are the names String writes, indexed by phase.
var phaseNames = textvalue.Enum[Phase]{Closed: "closed", Open: "open", HalfOpen: "half-open"}

func (p Phase) String() string { return phaseNames.String(p, "Phase") }

const (
	phaseShift = 46
	midShift   = 30
	midMask    = 1<<16 - 1
	timeMask   = 1<<30 - 1
	timeUnit   = time.Millisecond
	// maxAhead bounds every time a breaker stores (backoff, probe
	// deadline) ahead of now; see the state word's comment.
	maxAhead = time.Hour
)

func mkWord(p Phase, mid uint64, t uint64) uint64 {
	return uint64(p)<<phaseShift | (mid&midMask)<<midShift | t&timeMask
}

func phaseOf(w uint64) Phase { return Phase(w >> phaseShift & 3) }
func midOf(w uint64) uint64  { return w >> midShift & midMask }
func timeOf(w uint64) uint64 { return w & timeMask }

func ms(now time.Duration) uint64 { return uint64(max(now, 0)/timeUnit) & timeMask }

// until returns how long after now the stored time t is, or 0 when it is
// not in the future.
func until(t uint64, now time.Duration) time.Duration {
	d := time.Duration((t-ms(now))&timeMask) * timeUnit
	if d > maxAhead {
		return 0
	}
	return d
}

// Breaker is the breaker's policy: when it opens and for how long.
type Breaker struct {
	// Failures is how many consecutive failed calls open the breaker.
	Failures int
	// Backoff is how long it stays open before a probe, at most an hour.
	Backoff time.Duration
	// ProbeTimeout is how long a probe may take before another worker
	// takes it over, at most an hour.
	ProbeTimeout time.Duration
}

// Admission is what the breaker lets a caller do.
type Admission uint8

const (
	// Call: the breaker is closed; call Redis.
	Call Admission = iota
	// Probe: this caller won the half-open probe; call Redis and report.
	Probe
	// Refuse: the breaker is open (or another worker probes): do not
	// call Redis; the rule's on_unavailable policy answers.
	Refuse
)

// Transition is a change of phase made by one update of the word: the
// worker whose CAS made it logs it.
type Transition uint8

const (
	// NoTransition: the phase did not change.
	NoTransition Transition = iota
	// Opened: the failures reached the threshold (or a probe failed).
	Opened
	// Probing: the backoff passed and this worker probes (or it took
	// over a probe past its deadline).
	Probing
	// Recovered: a probe succeeded; the breaker is closed.
	Recovered
)

var transitionNames = textvalue.Enum[Transition]{"none", "opened", "probing", "recovered"}

// String names the transition; one out of range prints as "Transition(n)".
func (t Transition) String() string { return transitionNames.String(t, "Transition") }

// Admit decides whether worker self may call Redis at now, and returns the
// word to store when that takes a transition (write).
func (b *Breaker) Admit(w uint64, now time.Duration, self int) (next uint64, a Admission, tr Transition, write bool) {
	switch phaseOf(w) {
	case Open:
		if until(timeOf(w), now) > 0 {
			return w, Refuse, NoTransition, false
		}
	case HalfOpen:
		if until(timeOf(w), now) > 0 {
			// A probe is in flight, perhaps this worker's own: no other
			// request piles onto a server that may be sick.
			return w, Refuse, NoTransition, false
		}
	default:
		return w, Call, NoTransition, false
	}
	// The backoff passed, or a probe outlived its deadline: probe.
	return mkWord(HalfOpen, uint64(self), ms(now+b.ProbeTimeout)), Probe, Probing, true
}

// Success records a call that Redis answered. A probe's success closes
// the breaker; any success resets the failure count of a closed one.
// Successes of calls that began before the breaker opened, or of a probe
// taken over by another worker, change nothing: the current probe
// decides.
func (b *Breaker) Success(w uint64, now time.Duration, self int, probe bool) (next uint64, tr Transition, write bool) {
	switch phaseOf(w) {
	case Closed:
		if w == 0 {
			return w, NoTransition, false
		}
		return 0, NoTransition, true
	case HalfOpen:
		if probe && midOf(w) == uint64(self)&midMask {
			return 0, Recovered, true
		}
	}
	return w, NoTransition, false
}

// Failure records a call that failed or timed out. The Failures-th
// consecutive one opens a closed breaker for Backoff; a failed probe opens
// it again.
func (b *Breaker) Failure(w uint64, now time.Duration, self int, probe bool) (next uint64, tr Transition, write bool) {
	switch phaseOf(w) {
	case Closed:
		n := midOf(w) + 1
		if n >= uint64(max(b.Failures, 1)) {
			return mkWord(Open, 0, ms(now+b.Backoff)), Opened, true
		}
		return mkWord(Closed, min(n, midMask), 0), NoTransition, true
	case HalfOpen:
		if probe && midOf(w) == uint64(self)&midMask {
			return mkWord(Open, 0, ms(now+b.Backoff)), Opened, true
		}
	}
	return w, NoTransition, false
}

// BreakerState is a breaker word decoded, for status pages.
type BreakerState struct {
	Phase Phase
	// Failures counts the consecutive failures of a closed breaker.
	Failures int
	// Until is how long an open breaker stays open, or how long a probe
	// has before it is taken over.
	Until time.Duration
	// Prober is the worker index (mod 2^16) of a half-open breaker's probe.
	Prober int
}

// DecodeBreaker reads a breaker word at now.
func DecodeBreaker(w uint64, now time.Duration) BreakerState {
	s := BreakerState{Phase: phaseOf(w)}
	switch s.Phase {
	case Closed:
		s.Failures = int(midOf(w))
	case Open:
		s.Until = until(timeOf(w), now)
	case HalfOpen:
		s.Until = until(timeOf(w), now)
		s.Prober = int(midOf(w))
	}
	return s
}

func (b *Breaker) validate() error {
	switch {
	case b.Failures < 1 || b.Failures > midMask:
		return fmt.Errorf("redisstore: breaker failures %d outside 1..%d", b.Failures, midMask)
	case b.Backoff < timeUnit || b.Backoff > maxAhead:
		return fmt.Errorf("redisstore: breaker backoff %v outside %v..%v", b.Backoff, timeUnit, maxAhead)
	case b.ProbeTimeout < timeUnit || b.ProbeTimeout > maxAhead:
		return fmt.Errorf("redisstore: probe timeout %v outside %v..%v", b.ProbeTimeout, timeUnit, maxAhead)
	}
	return nil
}
