package main

import (
	"net/http"
	"net/url"
	"time"

	"github.com/preforkd/preforkd/config"
	"github.com/preforkd/preforkd/metrics"
	"github.com/preforkd/preforkd/prefork"
	"github.com/preforkd/preforkd/shm"
)

// statusJSON is GET /status. Field names are snake case; times RFC 3339;
// durations in seconds. It never holds a secret: the upstream's password
// is masked, the persistence key and the admin token are left out.
type statusJSON struct {
	Version       string  `json:"version"`
	Commit        string  `json:"commit"`
	Config        string  `json:"config"`
	PID           int     `json:"pid"`
	Started       string  `json:"started"`
	UptimeSeconds float64 `json:"uptime_seconds"`
	Generation    int     `json:"generation"`
	// Ready: every worker runs the running configuration and is ready.
	// Serving: what /readyz answers 200 for.
	Ready    bool `json:"ready"`
	Serving  bool `json:"serving"`
	Draining bool `json:"draining"`

	Reloads  reloadsJSON `json:"reloads"`
	Crashes  int         `json:"worker_crashes"`
	Listen   string      `json:"listen"`
	Upstream string      `json:"upstream"`
	Rules    []ruleJSON  `json:"rules"`
	Blocks   []blockJSON `json:"idempotency"`
	// Workers are the worker processes; a worker's state is "starting",
	// "ready" or "retiring" (prefork.WorkerStatus.State).
	Workers []workerJSON `json:"workers"`
	// Canary is the canary being judged, else the last canary's verdict;
	// absent before the first canary reload. Quarantined are the worker
	// slots an aborted canary left empty until a reload succeeds;
	// Recycled counts workers replaced for max_requests or max_rss.
	Canary      *canaryJSON `json:"canary,omitempty"`
	Quarantined []int       `json:"quarantined_slots"`
	Recycled    int         `json:"workers_recycled"`
	Table       tableJSON   `json:"table"`
	// Redis is [redis] and its breaker, when [redis] is set.
	Redis map[string]any `json:"redis,omitempty"`
}

type reloadsJSON struct {
	Accepted int `json:"accepted"`
	Refused  int `json:"refused"`
	// Aborted: accepted, then aborted (prefork.ReloadStatus.Aborted).
	Aborted   int    `json:"aborted"`
	Last      string `json:"last,omitempty"`
	LastError string `json:"last_error,omitempty"`
}

type ruleJSON struct {
	Name      string   `json:"name"`
	Path      string   `json:"path"`
	Methods   []string `json:"methods"`
	Limit     int64    `json:"limit"`
	Window    string   `json:"window"`
	Algorithm string   `json:"algorithm"`
	Burst     int64    `json:"burst"`
	By        string   `json:"by"`
	Mode      string   `json:"mode"`
	OnFull    string   `json:"on_full"`
}

type blockJSON struct {
	Path    string   `json:"path"`
	Methods []string `json:"methods"`
	Header  string   `json:"header"`
	TTL     string   `json:"ttl"`
	By      string   `json:"by"`
	MaxBody int64    `json:"max_body"`
}

type canaryJSON struct {
	Generation int    `json:"generation"`
	Slot       int    `json:"slot"`
	PID        int    `json:"pid,omitempty"`
	Verdict    string `json:"verdict"` // "" while the window runs
	Aborted    bool   `json:"aborted"`
	Requests   uint64 `json:"requests"`
	Errors5xx  uint64 `json:"errors_5xx"`
	// FleetRequests and FleetErrors5xx are every other worker's over the
	// same window.
	FleetRequests  uint64  `json:"fleet_requests"`
	FleetErrors5xx uint64  `json:"fleet_errors_5xx"`
	PValue         float64 `json:"p_value"`
	Test           string  `json:"test,omitempty"`
	Summary        string  `json:"summary,omitempty"`
	Started        string  `json:"started,omitempty"`
	Ends           string  `json:"ends,omitempty"`
}

type workerJSON struct {
	Index      int    `json:"index"`
	Slot       int    `json:"slot"`
	PID        int    `json:"pid"`
	Generation int    `json:"generation"`
	Started    string `json:"started"`
	State      string `json:"state"`
	// Requests and Errors5xx are the responses this process sent since it
	// started (its row of the statistics), all and 5xx.
	Requests  uint64 `json:"requests"`
	Errors5xx uint64 `json:"errors_5xx"`
}

type tableJSON struct {
	Counters  countersJSON   `json:"counters"`
	Responses *responsesJSON `json:"responses,omitempty"`
}

type countersJSON struct {
	Slots        int     `json:"slots"`
	Probe        int     `json:"probe"`
	Used         int     `json:"used"`
	Occupancy    float64 `json:"occupancy"`
	Full         uint64  `json:"full"`
	LockTimeouts uint64  `json:"lock_timeouts"`
	Claims       uint64  `json:"claims"`
	Reclaims     uint64  `json:"reclaims"`
	Recovered    uint64  `json:"recovered"`
	Loaded       uint64  `json:"loaded"`
}

type responsesJSON struct {
	Records     int    `json:"records"`
	RecordsUsed int    `json:"records_used"`
	Full        uint64 `json:"full"`
	Blocks      int    `json:"blocks"`
	BlockSize   int    `json:"block_size"`
	BlocksUsed  int    `json:"blocks_used"`
	NoBlocks    uint64 `json:"no_blocks"`
}

func (a *admin) serveStatus(w http.ResponseWriter, _ *http.Request) {
	st := a.status.Load()
	if st == nil {
		st = &prefork.Status{}
	}
	now := time.Now()
	out := statusJSON{
		Version: a.version, Commit: a.commit, Config: a.configPath, PID: pid(),
		Started: a.since.UTC().Format(time.RFC3339), UptimeSeconds: now.Sub(a.since).Seconds(),
		Generation: st.Generation, Ready: st.Ready, Serving: st.Serving, Draining: st.Draining,
		Reloads:     reloadsJSON{Accepted: st.Reloads.Accepted, Refused: st.Reloads.Refused, Aborted: st.Reloads.Aborted, LastError: st.Reloads.LastError},
		Crashes:     st.Crashes,
		Listen:      runningConfig(st).Server.Listen,
		Upstream:    redactedURL(runningConfig(st).Server.Upstream),
		Rules:       rulesJSON(runningConfig(st)),
		Blocks:      blocksJSON(runningConfig(st)),
		Workers:     []workerJSON{},
		Quarantined: append([]int{}, st.Quarantined...),
		Recycled:    st.Recycled,
	}
	if c := st.Canary; c != nil {
		out.Canary = &canaryJSON{
			Generation: c.Generation, Slot: c.Slot, PID: c.PID, Verdict: string(c.Verdict), Aborted: c.Aborted,
			Requests: c.Canary.Requests, Errors5xx: c.Canary.Errors, FleetRequests: c.Fleet.Requests, FleetErrors5xx: c.Fleet.Errors,
			PValue: c.PValue, Test: c.Test, Summary: c.Summary, Started: rfc3339(c.Started), Ends: rfc3339(c.Ends),
		}
	}
	var snap metrics.Snapshot
	metrics.Read(a.region, &snap)
	out.Table = tableStatsJSON(snap.Table())
	if runningConfig(st).Redis.Enabled() {
		out.Redis = redisStatus(a.region, runningConfig(st))
	}
	if !st.Reloads.Last.IsZero() {
		out.Reloads.Last = st.Reloads.Last.UTC().Format(time.RFC3339)
	}
	for _, wk := range st.Workers {
		metrics.ReadWorker(a.region, wk.Index, &snap)
		out.Workers = append(out.Workers, workerJSON{
			Index: wk.Index, Slot: wk.Slot, PID: wk.PID, Generation: wk.Generation,
			Started: wk.Started.UTC().Format(time.RFC3339), State: wk.State(),
			Requests: snap.Requests(), Errors5xx: snap.Errors5xx(),
		})
	}
	writeJSON(w, out)
}

// rfc3339 formats t, or "" for the zero time.
func rfc3339(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format(time.RFC3339Nano)
}

func rulesJSON(cfg config.Config) []ruleJSON {
	out := []ruleJSON{}
	for _, r := range cfg.RateLimits {
		out = append(out, ruleJSON{
			Name: r.Name, Path: r.Path, Methods: nonNil(r.Methods), Limit: r.Limit, Window: r.Window.String(),
			Algorithm: r.Algorithm.String(), Burst: r.EffectiveBurst(), By: r.By, Mode: cfg.RuleMode(r).String(), OnFull: r.OnFull.String(),
		})
	}
	return out
}

func blocksJSON(cfg config.Config) []blockJSON {
	out := []blockJSON{}
	for _, d := range cfg.Idempotency {
		out = append(out, blockJSON{
			Path: d.Path, Methods: nonNil(d.Methods), Header: d.Header, TTL: d.TTL.String(), By: d.By, MaxBody: int64(d.MaxBody),
		})
	}
	return out
}

// tableJSON is the tables' occupancy and events, from the statistics
// rows: no slot is read.
func tableStatsJSON(tb shm.TableStats) tableJSON {
	t := tableJSON{Counters: countersJSON{
		Slots: tb.Slots, Probe: tb.Probe, Used: tb.Live, Occupancy: tb.Occupancy(),
		Full: tb.Full, LockTimeouts: tb.LockTimeout, Claims: tb.Claims, Reclaims: tb.Reclaims,
		Recovered: tb.Recovered, Loaded: tb.Placed,
	}}
	if tb.Records > 0 {
		t.Responses = &responsesJSON{Records: tb.Records, RecordsUsed: tb.RecordsInUse, Full: tb.RecordsFull,
			Blocks: tb.Blocks, BlockSize: tb.BlockSize, BlocksUsed: tb.BlocksUsed, NoBlocks: tb.NoBlocks}
	}
	return t
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// redactedURL masks the password of a URL, if it has one.
func redactedURL(s string) string {
	if u, err := url.Parse(s); err == nil && u.User != nil {
		return u.Redacted()
	}
	return s
}
