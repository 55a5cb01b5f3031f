package config

import "github.com/preforkd/preforkd/proxy"

// ProxyOptions translates the [server] timeouts and limits into the fast
// engine's options (package proxy). The caller adds the application
// (Upstream or App), the decision core and the logger; the drain graces
// are the engine's defaults, which are the retiring worker's rule.
func (c Config) ProxyOptions() proxy.Options {
	s := c.WithDefaults().Server
	return proxy.Options{
		ReadHeaderTimeout:      s.ReadHeaderTimeout,
		IdleTimeout:            s.IdleTimeout,
		ClientBodyTimeout:      s.ClientBodyTimeout,
		SendTimeout:            s.SendTimeout,
		MaxHeaderBytes:         int(s.MaxHeaderBytes),
		MaxConnections:         s.MaxConnections,
		UpstreamConnectTimeout: s.UpstreamConnectTimeout,
		UpstreamTimeout:        s.UpstreamTimeout,
		UpstreamMaxIdle:        s.UpstreamMaxIdle,
	}
}
