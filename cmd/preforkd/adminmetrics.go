package main

import (
	"net/http"
	"sync"

	"github.com/preforkd/preforkd/metrics"
	"github.com/preforkd/preforkd/prefork"
	"github.com/preforkd/preforkd/redisstore"
)

// scrape is the buffers of one /metrics answer, reused.
type scrape struct {
	snap    metrics.Snapshot
	text    metrics.Text
	rules   []metrics.Rule
	workers []workerFigures
}

var scrapes = sync.Pool{New: func() any { return new(scrape) }}

// serveMetrics is GET /metrics: the supervisor's own state, then the sums
// of the workers' statistics rows (package metrics). It reads the rows,
// never the slots: its cost does not grow with the tables.
func (a *admin) serveMetrics(w http.ResponseWriter, _ *http.Request) {
	sc := scrapes.Get().(*scrape)
	defer scrapes.Put(sc)
	sc.text.Reset()
	st := a.status.Load()
	if st == nil {
		st = &prefork.Status{}
	}
	predecessor := collectWorkers(st, a.region, &sc.workers)
	a.appendSupervisor(&sc.text, st, predecessor)
	appendWorkers(&sc.text, a.region, &sc.workers)
	metrics.Read(a.region, &sc.snap)
	sc.rules = sc.rules[:0]
	for _, r := range runningConfig(st).RateLimits {
		sc.rules = append(sc.rules, metrics.Rule{Name: r.Name, Index: metrics.RuleIndex(a.region, r.Name)})
	}
	sc.snap.AppendFamilies(&sc.text, sc.rules)
	sc.snap.AppendTable(&sc.text)
	if rd := runningConfig(st).Redis; rd.Enabled() {
		b := redisstore.ReadBreaker(a.region, rd.StoreOptions(), a.region.Now())
		sc.text.Family("preforkd_redis_breaker_state", "gauge", "The Redis breaker shared by the workers: 0 closed, 1 open, 2 half-open.")
		sc.text.Uint("preforkd_redis_breaker_state", uint64(b.Phase))
		sc.snap.AppendRedis(&sc.text)
	}
	w.Header().Set("Content-Type", metrics.ContentType)
	w.Header().Set("Cache-Control", "no-store")
	w.Write(sc.text.Bytes())
}

// appendSupervisor writes what the supervisor knows: the build, the
// workers, the reloads. predecessor workers of the old supervisor of a
// binary upgrade still drain: they are counted retiring.
func (a *admin) appendSupervisor(t *metrics.Text, st *prefork.Status, predecessor int) {
	t.Family("preforkd_build_info", "gauge", "The running build: 1, labelled with its version and commit.")
	t.Uint("preforkd_build_info", 1, "version", a.version, "commit", a.commit)
	t.Family("preforkd_start_time_seconds", "gauge", "When the instance started, in Unix seconds: its first supervisor's start, kept across binary upgrades (USR2) as the counters are.")
	t.Float("preforkd_start_time_seconds", float64(a.since.UnixNano())/1e9)

	var starting, ready uint64
	retiring := uint64(predecessor)
	for _, w := range st.Workers {
		switch w.State() {
		case "starting":
			starting++
		case "ready":
			ready++
		default:
			retiring++
		}
	}
	t.Family("preforkd_workers", "gauge", "Worker processes, by state: starting (not yet ready), ready, retiring (draining after a reload, at shutdown, or the old supervisor's after a binary upgrade).")
	t.Uint("preforkd_workers", starting, "state", "starting")
	t.Uint("preforkd_workers", ready, "state", "ready")
	t.Uint("preforkd_workers", retiring, "state", "retiring")
	t.Family("preforkd_worker_restarts_total", "counter", "Workers that exited without being asked to (or never became ready) and were replaced.")
	t.Uint("preforkd_worker_restarts_total", uint64(st.Crashes))
	t.Family("preforkd_ready", "gauge", "1 while the instance serves (what /readyz answers 200 for), else 0.")
	t.Uint("preforkd_ready", b2u(st.Serving))
	t.Family("preforkd_draining", "gauge", "1 from the moment a graceful shutdown began.")
	t.Uint("preforkd_draining", b2u(st.Draining))

	t.Family("preforkd_reload_generation", "gauge", "The generation the workers run: 0 at start, one more for each accepted reload (once its canary passed) and for each binary upgrade (the new supervisor loads the file again), the running one's again after an aborted reload.")
	t.Uint("preforkd_reload_generation", uint64(st.Generation))
	t.Family("preforkd_reloads_total", "counter", "Reloads (HUP), by result: accepted, or refused (the file did not load, or an upgrade or a drain was under way; the running configuration was kept).")
	t.Uint("preforkd_reloads_total", uint64(st.Reloads.Accepted), "result", "accepted")
	t.Uint("preforkd_reloads_total", uint64(st.Reloads.Refused), "result", "refused")
	// Aborted reloads were accepted first: a counter of their own, so
	// that the results above still add up to the reloads asked for.
	t.Family("preforkd_reloads_aborted_total", "counter", "Accepted reloads that were aborted, the running configuration kept: by their canary, or because a worker of the new configuration could not start or become ready.")
	t.Uint("preforkd_reloads_aborted_total", uint64(st.Reloads.Aborted))
	t.Family("preforkd_reload_last_success", "gauge", "0 when the last reload was refused or aborted, else 1 (also before the first: the configuration at start loaded).")
	t.Uint("preforkd_reload_last_success", b2u(st.Reloads.LastError == ""))
	// As Prometheus' own config_last_reload_success_timestamp_seconds:
	// the configuration's load at start is the first.
	last := st.Reloads.Last
	if last.IsZero() {
		last = a.started
	}
	t.Family("preforkd_reload_last_timestamp_seconds", "gauge", "When the configuration was last loaded, in Unix seconds: at start, then at each reload asked for (HUP), accepted or refused.")
	t.Float("preforkd_reload_last_timestamp_seconds", float64(last.UnixNano())/1e9)
	t.Family("preforkd_workers_quarantined", "gauge", "Worker slots an aborted canary left empty until a reload succeeds.")
	t.Uint("preforkd_workers_quarantined", uint64(len(st.Quarantined)))
	t.Family("preforkd_worker_recycles_total", "counter", "Workers replaced for server.max_requests or server.max_rss.")
	t.Uint("preforkd_worker_recycles_total", uint64(st.Recycled))
	if c := st.Canary; c != nil {
		// One series per verdict, 1 for the last canary's (running: its
		// window has not ended), so that an alert can match a value.
		t.Family("preforkd_canary_verdict", "gauge", "The last canary's verdict: 1 for the one it got (running while its window runs), 0 for the others.")
		for _, v := range []prefork.Verdict{"", prefork.VerdictHealthy, prefork.VerdictUnhealthy, prefork.VerdictInconclusive, prefork.VerdictFailed} {
			name := string(v)
			if v == "" {
				name = "running"
			}
			t.Uint("preforkd_canary_verdict", b2u(c.Verdict == v), "verdict", name)
		}
		t.Family("preforkd_canary_generation", "gauge", "The configuration generation the last canary ran.")
		t.Uint("preforkd_canary_generation", uint64(c.Generation))
	}
}

func b2u(b bool) uint64 {
	if b {
		return 1
	}
	return 0
}
