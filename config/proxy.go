package config

import (
	"github.com/preforkd/preforkd/engine"
	"github.com/preforkd/preforkd/metrics"
	"github.com/preforkd/preforkd/prefork"
	"github.com/preforkd/preforkd/proxy"
	"github.com/preforkd/preforkd/shm"
)

// Limits are the [server] keys every engine honours (package engine).
func (s Server) Limits() engine.Limits {
	return engine.Limits{
		ReadHeaderTimeout: s.ReadHeaderTimeout,
		IdleTimeout:       s.IdleTimeout,
		ClientBodyTimeout: s.ClientBodyTimeout,
		SendTimeout:       s.SendTimeout,
		MaxHeaderBytes:    int(s.MaxHeaderBytes),
		MaxConnections:    s.MaxConnections,
	}
}

// UpstreamClient are the [server] keys of an engine's upstream client.
func (s Server) UpstreamClient() engine.Upstream {
	return engine.Upstream{ConnectTimeout: s.UpstreamConnectTimeout, Timeout: s.UpstreamTimeout, MaxIdle: s.UpstreamMaxIdle,
		IdleTimeout: s.UpstreamIdleTimeout}
}

// ProxyOptions translates the [server] timeouts and limits into the fast
// engine's options (package proxy). The caller adds the application
// (Upstream or App), the decision core and the logger; the drain graces
// are the engine's defaults, which are the retiring worker's rule.
func (c Config) ProxyOptions() proxy.Options {
	return proxy.Options{Limits: c.Server.Limits(), Client: c.Server.UpstreamClient()}
}

// Settings translates [server] and [reload] into the supervisor's
// settings (package prefork): the drain's timeout, the canary, the
// recycling limits. The caller adds the payload its workers decode.
func (c Config) Settings() prefork.Settings { return c.WithDefaults().settings() }

// settings is Settings of c as it is: a zero is a zero (check).
func (c Config) settings() prefork.Settings {
	s := c.Server
	rl := c.Reload
	inconclusive := prefork.InconclusiveContinue
	if rl.CanaryInconclusive == InconclusiveAbort {
		inconclusive = prefork.InconclusiveAbort
	}
	return prefork.Settings{
		ShutdownTimeout: s.ShutdownTimeout,
		DrainDelay:      s.DrainDelay,
		UpgradeTimeout:  s.UpgradeTimeout,
		MaxRequests:     s.MaxRequests,
		MaxRSS:          int64(s.MaxRSS),
		Canary: prefork.Canary{
			Off:           !rl.Canary.IsOn(true),
			Window:        rl.CanaryWindow,
			MinRequests:   rl.CanaryMinRequests,
			MaxErrorDelta: rl.CanaryMaxErrorDelta,
			Inconclusive:  inconclusive,
		},
	}
}

// RegionOptions is the geometry of the shared region for the
// configuration: its [table] section, and the statistics rows and rule
// names of package metrics. The supervisor adds the worker indexes.
func (c Config) RegionOptions() shm.Options {
	c = c.WithDefaults()
	t := c.RegionTable() // no response table without a block that stores responses
	o := shm.Options{
		Counters:      t.Counters,
		Responses:     t.Responses,
		ResponseBytes: int64(t.ResponseBytes),
	}
	metrics.Geometry(&o, len(c.RateLimits))
	return o
}
