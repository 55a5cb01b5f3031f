package redisstore

import (
	"context"
	"log/slog"
	"time"

	"github.com/preforkd/preforkd/bucket"
	"github.com/preforkd/preforkd/shm"
)

// sharedBreaker keeps a Breaker's word in the region's counter table, as
// a key of its own, so that every worker of the host shares one breaker:
// each transition is one CAS (Counters.Update). A closed breaker with no
// failures is payload 0, which the table judges as a fresh key's (its
// meta word has window 0, see bucket.Fresh): reclaiming its slot for
// another key loses nothing, and a breaker that finds no slot (a full
// table) is as one that stays closed: calls go on, each bounded by the
// timeout.
//
// The hot path (a closed breaker, a call that succeeds) only reads the
// word: no write, no contention between workers.
type sharedBreaker struct {
	tab    *shm.Counters
	key    shm.Key
	meta   uint64
	pol    Breaker
	self   int
	log    *slog.Logger
	target string
}

// breakerQuota charges a breaker's slot to an account of its own (its
// meta's tag), never to a rule's.
var breakerQuota = shm.Quota{Account: 0xb4ea}

// breakerNS is the namespace of breaker keys.
const breakerNS = 0x6272_6561_6b65_7200 // "breaker"

func newSharedBreaker(tab *shm.Counters, pol Breaker, target string, self int, log *slog.Logger) sharedBreaker {
	b := sharedBreaker{
		tab: tab, key: tab.KeyOfString(breakerNS, target),
		meta: bucket.MetaOf(0xb4ea, bucket.GCRA, 0), // window 0: fresh only as payload 0
		pol:  pol, self: self, log: log, target: target,
	}
	tab.Use(b.meta)
	return b
}

// word reads the breaker's state word (0, closed, when it has no slot).
func (b *sharedBreaker) word(now time.Duration) uint64 {
	w, _ := b.tab.Peek(b.key, now)
	return w
}

// update applies a transition function with one CAS and logs the
// transition the CAS made, if any: the worker whose CAS made it is the
// one that logs it, once. cause is the error that made a failure, for the
// log.
func (b *sharedBreaker) update(now time.Duration, cause error, f func(w uint64, now time.Duration) (uint64, Transition, bool)) (tr Transition) {
	var prev uint64
	_, err := b.tab.Update(b.key, breakerQuota, b.meta, now, func(w uint64, t time.Duration) (uint64, bool) {
		next, t2, write := f(w, t)
		prev, tr = w, t2
		return next, write
	})
	if err != nil {
		return NoTransition // no slot: as a breaker that stays closed
	}
	if tr != NoTransition {
		b.logTransition(tr, prev, cause)
	}
	return tr
}

// logTransition logs a change of phase; a probe that follows a successful
// one changes none (the breaker stays half-open) and is not logged.
func (b *sharedBreaker) logTransition(tr Transition, prev uint64, cause error) {
	attrs := []slog.Attr{slog.String("transition", tr.String())}
	level := slog.LevelWarn
	msg := "redis breaker opened: rules answer by on_unavailable"
	switch tr {
	case Opened:
		if phaseOf(prev) == HalfOpen {
			msg = "redis breaker opened again: the probe failed"
			attrs = append(attrs, slog.Int("successes", int(successesOf(prev))), slog.Int("success_threshold", b.pol.Successes))
		} else {
			attrs = append(attrs, slog.Int("failures", b.pol.Failures))
		}
		attrs = append(attrs, slog.Duration("backoff", b.pol.Backoff))
		if cause != nil {
			attrs = append(attrs, slog.String("err", cause.Error()))
		}
	case Probing:
		switch phaseOf(prev) {
		case betweenProbes:
			return
		case HalfOpen:
			level, msg = slog.LevelInfo, "redis breaker half-open: this worker takes over a probe past its deadline"
		default:
			level, msg = slog.LevelInfo, "redis breaker half-open: this worker probes"
		}
	case Recovered:
		level, msg = slog.LevelInfo, "redis breaker closed: the probes succeeded"
		attrs = append(attrs, slog.Int("successes", b.pol.Successes))
	}
	b.log.LogAttrs(context.Background(), level, msg, attrs...)
}

// admit asks whether this worker may call Redis now.
func (b *sharedBreaker) admit(now time.Duration) Admission {
	w := b.word(now)
	if _, a, _, write := b.pol.Admit(w, now, b.self); !write {
		return a
	}
	a := Refuse
	tr := b.update(now, nil, func(w uint64, t time.Duration) (uint64, Transition, bool) {
		next, a2, tr, write := b.pol.Admit(w, t, b.self)
		a = a2
		return next, tr, write
	})
	if tr == NoTransition && a == Probe {
		a = Call // no slot for the breaker: call, as a closed one would
	}
	return a
}

// open reports, without changing anything, whether a request must not
// wait on Redis now: the breaker is open, or a probe is in flight.
func (b *sharedBreaker) open(now time.Duration) bool {
	_, a, _, _ := b.pol.Admit(b.word(now), now, b.self)
	return a == Refuse
}

// success reports a call Redis answered.
func (b *sharedBreaker) success(now time.Duration, probe bool) Transition {
	if w := b.word(now); w == 0 && !probe {
		return NoTransition // closed with no failures: nothing to write (the hot path)
	}
	return b.update(now, nil, func(w uint64, t time.Duration) (uint64, Transition, bool) {
		return b.pol.Success(w, t, b.self, probe)
	})
}

// failure reports a call that failed or timed out with err.
func (b *sharedBreaker) failure(now time.Duration, probe bool, err error) Transition {
	return b.update(now, err, func(w uint64, t time.Duration) (uint64, Transition, bool) {
		return b.pol.Failure(w, t, b.self, probe)
	})
}
