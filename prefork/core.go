package prefork

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/preforkd/preforkd/clientip"
	"github.com/preforkd/preforkd/config"
	"github.com/preforkd/preforkd/core"
	"github.com/preforkd/preforkd/redisstore"
	"github.com/preforkd/preforkd/route"
	"github.com/preforkd/preforkd/shm"
)

// NewCore builds the decision core of a worker from its configuration:
// the rules and blocks, the client resolver and the limits, over region
// (joined by this process). Every engine a worker serves with decides by
// it.
//
// With store = "redis" rules it also connects to [redis] (lazily: nothing
// is sent before the first request), and the core owns that connection:
// Core.Close, once the worker has drained, adds the last sync-mode counts
// to Redis and closes it.
func NewCore(cfg config.Config, region *shm.Region, log *slog.Logger) (*core.Core, error) {
	o, err := CoreOptions(cfg)
	if err != nil {
		return nil, err
	}
	o.Logger = log
	if usesRedis(cfg) {
		ro := cfg.WithDefaults().Redis.StoreOptions()
		ro.Logger = log
		if o.Redis, err = redisstore.New(region, ro); err != nil {
			return nil, fmt.Errorf("prefork: %w", err)
		}
	}
	c, err := core.New(region, o)
	if err != nil && o.Redis != nil {
		o.Redis.Close()
	}
	return c, err
}

// usesRedis reports whether a rule of cfg keeps its counts in Redis.
func usesRedis(cfg config.Config) bool {
	for _, rl := range cfg.RateLimits {
		if rl.Store == config.StoreRedis {
			return true
		}
	}
	return false
}

// CoreOptions translates a configuration into the decision core's options.
// cfg must be valid (config.Config.Validate): its values were checked by
// the same functions this calls.
func CoreOptions(cfg config.Config) (core.Options, error) {
	cfg = cfg.WithDefaults()
	s := cfg.Server
	o := core.Options{
		Resolver:       clientip.Resolver{Trusted: s.TrustedProxies, IPv6Prefix: s.IPv6Prefix},
		MaxRequestBody: int64(s.MaxRequestBody),
		Headers:        s.Headers,
	}
	for _, rl := range cfg.RateLimits {
		rt, err := route.Compile(rl.Path, rl.Methods)
		if err != nil {
			return o, fmt.Errorf("prefork: rule %q: %w", rl.Name, err)
		}
		by, err := clientip.ParseBy(rl.By)
		if err != nil {
			return o, fmt.Errorf("prefork: rule %q: %w", rl.Name, err)
		}
		crl := core.RateLimit{
			Rule:   rl.BucketRule(),
			Route:  rt,
			By:     by,
			Shadow: rl.Mode == config.Shadow,
		}
		if rl.Store == config.StoreRedis {
			crl.Redis = &core.RedisRule{OnUnavailable: rl.OnUnavailable, LocalShare: rl.LocalShare, Sync: time.Duration(rl.Sync)}
		}
		o.RateLimits = append(o.RateLimits, crl)
	}
	for i, d := range cfg.Idempotency {
		rt, err := route.Compile(d.Path, d.Methods)
		if err != nil {
			return o, fmt.Errorf("prefork: idempotency block %d: %w", i+1, err)
		}
		by, err := clientip.ParseBy(d.By)
		if err != nil {
			return o, fmt.Errorf("prefork: idempotency block %d: %w", i+1, err)
		}
		o.Idempotency = append(o.Idempotency, core.Idempotency{
			Route: rt, Header: d.Header, Required: d.Required, TTL: d.TTL, Wait: d.Wait, By: by, MaxBody: int64(d.MaxBody),
		})
	}
	return o, nil
}
