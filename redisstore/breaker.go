package redisstore

import (
	"time"

	"github.com/preforkd/preforkd/internal/textvalue"
)

// The circuit breaker's state machine: pure functions over one state word
// (time is a parameter), like package bucket's policies. The word is a
// 48-bit payload of the shared counter table, so every worker of the host
// sees one breaker and each transition is one CAS (see sharedBreaker).
//
//	bits 46-47  phase: closed, open, half-open (a probe in flight), or
//	            between probes (half-open, the next request probes)
//	bits 30-45  closed: consecutive failures (saturating)
//	            half-open: bits 42-45 the probes that succeeded in a row
//	            before this one, bits 30-41 the probing worker's index
//	            (mod 2^12)
//	            between probes: bits 42-45 the probes that succeeded
//	bits  0-29  open: the region time it opens until; half-open: the
//	            probe's deadline. Milliseconds, modulo 2^30 (12.4 days).
//
// A closed breaker with no failures is the word 0: the table's freshness
// judgement treats its slot as a fresh key's, so reclaiming that slot for
// another key loses nothing. Every other word is kept.
//
// The prober's index is kept modulo 2^12: two workers whose indexes differ
// by a multiple of 4096 (a region of more than 4096 workers) could take
// each other's late probe answer for their own; preforkd's regions have at
// most 8194 indexes, and the answer would have to come after the probe's
// deadline, from a worker that was presumed dead.
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
	// HalfOpen: one worker's call at a time (the probe) goes to Redis.
	// Breaker.Successes probes that succeed in a row close the breaker;
	// a failed one opens it again. A probe that outlives its deadline
	// (its worker died or hung) is taken over by the next request.
	HalfOpen
	// betweenProbes is HalfOpen with no probe in flight: a probe
	// succeeded and the next request probes. It is never reported:
	// DecodeBreaker shows it as HalfOpen.
	betweenProbes
)

// phaseNames are the names String writes, indexed by phase.
var phaseNames = textvalue.Enum[Phase]{Closed: "closed", Open: "open", HalfOpen: "half-open"}

func (p Phase) String() string { return phaseNames.String(p, "Phase") }

const (
	phaseShift = 46
	midShift   = 30
	midMask    = 1<<16 - 1
	succShift  = 12 // within mid
	succMask   = 1<<4 - 1
	proberMask = 1<<12 - 1
	timeMask   = 1<<30 - 1
	timeUnit   = time.Millisecond
	// maxAhead bounds every time a breaker stores (backoff, probe
	// deadline) ahead of now; see the state word's comment.
	maxAhead = time.Hour
)

// MaxBreakerSuccesses bounds Breaker.Successes: the word keeps the count
// of the probes before the closing one in 4 bits.
const MaxBreakerSuccesses = succMask + 1

func mkWord(p Phase, mid uint64, t uint64) uint64 {
	return uint64(p)<<phaseShift | (mid&midMask)<<midShift | t&timeMask
}

// probeMid is the middle field of a half-open word: the successes so far
// and the prober.
func probeMid(successes, self uint64) uint64 {
	return (successes&succMask)<<succShift | self&proberMask
}

func phaseOf(w uint64) Phase      { return Phase(w >> phaseShift & 3) }
func midOf(w uint64) uint64       { return w >> midShift & midMask }
func timeOf(w uint64) uint64      { return w & timeMask }
func successesOf(w uint64) uint64 { return midOf(w) >> succShift & succMask }
func proberOf(w uint64) uint64    { return midOf(w) & proberMask }

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

// Breaker is the breaker's policy: when it opens, for how long, and what
// closes it again.
type Breaker struct {
	// Failures is how many consecutive failed calls open the breaker.
	Failures int
	// Backoff is how long it stays open before a probe, at most an hour.
	Backoff time.Duration
	// ProbeTimeout is how long a probe may take before another worker
	// takes it over, at most an hour.
	ProbeTimeout time.Duration
	// Successes is how many probes, one at a time, must succeed in a row
	// to close the breaker again, 1..MaxBreakerSuccesses: a Redis that
	// answers one probe in two keeps it open rather than flapping.
	Successes int
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

// Transition is a change made by one update of the word: the worker whose
// CAS made it logs it, when it changes the phase.
type Transition uint8

const (
	// NoTransition: the phase did not change (a probe that succeeded
	// short of Successes leaves the breaker half-open).
	NoTransition Transition = iota
	// Opened: the failures reached the threshold (or a probe failed).
	Opened
	// Probing: this worker probes: the backoff passed, or the probe
	// before succeeded, or it takes over a probe past its deadline.
	Probing
	// Recovered: the last of Successes probes succeeded; the breaker is
	// closed.
	Recovered
)

var transitionNames = textvalue.Enum[Transition]{"none", "opened", "probing", "recovered"}

// String names the transition; one out of range prints as "Transition(n)".
func (t Transition) String() string { return transitionNames.String(t, "Transition") }

// Admit decides whether worker self may call Redis at now, and returns the
// word to store when that takes a transition (write).
func (b *Breaker) Admit(w uint64, now time.Duration, self int) (next uint64, a Admission, tr Transition, write bool) {
	var successes uint64
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
		// Its worker died or hung: the successes before it still count.
		successes = successesOf(w)
	case betweenProbes:
		successes = successesOf(w)
	default:
		return w, Call, NoTransition, false
	}
	// The backoff passed, a probe succeeded, or a probe outlived its
	// deadline: probe.
	return mkWord(HalfOpen, probeMid(successes, uint64(self)), ms(now+b.ProbeTimeout)), Probe, Probing, true
}

// Success records a call that Redis answered. A probe's success counts
// towards closing the breaker: the Successes-th in a row closes it, an
// earlier one lets the next request probe. Any success resets the failure
// count of a closed breaker. Successes of calls that began before the
// breaker opened, or of a probe taken over by another worker, change
// nothing: the current probe decides.
func (b *Breaker) Success(w uint64, now time.Duration, self int, probe bool) (next uint64, tr Transition, write bool) {
	switch phaseOf(w) {
	case Closed:
		if w == 0 {
			return w, NoTransition, false
		}
		return 0, NoTransition, true
	case HalfOpen:
		if probe && proberOf(w) == uint64(self)&proberMask {
			n := successesOf(w) + 1
			if n >= uint64(max(b.Successes, 1)) {
				return 0, Recovered, true
			}
			return mkWord(betweenProbes, probeMid(n, 0), 0), NoTransition, true
		}
	}
	return w, NoTransition, false
}

// Failure records a call that failed or timed out. The Failures-th
// consecutive one opens a closed breaker for Backoff; a failed probe opens
// it again, whatever probes succeeded before it.
func (b *Breaker) Failure(w uint64, now time.Duration, self int, probe bool) (next uint64, tr Transition, write bool) {
	switch phaseOf(w) {
	case Closed:
		n := midOf(w) + 1
		if n >= uint64(max(b.Failures, 1)) {
			return mkWord(Open, 0, ms(now+b.Backoff)), Opened, true
		}
		return mkWord(Closed, min(n, midMask), 0), NoTransition, true
	case HalfOpen:
		if probe && proberOf(w) == uint64(self)&proberMask {
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
	// Prober is the worker index (mod 2^12) of a half-open breaker's
	// probe; -1 between two probes (the next request probes).
	Prober int
	// Successes counts the probes of a half-open breaker that succeeded
	// in a row.
	Successes int
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
		s.Prober = int(proberOf(w))
		s.Successes = int(successesOf(w))
	case betweenProbes:
		s.Phase, s.Prober, s.Successes = HalfOpen, -1, int(successesOf(w))
	}
	return s
}

func (b *Breaker) validate() error {
	switch {
	case b.Failures < 1 || b.Failures > midMask:
		return fieldErr("Breaker.Failures", "must be between 1 and %d, got %d", midMask, b.Failures)
	case b.Backoff < timeUnit || b.Backoff > maxAhead:
		return fieldErr("Breaker.Backoff", "must be between %v and %v, got %v", timeUnit, maxAhead, b.Backoff)
	case b.ProbeTimeout < timeUnit || b.ProbeTimeout > maxAhead:
		return fieldErr("Breaker.ProbeTimeout", "must be between %v and %v, got %v", timeUnit, maxAhead, b.ProbeTimeout)
	case b.Successes < 1 || b.Successes > MaxBreakerSuccesses:
		return fieldErr("Breaker.Successes", "must be between 1 and %d, got %d", MaxBreakerSuccesses, b.Successes)
	}
	return nil
}
