package nethttp_test

import (
	"errors"
	"log/slog"
	"net/http"
	"time"

	"github.com/preforkd/preforkd/bucket"
	"github.com/preforkd/preforkd/config"
	"github.com/preforkd/preforkd/core"
	"github.com/preforkd/preforkd/engine/nethttp"
	"github.com/preforkd/preforkd/metrics"
	"github.com/preforkd/preforkd/shm"
)

// Options are the knobs the tests turn on the core.
type Options struct {
	Logger *slog.Logger
	Now    func() time.Duration
	Wall   func() time.Time
	Refuse func(http.ResponseWriter, *http.Request, *core.Refusal)
}

// handler is the adapter with the accessors the tests use.
type handler struct {
	*nethttp.Handler
	region *shm.Region
	rules  []string
}

func newHandler(c *core.Core, next http.Handler, opts nethttp.Options, region *shm.Region, rls []core.RateLimit) *handler {
	h := &handler{Handler: nethttp.New(c, next, opts), region: region}
	for _, rl := range rls {
		h.rules = append(h.rules, rl.Rule.Name)
	}
	return h
}

// ruleCounts is what a rule counted in the region's statistics.
type ruleCounts struct {
	Name                                                  string
	Allowed, Limited, ShadowLimited, FullOpen, FullClosed uint64
	UnavailableOpen, UnavailableClosed                    uint64
	CappedOpen, CappedClosed                              uint64
	// Unavailable counts the decisions on_unavailable answered, whatever
	// it answered.
	Unavailable uint64
}

// Stats are the rate-limit rules' counts in the region, in rule order.
func (h *handler) Stats() []ruleCounts {
	var s metrics.Snapshot
	metrics.Read(h.region, &s)
	var out []ruleCounts
	for _, name := range h.rules {
		i := metrics.RuleIndex(h.region, name)
		v := func(res int) uint64 { return s.RuleValue(metrics.RateLimitRequests, i, res) }
		out = append(out, ruleCounts{Name: name, Allowed: v(metrics.Allowed), Limited: v(metrics.Limited),
			ShadowLimited: v(metrics.ShadowLimited), FullOpen: v(metrics.FullOpen), FullClosed: v(metrics.FullClosed),
			UnavailableOpen: v(metrics.UnavailableOpen), UnavailableClosed: v(metrics.UnavailableClosed),
			CappedOpen: v(metrics.CappedOpen), CappedClosed: v(metrics.CappedClosed),
			Unavailable: s.RuleValue(metrics.RateLimitUnavailable, i, 0)})
	}
	return out
}

// idemCounts is what the idempotency stage counted in the region.
type idemCounts struct {
	Executions, Replays, Mismatches, Waits, Conflicts, Full, Invalid, Capped uint64
	Stored, Unreplayable, Released                                           uint64
}

// IdemStats are the idempotency stage's counts in the region.
func (h *handler) IdemStats() idemCounts {
	var s metrics.Snapshot
	metrics.Read(h.region, &s)
	r := func(i int) uint64 { return s.Value(metrics.IdempotencyRequests, i) }
	c := func(i int) uint64 { return s.Value(metrics.IdempotencyCompletions, i) }
	return idemCounts{
		Executions: r(metrics.IdemExecuted), Replays: r(metrics.IdemReplayed), Mismatches: r(metrics.IdemMismatch),
		Conflicts: r(metrics.IdemConflict), Full: r(metrics.IdemFull), Invalid: r(metrics.IdemInvalid), Capped: r(metrics.IdemCapped),
		Waits:  s.Value(metrics.IdempotencyWaits, 0),
		Stored: c(metrics.IdemStored), Unreplayable: c(metrics.IdemUnreplayable), Released: c(metrics.IdemReleased),
	}
}

// statRegion gives a test region room for the statistics, as
// prefork.RegionOptions does.
func statRegion(o shm.Options) shm.Options {
	if o.StatWords == 0 {
		metrics.Geometry(&o, 8)
	}
	return o
}

// Limiter is the limiter of rule name.
func (h *handler) Limiter(name string) *bucket.Limiter { return h.Core().Limiter(name) }

// New builds the adapter as a worker does: the core compiled from cfg
// (config.Config.CoreOptions) over region, in front of next.
func New(cfg config.Config, region *shm.Region, next http.Handler, opts Options) (*handler, error) {
	if next == nil {
		return nil, errors.New("nil next handler")
	}
	o, err := cfg.CoreOptions()
	if err != nil {
		return nil, err
	}
	o.Logger, o.Now, o.Wall = opts.Logger, opts.Now, opts.Wall
	c, err := core.New(region, o)
	if err != nil {
		return nil, err
	}
	return newHandler(c, next, nethttp.Options{Refuse: opts.Refuse}, region, o.RateLimits), nil
}
