package config

import (
	"time"

	"github.com/preforkd/preforkd/clientip"
	"github.com/preforkd/preforkd/core"
	"github.com/preforkd/preforkd/route"
)

// CoreOptions translates the configuration into the decision core's
// options: the rules and blocks compiled by the packages that own them. It
// is the one translation (Validate checks through it), so a configuration
// that validates always translates.
func (c Config) CoreOptions() (core.Options, error) {
	c = c.WithDefaults()
	s := c.Server
	o := core.Options{
		Resolver:       clientip.Resolver{Trusted: s.TrustedProxies, IPv6Prefix: s.IPv6Prefix},
		Exempt:         s.Exempt,
		Shadow:         s.Shadow,
		CaseSensitive:  s.CaseSensitive,
		MaxRequestBody: int64(s.MaxRequestBody),
		Headers:        s.Headers,
		ResetHeader:    s.ResetHeader,
		RequestID:      s.RequestID,
		HealthPath:     s.HealthPath,
	}
	for _, rl := range c.RateLimits {
		r, err := rl.core(s.routes())
		if err != nil {
			return o, err
		}
		o.RateLimits = append(o.RateLimits, r)
	}
	var blocks []core.Idempotency
	for _, d := range c.Idempotency {
		b, err := d.core(s)
		if err != nil {
			return o, err
		}
		blocks = append(blocks, b)
	}
	var caches []core.Cache
	for _, d := range c.Caches {
		b, err := d.core(s.routes())
		if err != nil {
			return o, err
		}
		caches = append(caches, b)
	}
	if blocks != nil {
		o.Idempotency = core.IdempotencyBlocks(blocks...)
	}
	if caches != nil {
		o.Caches = core.CacheBlocks(caches...)
	}
	return o, nil
}

// core is the cache block as the core takes it.
func (d Cache) core(ro route.Options) (core.Cache, error) {
	rt, err := ro.Compile(d.Path, d.Methods)
	if err != nil {
		return core.Cache{}, err
	}
	b := core.Cache{Route: rt, TTL: d.TTL, MaxBody: int64(d.MaxBody), TagHeaders: d.TagHeaders, LockTimeout: d.LockTimeout, Heuristic: d.Heuristic,
		Targeted: d.Targeted, Since: d.Since}
	return b, b.Check()
}

// routes are the route options of the server's paths.
func (s Server) routes() route.Options { return route.Options{CaseSensitive: s.CaseSensitive} }

// core is the rule as the core takes it; the error is the first of its
// route, key or rate.
func (rl RateLimit) core(ro route.Options) (core.RateLimit, error) {
	rt, by, err := routeAndKey(ro, rl.Path, rl.Methods, rl.By)
	if err != nil {
		return core.RateLimit{}, err
	}
	r := core.RateLimit{Rule: rl.BucketRule(), Route: rt, By: by, Shadow: rl.Mode == Shadow, Status: rl.Status, Exempt: rl.Exempt}
	r.Overrides = rl.coreOverrides()
	if rl.Store == StoreRedis {
		r.Redis = &core.RedisRule{OnUnavailable: rl.OnUnavailable, LocalShare: rl.LocalShare, Sync: time.Duration(rl.Sync)}
	}
	return r, r.Check()
}

// coreOverrides are the rule's overrides as the core takes them.
func (rl RateLimit) coreOverrides() []core.Override {
	var out []core.Override
	for _, o := range rl.Overrides {
		out = append(out, core.Override{Key: o.Key, Clients: o.Client, Limit: o.Limit, Window: o.Window, Burst: o.Burst})
	}
	return out
}

// core is the block as the core takes it, under the [server] of s: a
// wait of UntilDone is s's bound (Server.UntilDone).
func (d Idempotency) core(s Server) (core.Idempotency, error) {
	rt, by, err := routeAndKey(s.routes(), d.Path, d.Methods, d.By)
	if err != nil {
		return core.Idempotency{}, err
	}
	wait := time.Duration(d.Wait)
	if d.Wait == UntilDone {
		wait = s.UntilDone()
	}
	b := core.Idempotency{Route: rt, Header: d.Header, Required: d.Required, TTL: d.TTL, Wait: wait, By: by, MaxBody: int64(d.MaxBody), MaxRecords: d.MaxRecords}
	return b, b.Check()
}

// routeAndKey compiles a block's path and methods and parses its key
// namespace; the error is the route's, else the key's.
func routeAndKey(ro route.Options, path string, methods []string, by string) (route.Route, clientip.By, error) {
	rt, err := ro.Compile(path, methods)
	if err != nil {
		return rt, clientip.By{}, err
	}
	k, err := clientip.ParseBy(by)
	return rt, k, err
}
