package bucket

import (
	"fmt"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/preforkd/preforkd/internal/textvalue"
	"github.com/preforkd/preforkd/shm"
)

// OnFull is what a rule answers when no slot can be had for a new key.
type OnFull uint8

const (
	// Open allows the request (and the table counts it).
	Open OnFull = iota
	// Closed refuses it (the HTTP layer answers 503 with Retry-After).
	Closed
)

// onFullNames are the names UnmarshalText reads and String writes, indexed
// by policy.
var onFullNames = textvalue.Enum[OnFull]{Open: "open", Closed: "closed"}

func (o OnFull) String() string { return onFullNames.String(o, "OnFull") }

// MarshalText returns "open" or "closed".
func (o OnFull) MarshalText() ([]byte, error) { return marshalName(onFullNames, o, "on-full policy") }

// UnmarshalText parses "open" or "closed".
func (o *OnFull) UnmarshalText(b []byte) error {
	v, ok := onFullNames.Value(string(b))
	if !ok {
		return fmt.Errorf("bucket: unknown on-full policy %q (want \"open\" or \"closed\")", b)
	}
	*o = v
	return nil
}

// FullRetryAfter is the Retry-After of a decision refused by on_full
// "closed": a full table has no better estimate of when a slot frees up.
const FullRetryAfter = time.Second

// Rule is one rate limit. Zero values: Algorithm GCRA, Burst = Limit,
// OnFull Open.
type Rule struct {
	Name      string        // identifies the rule's state across restarts and reloads
	Limit     int64         // requests per Window, 1..MaxLimit
	Window    time.Duration // MinWindow..MaxWindow, in whole microseconds
	Algorithm Algorithm
	Burst     int64 // GCRA only: bucket size, 0..MaxLimit; 0 means Limit
	OnFull    OnFull
	// Cost is what one request takes from a key's allowance, 1..burst
	// (GCRA) or 1..limit (fixed window): an expensive route costs more.
	// 0 means 1.
	Cost int64
	// MaxKeys bounds the counter slots that the keys of the rule's group
	// hold together; past it a new key is answered by OnFull (Decision
	// Capped), and other groups keep their room. 0 means no bound but the
	// table's. Keys already counted are decided as usual.
	MaxKeys int
	// Group names the rule whose room the keys count against (the
	// account of [Rule.Account]): "" means Name. Another limit for some
	// keys of a rule (a tier) is in the rule's group, so that its keys take
	// the rule's room.
	Group string
}

// A RuleError is a [Rule] that Compile refuses.
type RuleError struct {
	Rule  string // the rule's name
	Field string // the Rule field at fault: "Name", "Limit", "Window", "Algorithm", "Burst", "OnFull", "Cost" or "MaxKeys"
	Msg   string // what is wrong, naming the setting
}

func (e *RuleError) Error() string { return fmt.Sprintf("bucket: rule %q: %s", e.Rule, e.Msg) }

// Compile validates r and returns its pure decision policy. Every problem
// is a *[RuleError].
func (r Rule) Compile() (Policy, error) {
	fail := func(field, format string, args ...any) (Policy, error) {
		return Policy{}, ruleError(r.Name, field, format, args)
	}
	switch {
	case r.Name == "":
		return fail("Name", "name is empty")
	case r.Limit < 1 || r.Limit > MaxLimit:
		return fail("Limit", "limit must be between 1 and %d, got %d", MaxLimit, r.Limit)
	case r.Window < MinWindow || r.Window > MaxWindow:
		return fail("Window", "window must be between %v and %v, got %v", MinWindow, MaxWindow, r.Window)
	case r.Window%time.Microsecond != 0:
		// The state counts whole microseconds: a fraction would be
		// dropped without a word.
		return fail("Window", "window %v is not a whole number of microseconds", r.Window)
	case r.Algorithm != GCRA && r.Algorithm != FixedWindow:
		return fail("Algorithm", "unknown algorithm %v", r.Algorithm)
	case r.Burst < 0 || r.Burst > MaxLimit:
		return fail("Burst", "burst must be between 0 and %d (0 means limit), got %d", MaxLimit, r.Burst)
	case r.Burst != 0 && r.Algorithm != GCRA:
		return fail("Burst", "burst applies to algorithm gcra only, not %v", r.Algorithm)
	case r.OnFull != Open && r.OnFull != Closed:
		return fail("OnFull", "unknown on-full policy %v", r.OnFull)
	case r.Cost < 0:
		return fail("Cost", "cost must not be negative, got %d", r.Cost)
	case r.MaxKeys < 0:
		return fail("MaxKeys", "max_keys must not be negative (0 means no bound but the table), got %d", r.MaxKeys)
	}
	p := Policy{algo: r.Algorithm, limit: r.Limit, burst: r.Burst, window: int64(r.Window / time.Microsecond), cost: max(r.Cost, 1)}
	if p.burst == 0 {
		p.burst = r.Limit
	}
	if p.cost > p.burst {
		return fail("Cost", "cost %d is more than the %d a key can ever hold: every request would be refused", p.cost, p.burst)
	}
	// Round the emission interval up: the rate may fall short by under a
	// microsecond per request, but never exceeds Limit per Window.
	p.t = (p.window + r.Limit - 1) / r.Limit
	if r.Algorithm == GCRA {
		// The state keeps time in whole microseconds: a request must be
		// worth at least one, and a full bucket's refill must fit a window.
		if p.window < r.Limit {
			return fail("Window", "window %v is too short for %d requests: gcra needs at least 1µs per request", r.Window, r.Limit)
		}
		if maxUS := int64(MaxWindow / time.Microsecond); p.t > maxUS/p.burst {
			return fail("Burst", "burst %d takes longer than %v to refill at %d per %v", p.burst, MaxWindow, r.Limit, r.Window)
		}
	}
	p.tau = p.t * p.burst
	return p, nil
}

// ruleError is Compile's error. Not inlined: Compile refuses a rule in a
// dozen places, each of which would otherwise carry a copy of it.
//
//go:noinline
func ruleError(rule, field, format string, args []any) error {
	return &RuleError{Rule: rule, Field: field, Msg: fmt.Sprintf(format, args...)}
}

// Namespace is the key namespace of the rule's state: its name, algorithm
// and window, which fix what a payload means. A reload that changes only
// the limit or burst keeps each key's state, read under the new rate: a
// fixed window's count, and GCRA's time until the bucket is full again,
// which keeps the share of the bucket a key has used (5 of 10 used, then
// a limit of 5 leaves 2). One that changes the window or the algorithm
// starts the rule afresh (see [NewLimiter]).
func (r Rule) Namespace() uint64 {
	var d xxhash.Digest
	d.Reset()
	fmt.Fprintf(&d, "%s\x00%s\x00%d", r.Name, r.Algorithm, int64(r.Window))
	return d.Sum64()
}

// Limiter applies one rule to a shared counter table. It is safe for
// concurrent use by goroutines and by every process mapping the table.
type Limiter struct {
	rule  Rule
	pol   Policy
	tab   *shm.Counters
	ns    uint64
	meta  uint64
	quota shm.Quota
	clock func() time.Duration // SetClock's, or nil
}

// SetClock gives l the clock its callers read `now` from (the region's,
// shm.Region.Now, or a core's own). A decision is then taken no earlier
// than the clock reads once the key's state is loaded: a process that read
// the clock, was descheduled, and decides after another process's
// decision on the key (taken at a later reading) would otherwise judge a
// bucket fuller than it is by the gap, and refuse the last request the
// limit allows. Call it before l is used; without it, a decision is taken
// at the caller's now.
func (l *Limiter) SetClock(now func() time.Duration) { l.clock = now }

// NewLimiter binds r to t. It installs this package's freshness judgement
// in t, so that only keys equivalent to fresh ones are ever reclaimed, and
// records the rule's meta word as one this process writes (shm's
// Counters.Use): once every worker runs rules of the same definitions, a
// rule at its MaxKeys takes over the slots that its definition before a
// reload left (another window or algorithm), as it does fresh ones.
func NewLimiter(r Rule, t *shm.Counters) (*Limiter, error) {
	p, err := r.Compile()
	if err != nil {
		return nil, err
	}
	t.SetFresh(Fresh)
	l := &Limiter{rule: r, pol: p, tab: t, ns: r.Namespace(), meta: r.Meta(),
		quota: shm.Quota{Account: r.Account(), Max: r.MaxKeys}}
	t.Use(l.meta)
	return l, nil
}

// Keys reports how many counter slots the keys of the limiter's group
// hold, in every process: one load.
func (l *Limiter) Keys() int { return l.tab.Held(l.quota.Account) }

// Key returns the table key for id under this rule.
func (l *Limiter) Key(id []byte) shm.Key { return l.tab.KeyOf(l.ns, id) }

// Allow decides one request for id at now (region time: shm.Region.Now).
// It panics when this process has not joined the region (shm.Region.Join):
// a limiter that cannot count would otherwise answer as a full table does,
// and a forgotten Join would let every request through.
func (l *Limiter) Allow(id string, now time.Duration) Decision {
	return l.AllowKey(l.tab.KeyOfString(l.ns, id), now)
}

// AllowKey is Allow for a key from Key.
func (l *Limiter) AllowKey(k shm.Key, now time.Duration) Decision {
	var d Decision
	var at time.Duration
	_, err := l.tab.Update(k, l.quota, l.meta, now, func(p uint64, t time.Duration) (uint64, bool) {
		t = l.reread(t)
		var next uint64
		next, d = l.pol.Take(p, t)
		at = t
		return next, d.Allowed
	})
	if err == shm.ErrNotJoined {
		panic("bucket: Allow on a region this process has not joined (call shm.Region.Join first)")
	}
	if err != nil {
		l.tab.Refused(err)
		return l.full(err == shm.ErrQuota)
	}
	// Decided at the reclaim watermark (see shm.Counters.Update) or at
	// the clock read again: report times from the caller's now.
	return fromNow(d, at-now)
}

// reread is t, the time a decision would be taken at, no earlier than
// the clock reads now that the key's state is loaded (see SetClock).
func (l *Limiter) reread(t time.Duration) time.Duration {
	if l.clock != nil {
		return AtReading(t, l.clock())
	}
	return t
}

// AtReading is t, the time a decision would be taken at, raised to
// reading, a clock read once the key's state was loaded, if that is
// later (see Limiter.SetClock). Both are compared in whole microseconds,
// the unit a payload's times are decided in, and t is raised by whole
// microseconds into reading's own microsecond, never past it: times
// reported from t keep t's fraction, and two readings in one microsecond
// decide at the same payload time (rounding up would put a decision up to
// a microsecond after its reading, and a check that read the clock just
// after it, in the same microsecond, before it).
func AtReading(t, reading time.Duration) time.Duration {
	if late := reading/time.Microsecond - t/time.Microsecond; late > 0 {
		t += late * time.Microsecond
	}
	return t
}

// fromNow is d, taken late after the caller's now, with its times told
// from now. A state fresh at the later reading (ResetAfter 0) is told as
// fresh: the gap is no time to wait.
func fromNow(d Decision, late time.Duration) Decision {
	if late > 0 {
		if d.ResetAfter > 0 {
			d.ResetAfter += late
		}
		if !d.Allowed {
			d.RetryAfter += late
		}
	}
	return d
}

func (l *Limiter) full(capped bool) Decision {
	d := Decision{Limit: l.rule.Limit, Full: true, Capped: capped}
	if l.rule.OnFull == Closed {
		d.RetryAfter = FullRetryAfter
		return d
	}
	d.Allowed = true
	d.Remaining = l.rule.Limit - 1
	return d
}

// Peek reports id's state at now without taking anything.
func (l *Limiter) Peek(id string, now time.Duration) Decision {
	return l.PeekKey(l.tab.KeyOfString(l.ns, id), now)
}

// PeekKey is Peek for a key from Key.
func (l *Limiter) PeekKey(k shm.Key, now time.Duration) Decision {
	p, _ := l.tab.Peek(k, now)
	// As AllowKey, at the clock read after the state: a check before
	// charging (core's, for a request that several rules match) must not
	// refuse what AllowKey would then allow.
	at := l.reread(now)
	return fromNow(l.pol.Peek(p, at), at-now)
}

// Lookup is PeekKey that also reports whether k has a slot in the table:
// ok is false for a key never seen or whose slot went to another (its
// state is a fresh key's).
func (l *Limiter) Lookup(k shm.Key, now time.Duration) (d Decision, ok bool) {
	p, ok := l.tab.Peek(k, now)
	return l.pol.Peek(p, now), ok
}

// ResetKey is Reset for a key from Key.
func (l *Limiter) ResetKey(k shm.Key, now time.Duration) { l.tab.Reset(k, now) }

// Reset forgets id's state (e.g. after a successful login).
func (l *Limiter) Reset(id string, now time.Duration) {
	l.tab.Reset(l.tab.KeyOfString(l.ns, id), now)
}

// RefundKey gives back one request allowed for k, e.g. when another rule
// refused the same request (a refusal charges no rule).
func (l *Limiter) RefundKey(k shm.Key, now time.Duration) {
	if _, ok := l.tab.Peek(k, now); !ok {
		return
	}
	_, _ = l.tab.Update(k, l.quota, l.meta, now, func(p uint64, t time.Duration) (uint64, bool) {
		return l.pol.Refund(p, t)
	})
}
