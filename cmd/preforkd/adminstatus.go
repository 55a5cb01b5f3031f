package main

import (
	"net/http"
	"net/url"
	"time"

	"github.com/preforkd/preforkd/config"
	"github.com/preforkd/preforkd/prefork"
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
	Table   tableJSON    `json:"table"`
}

type reloadsJSON struct {
	Accepted  int    `json:"accepted"`
	Refused   int    `json:"refused"`
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

type workerJSON struct {
	Index      int    `json:"index"`
	PID        int    `json:"pid"`
	Generation int    `json:"generation"`
	Started    string `json:"started"`
	State      string `json:"state"`
}

type tableJSON struct {
	Counters  countersJSON   `json:"counters"`
	Responses *responsesJSON `json:"responses,omitempty"`
}

type countersJSON struct {
	Slots     int     `json:"slots"`
	Probe     int     `json:"probe"`
	Live      int     `json:"live"`
	Occupancy float64 `json:"occupancy"`
	Full      uint64  `json:"full"`
	Claims    uint64  `json:"claims"`
	Reclaims  uint64  `json:"reclaims"`
	Recovered uint64  `json:"recovered"`
}

type responsesJSON struct {
	Records    int    `json:"records"`
	InUse      int    `json:"in_use"`
	Blocks     int    `json:"blocks"`
	BlocksUsed int    `json:"blocks_used"`
	Full       uint64 `json:"full"`
	NoBlocks   uint64 `json:"no_blocks"`
}

func (a *admin) serveStatus(w http.ResponseWriter, _ *http.Request) {
	st := a.status.Load()
	if st == nil {
		st = &prefork.Status{}
	}
	now := time.Now()
	out := statusJSON{
		Version: a.version, Commit: a.commit, Config: a.configPath, PID: pid(),
		Started: a.started.UTC().Format(time.RFC3339), UptimeSeconds: now.Sub(a.started).Seconds(),
		Generation: st.Generation, Ready: st.Ready, Serving: st.Serving, Draining: st.Draining,
		Reloads:  reloadsJSON{Accepted: st.Reloads.Accepted, Refused: st.Reloads.Refused, LastError: st.Reloads.LastError},
		Crashes:  st.Crashes,
		Listen:   st.Config.Server.Listen,
		Upstream: redactedURL(st.Config.Server.Upstream),
		Rules:    rulesJSON(st.Config),
		Blocks:   blocksJSON(st.Config),
		Workers:  []workerJSON{},
		Table:    a.tableJSON(),
	}
	if !st.Reloads.Last.IsZero() {
		out.Reloads.Last = st.Reloads.Last.UTC().Format(time.RFC3339)
	}
	for _, wk := range st.Workers {
		out.Workers = append(out.Workers, workerJSON{
			Index: wk.Index, PID: wk.PID, Generation: wk.Generation,
			Started: wk.Started.UTC().Format(time.RFC3339), State: wk.State(),
		})
	}
	writeJSON(w, out)
}

func rulesJSON(cfg config.Config) []ruleJSON {
	out := []ruleJSON{}
	for _, r := range cfg.RateLimits {
		out = append(out, ruleJSON{
			Name: r.Name, Path: r.Path, Methods: nonNil(r.Methods), Limit: r.Limit, Window: r.Window.String(),
			Algorithm: r.Algorithm.String(), Burst: r.EffectiveBurst(), By: r.By, Mode: r.Mode.String(), OnFull: r.OnFull.String(),
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

func (a *admin) tableJSON() tableJSON {
	cs := a.region.Counters().Stats()
	t := tableJSON{Counters: countersJSON{
		Slots: cs.Slots, Probe: cs.Probe, Live: cs.Live, Occupancy: cs.Occupancy(),
		Full: cs.Full + cs.LockTimeout, Claims: cs.Claims, Reclaims: cs.Reclaims, Recovered: cs.Recovered,
	}}
	if rs := a.region.Responses(); rs.Len() > 0 {
		s := rs.Stats()
		t.Responses = &responsesJSON{Records: s.Records, InUse: s.Reserved + s.Complete, Blocks: s.Blocks,
			BlocksUsed: s.BlocksUsed, Full: s.Full, NoBlocks: s.NoBlocks}
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
