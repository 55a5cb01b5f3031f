package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/preforkd/preforkd/config"
	"github.com/preforkd/preforkd/prefork"
	"github.com/preforkd/preforkd/redisstore"
	"github.com/preforkd/preforkd/shm"
)

// adminHooks serves [admin] listen from the supervisor, which never serves
// application requests: /metrics (Prometheus text format) and /status
// (JSON), both read-only, from the region's statistics.
func adminHooks(opts *prefork.Options) {
	var srv *http.Server
	// The configuration in force, for the [redis] whose breaker /status
	// shows: the one started with, then each reloaded one.
	var running atomic.Pointer[config.Config]
	running.Store(&opts.Config)
	if load := opts.LoadConfig; load != nil {
		opts.LoadConfig = func() (config.Config, error) {
			c, err := load()
			if err == nil {
				running.Store(&c)
			}
			return c, err
		}
	}
	prepare, finish := opts.Prepare, opts.Finish
	opts.Prepare = func(r *shm.Region, cfg config.Config, log *slog.Logger) error {
		if prepare != nil {
			if err := prepare(r, cfg, log); err != nil {
				return err
			}
		}
		if cfg.Admin.Listen == "" {
			return nil
		}
		ln, err := net.Listen("tcp", cfg.Admin.Listen)
		if err != nil {
			return fmt.Errorf("admin: %w", err)
		}
		srv = newAdminServer(adminMux(r, running.Load, log), defaultAdminLimits, log)
		capped := capListener(ln, defaultAdminLimits.maxConns, log)
		go func() {
			if err := srv.Serve(capped); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Error("admin endpoint stopped", "err", err)
			}
		}()
		log.Info("admin endpoint listening", "listen", ln.Addr().String())
		return nil
	}
	opts.Finish = func(r *shm.Region, cfg config.Config, log *slog.Logger) error {
		if srv != nil {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			srv.Shutdown(ctx)
			cancel()
		}
		if finish != nil {
			return finish(r, cfg, log)
		}
		return nil
	}
}

func adminMux(r *shm.Region, cfg func() *config.Config, log *slog.Logger) http.Handler {
	mux := http.NewServeMux()
	tokenFile := func() string { return cfg().Admin.TokenFile }
	mux.HandleFunc("POST /cache/purge", withToken(tokenFile, log, serveCachePurge(r, log)))
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, _ *http.Request) {
		st := r.Counters().Stats()
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		metric := func(name, typ, help string, v any) {
			fmt.Fprintf(w, "# HELP %s %s\n# TYPE %s %s\n%s %v\n", name, help, name, typ, name, v)
		}
		metric("preforkd_counter_slots", "gauge", "Counter slots in the table.", st.Slots)
		metric("preforkd_counter_slots_live", "gauge", "Counter slots holding a key.", st.Live)
		metric("preforkd_counter_slots_busy", "gauge", "Counter slots being installed.", st.Busy)
		metric("preforkd_counter_slots_tomb", "gauge", "Released counter slots.", st.Tomb)
		metric("preforkd_counter_probe_max", "gauge", "Largest probe distance of a live key.", st.MaxProbe)
		metric("preforkd_counter_probe_mean", "gauge", "Mean probe distance of live keys.", st.MeanProbe)
		metric("preforkd_counter_full_total", "counter", "Decisions answered by on_full: no slot in the probe window.", st.Full)
		metric("preforkd_counter_lock_timeout_total", "counter", "Decisions answered by on_full: insert lock held too long.", st.LockTimeout)
		metric("preforkd_counter_claims_total", "counter", "Keys installed in free slots.", st.Claims)
		metric("preforkd_counter_reclaims_total", "counter", "Slots reclaimed from keys equivalent to fresh ones.", st.Reclaims)
		metric("preforkd_counter_recovered_total", "counter", "Slots and locks released from dead workers.", st.Recovered)
		metric("preforkd_workers", "gauge", "Worker processes joined to the region.", liveWorkers(r))
		if rd := cfg().Redis; rd.Enabled() {
			b := redisstore.ReadBreaker(r, rd.StoreOptions(), r.Now())
			metric("preforkd_redis_breaker_state", "gauge", "The Redis breaker shared by the workers: 0 closed, 1 open, 2 half-open.", int(b.Phase))
		}
	})
	mux.HandleFunc("GET /status", func(w http.ResponseWriter, _ *http.Request) {
		geo, st := r.Geometry(), r.Counters().Stats()
		workers := []map[string]any{}
		for _, wi := range r.Workers() {
			if wi.PID != 0 {
				workers = append(workers, map[string]any{"index": wi.Index, "pid": wi.PID, "incarnation": wi.Incarnation})
			}
		}
		status := map[string]any{
			"region_clock": r.Now().String(),
			"workers":      workers,
			"counters": map[string]any{
				"slots": geo.Counters, "probe": geo.Probe, "live": st.Live, "busy": st.Busy, "tomb": st.Tomb,
				"occupancy": st.Occupancy(), "probe_max": st.MaxProbe, "probe_mean": st.MeanProbe,
				"full": st.Full, "lock_timeouts": st.LockTimeout, "claims": st.Claims,
				"reclaims": st.Reclaims, "recovered": st.Recovered,
			},
		}
		if c := cfg(); c.Redis.Enabled() {
			status["redis"] = redisStatus(r, *c)
		}
		if rs := r.Responses(); rs.Len() > 0 {
			s := rs.Stats()
			status["responses"] = map[string]any{
				"records": s.Records, "reserved": s.Reserved, "complete": s.Complete,
				"blocks": s.Blocks, "blocks_used": s.BlocksUsed, "full": s.Full, "no_blocks": s.NoBlocks,
			}
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(status)
	})
	return mux
}

// redisStatus is /status's view of [redis]: where it is (no password),
// which rules use it, and the breaker the workers share, read from the
// region.
func redisStatus(r *shm.Region, cfg config.Config) map[string]any {
	rd := cfg.WithDefaults().Redis
	target := map[string]any{}
	switch {
	case rd.URL != "":
		target["url"] = rd.URL.String()
	case len(rd.Cluster) > 0:
		target["cluster"] = rd.Cluster
	default:
		target["sentinel"] = map[string]any{"master": rd.Sentinel.Master, "addrs": rd.Sentinel.Addrs}
	}
	rules := []map[string]any{}
	for _, rl := range cfg.RateLimits {
		if rl.Store == config.StoreRedis {
			rules = append(rules, map[string]any{"name": rl.Name, "on_unavailable": rl.OnUnavailable.String(),
				"local_share": rl.LocalShare, "sync": rl.Sync.String()})
		}
	}
	b := redisstore.ReadBreaker(r, rd.StoreOptions(), r.Now())
	breaker := map[string]any{"state": b.Phase.String(), "failures": b.Failures,
		"threshold": rd.BreakerFailures, "backoff": rd.BreakerBackoff.String()}
	switch b.Phase {
	case redisstore.Open:
		breaker["open_for"] = b.Until.String()
	case redisstore.HalfOpen:
		breaker["prober"] = b.Prober
		breaker["probe_deadline_in"] = b.Until.String()
	}
	return map[string]any{"target": target, "timeout": rd.Timeout.String(), "prefix": rd.Prefix,
		"rules": rules, "breaker": breaker}
}

// quietRedisLog sends go-redis's own log lines (one per failed dial) to
// log at debug level: the breaker logs what an operator acts on, once.
func quietRedisLog(log *slog.Logger) {
	redis.SetLogger(redisLog{log})
}

type redisLog struct{ log *slog.Logger }

func (l redisLog) Printf(ctx context.Context, format string, v ...any) {
	l.log.Log(ctx, slog.LevelDebug, "redis client: "+fmt.Sprintf(format, v...))
}

func liveWorkers(r *shm.Region) int {
	n := 0
	for _, w := range r.Workers() {
		if w.PID != 0 {
			n++
		}
	}
	return n
}
