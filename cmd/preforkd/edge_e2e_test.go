//go:build linux

package main

// End-to-end tests of "At the edge on its own" (README): request ids, the
// access log, health on the data port, nginx's signals, the binary
// upgrade, socket activation, TLS and HTTP/2, against the built daemon.

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
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
						Scheme    string  `json:"scheme"`
						UserAgent string  `json:"user_agent"`
						Duration  float64 `json:"duration"`
					}
					if err := json.Unmarshal([]byte(l), &e); err != nil || e.Client != "127.0.0.1" || !strings.HasPrefix(e.Target, "/limited?i=") ||
						e.Worker == nil || e.UserAgent != "e2e/1" || e.Scheme != "http" {
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
				at, _, ok := d.logs.waitFor(from, 5*time.Second, msgIs("worker reopened its files"))
				if !ok {
					t.Fatalf("worker %d did not reopen its files", i)
				}
				from = at + 1 // the second worker's line comes after the first's
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
	`request_id=(\S+) request_time=\d+\.\d{3} upstream_time=(?:\d+\.\d{3}|-) rule=(\S+) cache=- worker=\d+ scheme=http$`)

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

// systemctl kill -s USR2 (the binary upgrade), as systemctl kill does
// by default, signals every process of the unit: the workers too. A
// worker takes from the supervisor alone that the instance stops: the
// USR2 an operator meant for the supervisor leaves its health check and
// its recycling as they were, also when the upgrade is refused or fails
// and the worker serves on.
func TestUSR2ToTheWorkersLeavesThemServing(t *testing.T) {
	t.Parallel()
	d := startDaemon(t, daemonOptions{config: baseServer(2, "health_path = \"/healthz\"")})
	for _, pid := range d.workerPIDs() {
		if err := syscall.Kill(pid, syscall.SIGUSR2); err != nil {
			t.Fatalf("kill -USR2 %d: %v", pid, err)
		}
	}
	c := newClient(t, nil, false)
	// The signal reaches the workers a moment later: watch for a while.
	for deadline := time.Now().Add(time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if r := get(c, d.url("/healthz")); r.status != 200 {
			t.Fatalf("GET /healthz after USR2 to the workers: %d %q %v, want 200: the instance does not stop", r.status, r.body, r.err)
		}
	}
}

// inFlight sends a request in the background and returns once it reached
// up, with the channel its result comes on.
func inFlight(t *testing.T, up *idemUpstream, send func() result) <-chan result {
	t.Helper()
	done := make(chan result, 1)
	go func() { done <- send() }()
	select {
	case <-up.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the request did not reach the upstream")
	}
	return done
}

// USR1 reaches a draining worker too: a request it still serves after
// TERM, when logrotate renamed the file meanwhile, is logged to the new
// file at log.access, not to the renamed one.
func TestAccessLogReopenedWhileDraining(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	up := idemStartUpstream(t, func(n int64, w http.ResponseWriter, r *http.Request) {
		select { // in flight across TERM and the rotation
		case <-release:
		case <-time.After(10 * time.Second):
		}
		w.WriteHeader(http.StatusOK)
	})
	path := filepath.Join(t.TempDir(), "access.log")
	d := startDaemon(t, daemonOptions{config: fmt.Sprintf("[server]\nworkers = 1\nupstream = \"http://%s\"\nshutdown_timeout = \"10s\"\n\n[log]\naccess = %q\n\n[table]\ncounters = 1024\n", up.addr, path)})
	c := newClient(t, nil, false)
	done := inFlight(t, up, func() result { return get(c, d.url("/in-flight")) })
	from := d.logs.len()
	d.signal(syscall.SIGTERM)
	if _, _, ok := d.logs.waitFor(from, 5*time.Second, msgIs("worker draining")); !ok {
		t.Fatal("no drain")
	}
	if err := os.Rename(path, path+".1"); err != nil {
		t.Fatal(err)
	}
	d.signal(syscall.SIGUSR1)
	_, _, reopened := d.logs.waitFor(from, 5*time.Second, msgIs("worker reopened its files"))
	close(release)
	if r := <-done; r.status != http.StatusOK {
		t.Fatalf("the request in flight: %d %v", r.status, r.err)
	}
	if code, ok := d.wait(15 * time.Second); !ok || code != 0 {
		t.Fatalf("exit %v %d", ok, code)
	}
	lines := accessLines(t, path, 1, time.Second)
	if !reopened || len(lines) != 1 || !strings.Contains(lines[0], "/in-flight") {
		t.Errorf("a draining worker told USR1: reopened %v, the new file has %q; want its last line there", reopened, lines)
	}
}

// During drain_delay the workers serve on, also past max_requests: a
// worker that stopped accepting then would get no successor (none starts
// while the instance stops), and with every worker past its limit the
// requests would wait in the listen queue until the listener closes.
func TestDrainDelayServesPastMaxRequests(t *testing.T) {
	t.Parallel()
	d := startDaemon(t, daemonOptions{config: baseServer(2, "health_path = \"/healthz\"\ndrain_delay = \"5s\"\nmax_requests = 10")})
	c := newClient(t, nil, false) // a connection each: each accept counts
	c.Timeout = 2 * time.Second
	from := d.logs.len()
	d.signal(syscall.SIGTERM)
	if _, _, ok := d.logs.waitFor(from, 5*time.Second, msgIs("drain begun")); !ok {
		t.Fatal("no drain begun")
	}
	// USR2 reaches the workers a moment after the line: poll for it.
	deadline := time.Now().Add(time.Second)
	for get(c, d.url("/healthz")).status != 503 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	var failed []string
	for i := range 40 { // past both workers' limits (at most 11 each)
		if r := get(c, d.url(fmt.Sprintf("/r%d", i))); r.status != 200 {
			failed = append(failed, fmt.Sprintf("%d: %d %v", i, r.status, r.err))
		}
	}
	_, _, over := d.logs.waitFor(from, 0, msgIs("drain delay over"))
	switch {
	case len(failed) > 0:
		t.Errorf("during the drain delay, past max_requests: %d of 40 failed: %v", len(failed), failed)
	case over:
		t.Fatal("the delay ended before the requests: the machine is too slow for this test")
	}
	if _, _, recycled := d.logs.waitFor(from, 0, msgIs("worker past a recycling limit: stopped accepting")); recycled {
		t.Error("a worker stopped accepting for recycling during the drain delay")
	}
	if code, ok := d.wait(15 * time.Second); !ok || code != 0 {
		t.Fatalf("exit %v %d", ok, code)
	}
}

// needTool returns the path of a program a test needs: missing, the test
// fails under CI (which installs it) and is skipped elsewhere.
func needTool(t *testing.T, name, pkg string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("%s is not installed (Debian package %s)", name, pkg)
		}
		t.Skipf("%s is not installed (Debian package %s)", name, pkg)
	}
	return p
}

// A socket passed by systemd (LISTEN_FDS, LISTEN_PID) is served instead
// of opening listen: systemd-socket-activate holds it, starts preforkd on
// the first connection, which is served, and -listen is never bound.
func TestSocketActivation(t *testing.T) {
	t.Parallel()
	activate := needTool(t, "systemd-socket-activate", "systemd")
	dir := t.TempDir()
	addrs := freeAddrs(t, 2)
	passed, unused := addrs[0], addrs[1]
	d := &daemon{t: t, addr: passed, cfgPath: filepath.Join(dir, "preforkd.toml"), wrapper: []string{activate, "-l", passed}}
	if err := os.WriteFile(d.cfgPath, []byte(baseServer(2, "")), 0o600); err != nil {
		t.Fatal(err)
	}
	d.start(nil, "run", "-config", d.cfgPath, "-listen", unused)
	// The socket is open before preforkd runs: the first connection
	// starts it, waits in the backlog, and is served.
	var first result
	c := newClient(t, nil, false)
	for deadline := time.Now().Add(10 * time.Second); ; {
		if first = get(c, d.url("/first")); first.err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond) // systemd-socket-activate not listening yet
	}
	if b, ok := first.demo(); first.status != 200 || !ok || b.Path != "/first" {
		t.Fatalf("the first connection: %d %q %v; log:\n%s", first.status, first.body, first.err, d.logs.text())
	}
	if _, l, ok := d.logs.waitFor(0, 5*time.Second, msgIs("listening on the socket passed by the service manager")); !ok || l.get("listen") != passed {
		t.Errorf("no line about the passed socket (%q)", l.raw)
	}
	if _, err := net.DialTimeout("tcp", unused, time.Second); err == nil {
		t.Errorf("-listen %s was bound besides the passed socket", unused)
	}
	if _, _, ok := d.logs.waitFor(0, 5*time.Second, msgIs("ready")); !ok {
		t.Fatal("not ready")
	}
	// The workers inherited the variables' removal: none takes the
	// socket for its own (a worker would fail to start).
	d.stop()
}

// upgrade sends USR2 and waits for the old supervisor to hand over and
// exit 0; it returns the new supervisor's pid.
func upgrade(t *testing.T, d *daemon) int {
	t.Helper()
	from, pid := beginUpgrade(t, d)
	endUpgrade(t, d, from)
	return pid
}

// beginUpgrade sends USR2 and returns where the log was and the new
// supervisor's pid once it started.
func beginUpgrade(t *testing.T, d *daemon) (from, pid int) {
	t.Helper()
	from = d.logs.len()
	d.signal(syscall.SIGUSR2)
	_, begun, ok := d.logs.waitFor(from, 10*time.Second, msgIs("upgrade begun: new supervisor started"))
	if !ok {
		t.Fatalf("no upgrade begun; log:\n%s", d.logs.text())
	}
	return from, begun.int("pid")
}

// endUpgrade waits for the old supervisor of the upgrade begun at from
// to exit 0, handed over and without a dump.
func endUpgrade(t *testing.T, d *daemon, from int) {
	t.Helper()
	code, ok := d.wait(30 * time.Second)
	if !ok || code != 0 {
		t.Fatalf("the old supervisor after USR2: exited %v, code %d; log:\n%s", ok, code, d.logs.text())
	}
	// The line was written before the exit, but the log is read from a
	// pipe by another goroutine: it may not be read yet when the exit is
	// seen.
	if _, _, ok := d.logs.waitFor(from, 5*time.Second, msgIs("upgrade: the old supervisor exits; the new one serves")); !ok {
		t.Fatalf("the old supervisor exited without handing over; log:\n%s", d.logs.text())
	}
	for _, l := range d.logs.snapshot()[from:] {
		if l.msg() == "dump written" {
			t.Errorf("the old supervisor wrote a dump: %s", l.raw)
		}
	}
}

// stopPID sends TERM to a supervisor the harness did not start (the new
// one of an upgrade) and waits for every process that holds the log to
// exit.
func stopPID(t *testing.T, d *daemon, pid int) {
	t.Helper()
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if !d.logs.waitEOF(20 * time.Second) {
		t.Fatalf("the new supervisor did not exit after TERM; log:\n%s", d.logs.text())
	}
}

// USR2: a new supervisor from the binary on disk takes the listener, the
// region and the admin endpoint; the old one exits without a dump; a
// limit of 5 with 3 used before admits exactly 2 after. Without
// persist.live: the region is the memory file the new one inherits.
func TestUpgradeE2E(t *testing.T) {
	t.Parallel()
	for _, live := range []bool{false, true} {
		t.Run(fmt.Sprintf("live=%v", live), parallel(func(t *testing.T) {
			dump := filepath.Join(t.TempDir(), "table.dump")
			persistCfg := fmt.Sprintf("\n[persist]\npath = %q\n", dump)
			if live {
				persistCfg += fmt.Sprintf("live = %q\n", liveRegionPath(t))
			}
			cfg := strings.Replace(baseServer(2, ""), "[table]", "[admin]\nlisten = \"ADMIN_ADDR\"\n\n[table]", 1) +
				rule("five", "/u", "gcra", 5, "1h") + persistCfg
			d := startDaemon(t, daemonOptions{config: cfg, admin: true})
			c := newClient(t, nil, false)
			for range 3 {
				if r := get(c, d.url("/u")); r.status != 200 {
					t.Fatalf("before: %d %v", r.status, r.err)
				}
			}
			oldPID := d.pid()
			at := d.logs.len()
			newPID := upgrade(t, d)
			if newPID == oldPID || newPID <= 0 {
				t.Fatalf("new supervisor pid %d", newPID)
			}
			if _, _, ok := d.logs.waitFor(at, 10*time.Second, msgIs("upgrade finished: the old supervisor's workers are gone")); !ok {
				t.Errorf("the new supervisor did not see the old workers gone")
			}
			var rs []result
			for range 3 {
				rs = append(rs, get(c, d.url("/u")))
			}
			if got := statuses(rs); got[200] != 2 || got[429] != 1 || rs[2].status != 429 {
				t.Errorf("after the upgrade: %v, want exactly 2 more admitted (5 - 3), then 429", got)
			}
			// The admin endpoint is the new supervisor's.
			var st struct {
				PID   int  `json:"pid"`
				Ready bool `json:"ready"`
			}
			r := get(c, "http://"+d.admin+"/status")
			if err := json.Unmarshal(r.body, &st); err != nil || st.PID != newPID || !st.Ready {
				t.Errorf("/status after the upgrade: %s %v, want pid %d ready", r.body, err, newPID)
			}
			from := d.logs.len()
			stopPID(t, d, newPID)
			if _, _, ok := d.logs.waitFor(from, 0, msgIs("dump written")); !ok {
				t.Errorf("the new supervisor wrote no dump at its stop")
			}
		}))
	}
}

// TERM to the new supervisor of an upgrade (systemctl stop) while an old
// worker still serves an idempotent request: the new one dumps only once
// the old workers are gone, so the response they stored is in the dump,
// and the client's retry after a restart is replayed, not run again.
func TestUpgradeStopKeepsTheOldWorkersResponses(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	up := idemStartUpstream(t, func(n int64, w http.ResponseWriter, r *http.Request) {
		if n == 1 {
			select { // in flight across the upgrade and the stop
			case <-release:
			case <-time.After(10 * time.Second):
			}
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"execution":%d}`, n)
	})
	dump := filepath.Join(t.TempDir(), "table.dump")
	cfg := strings.Replace(idemConfig(up, 64), "workers = 4", "workers = 2", 1) + fmt.Sprintf("\n[persist]\npath = %q\n", dump)
	d := startDaemon(t, daemonOptions{config: cfg})
	c := newClient(t, nil, false)
	first := inFlight(t, up, func() result { return idemPost(c, d.url("/orders"), `"order-1"`, `{"item":42}`) })
	from := d.logs.len()
	d.signal(syscall.SIGUSR2)
	_, begun, ok := d.logs.waitFor(from, 10*time.Second, msgIs("upgrade begun: new supervisor started"))
	if !ok {
		t.Fatalf("no upgrade begun; log:\n%s", d.logs.text())
	}
	if _, _, ok := d.logs.waitFor(from, 10*time.Second, msgIs("upgrade: this supervisor is the main process now")); !ok {
		t.Fatalf("no handover; log:\n%s", d.logs.text())
	}
	// systemctl stop: TERM to the main process, the new supervisor; the
	// request goes on only once it is draining.
	stopped := d.logs.len()
	if err := syscall.Kill(begun.int("pid"), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if _, _, ok := d.logs.waitFor(stopped, 10*time.Second, msgIs("drain begun")); !ok {
		t.Fatalf("the new supervisor did not drain; log:\n%s", d.logs.text())
	}
	// Its own workers go at once (they serve nothing). Had it not waited
	// for the old ones, it would dump now, without the response still to
	// come: give it that time, then let the request go on.
	d.logs.waitFor(stopped, 500*time.Millisecond, msgIs("dump written"))
	close(release)
	if !d.logs.waitEOF(20 * time.Second) {
		t.Fatalf("the supervisors did not exit; log:\n%s", d.logs.text())
	}
	if r := <-first; r.status != http.StatusCreated || string(r.body) != `{"execution":1}` {
		t.Fatalf("the request in flight: %d %q %v", r.status, r.body, r.err)
	}
	d2 := startDaemon(t, daemonOptions{config: cfg})
	again := idemPost(c, d2.url("/orders"), `"order-1"`, `{"item":42}`)
	if n := up.executions.Load(); n != 1 || again.header.Get("Idempotent-Replayed") != "true" || string(again.body) != `{"execution":1}` {
		t.Errorf("the retry after a restart: %d %q, replayed %q, executions %d; want the stored response replayed\nlog:\n%s",
			again.status, again.body, again.header.Get("Idempotent-Replayed"), n, d.logs.text())
	}
	d2.stop()
}

// wrk -c20 across USR2 sees no error: the new workers accept on the
// socket before the old ones stop.
func TestUpgradeUnderLoad(t *testing.T) {
	t.Parallel()
	wrk := needTool(t, "wrk", "wrk")
	d := startDaemon(t, daemonOptions{config: baseServer(2, "")})
	const run = 6 * time.Second
	ctx, cancel := context.WithTimeout(context.Background(), run+15*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, wrk, "-t1", "-c20", fmt.Sprintf("-d%ds", int(run.Seconds())), "--timeout", "5s", d.url("/"))
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	time.Sleep(time.Second) // wrk's connections are open and busy
	newPID := upgrade(t, d)
	if time.Since(began) > run-time.Second {
		t.Fatalf("the upgrade took %v, too close to wrk's %v to have run under load", time.Since(began), run)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("wrk: %v\n%s", err, out.String())
	}
	requests, errs, err := wrkResults(out.String())
	if err != nil {
		t.Fatalf("%v in wrk's output:\n%s", err, out.String())
	}
	t.Logf("wrk: %d requests, errors %v", requests, errs)
	if requests == 0 || len(errs) > 0 {
		t.Errorf("wrk -c20 across USR2: %d requests, errors %v; want none\n%s", requests, errs, out.String())
	}
	stopPID(t, d, newPID)
}

// A new supervisor that fails (a configuration it cannot load) or is not
// ready within upgrade_timeout leaves the old one serving, counts and
// all, and may be tried again.
func TestUpgradeFails(t *testing.T) {
	t.Parallel()
	t.Run("bad configuration", parallel(func(t *testing.T) {
		d := startDaemon(t, daemonOptions{config: baseServer(2, "") + rule("five", "/u", "gcra", 5, "1h")})
		c := newClient(t, nil, false)
		get(c, d.url("/u"))
		good, _ := os.ReadFile(d.cfgPath)
		os.WriteFile(d.cfgPath, []byte("[server]\nworkers = -1\n"), 0o600)
		from := d.logs.len()
		d.signal(syscall.SIGUSR2)
		if _, _, ok := d.logs.waitFor(from, 10*time.Second, msgIs("upgrade failed: the new supervisor exited before it was ready; serving on")); !ok {
			t.Fatalf("no failure line; log:\n%s", d.logs.text())
		}
		if _, ok := d.wait(0); ok {
			t.Fatal("the old supervisor exited")
		}
		if _, _, ok := d.logs.waitFor(from, 10*time.Second, msgIs("upgrade abandoned: the new supervisor's workers are gone, their indexes reaped")); !ok {
			t.Errorf("the failed upgrade's indexes were not reaped")
		}
		got := statuses([]result{get(c, d.url("/u")), get(c, d.url("/u")), get(c, d.url("/u")), get(c, d.url("/u")), get(c, d.url("/u"))})
		if got[200] != 4 || got[429] != 1 {
			t.Errorf("after the failed upgrade: %v, want the 4 left of 5, then 429", got)
		}
		// Fixed, it upgrades.
		os.WriteFile(d.cfgPath, good, 0o600)
		stopPID(t, d, upgrade(t, d))
	}))
	t.Run("not ready in time", parallel(func(t *testing.T) {
		d := startDaemon(t, daemonOptions{config: baseServer(2, "upgrade_timeout = \"1ms\"")})
		from := d.logs.len()
		d.signal(syscall.SIGUSR2)
		if _, _, ok := d.logs.waitFor(from, 10*time.Second, msgIs("upgrade failed: the new supervisor was not ready within upgrade_timeout: killing it; serving on")); !ok {
			t.Fatalf("no timeout line; log:\n%s", d.logs.text())
		}
		if r := get(newClient(t, nil, false), d.url("/")); r.status != 200 {
			t.Errorf("after the failed upgrade: %d %v", r.status, r.err)
		}
		// The killed supervisor's workers die with it; their indexes are
		// reaped (a HUP before that is refused: the upgrade is still under
		// way), and the old one goes on: a reload replaces its workers.
		if _, _, ok := d.logs.waitFor(from, 10*time.Second, msgIs("upgrade abandoned: the new supervisor's workers are gone, their indexes reaped")); !ok {
			t.Fatalf("the killed upgrade's indexes were not reaped; log:\n%s", d.logs.text())
		}
		noCanaryReload := reloadTo(d, noCanary(baseServer(2, "upgrade_timeout = \"1ms\"")))
		waitReloaded(t, d, noCanaryReload, 20*time.Second)
		d.stop()
	}))
}

// notifySocket is a systemd notification socket of the test's: what each
// datagram says, and the pid the kernel says sent it.
type notifySocket struct {
	path string
	conn *net.UnixConn
}

func newNotifySocket(t *testing.T) *notifySocket {
	t.Helper()
	path := filepath.Join(t.TempDir(), "notify")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	raw, _ := conn.SyscallConn()
	raw.Control(func(fd uintptr) { err = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_PASSCRED, 1) })
	if err != nil {
		t.Fatal(err)
	}
	return &notifySocket{path: path, conn: conn}
}

// next returns the next notification that is not a watchdog ping unless
// pings, waiting up to timeout.
func (n *notifySocket) next(t *testing.T, timeout time.Duration, pings bool) (state string, pid int) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		buf, oob := make([]byte, 256), make([]byte, 1024)
		n.conn.SetReadDeadline(deadline)
		k, oobn, _, _, err := n.conn.ReadMsgUnix(buf, oob)
		if err != nil {
			t.Fatalf("no notification: %v", err)
		}
		msgs, _ := unix.ParseSocketControlMessage(oob[:oobn])
		for _, m := range msgs {
			if cred, err := unix.ParseUnixCredentials(&m); err == nil {
				pid = int(cred.Pid)
			}
		}
		if state = string(buf[:k]); pings || state != "WATCHDOG=1" {
			return state, pid
		}
	}
}

// systemd learns of an upgrade from the service's main process: the old
// supervisor sends MAINPID= with the new one's pid once it serves; the new
// one says nothing before that, then pings the watchdog and says
// STOPPING=1 at its stop.
func TestUpgradeNotifiesSystemd(t *testing.T) {
	t.Parallel()
	ns := newNotifySocket(t)
	d := startDaemon(t, daemonOptions{config: baseServer(2, ""), env: []string{"NOTIFY_SOCKET=" + ns.path, "WATCHDOG_USEC=1000000"}})
	if state, pid := ns.next(t, 10*time.Second, false); state != "READY=1" || pid != d.pid() {
		t.Fatalf("first notification %q from %d, want READY=1 from the supervisor %d", state, pid, d.pid())
	}
	oldPID := d.pid()
	d.signal(syscall.SIGUSR2)
	var state string
	var pid int
	for {
		// Until MAINPID=, every notification is the old supervisor's.
		if state, pid = ns.next(t, 20*time.Second, true); pid != oldPID || state != "WATCHDOG=1" {
			break
		}
	}
	_, begun, _ := d.logs.waitFor(0, 10*time.Second, msgIs("upgrade begun: new supervisor started"))
	newPID := begun.int("pid")
	if state != fmt.Sprintf("MAINPID=%d", newPID) || pid != oldPID {
		t.Fatalf("at the upgrade: %q from %d, want MAINPID=%d from the old supervisor %d", state, pid, newPID, oldPID)
	}
	if state, pid := ns.next(t, 5*time.Second, true); state != "WATCHDOG=1" || pid != newPID {
		t.Errorf("after the upgrade: %q from %d, want WATCHDOG=1 from the new supervisor", state, pid)
	}
	if _, ok := d.wait(20 * time.Second); !ok {
		t.Fatal("the old supervisor did not exit")
	}
	syscall.Kill(newPID, syscall.SIGTERM)
	if state, pid := ns.next(t, 10*time.Second, false); state != "STOPPING=1" || pid != newPID {
		t.Errorf("at the new supervisor's stop: %q from %d", state, pid)
	}
	d.logs.waitEOF(20 * time.Second)
}

// A binary upgrade whose new supervisor fails after it took over the
// locks (here: its file adds the first [[idempotency]] block, which the
// running region has no table for) leaves the old one holding them, and
// the lock still names it: a second supervisor on the path is told the
// pid of the one that serves, not of the one that exited.
func TestFailedUpgradeLockNamesTheOldSupervisor(t *testing.T) {
	t.Parallel()
	dump := filepath.Join(t.TempDir(), "dump")
	cfg := persistConfig(fmt.Sprintf("[persist]\npath = %q\n", dump))
	d := startDaemon(t, daemonOptions{config: cfg})
	if err := os.WriteFile(d.cfgPath, []byte(cfg+"\n[[idempotency]]\npath = \"/orders\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	from := d.logs.len()
	d.signal(syscall.SIGUSR2)
	if _, _, ok := d.logs.waitFor(from, 10*time.Second, msgIs("upgrade failed: the new supervisor exited before it was ready; serving on")); !ok {
		t.Fatalf("no failed upgrade; log:\n%s", d.logs.text())
	}
	// The next USR2 is taken once the indexes it may have used are reaped.
	if _, _, ok := d.logs.waitFor(from, 10*time.Second, msgIs("upgrade abandoned: the new supervisor's workers are gone, their indexes reaped")); !ok {
		t.Fatalf("the failed upgrade's indexes were not reaped; log:\n%s", d.logs.text())
	}
	second := filepath.Join(t.TempDir(), "second.toml")
	os.WriteFile(second, []byte(cfg), 0o600)
	code, _, stderr := runBinary(t, "run", "-config", second, "-listen", freeAddr(t))
	holder := fmt.Sprintf("(pid %d holds", d.pid())
	if code != 1 || !strings.Contains(stderr, "in use by another supervisor") || !strings.Contains(stderr, holder) {
		t.Fatalf("second supervisor after a failed upgrade: exit %d, want 1 naming %s:\n%s", code, holder, stderr)
	}
	// Fixed, it upgrades, and the lock names the new one.
	os.WriteFile(d.cfgPath, []byte(cfg), 0o600)
	newPID := upgrade(t, d)
	code, _, stderr = runBinary(t, "run", "-config", second, "-listen", freeAddr(t))
	holder = fmt.Sprintf("(pid %d holds", newPID)
	if code != 1 || !strings.Contains(stderr, holder) {
		t.Fatalf("second supervisor after an upgrade: exit %d, want 1 naming %s:\n%s", code, holder, stderr)
	}
	stopPID(t, d, newPID)
}

// A binary upgrade keeps the files the region is persisted to, as a
// reload does: a new supervisor whose file names another persist.path
// would write a dump that no lock guards. It is refused with the reason,
// and the old supervisor serves on, nothing written at the new path.
func TestUpgradeKeepsThePersistFiles(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	dump, moved := filepath.Join(dir, "dump"), filepath.Join(dir, "moved")
	cfg := persistConfig(fmt.Sprintf("[persist]\npath = %q\n", dump))
	d := startDaemon(t, daemonOptions{config: cfg})
	if err := os.WriteFile(d.cfgPath, []byte(persistConfig(fmt.Sprintf("[persist]\npath = %q\n", moved))), 0o600); err != nil {
		t.Fatal(err)
	}
	from := d.logs.len()
	d.signal(syscall.SIGUSR2)
	if _, _, ok := d.logs.waitFor(from, 10*time.Second, msgIs("upgrade failed: the new supervisor exited before it was ready; serving on")); !ok {
		t.Fatalf("no failed upgrade; log:\n%s", d.logs.text())
	}
	if !strings.Contains(d.logs.text(), "is not a file the running supervisor persists to") {
		t.Errorf("the reason is not logged:\n%s", d.logs.text())
	}
	if _, err := os.Stat(moved); !os.IsNotExist(err) {
		t.Errorf("a dump at the new path: %v", err)
	}
	if r := get(newClient(t, nil, false), d.url("/")); r.status != 200 {
		t.Errorf("after the refused upgrade: %d %v", r.status, r.err)
	}
	if _, _, ok := d.logs.waitFor(from, 10*time.Second, msgIs("upgrade abandoned: the new supervisor's workers are gone, their indexes reaped")); !ok {
		t.Fatalf("the failed upgrade's indexes were not reaped; log:\n%s", d.logs.text())
	}
	os.WriteFile(d.cfgPath, []byte(cfg), 0o600)
	stopPID(t, d, upgrade(t, d))
	if _, err := os.Stat(dump); err != nil {
		t.Errorf("no dump where the region was persisted: %v", err)
	}
}

// With persist.interval, the periodic dumps of a binary upgrade's new
// supervisor begin once it serves: before, the old one dumps, and the new
// one's first dump at its start raced it to the same file (a failed
// upgrade could leave the new build's dump behind). The interval here
// outlasts the test: the file is written at the start, then at the stop
// of the new supervisor, and not in between.
func TestUpgradeDumpsPeriodicallyOnceItServes(t *testing.T) {
	t.Parallel()
	dump := filepath.Join(t.TempDir(), "dump")
	d := startDaemon(t, daemonOptions{config: persistConfig(fmt.Sprintf("[persist]\npath = %q\ninterval = \"1h\"\n", dump))})
	inode := func() uint64 {
		t.Helper()
		var st syscall.Stat_t
		if err := syscall.Stat(dump, &st); err != nil {
			t.Fatalf("the dump: %v", err)
		}
		return st.Ino
	}
	first := inode() // each dump is a new file renamed over the last
	from := d.logs.len()
	newPID := upgrade(t, d)
	if _, _, ok := d.logs.waitFor(from, 5*time.Second, msgIs("periodic dumps every interval once this supervisor serves")); !ok {
		t.Errorf("the new supervisor did not say when it dumps; log:\n%s", d.logs.text())
	}
	if inode() != first {
		t.Errorf("the dump was written during the upgrade")
	}
	stopPID(t, d, newPID)
	if inode() == first {
		t.Errorf("the new supervisor's stop wrote no dump")
	}
}

// The access log's bytes are the body bytes sent (nginx's
// $body_bytes_sent): none to HEAD, also for the built-in application the
// event loop runs itself, whose answer to HEAD carries no body.
func TestAccessLogHeadSendsNoBody(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "access.log")
	d := startDaemon(t, daemonOptions{config: baseServer(1, "") + fmt.Sprintf("\n[log]\naccess = %q\n", path)})
	c := newClient(t, nil, false)
	head := do(c, http.MethodHead, d.url("/h"), nil)
	got := get(c, d.url("/g"))
	if head.status != 200 || len(head.body) != 0 || got.status != 200 || len(got.body) == 0 {
		t.Fatalf("HEAD: %d %q %v; GET: %d %q %v", head.status, head.body, head.err, got.status, got.body, got.err)
	}
	lines := accessLines(t, path, 2, 5*time.Second)
	want := map[string]int{"HEAD /h": 0, "GET /g": len(got.body)}
	for _, l := range lines {
		for req, n := range want {
			if strings.Contains(l, `"`+req+` HTTP/1.1" 200 `) {
				if !strings.Contains(l, fmt.Sprintf(`"%s HTTP/1.1" 200 %d "`, req, n)) {
					t.Errorf("%s: logged %q, want %d body bytes", req, l, n)
				}
				delete(want, req)
			}
		}
	}
	if len(want) != 0 {
		t.Errorf("no line for %v in %q", want, lines)
	}
}

// upstream_time runs from sending the request to the application to its
// response head: a short body the worker reads whole before it forwards
// is the client's time, not the application's, on every engine.
func TestAccessLogUpstreamTimeStartsWhenSent(t *testing.T) {
	t.Parallel()
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Write([]byte("ok"))
	}))
	t.Cleanup(up.Close)
	for _, eng := range []string{"loop", "fasthttp"} {
		t.Run(eng, parallel(func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "access.log")
			d := startDaemon(t, daemonOptions{config: baseServer(1, fmt.Sprintf("upstream = %q\nengine = %q", up.URL, eng)) +
				fmt.Sprintf("\n[log]\naccess = %q\naccess_format = \"json\"\n", path)})
			conn, err := net.Dial("tcp", d.addr)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			// Half the body, a pause, then the rest: the worker forwards
			// the request only once its body is whole.
			io.WriteString(conn, "POST /slow HTTP/1.1\r\nHost: x\r\nContent-Length: 6\r\n\r\nabc")
			time.Sleep(time.Second)
			io.WriteString(conn, "def")
			conn.SetReadDeadline(time.Now().Add(5 * time.Second))
			resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
			if err != nil || resp.StatusCode != 200 {
				t.Fatalf("%v %v", resp, err)
			}
			lines := accessLines(t, path, 1, 5*time.Second)
			if len(lines) != 1 {
				t.Fatalf("lines %q", lines)
			}
			var e struct {
				Duration     float64  `json:"duration"`
				UpstreamTime *float64 `json:"upstream_time"`
			}
			if err := json.Unmarshal([]byte(lines[0]), &e); err != nil || e.UpstreamTime == nil {
				t.Fatalf("line %s: %v", lines[0], err)
			}
			if e.Duration < 0.9 || *e.UpstreamTime > 0.5 {
				t.Errorf("duration %.3f, upstream_time %.3f: want the client's second in the first only (%s)", e.Duration, *e.UpstreamTime, lines[0])
			}
		}))
	}
}
