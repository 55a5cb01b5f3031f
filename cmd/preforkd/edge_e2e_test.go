package main

// End-to-end tests of "At the edge on its own" (README): request ids, the
// access log, health on the data port, nginx's signals, the binary
// upgrade, socket activation, TLS and HTTP/2, against the built daemon.

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

var madeRequestID = regexp.MustCompile(`^[0-9a-f]{32}$`)

// The request id: a client's well-formed one is kept, a missing or
// malformed one replaced; the application gets the one the client gets
// back, and a refusal names it in its body and in its log line.
func TestRequestIDE2E(t *testing.T) {
	t.Parallel()
	up := startUpstreamProcess(t)
	d := startDaemon(t, daemonOptions{config: baseServer(2, fmt.Sprintf("upstream = %q", "http://"+up)) +
		rule("one", "/limited", "gcra", 1, "1h")})
	c := newClient(t, nil, true)

	for _, tc := range []struct {
		name, sent string
		keep       bool
	}{
		{"kept", "trace-7f3a", true},
		{"absent", "", false},
		{"malformed", "a b", false},
		{"too long", strings.Repeat("x", 129), false},
	} {
		h := http.Header{}
		if tc.sent != "" {
			h.Set("X-Request-Id", tc.sent)
		}
		r := do(c, "GET", d.url("/request-id"), h)
		if r.err != nil || r.status != 200 {
			t.Fatalf("%s: %d %v", tc.name, r.status, r.err)
		}
		got := r.header.Values("X-Request-Id")
		if len(got) != 1 || string(r.body) != got[0] {
			t.Errorf("%s: the client got %q, the application %q: want one and the same", tc.name, got, r.body)
			continue
		}
		if tc.keep && got[0] != tc.sent || !tc.keep && !madeRequestID.MatchString(got[0]) {
			t.Errorf("%s: sent %q, id %q", tc.name, tc.sent, got[0])
		}
	}

	if r := do(c, "GET", d.url("/limited"), http.Header{"X-Request-Id": {"first"}}); r.status != 200 {
		t.Fatalf("first request to the rule: %d %v", r.status, r.err)
	}
	from := d.logs.len()
	r := do(c, "GET", d.url("/limited"), http.Header{"X-Request-Id": {"refused-1"}})
	var p struct {
		RequestID string `json:"request_id"`
	}
	if err := json.Unmarshal(r.body, &p); err != nil || r.status != 429 || p.RequestID != "refused-1" || r.header.Get("X-Request-Id") != "refused-1" {
		t.Errorf("refusal: %d %q %s, want 429 naming refused-1 in its header and body", r.status, r.header.Get("X-Request-Id"), r.body)
	}
	if _, l, ok := d.logs.waitFor(from, 5*time.Second, msgIs("request refused")); !ok || l.get("request_id") != "refused-1" {
		t.Errorf("refusal log line %q, want request_id=refused-1", l.raw)
	}
}

// accessLines reads the access log at path, waiting up to timeout until it
// has at least n lines.
func accessLines(t *testing.T, path string, n int, timeout time.Duration) []string {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		b, _ := os.ReadFile(path)
		lines := strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
		if len(b) == 0 {
			lines = nil
		}
		if len(lines) >= n || time.Now().After(deadline) {
			return lines
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A line per request, with its id, in either format, within a second
// (the workers' flush) and none lost at the drain; a 429 names its rule;
// USR1 reopens the file after logrotate renamed it.
func TestAccessLogE2E(t *testing.T) {
	t.Parallel()
	for _, format := range []string{"combined", "json"} {
		t.Run(format, parallel(func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "access.log")
			d := startDaemon(t, daemonOptions{config: baseServer(2, "") + rule("two", "/limited", "gcra", 2, "1h") +
				fmt.Sprintf("\n[log]\naccess = %q\naccess_format = %q\n", path, format)})
			c := newClient(t, nil, false)
			ids := map[string]int{} // request id → status
			for i := range 6 {
				id := fmt.Sprintf("%s-%d", format, i)
				r := do(c, "GET", d.url("/limited?i="+strconv.Itoa(i)), http.Header{"X-Request-Id": {id}, "User-Agent": {"e2e/1"}})
				if r.err != nil {
					t.Fatal(r.err)
				}
				ids[id] = r.status
			}
			lines := accessLines(t, path, 6, 5*time.Second)
			if len(lines) != 6 {
				t.Fatalf("%d lines for 6 requests:\n%s", len(lines), strings.Join(lines, "\n"))
			}
			refused := 0
			for _, l := range lines {
				var id, rule, status string
				if format == "json" {
					var e struct {
						RequestID string  `json:"request_id"`
						Rule      *string `json:"rule"`
						Status    int     `json:"status"`
						Client    string  `json:"client"`
						Target    string  `json:"target"`
						Worker    *int    `json:"worker"`
						UserAgent string  `json:"user_agent"`
						Duration  float64 `json:"duration"`
					}
					if err := json.Unmarshal([]byte(l), &e); err != nil || e.Client != "127.0.0.1" || !strings.HasPrefix(e.Target, "/limited?i=") ||
						e.Worker == nil || e.UserAgent != "e2e/1" {
						t.Errorf("line %s: %v", l, err)
					}
					id, status = e.RequestID, strconv.Itoa(e.Status)
					if e.Rule != nil {
						rule = *e.Rule
					}
				} else {
					m := combinedLine.FindStringSubmatch(l)
					if m == nil {
						t.Errorf("not a combined line: %s", l)
						continue
					}
					status, id, rule = m[1], m[3], m[4]
				}
				want, ok := ids[id]
				if !ok || strconv.Itoa(want) != status {
					t.Errorf("line %s: id %q status %s; the client got %d", l, id, status, want)
				}
				delete(ids, id)
				if status == "429" {
					refused++
					if rule != "two" {
						t.Errorf("a 429 without its rule: %s", l)
					}
				} else if rule != "" && rule != "-" {
					t.Errorf("a %s naming rule %q: %s", status, rule, l)
				}
			}
			if refused != 4 {
				t.Errorf("%d lines of 429, want 4", refused)
			}

			// logrotate: rename, USR1, and the next lines go to a new file.
			if err := os.Rename(path, path+".1"); err != nil {
				t.Fatal(err)
			}
			from := d.logs.len()
			d.signal(syscall.SIGUSR1)
			for i := range 2 {
				if _, _, ok := d.logs.waitFor(from, 5*time.Second, msgIs("worker reopened its files")); !ok {
					t.Fatalf("worker %d did not reopen its files", i)
				}
				from++ // the second line comes after the first
			}
			do(c, "GET", d.url("/after-rotation"), http.Header{"X-Request-Id": {format + "-after"}})
			// TERM: the last line is written at the drain, before the
			// second's flush.
			d.stop()
			after := accessLines(t, path, 1, time.Second)
			if len(after) != 1 || !strings.Contains(after[0], format+"-after") {
				t.Errorf("the new file has %q, want the one line after the rotation", after)
			}
			if old := accessLines(t, path+".1", 6, time.Second); len(old) != 6 {
				t.Errorf("the rotated file has %d lines, want 6", len(old))
			}
		}))
	}
}

// combinedLine is nginx's combined format and preforkd's fields after it:
// status, request id and rule are captured.
var combinedLine = regexp.MustCompile(`^127\.0\.0\.1 - - \[\d{2}/\w{3}/\d{4}:\d{2}:\d{2}:\d{2} [+-]\d{4}\] "GET /limited\?i=\d HTTP/1\.1" (\d{3}) (\d+) "-" "e2e/1" ` +
	`request_id=(\S+) request_time=\d+\.\d{3} upstream_time=(?:\d+\.\d{3}|-) rule=(\S+) cache=- worker=\d+$`)

// QUIT drains and dumps as TERM does (Go's default would dump the
// goroutines' stacks and exit at once, losing the counts); the counts
// are back after a restart.
func TestQuitDrainsAndDumps(t *testing.T) {
	t.Parallel()
	dump := filepath.Join(t.TempDir(), "table.dump")
	cfg := baseServer(2, "") + rule("three", "/q", "gcra", 3, "1h") + fmt.Sprintf("\n[persist]\npath = %q\n", dump)
	d := startDaemon(t, daemonOptions{config: cfg})
	c := newClient(t, nil, false)
	for range 2 {
		if r := get(c, d.url("/q")); r.status != 200 {
			t.Fatalf("%d %v", r.status, r.err)
		}
	}
	d.signal(syscall.SIGQUIT)
	code, ok := d.wait(15 * time.Second)
	if !ok || code != 0 {
		t.Fatalf("after QUIT: exited %v, code %d; log:\n%s", ok, code, d.logs.text())
	}
	d.logs.waitEOF(5 * time.Second)
	if _, _, ok := d.logs.waitFor(0, 0, msgIs("dump written")); !ok {
		t.Fatalf("no dump written after QUIT; log:\n%s", d.logs.text())
	}
	d2 := startDaemon(t, daemonOptions{config: cfg})
	got := statuses([]result{get(c, d2.url("/q")), get(c, d2.url("/q"))})
	if got[200] != 1 || got[429] != 1 {
		t.Errorf("after the restart: %v, want one 200 (3 - 2 used) then a 429", got)
	}
}

// health_path is answered by the workers before any rule, never
// forwarded; after TERM, for drain_delay, it and /readyz answer 503 while
// requests are still served; then the listener closes.
func TestHealthPathAndDrainDelay(t *testing.T) {
	t.Parallel()
	cfg := strings.Replace(baseServer(2, "health_path = \"/healthz\"\ndrain_delay = \"2s\""), "[table]", "[admin]\nlisten = \"ADMIN_ADDR\"\n\n[table]", 1) +
		rule("one", "/*", "gcra", 1, "1h")
	d := startDaemon(t, daemonOptions{config: cfg, admin: true})
	c := newClient(t, nil, false)
	for range 5 {
		r := get(c, d.url("/healthz"))
		if r.status != 200 || string(r.body) != "ok\n" || r.header.Get("X-Ratelimit-Limit") != "" {
			t.Fatalf("GET /healthz: %d %q %v", r.status, r.body, r.header)
		}
	}
	if r := do(c, "HEAD", d.url("/healthz"), nil); r.status != 200 || len(r.body) != 0 {
		t.Fatalf("HEAD /healthz: %d %q", r.status, r.body)
	}
	// Never counted: the rule's one request is still there. The demo
	// application answers JSON: "ok" was not it.
	if got := statuses([]result{get(c, d.url("/x")), get(c, d.url("/x"))}); got[200] != 1 || got[429] != 1 {
		t.Fatalf("after the health checks: %v, want the rule's one request then 429", got)
	}

	from := d.logs.len()
	d.signal(syscall.SIGTERM)
	if _, _, ok := d.logs.waitFor(from, 5*time.Second, msgIs("drain begun")); !ok {
		t.Fatal("no drain begun")
	}
	admin := newClient(t, nil, false)
	// USR2 reaches the workers a moment after the line: poll for it.
	deadline := time.Now().Add(time.Second)
	var health result
	for health = get(c, d.url("/healthz")); health.status != 503 && time.Now().Before(deadline); health = get(c, d.url("/healthz")) {
		time.Sleep(10 * time.Millisecond)
	}
	ready := get(admin, "http://"+d.admin+"/readyz")
	served := get(newClient(t, freshClientIP(), false), d.url("/during-delay"))
	if _, _, over := d.logs.waitFor(from, 0, msgIs("drain delay over")); over {
		t.Fatal("the delay ended before the checks: the machine is too slow for this test")
	}
	if health.status != 503 || string(health.body) != "draining\n" || ready.status != 503 || served.status != 200 {
		t.Errorf("during the delay: /healthz %d %q, /readyz %d, a request %d %v; want 503, 503, 200",
			health.status, health.body, ready.status, served.status, served.err)
	}
	if _, _, ok := d.logs.waitFor(from, 5*time.Second, msgIs("drain delay over")); !ok {
		t.Fatal("the delay did not end")
	}
	code, ok := d.wait(15 * time.Second)
	if !ok || code != 0 {
		t.Fatalf("exit %v %d", ok, code)
	}
	if r := get(c, d.url("/after")); r.err == nil {
		t.Errorf("after the drain: %d, want the connection refused", r.status)
	}
}
