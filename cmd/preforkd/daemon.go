package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/preforkd/preforkd/accesslog"
	"github.com/preforkd/preforkd/config"
	"github.com/preforkd/preforkd/core"
	"github.com/preforkd/preforkd/engine/nethttp"
	"github.com/preforkd/preforkd/engine/nethttp/tlsedge"
	"github.com/preforkd/preforkd/metrics"
	"github.com/preforkd/preforkd/prefork"
	"github.com/preforkd/preforkd/proxy"
	"github.com/preforkd/preforkd/redisstore"
	"github.com/preforkd/preforkd/shm"
	"github.com/preforkd/preforkd/tlsconf"
)

// The daemon wires the configuration file to the packages that own each
// part of it: config → the supervisor's settings and the region's
// geometry (package prefork), and in each worker config → the decision
// core (package core, with a Redis store from package redisstore) → the
// event-loop engine (package engine/loop; package proxy's for an https://
// upstream). The supervisor hands each worker the
// configuration it validated, as JSON in its settings' payload: the file
// may have changed (even broken) since.

// settingsOf is what the supervisor runs cfg (validated) with.
func settingsOf(cfg config.Config) (prefork.Settings, error) {
	s := cfg.Settings()
	payload, err := json.Marshal(cfg)
	if err != nil {
		return s, fmt.Errorf("encoding the configuration for the workers: %w", err)
	}
	s.Payload, s.Config = payload, cfg
	return s, nil
}

// configOf is the configuration of s: the supervisor's own, or what a
// worker decodes from the payload.
func configOf(s prefork.Settings) (config.Config, error) {
	if cfg, ok := s.Config.(config.Config); ok {
		return cfg, nil
	}
	var cfg config.Config
	if err := json.Unmarshal(s.Payload, &cfg); err != nil {
		return cfg, fmt.Errorf("decoding the configuration from the supervisor: %w", err)
	}
	return cfg, nil
}

// fitsRegion refuses a configuration whose [[idempotency]] or [[cache]]
// blocks need a response table that the region was made without: it
// would refuse every keyed request and store nothing. The region's
// geometry is fixed for its life, so a reload that adds the first such
// block is refused (the running configuration goes on) and a restart
// makes the region anew.
func fitsRegion(r *shm.Region, cfg config.Config) error {
	if cfg.RegionTable().Responses > 0 && r.Geometry().Responses == 0 {
		return errors.New("[[idempotency]] and [[cache]] blocks need the response table, which the running region was made without (it had no such block at start): restart to add them")
	}
	return nil
}

// reloader is prefork.Options.Reload: the file read again, with the
// command line's overrides, and the keys only a restart changes kept as
// they run; region is the running region, once the supervisor made it.
func reloader(path string, o overrides, region func() *shm.Region, log *slog.Logger) func(prefork.Settings) (prefork.Settings, error) {
	return func(running prefork.Settings) (prefork.Settings, error) {
		old, err := configOf(running)
		if err != nil {
			return running, err
		}
		cfg, kept, err := loadConfigOver(path, o, &old)
		if err != nil {
			return running, err
		}
		for _, k := range kept {
			log.Error("reload: a TLS certificate could not be used: the running one is kept", "err", k)
		}
		if r := region(); r != nil {
			if err := fitsRegion(r, cfg); err != nil {
				return running, err
			}
		}
		cfg = keepRestartOnly(log, old, cfg)
		if r := region(); r != nil {
			cacheSince(&cfg, old, r.Now())
		}
		// What runs is the file with the running values of the
		// restart-only keys: checked again as such, since a check can
		// span the two ([[idempotency]] max_body within [table]'s
		// response_bytes).
		if err := cfg.Validate(); err != nil {
			return running, fmt.Errorf("%w (with the running values of the settings that need a restart)", err)
		}
		if cfg, err = withTickets(cfg, &old, time.Now()); err != nil {
			return running, err
		}
		s, err := settingsOf(cfg)
		if err != nil {
			return running, err
		}
		logWarnings(log, cfg)
		s.LogAttrs = changeAttrs(config.Diff(old, cfg))
		if cfg.TLS.Enabled() {
			s.LogAttrs = append(s.LogAttrs, slog.Int("tls_certificates", len(cfg.TLS.Certificates)))
		}
		return s, nil
	}
}

// withTickets gives cfg's [tls] its session tickets' secret: the running
// configuration's chain, advanced to now, so that the tickets of every
// worker, old and new, stay valid across a reload; a new one at start, or
// when the rotation changed.
func withTickets(cfg config.Config, running *config.Config, now time.Time) (config.Config, error) {
	if !cfg.TLS.Enabled() {
		return cfg, nil
	}
	rotation := cfg.WithDefaults().TLS.TicketRotation
	if running != nil && !running.TLS.Tickets.IsZero() && running.TLS.Tickets.Rotation == rotation {
		cfg.TLS.Tickets = running.TLS.Tickets.Advance(now)
		return cfg, nil
	}
	t, err := tlsconf.NewTickets(rotation, now)
	if err != nil {
		return cfg, fmt.Errorf("tls: session tickets: %w", err)
	}
	cfg.TLS.Tickets = t
	return cfg, nil
}

// engine builds the engine a worker serves with, the worker's decision
// core running every request: the event-loop engine (package
// engine/loop), forwarding to server.upstream or serving the demo
// application; with server.engine = "fasthttp", or for an https://
// upstream, which the loop does not speak, the fast engine of package
// proxy; with [tls], the net/http engine (crypto/tls needs a blocking
// connection), which speaks HTTP/2 and HTTP/1.1 over TLS through the
// same core.
func engine(w *prefork.Worker) (prefork.Engine, error) {
	cfg, err := configOf(w.Settings)
	if err != nil {
		return nil, err
	}
	access, err := openAccessLog(cfg, w)
	if err != nil {
		return nil, err
	}
	c, err := newCore(cfg, w.Region, w.Logger, w.Responded, access)
	if err != nil {
		return nil, err
	}
	w.Defer(c.Close)
	w.OnDrain(c.Drain) // health_path answers 503 from the drain (delay) on
	if cfg.TLS.Enabled() {
		return tlsEngine(w, cfg, c)
	}
	return plainEngine(w, cfg, c)
}

// plainEngine is the engine of a cleartext listener: server.engine's,
// or package proxy's for an https:// upstream.
func plainEngine(w *prefork.Worker, cfg config.Config, c *core.Core) (prefork.Engine, error) {
	e := cfg.Server.Engine.String()
	if strings.HasPrefix(cfg.Server.Upstream, "https://") {
		e = config.EngineFasthttp.String()
	}
	if e == config.EngineFasthttp.String() {
		u := cfg.Server.Upstream
		o := cfg.ProxyOptions()
		o.Core, o.Logger = c, w.Logger
		if u == "" || u == demoUpstream {
			o.App = fastDemo(w.Index)
		} else {
			o.Upstream = u
		}
		return proxy.New(o)
	}
	return loopEngine(w, cfg, c)
}

// tlsEngine is the net/http engine on TLS: the certificates and the
// session ticket keys of cfg's [tls] (kept current until the worker
// exits), forwarding to server.upstream or serving the demo.
func tlsEngine(w *prefork.Worker, cfg config.Config, c *core.Core) (prefork.Engine, error) {
	to, _ := cfg.TLSOptions()
	tc, err := to.Config()
	if err != nil {
		return nil, err
	}
	stop := tlsconf.Rotate(tc, to.Tickets, time.Now)
	w.Defer(func() error { stop(); return nil })
	edge, err := tlsedge.New(tlsedge.Options{Config: tc})
	if err != nil {
		return nil, err
	}
	o := nethttp.ServerOptions{Core: c, Limits: cfg.Server.Limits(), Edge: edge, Logger: w.Logger}
	if u := cfg.Server.Upstream; u == "" || u == demoUpstream {
		o.Handler = demoHTTP(w.Index)
	} else if o.Upstream, err = nethttp.NewUpstream(c, u, cfg.Server.UpstreamClient()); err != nil {
		return nil, err
	}
	eng, err := nethttp.NewServer(o)
	if err != nil || cfg.TLS.CleartextListen == "" {
		return eng, err
	}
	return withCleartext(w, cfg, c, eng)
}

// newCore builds a worker's decision core from cfg over region, joined by
// this process; onResponse is told every response's status (the
// worker's recycling limits). With store = "redis" rules it also
// connects to [redis] (in the background: no request waits for it), and
// the core owns that connection: Core.Close, once the worker has
// drained, adds the last sync-mode counts to Redis and closes it.
func newCore(cfg config.Config, region *shm.Region, log *slog.Logger, onResponse func(int), access core.AccessLog) (*core.Core, error) {
	o, err := cfg.CoreOptions()
	if err != nil {
		return nil, err
	}
	o.Logger, o.OnResponse = log, onResponse
	if access != nil {
		o.AccessLog = access
	}
	var store *redisstore.Store
	if usesRedis(o) {
		ro := cfg.WithDefaults().Redis.StoreOptions()
		ro.Logger, ro.Observer = log, redisMetrics{metrics.NewRow(region)}
		if store, err = redisstore.New(region, ro); err != nil {
			return nil, err
		}
		o.Redis = core.RedisRules(store)
	}
	c, err := core.New(region, o)
	if err != nil && store != nil {
		store.Close()
	}
	return c, err
}

// redisMetrics counts a worker's Redis calls in its statistics row: the
// preforkd_redis_ families of /metrics.
type redisMetrics struct{ row metrics.Row }

// redisResults are the metrics' results of redisstore's.
var redisResults = [...]int{redisstore.CallOK: metrics.RedisOK, redisstore.CallError: metrics.RedisError, redisstore.CallTimeout: metrics.RedisTimeout}

func (m redisMetrics) Call(r redisstore.Result, d time.Duration) {
	m.row.RedisCall(redisResults[r], d)
}
func (m redisMetrics) Flush(r redisstore.Result) { m.row.Add(metrics.RedisFlushes, redisResults[r], 1) }
func (m redisMetrics) ShortCircuit()             { m.row.Add(metrics.RedisShortCircuits, 0, 1) }
func (m redisMetrics) DenyHit()                  { m.row.Add(metrics.RedisDenyCacheHits, 0, 1) }
func (m redisMetrics) NoScript()                 { m.row.Add(metrics.RedisNoScript, 0, 1) }

// openAccessLog opens the worker's access log ([log] access), if any: it
// is written until the worker drained (Defer), and reopened at its path
// when the supervisor is told USR1.
func openAccessLog(cfg config.Config, w *prefork.Worker) (core.AccessLog, error) {
	path, on := cfg.Log.AccessLog()
	if !on {
		return nil, nil
	}
	l, err := accesslog.New(accesslog.Options{Path: path, Format: cfg.Log.AccessFormat, Logger: w.Logger})
	if err != nil {
		return nil, err
	}
	w.Defer(l.Close)
	w.OnReopen(l.Reopen)
	return l, nil
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

// keepRestartOnly returns next with the settings that only a restart can
// change (the listener, the region's geometry, the number of workers, the
// persistence files, locked and checked at start, and the interval of
// their dumps, the admin listener)
// taken from running, and logs any such change that was asked for.
// persist.key, the application's version, is among them: the region
// records the key its stored responses were made under when it is made,
// and a dump carries that one, so that the next start under the new key
// drops them (the responses stored now are the old version's).
func keepRestartOnly(log *slog.Logger, running, next config.Config) config.Config {
	var ignored []string
	// keep puts the running value of a restart-only key back in next.
	keep := func(key string, asked *string, runs string) {
		if *asked != runs {
			ignored = append(ignored, fmt.Sprintf("%s %q", key, *asked))
			*asked = runs
		}
	}
	keep("server.listen", &next.Server.Listen, running.Server.Listen)
	keep("tls.cleartext_listen", &next.TLS.CleartextListen, running.TLS.CleartextListen)
	if next.Server.WorkerCount() != running.Server.WorkerCount() {
		ignored = append(ignored, fmt.Sprintf("server.workers %d", next.Server.Workers))
	}
	next.Server.Workers = running.Server.Workers
	// The file's [table], not the geometry made from it: a reload that
	// only removes or adds [[idempotency]] and [[cache]] blocks changes
	// no key of it (adding the first one is refused above, by the
	// region's own geometry).
	for _, k := range []struct {
		key         string
		asked, runs any
	}{
		{"table.counters", next.Table.Counters, running.Table.Counters},
		{"table.responses", next.Table.Responses, running.Table.Responses},
		{"table.response_bytes", next.Table.ResponseBytes, running.Table.ResponseBytes},
	} {
		if k.asked != k.runs {
			ignored = append(ignored, fmt.Sprintf("%s %v", k.key, k.asked))
		}
	}
	next.Table = running.Table
	keep("persist.path", &next.Persist.Path, running.Persist.Path)
	keep("persist.live", &next.Persist.Live, running.Persist.Live)
	// The supervisor's admin server listens where it started.
	keep("admin.listen", &next.Admin.Listen, running.Admin.Listen)
	if next.Persist.AppKey() != running.Persist.AppKey() {
		ignored = append(ignored, "persist.key (takes effect at the next start)") // never its value: it may be a secret
		next.Persist.Key, next.Persist.KeyFile, next.Persist.FileKey = running.Persist.Key, running.Persist.KeyFile, running.Persist.FileKey
	}
	if next.Persist.Interval != running.Persist.Interval {
		ignored = append(ignored, fmt.Sprintf("persist.interval %v", next.Persist.Interval))
		next.Persist.Interval = running.Persist.Interval
	}
	if next.TLS.Enabled() != running.TLS.Enabled() {
		// The listener speaks TLS or not: a reload's workers would speak
		// another protocol on it than the ones they replace.
		ignored = append(ignored, "[tls] turned on or off")
		next.TLS = running.TLS
	}
	if len(ignored) > 0 {
		log.Warn("reload: these settings need a restart; keeping the running values", "ignored", ignored)
	}
	return next
}

// cacheSince gives each [[cache]] block of next the time from which it
// serves stored responses: a block of running's path keeps its own, and
// one new to running (added, or added back after a reload removed it)
// gets now. While no block covered its URLs, unsafe requests to them
// invalidated nothing, so the responses stored before may be ones those
// requests changed.
func cacheSince(next *config.Config, running config.Config, now time.Duration) {
	for i := range next.Caches {
		next.Caches[i].Since = now
		for _, r := range running.Caches {
			if r.Path == next.Caches[i].Path {
				next.Caches[i].Since = r.Since
				break
			}
		}
	}
}

// changeAttrs are the log attributes that say what a reload changes: the
// keys, never their values (a value may be a secret).
func changeAttrs(ch config.Changes) []slog.Attr {
	if ch.Empty() {
		return []slog.Attr{slog.String("changed", "nothing")}
	}
	var attrs []slog.Attr
	add := func(key string, v []string) {
		if len(v) > 0 {
			attrs = append(attrs, slog.Any(key, v))
		}
	}
	add("rules_added", ch.RulesAdded)
	add("rules_removed", ch.RulesRemoved)
	add("rules_changed", ch.RulesChanged)
	add("idempotency_added", ch.BlocksAdded)
	add("idempotency_removed", ch.BlocksRemoved)
	add("idempotency_changed", ch.BlocksChanged)
	add("keys_changed", ch.Keys)
	return attrs
}

// runningConfig is the configuration of the supervisor's snapshot: the
// one its running generation's settings came from.
func runningConfig(st *prefork.Status) config.Config {
	cfg, _ := st.Settings.Config.(config.Config)
	return cfg
}
