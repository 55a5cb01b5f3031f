package main

// End-to-end tests of the built preforkd binary: each
// scenario runs a real supervisor with real workers (harness_test.go) and
// counts outcomes exactly. Scenarios that share nothing run in parallel.

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"
	"time"
)

// baseServer is the [server], [table] and [reload] part shared by the
// scenarios: a small table, so that many daemons fit side by side, and a
// short canary window, so that a reload is judged in a fraction of a
// second.
func baseServer(workers int, extra string) string {
	return fmt.Sprintf(`[server]
workers = %d
shutdown_timeout = "10s"
%s
[table]
counters = 1024
responses = 64
response_bytes = "64KiB"

[reload]
%s
`, workers, extra, shortCanary)
}

const shortCanary = `canary_window = "300ms"`

// noCanary is a configuration from baseServer whose reloads have no
// canary: every worker is replaced at once, one after the other.
func noCanary(cfg string) string {
	return strings.Replace(cfg, shortCanary, "canary = false", 1)
}

func rule(name, path, algorithm string, limit int, window string) string {
	return fmt.Sprintf(`
[[ratelimit]]
name = %q
path = %q
limit = %d
window = %q
algorithm = %q
`, name, path, limit, window, algorithm)
}

// Scenario 2: X-Forwarded-For from an untrusted peer changes nothing; from
// a trusted proxy it names the client, right-most untrusted hop first.
func TestForwardedClients(t *testing.T) {
	t.Parallel()
	t.Run("untrusted peer", func(t *testing.T) {
		t.Parallel()
		d := startDaemon(t, daemonOptions{config: baseServer(2, "") + rule("xff", "/xff", "gcra", 3, "1m")})
		c := newClient(t, freshClientIP(), false)
		var rs []result
		for i := range 10 {
			h := http.Header{"X-Forwarded-For": {fmt.Sprintf("203.0.113.%d", i+1)}}
			if i%2 == 1 {
				h = http.Header{"Forwarded": {fmt.Sprintf("for=198.51.100.%d", i+1)}}
			}
			rs = append(rs, do(c, "GET", d.url("/xff"), h))
		}
		if got := statuses(rs); got[200] != 3 || got[429] != 7 {
			t.Fatalf("rotating X-Forwarded-For/Forwarded from an untrusted peer: %v, want exactly 3×200 and 7×429", got)
		}
	})
	t.Run("trusted proxy", func(t *testing.T) {
		t.Parallel()
		d := startDaemon(t, daemonOptions{config: baseServer(2, `trusted_proxies = ["127.0.0.1/32"]`) + rule("xff", "/xff", "gcra", 3, "1m")})
		proxy := newClient(t, net.IPv4(127, 0, 0, 1), false)
		client := func(i int) string { return fmt.Sprintf("203.0.113.%d", 10+i) }
		for round := range 3 {
			for i := range 5 {
				r := do(proxy, "GET", d.url("/xff"), http.Header{"X-Forwarded-For": {client(i)}})
				if r.err != nil || r.status != 200 {
					t.Errorf("round %d, client %s: %d %v, want 200 (each client has its own budget of 3)", round, client(i), r.status, r.err)
				}
			}
		}
		for i := range 5 {
			// The left-most hop is whatever the client wrote: it must not
			// give it a fresh budget; the right-most untrusted hop is the client.
			xff := fmt.Sprintf("192.0.2.%d, %s", 100+i, client(i))
			r := do(proxy, "GET", d.url("/xff"), http.Header{"X-Forwarded-For": {xff}})
			if r.err != nil || r.status != 429 {
				t.Errorf("4th request of client %s (X-Forwarded-For: %s): %d %v, want 429", client(i), xff, r.status, r.err)
			}
		}
		// And a peer outside trusted_proxies still cannot choose its key.
		c := newClient(t, freshClientIP(), false)
		var spoofed []result
		for i := range 6 {
			spoofed = append(spoofed, do(c, "GET", d.url("/xff"), http.Header{"X-Forwarded-For": {fmt.Sprintf("203.0.113.%d", 100+i)}}))
		}
		if got := statuses(spoofed); got[200] != 3 || got[429] != 3 {
			t.Errorf("untrusted peer rotating X-Forwarded-For: %v, want exactly 3×200 and 3×429", got)
		}
	})
}

// Scenario 7: configuration and usage errors exit 2 and say where.
func TestConfigErrors(t *testing.T) {
	t.Parallel()
	okRule := "[[ratelimit]]\nname = \"a\"\npath = \"/a\"\nlimit = 1\nwindow = \"1m\"\n"
	cases := []struct {
		name, file string
		line       int
		says       string
	}{
		{"unknown key", "[server]\nworkers = 1\nlisen = \"127.0.0.1:1\"\n", 3, "lisen"},
		{"duplicate rule name", okRule + "\n" + okRule, 8, "duplicate"},
		{"bad duration", "[server]\nshutdown_timeout = \"10 s\"\n", 2, "10 s"},
		{"bad CIDR", "[server]\ntrusted_proxies = [\"10.0.0.0/8\", \"10.0.0.0/33\"]\n", 2, "10.0.0.0/33"},
		{"bad mode", okRule + "mode = \"enforcing\"\n", 6, "enforcing"},
		// A window that config once passed and every worker then refused:
		// `check` and `run` must refuse what a worker cannot run.
		{"window of 2^44µs", strings.Replace(okRule, `"1m"`, `"4886h43m6.044416s"`, 1), 5, "window must be between 1ms and 4886h43m6.044415s"},
		// More workers than a region can hold (65536 worker indexes, 2×workers+2
		// indexes): `check` must not call ok what `run` refuses.
		{"too many workers", "[server]\nworkers = 40000\n", 2, "workers"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			path := t.TempDir() + "/bad.toml"
			if err := os.WriteFile(path, []byte(tc.file), 0o600); err != nil {
				t.Fatal(err)
			}
			for _, args := range [][]string{
				{"check", "-config", path},
				{"run", "-config", path, "-listen", "127.0.0.1:0"},
			} {
				code, _, stderr := runBinary(t, args...)
				where := fmt.Sprintf("%s:%d", path, tc.line)
				if code != 2 || !strings.Contains(stderr, where) || !strings.Contains(stderr, tc.says) {
					t.Errorf("preforkd %s: exit %d, stderr %q; want exit 2 naming %s and %q", args[0], code, stderr, where, tc.says)
				}
			}
		})
	}
	t.Run("negative -workers", func(t *testing.T) {
		t.Parallel()
		path := t.TempDir() + "/ok.toml"
		if err := os.WriteFile(path, []byte(okRule), 0o600); err != nil {
			t.Fatal(err)
		}
		code, _, stderr := runBinary(t, "run", "-config", path, "-listen", "127.0.0.1:0", "-workers", "-3")
		if code != 2 || !strings.Contains(stderr, "-workers") {
			t.Errorf("preforkd run -workers -3: exit %d, stderr %q; want exit 2 naming -workers", code, stderr)
		}
	})
	t.Run("no command", func(t *testing.T) {
		t.Parallel()
		code, _, stderr := runBinary(t)
		if code != 2 || !strings.Contains(stderr, "usage:") || !strings.Contains(stderr, "preforkd run") {
			t.Errorf("preforkd: exit %d, stderr %q; want exit 2 and the usage", code, stderr)
		}
	})
	t.Run("version", func(t *testing.T) {
		t.Parallel()
		code, stdout, _ := runBinary(t, "version")
		if code != 0 || !strings.Contains(stdout, "dump format") {
			t.Errorf("preforkd version: exit %d, stdout %q; want exit 0 and the dump format", code, stdout)
		}
	})
	t.Run("check ok", func(t *testing.T) {
		t.Parallel()
		path := t.TempDir() + "/ok.toml"
		if err := os.WriteFile(path, []byte(okRule), 0o600); err != nil {
			t.Fatal(err)
		}
		code, stdout, stderr := runBinary(t, "check", "-config", path)
		if code != 0 || !strings.Contains(stdout, "ok") {
			t.Errorf("preforkd check on a good file: exit %d, stdout %q, stderr %q", code, stdout, stderr)
		}
	})
}

// Scenario 8: the admin endpoint serves metrics and status from the region.
func TestAdminEndpoint(t *testing.T) {
	t.Parallel()
	cfg := baseServer(2, "") + "\n[admin]\nlisten = \"ADMIN_ADDR\"\n" + rule("m", "/m", "gcra", 3, "1m")
	d := startDaemon(t, daemonOptions{config: cfg, admin: true})
	c := newClient(t, nil, false)
	if r := get(newClient(t, freshClientIP(), false), d.url("/m")); r.status != 200 {
		t.Fatalf("GET /m: %d %v", r.status, r.err)
	}

	// A response is counted when the exchange ends, a moment after the
	// client has it: the page is read again until it counts it.
	var r result
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		r = get(c, "http://"+d.admin+"/metrics")
		if r.err != nil || r.status != 200 || !strings.HasPrefix(r.header.Get("Content-Type"), "text/plain") {
			t.Fatalf("/metrics: %d %q %v", r.status, r.header.Get("Content-Type"), r.err)
		}
		if strings.Contains(string(r.body), "\npreforkd_http_requests_total{code=\"200\"} 1\n") || time.Now().After(deadline) {
			break
		}
	}
	metrics := map[string]string{}
	for line := range strings.Lines(string(r.body)) {
		if line = strings.TrimSpace(line); line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, value, ok := strings.Cut(line, " ")
		if !ok {
			t.Errorf("/metrics: not Prometheus text: %q", line)
		}
		metrics[name] = value
	}
	if !strings.Contains(string(r.body), "# TYPE preforkd_table_slots gauge\n") {
		t.Errorf("/metrics has no TYPE line for preforkd_table_slots:\n%s", r.body)
	}
	for name, want := range map[string]string{
		"preforkd_table_slots":                                         "1024",
		"preforkd_table_slots_used":                                    "1", // the one client of rule m
		"preforkd_table_claims_total":                                  "1",
		`preforkd_workers{state="ready"}`:                              "2",
		`preforkd_http_requests_total{code="200"}`:                     "1",
		`preforkd_ratelimit_requests_total{rule="m",result="allowed"}`: "1",
	} {
		if got := metrics[name]; got != want {
			t.Errorf("/metrics: %s = %q, want %s", name, got, want)
		}
	}

	r = get(c, "http://"+d.admin+"/status")
	if r.err != nil || r.status != 200 || r.header.Get("Content-Type") != "application/json" {
		t.Fatalf("/status: %d %q %v", r.status, r.header.Get("Content-Type"), r.err)
	}
	var st struct {
		Workers []struct {
			Index int
			PID   int
		}
	}
	if err := json.Unmarshal(r.body, &st); err != nil {
		t.Fatalf("/status: %v in %s", err, r.body)
	}
	var live []int
	for _, w := range st.Workers {
		if w.PID != 0 {
			live = append(live, w.PID)
		}
	}
	want := d.workerPIDs()
	slices.Sort(live)
	slices.Sort(want)
	if !slices.Equal(live, want) {
		t.Errorf("/status workers %v (body %s), want the running workers %v", live, r.body, want)
	}
}

// A reload that changes a rule's window moves its keys to a namespace of
// their own. With the rule at its max_keys, the slots of the old window
// are taken over by the new keys once no old worker serves: held against
// them until the old window ended, they capped the rule, and every
// request was served uncounted (on_full open) for up to an hour. Across 4
// workers each key gets exactly its limit after the reload, as before it.
func TestReloadedWindowAtMaxKeys(t *testing.T) {
	t.Parallel()
	cfg := func(window string) string {
		return noCanary(baseServer(4, "")) + fmt.Sprintf(`
[[ratelimit]]
name = "api"
path = "/api"
limit = 2
window = %q
algorithm = "fixed-window"
by = "header:X-Api-Key"
max_keys = 3
`, window)
	}
	d := startDaemon(t, daemonOptions{config: cfg("1h")})
	c := newClient(t, nil, false)
	exact := func(when string) {
		t.Helper()
		for _, key := range []string{"a", "b", "c"} {
			var rs []result
			for range 4 {
				rs = append(rs, do(c, "GET", d.url("/api"), http.Header{"X-Api-Key": {key}}))
			}
			if got := statuses(rs); got[200] != 2 || got[429] != 2 {
				t.Fatalf("%s: key %q got %v, want exactly 2×200 and 2×429", when, key, got)
			}
		}
	}
	exact("before the reload")
	from := reloadTo(d, cfg("2h"))
	waitReloaded(t, d, from, 20*time.Second)
	// The old window's slots are counts in use while a worker of the old
	// configuration serves; once the last is gone they are taken over.
	waitRetired(t, d, from)
	exact("after the reload to a 2h window")
}
