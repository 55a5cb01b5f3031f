package bucket

import (
	"errors"
	"fmt"
	"time"

	"github.com/cespare/xxhash/v2"
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

func (o OnFull) String() string {
	if o == Closed {
		return "closed"
	}
	return "open"
}

// FullRetryAfter is the Retry-After of a decision refused by on_full
// "closed": a full table has no better estimate of when a slot frees up.
const FullRetryAfter = time.Second

// Rule is one rate limit. Zero values: Algorithm GCRA, Burst = Limit,
// OnFull Open.
type Rule struct {
	Name      string        // identifies the rule's state across restarts and reloads
	Limit     int64         // requests per Window, 1..MaxLimit
	Window    time.Duration // MinWindow..MaxWindow
	Algorithm Algorithm
	Burst     int64 // GCRA only: bucket size; 0 means Limit
	OnFull    OnFull
	// Cost is what one request takes from a key's allowance, 1..burst
	// (GCRA) or 1..limit (fixed window): an expensive route costs more.
	// 0 means 1.
	Cost int64
}

// Compile validates r and returns its pure decision policy.
func (r Rule) Compile() (Policy, error) {
	switch {
	case r.Name == "":
		return Policy{}, errors.New("bucket: rule without a name")
	case r.Limit < 1 || r.Limit > MaxLimit:
		return Policy{}, fmt.Errorf("bucket: rule %q: limit %d outside 1..%d", r.Name, r.Limit, MaxLimit)
	case r.Window < MinWindow || r.Window > MaxWindow:
		return Policy{}, fmt.Errorf("bucket: rule %q: window %v outside %v..%v", r.Name, r.Window, MinWindow, MaxWindow)
	case r.Burst < 0 || r.Burst > MaxLimit:
		return Policy{}, fmt.Errorf("bucket: rule %q: burst %d outside 0..%d", r.Name, r.Burst, MaxLimit)
	case r.Burst != 0 && r.Algorithm != GCRA:
		return Policy{}, fmt.Errorf("bucket: rule %q: burst applies to gcra only", r.Name)
	case r.Algorithm != GCRA && r.Algorithm != FixedWindow:
		return Policy{}, fmt.Errorf("bucket: rule %q: unknown algorithm %d", r.Name, r.Algorithm)
	case r.Cost < 0:
		return Policy{}, fmt.Errorf("bucket: rule %q: cost %d is negative", r.Name, r.Cost)
	}
	p := Policy{algo: r.Algorithm, limit: r.Limit, burst: r.Burst, window: int64(r.Window / time.Microsecond), cost: max(r.Cost, 1)}
	if p.burst == 0 {
		p.burst = r.Limit
	}
	if capacity := p.burst; p.cost > capacity {
		return Policy{}, fmt.Errorf("bucket: rule %q: cost %d is more than the %d a key can ever hold: every request would be refused", r.Name, p.cost, capacity)
	}
	// Round the emission interval up: the rate may fall short by under a
	// microsecond per request, but never exceeds Limit per Window.
	p.t = (p.window + r.Limit - 1) / r.Limit
	p.tau = p.t * p.burst
	return p, nil
}

// Namespace is the key namespace of the rule's state: its name, algorithm
// and window, which fix what a payload means. A reload that changes only
// the limit or burst keeps the counts; one that changes the window or the
// algorithm starts the rule afresh.
func (r Rule) Namespace() uint64 {
	var d xxhash.Digest
	d.Reset()
	fmt.Fprintf(&d, "%s\x00%s\x00%d", r.Name, r.Algorithm, int64(r.Window))
	return d.Sum64()
}

// Tag is a 16-bit hash of the rule's name, stored in each of its slots.
func (r Rule) Tag() uint16 { return uint16(xxhash.Sum64String(r.Name)) }

// Limiter applies one rule to a shared counter table. It is safe for
// concurrent use by goroutines and by every process mapping the table.
type Limiter struct {
	rule Rule
	pol  Policy
	tab  *shm.Counters
	ns   uint64
	meta uint64
}

// NewLimiter binds r to t. It installs this package's freshness judgement
// in t, so that only keys equivalent to fresh ones are ever reclaimed.
func NewLimiter(r Rule, t *shm.Counters) (*Limiter, error) {
	p, err := r.Compile()
	if err != nil {
		return nil, err
	}
	t.SetFresh(Fresh)
	return &Limiter{rule: r, pol: p, tab: t, ns: r.Namespace(), meta: p.meta(r.Tag())}, nil
}

// Rule returns the rule the limiter applies.
func (l *Limiter) Rule() Rule { return l.rule }

// Key returns the table key for id under this rule.
func (l *Limiter) Key(id []byte) shm.Key { return l.tab.KeyOf(l.ns, id) }

// Allow decides one request for id at now (region time: shm.Region.Now).
func (l *Limiter) Allow(id string, now time.Duration) Decision {
	return l.AllowKey(l.tab.KeyOfString(l.ns, id), now)
}

// AllowKey is Allow for a key from Key.
func (l *Limiter) AllowKey(k shm.Key, now time.Duration) Decision {
	var d Decision
	var at time.Duration
	_, err := l.tab.Update(k, l.meta, now, func(p uint64, t time.Duration) (uint64, bool) {
		var next uint64
		next, d = l.pol.Take(p, t)
		at = t
		return next, d.Allowed
	})
	if err != nil {
		return l.full()
	}
	if late := at - now; late > 0 {
		// Decided at the reclaim watermark (see shm.Counters.Update):
		// report times from the caller's now.
		d.ResetAfter += late
		if !d.Allowed {
			d.RetryAfter += late
		}
	}
	return d
}

func (l *Limiter) full() Decision {
	d := Decision{Limit: l.rule.Limit, Full: true}
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
	return l.pol.Peek(p, now)
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
	_, _ = l.tab.Update(k, l.meta, now, func(p uint64, t time.Duration) (uint64, bool) {
		return l.pol.Refund(p, t)
	})
}
