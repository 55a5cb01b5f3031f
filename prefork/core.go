package prefork

import (
	"fmt"
	"log/slog"

	"github.com/preforkd/preforkd/clientip"
	"github.com/preforkd/preforkd/config"
	"github.com/preforkd/preforkd/core"
	"github.com/preforkd/preforkd/route"
	"github.com/preforkd/preforkd/shm"
)

// NewCore builds the decision core of a worker from its configuration:
// the rules and blocks, the client resolver and the limits, over region
// (joined by this process). Every engine a worker serves with decides by
// it.
func NewCore(cfg config.Config, region *shm.Region, log *slog.Logger) (*core.Core, error) {
	o, err := CoreOptions(cfg)
	if err != nil {
		return nil, err
	}
	o.Logger = log
	return core.New(region, o)
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
		o.RateLimits = append(o.RateLimits, core.RateLimit{
			Rule:   rl.BucketRule(),
			Route:  rt,
			By:     by,
			Shadow: rl.Mode == config.Shadow,
		})
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
