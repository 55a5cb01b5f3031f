package main

// End-to-end tests of the logs: refusals rate-limited across workers,
// JSON lines, the start banner.

import (
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// A flood of 10,000 refusals over 4 workers writes at most one line a
// second for the rule, each naming the rule, client, method and path, never
// the secret key header; the lines and the refusals they hold back add up
// to every refusal.
func TestRefusalLogFlood(t *testing.T) {
	t.Parallel()
	cfg := baseServer(4, "") + `
[[ratelimit]]
name = "api"
path = "/api/*"
limit = 1
window = "1h"
by = "header:X-Api-Key|ip"
`
	d := startDaemon(t, daemonOptions{config: cfg})
	const secret = "s3cret-api-key-value"
	h := http.Header{"X-Api-Key": {secret}}
	ip := freshClientIP()
	c := newClient(t, ip, true)
	if r := do(c, http.MethodPost, d.url("/api/orders"), h); r.status != 200 {
		t.Fatalf("first request: %d %v", r.status, r.err)
	}
	const flood = 10000
	var refused, other atomic.Int64
	start := time.Now()
	var wg sync.WaitGroup
	for range 8 {
		c := newClient(t, ip, true)
		wg.Go(func() {
			for range flood / 8 {
				switch r := do(c, http.MethodPost, d.url("/api/orders"), h); r.status {
				case 429:
					refused.Add(1)
				default:
					other.Add(1)
				}
			}
		})
	}
	wg.Wait()
	took := time.Since(start)
	if refused.Load() != flood || other.Load() != 0 {
		t.Fatalf("%d refused, %d other: want all %d refused", refused.Load(), other.Load(), flood)
	}
	// One more, more than a second later: its line accounts for all the
	// refusals held back since the last one.
	time.Sleep(1100 * time.Millisecond)
	if r := do(c, http.MethodPost, d.url("/api/orders"), h); r.status != 429 {
		t.Fatalf("the last request: %d", r.status)
	}
	var lines []logLine
	if _, _, ok := d.logs.waitFor(d.readyAt, 5*time.Second, func(l logLine) bool {
		if l.msg() == "request refused" {
			lines = append(lines, l)
		}
		return l.msg() == "request refused" && len(lines) > 0 && l.int("suppressed") >= 0 && sumRefusals(lines) == flood+1
	}); !ok {
		t.Fatalf("the refusal lines stand for %d refusals, want %d:\n%s", sumRefusals(lines), flood+1, d.logs.text())
	}
	// At most one line per started second of the flood, and one for the last.
	if max := int(took/time.Second) + 2; len(lines) > max {
		t.Errorf("%d lines for a flood of %v: more than one a second", len(lines), took)
	}
	var prev time.Time
	for i, l := range lines {
		if l.get("rule") != "api" || l.get("client") != ip.String() || l.get("method") != "POST" || l.get("path") != "/api/orders" {
			t.Errorf("line %q does not name the rule, client, method and path", l.raw)
		}
		at, err := time.Parse(time.RFC3339Nano, l.get("time"))
		if err != nil {
			t.Fatalf("line %q: %v", l.raw, err)
		}
		// Lines are gated on the shared clock: a second apart, give or take
		// the time a worker takes from its clock read to its write.
		if i > 0 && at.Sub(prev) < 900*time.Millisecond {
			t.Errorf("two refusal lines %v apart:\n%s\n%s", at.Sub(prev), lines[i-1].raw, l.raw)
		}
		prev = at
	}
	if strings.Contains(d.logs.text(), secret) {
		t.Error("the log shows the API key")
	}
	t.Logf("%d refusals in %v: %d lines", flood, took.Round(time.Millisecond), len(lines))
}

// sumRefusals is the refusals lines stand for: each its own and the ones
// it says it held back.
func sumRefusals(lines []logLine) int {
	n := 0
	for _, l := range lines {
		n += l.int("suppressed") + 1
	}
	return n
}

// [log] format = "json" writes every line, the workers' too, as one JSON
// object, the banner first; -log-level overrides the file's level.
func TestJSONLogs(t *testing.T) {
	t.Parallel()
	type line struct {
		Msg, Level, Config string
		Rules              []string
		Workers            int
		Worker             *int
	}
	parse := func(l logLine) (line, bool) {
		var v line
		return v, json.Unmarshal([]byte(l.raw), &v) == nil
	}
	d := startDaemon(t, daemonOptions{
		config: baseServer(2, "") + "\n[log]\nformat = \"json\"\nlevel = \"warn\"\n" + rule("login", "/login", "gcra", 1, "1h"),
		args:   []string{"-log-level", "debug"},
		ready:  func(l logLine) bool { v, _ := parse(l); return v.Msg == "ready" },
	})
	c := newClient(t, freshClientIP(), false)
	get(c, d.url("/login"))
	get(c, d.url("/login"))
	if _, _, ok := d.logs.waitFor(0, 5*time.Second, func(l logLine) bool {
		v, _ := parse(l)
		return v.Msg == "request refused" && v.Worker != nil
	}); !ok {
		t.Fatalf("no JSON refusal line from a worker:\n%s", d.logs.text())
	}
	d.stop()
	lines := d.logs.snapshot()
	debug := false
	for i, l := range lines {
		v, ok := parse(l)
		if !ok {
			t.Errorf("line %d is not JSON: %s", i, l.raw)
			continue
		}
		debug = debug || v.Level == "DEBUG"
		if i == 0 && (v.Msg != "preforkd starting" || v.Config != d.cfgPath || v.Workers != 2 || len(v.Rules) != 1 || v.Rules[0] != "login") {
			t.Errorf("first line %s: want the banner with the config path, 2 workers and rule login", l.raw)
		}
	}
	if !debug {
		t.Error("-log-level debug wrote no debug line")
	}
	// A level or format that does not exist is a usage error.
	for _, args := range [][]string{{"-log-format", "xml"}, {"-log-level", "verbose"}} {
		code, _, stderr := runBinary(t, append([]string{"run", "-config", d.cfgPath}, args...)...)
		if code != 2 || !strings.Contains(stderr, args[0]) {
			t.Errorf("run %s: exit %d, %q; want 2 naming the flag", strings.Join(args, " "), code, stderr)
		}
	}
}
