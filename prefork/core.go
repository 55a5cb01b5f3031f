package prefork

import (
	"fmt"
	"log/slog"

	"github.com/preforkd/preforkd/config"
	"github.com/preforkd/preforkd/core"
	"github.com/preforkd/preforkd/redisstore"
	"github.com/preforkd/preforkd/shm"
)

// NewCore builds the decision core of a worker from its configuration
// (config.Config.CoreOptions) over region, joined by this process. Every
// engine a worker serves with decides by it.
//
// With store = "redis" rules it also connects to [redis] (in the
// background: no request waits for it), and the core owns that
// connection: Core.Close, once the worker has drained, adds the last
// sync-mode counts to Redis and closes it.
func NewCore(cfg config.Config, region *shm.Region, log *slog.Logger) (*core.Core, error) {
	return newCore(cfg, region, log, nil)
}

// newCore is NewCore with a hook told the status of every response.
func newCore(cfg config.Config, region *shm.Region, log *slog.Logger, onResponse func(int)) (*core.Core, error) {
	o, err := cfg.CoreOptions()
	if err != nil {
		return nil, err
	}
	o.Logger, o.OnResponse = log, onResponse
	if usesRedis(o) {
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

// usesRedis reports whether a rule keeps its counts in Redis.
func usesRedis(o core.Options) bool {
	for _, rl := range o.RateLimits {
		if rl.Redis != nil {
			return true
		}
	}
	return false
}
