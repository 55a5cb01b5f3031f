package core

import (
	"context"
	"fmt"
	"time"

	"github.com/preforkd/preforkd/bucket"
	"github.com/preforkd/preforkd/internal/textvalue"
	"github.com/preforkd/preforkd/shm"
)

// A store shared by several hosts keeps the counts of the rules whose
// RateLimit.Redis is set, so that a limit holds across every host:
// package redisstore's Store (Redis) is one. The core knows it only
// through these types, so that a program that uses none links none.

// SharedStore is a store of counts shared by several hosts.
type SharedStore interface {
	// Limiter returns the limiter of one rule (or override) in the store.
	Limiter(r SharedRule) (SharedLimiter, error)
	// Available reports, without I/O, whether the store can decide at
	// now (a circuit breaker shared by the workers is closed).
	Available(now time.Duration) bool
	// Decide charges the hits of one request in one round trip, all or
	// none: refused reports that an enforcing hit refused it, and each
	// hit's D is set. An error means the store could not decide. ctx
	// ending (Core.Cut) cuts the decision: one not sent is not, and one
	// in flight returns at once (or, a store may choose, within a short
	// timeout of its own), and hits are not written to after it returned.
	Decide(ctx context.Context, hits []SharedHit, now time.Duration) (refused bool, err error)
	// Close releases the store (a sync-mode limiter's last counts are
	// added first). It is idempotent.
	Close() error
}

// SharedRule is a rule as a shared store keeps it.
type SharedRule struct {
	bucket.Rule
	// OnUnavailable answers when the store cannot decide.
	OnUnavailable OnUnavailable
	// LocalShare is the number of hosts sharing the rule, for
	// OnUnavailable FailLocal; 0 means 1.
	LocalShare int
	// Sync 0 decides every request in the store; a positive interval
	// counts on this host and adds the counts to the store every interval
	// (fixed window only).
	Sync time.Duration
}

// SharedKey is a client's key in one SharedLimiter: what the store names
// its state with, in the store and in the host's table. The limiter makes
// it (Key) and reads it; the core only keeps it with the request.
type SharedKey struct {
	ID                 [2]uint64
	Deny, Host, Remote shm.Key
}

// SharedHit is a rule of a request that the store decides.
type SharedHit struct {
	Lim    SharedLimiter
	Key    *SharedKey
	Shadow bool // never refuses
	// D is the decision, set by Decide: for an allowed request, the state
	// after it was charged; for a refused one, each rule's state as it
	// stands (Allowed reports whether that rule would have let it pass).
	D bucket.Decision
}

// SharedLimiter is one rule of a shared store. One that also has a
// method SetClock(func() time.Duration) is given the core's clock
// (Options.Now), for AllowKey to read again once a key's state is
// loaded, as bucket.Limiter.SetClock.
type SharedLimiter interface {
	// Rule is the rule it limits by.
	Rule() SharedRule
	// Sync reports whether it counts on this host and syncs (Rule.Sync).
	Sync() bool
	// LocalShare is the limiter of this host's share (OnUnavailable
	// FailLocal) and its limit; nil otherwise.
	LocalShare() (*bucket.Limiter, int64)
	// Key is the key of a client's key bytes.
	Key(id []byte) SharedKey
	// Denied reports, without I/O, that the store refused k lately: it is
	// refused until retry (a deny cache in the host's table).
	Denied(k *SharedKey, now time.Duration) (retry time.Duration, ok bool)
	// AllowKey, PeekKey and RefundKey decide a sync-mode limiter's key on
	// this host.
	AllowKey(k *SharedKey, now time.Duration) bucket.Decision
	PeekKey(k *SharedKey, now time.Duration) bucket.Decision
	RefundKey(k *SharedKey, now time.Duration)
	// State is k's state in the store, without charging; stored is false
	// for a key it has no state of (a fresh key).
	State(k *SharedKey, now time.Duration) (d bucket.Decision, stored bool, err error)
	// Reset forgets k's state, in the store and on this host. request
	// tells a reset on a request's path (the application's reset header,
	// Core.Reset), which must not wait longer than a decision would nor
	// pass the store's breaker, from an operator's (Control).
	Reset(k *SharedKey, now time.Duration, request bool) error
}

// OnUnavailable is what a shared rule answers when the store cannot
// decide (down, slow, or the breaker is open).
type OnUnavailable uint8

const (
	// FailLocal (the zero value) enforces the rule's limit divided by its
	// local share on this host's own table.
	FailLocal OnUnavailable = iota
	// FailOpen lets the request through, uncounted.
	FailOpen
	// FailClosed refuses it: 503 with Retry-After.
	FailClosed
)

// onUnavailableNames are the names ParseOnUnavailable reads and String
// writes, indexed by value.
var onUnavailableNames = textvalue.Enum[OnUnavailable]{FailLocal: "local", FailOpen: "open", FailClosed: "closed"}

// ParseOnUnavailable parses "open", "closed" or "local".
func ParseOnUnavailable(s string) (OnUnavailable, error) {
	if u, ok := onUnavailableNames.Value(s); ok {
		return u, nil
	}
	return 0, fmt.Errorf("core: on_unavailable %q: want \"open\", \"closed\" or \"local\"", s)
}

func (u OnUnavailable) String() string { return onUnavailableNames.String(u, "OnUnavailable") }

// UnmarshalText makes an OnUnavailable a configuration value.
func (u *OnUnavailable) UnmarshalText(b []byte) error {
	return textvalue.Unmarshal(b, u, ParseOnUnavailable)
}

// MarshalText is the value as ParseOnUnavailable reads it; a value out of
// range is an error.
func (u OnUnavailable) MarshalText() ([]byte, error) {
	return onUnavailableNames.Marshal("core", u)
}
