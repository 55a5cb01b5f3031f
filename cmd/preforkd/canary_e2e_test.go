package main

// Safe deploys against the built binary (README, "Safe deploys"): canary reloads to a
// configuration whose upstream is good, broken, or as flaky as the old
// one; a quiet site; TERM during a canary's window; worker recycling.

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/preforkd/preforkd/internal/looptest"
)

// holder holds the requests for /hold at the upstream: arrived says one
// came, release lets them go (4 s at most).
type holder struct{ arrived, release chan struct{} }

// flakyUpstream answers every nth request with 500 (n = 1: every one;
// 0: none) and the others with 200; with a holder, it holds the requests
// for /hold by it.
func flakyUpstream(t *testing.T, n int64, hold ...*holder) *httptest.Server {
	var count atomic.Int64
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if len(hold) > 0 && r.URL.Path == "/hold" {
			select {
			case hold[0].arrived <- struct{}{}:
			default:
			}
			select {
			case <-hold[0].release:
			case <-time.After(4 * time.Second):
			}
			fmt.Fprint(w, "held")
			return
		}
		if n > 0 && count.Add(1)%n == 0 {
			http.Error(w, "broken", http.StatusInternalServerError)
			return
		}
		fmt.Fprint(w, "ok")
	}))
	t.Cleanup(up.Close)
	return up
}

// canaryConfig is a daemon of n workers in front of upstream, with a
// canary window of 1s and 20 requests to judge by (a quarter of the
// loops' few hundred a second: at 50 a loaded machine running tests side
// by side once left the canary 47 and the verdict inconclusive); extra
// goes into [reload], serverExtra into [server].
func canaryConfig(n int, upstream, extra, serverExtra string) string {
	return fmt.Sprintf(`[server]
workers = %d
shutdown_timeout = "5s"
upstream = %q
%s

[admin]
listen = "ADMIN_ADDR"

[table]
counters = 1024

[reload]
canary_window = "1s"
canary_min_requests = 20
%s
`, n, upstream, serverExtra, extra)
}

// loops are client loops, each sending GETs of url on new connections
// (spread over the workers by the kernel) until stopped.
type loops struct {
	run     *looptest.Loops
	mu      sync.Mutex
	results []result
}

func startLoops(t *testing.T, n int, url string) *loops {
	l := &loops{run: looptest.Start(t, 60*time.Second)}
	for range n {
		c := newClient(t, freshClientIP(), false)
		l.run.Go(func() {
			r := get(c, url)
			r.body = nil
			l.mu.Lock()
			l.results = append(l.results, r)
			l.mu.Unlock()
		})
	}
	return l
}

func (l *loops) end() { l.run.Stop() }

// reloadUnderLoad starts a daemon of 4 workers in front of upstream and 4
// client loops against it, then reloads it to cfg; it returns where the
// log was at the HUP.
func reloadUnderLoad(t *testing.T, upstream, cfg string) (*daemon, *loops, int) {
	t.Helper()
	d := startDaemon(t, daemonOptions{config: canaryConfig(4, upstream, "", ""), admin: true})
	load := startLoops(t, 4, d.url("/x"))
	return d, load, reloadTo(d, cfg)
}

// verdict waits for the line that gives a canary's verdict.
func verdict(t *testing.T, d *daemon, from int, timeout time.Duration) (int, logLine) {
	t.Helper()
	i, l, ok := d.logs.waitFor(from, timeout, func(l logLine) bool { return l.get("verdict") != "" })
	if !ok {
		t.Fatalf("no canary verdict within %v", timeout)
	}
	return i, l
}

// loggedWorkers lists the workers the log shows started and not exited.
func loggedWorkers(d *daemon) map[int]logLine {
	live := map[int]logLine{}
	for _, l := range d.logs.snapshot() {
		switch l.msg() {
		case "worker started":
			live[l.int("pid")] = l
		case "worker exited", "worker crashed":
			delete(live, l.int("pid"))
		}
	}
	return live
}

// statusWorkers is the number of workers the admin /status lists.
//
// The supervisor publishes a snapshot when a worker exits, a moment after
// the log line the test waited for: it is read again for up to 2 s while
// it still lists an exited worker (one whose pid is gone).
func statusWorkers(t *testing.T, d *daemon) int {
	t.Helper()
	deadline := time.Now().Add(2 * time.Second)
	for {
		r := get(newClient(t, nil, false), "http://"+d.admin+"/status")
		var st struct{ Workers []struct{ PID int } }
		if r.err != nil || r.status != 200 || json.Unmarshal(r.body, &st) != nil {
			t.Fatalf("/status: %d %v %s", r.status, r.err, r.body)
		}
		stale := false
		for _, w := range st.Workers {
			stale = stale || syscall.Kill(w.PID, 0) != nil
		}
		if !stale || time.Now().After(deadline) {
			return len(st.Workers)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitRetired waits for every worker told to retire since from to exit.
func waitRetired(t *testing.T, d *daemon, from int) {
	t.Helper()
	for _, l := range d.logs.snapshot()[from:] {
		if l.msg() == "worker retiring" {
			waitExited(t, d, from, l.int("pid"))
		}
	}
}

// waitExited waits for pid's "worker exited" line.
func waitExited(t *testing.T, d *daemon, from, pid int) logLine {
	t.Helper()
	_, l, ok := d.logs.waitFor(from, 15*time.Second, func(l logLine) bool { return l.msg() == "worker exited" && l.int("pid") == pid })
	if !ok {
		t.Fatalf("worker %d did not exit", pid)
	}
	return l
}

func TestCanaryGoodReloadE2E(t *testing.T) {
	t.Parallel()
	a, b := flakyUpstream(t, 0), flakyUpstream(t, 0)
	d, load, from := reloadUnderLoad(t, a.URL, canaryConfig(4, b.URL, "", ""))
	_, v := verdict(t, d, from, 15*time.Second)
	waitReloaded(t, d, from, 15*time.Second)
	waitRetired(t, d, from)
	load.end()
	got := statuses(load.results)
	t.Logf("%s; loops: %v", v.msg(), got)
	if v.get("verdict") != "healthy" || !strings.HasSuffix(v.msg(), "; reload continues") {
		t.Errorf("verdict %q", v.raw)
	}
	if got[200] != len(load.results) || got[200] == 0 {
		t.Errorf("loops through the reload: %v, want every request 200 (first error: %s)", got, firstErr(load.results))
	}
	live := loggedWorkers(d)
	gens := map[string]int{}
	for _, l := range live {
		gens[l.get("generation")]++
	}
	if gens["1"] != 4 || len(live) != 4 {
		t.Errorf("workers by generation %v, want all 4 on generation 1", gens)
	}
	d.stop()
}

var unhealthyLine = regexp.MustCompile(`^canary unhealthy: 5xx 100\.0% \((\d+)/(\d+)\) vs fleet 0\.0% \(0/(\d+)\), allowed \+2\.0 points; reload aborted, slot 0 quarantined$`)

func TestCanaryBadUpstreamE2E(t *testing.T) {
	t.Parallel()
	good, bad := flakyUpstream(t, 0), flakyUpstream(t, 1)
	d, load, from := reloadUnderLoad(t, good.URL, canaryConfig(4, bad.URL, "", ""))
	at, v := verdict(t, d, from, 15*time.Second)
	if v.get("level") != "ERROR" || v.get("verdict") != "unhealthy" || !unhealthyLine.MatchString(v.msg()) {
		t.Fatalf("verdict line %s", v.raw)
	}
	canary := v.int("pid")
	exited := waitExited(t, d, at, canary)
	if exited.get("status") != "exit status 0" {
		t.Errorf("the canary's exit: %s", exited.raw)
	}
	load.end()
	// Every failure is a 500 of the canary, before it was gone; no
	// connection failed.
	got := statuses(load.results)
	for _, r := range load.results {
		if r.err != nil {
			t.Errorf("a request failed: %v", r.err)
		}
	}
	t.Logf("%s; loops: %v", v.msg(), got)
	if got[500] == 0 || got[200]+got[500] != len(load.results) {
		t.Errorf("loops: %v, want 200s and the canary's 500s", got)
	}

	// After the abort: 100 of 100 succeed, one slot short.
	c := newClient(t, freshClientIP(), false)
	ok := 0
	for range 100 {
		if r := get(c, d.url("/after")); r.status == 200 {
			ok++
		}
	}
	if ok != 100 {
		t.Errorf("after the abort: %d of 100 requests succeeded", ok)
	}
	if n := len(loggedWorkers(d)); n != 3 {
		t.Errorf("%d workers after the abort, want 3: the quarantined slot is empty", n)
	}
	if n := statusWorkers(t, d); n != 3 {
		t.Errorf("/status lists %d workers after the abort, want 3", n)
	}
	// /status and /metrics show the verdict and the quarantined slot.
	var st struct {
		Canary struct {
			Verdict  string `json:"verdict"`
			Aborted  bool   `json:"aborted"`
			Requests uint64 `json:"requests"`
		} `json:"canary"`
		Quarantined []int `json:"quarantined_slots"`
	}
	if r := get(newClient(t, nil, false), "http://"+d.admin+"/status"); json.Unmarshal(r.body, &st) != nil ||
		st.Canary.Verdict != "unhealthy" || !st.Canary.Aborted || st.Canary.Requests == 0 || fmt.Sprint(st.Quarantined) != "[0]" {
		t.Errorf("/status after the abort: %s", r.body)
	}
	raw := get(newClient(t, nil, false), "http://"+d.admin+"/metrics").body
	promtoolCheck(t, raw)
	page := string(raw)
	for _, want := range []string{"preforkd_workers_quarantined 1\n", `preforkd_canary_verdict{verdict="unhealthy"} 1` + "\n",
		"preforkd_reloads_aborted_total 1\n", "preforkd_reload_last_success 0\n"} {
		if !strings.Contains(page, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	for _, l := range d.logs.snapshot()[at:] {
		if l.msg() == "worker started" {
			t.Errorf("a worker was started after the abort: %s", l.raw)
		}
	}

	// A good reload: its canary fills the quarantined slot; all 4 serve it.
	from = reloadTo(d, canaryConfig(4, good.URL, "", ""))
	load = startLoops(t, 4, d.url("/x"))
	_, v = verdict(t, d, from, 15*time.Second)
	waitReloaded(t, d, from, 15*time.Second)
	waitRetired(t, d, from)
	load.end()
	if v.get("verdict") != "healthy" || v.get("slot") != "0" {
		t.Errorf("second verdict %s", v.raw)
	}
	live := loggedWorkers(d)
	for _, l := range live {
		if l.get("generation") != "2" {
			t.Errorf("worker %d of generation %s after the good reload", l.int("pid"), l.get("generation"))
		}
	}
	if n := statusWorkers(t, d); len(live) != 4 || n != 4 {
		t.Errorf("%d workers after the good reload (/status: %d), want 4", len(live), n)
	}
	if got := statuses(load.results); got[200] != len(load.results) {
		t.Errorf("loops through the good reload: %v", got)
	}
	d.stop()
}

// Old workers with a 5% error baseline, and a new configuration with the
// same: the reload is not aborted.
func TestCanarySameBaselineE2E(t *testing.T) {
	t.Parallel()
	a, b := flakyUpstream(t, 20), flakyUpstream(t, 20)
	// A longer window than the others: the verdict needs 50 requests at
	// the canary, and a loaded machine serves few a second.
	d, load, from := reloadUnderLoad(t, a.URL, strings.Replace(canaryConfig(4, b.URL, "", ""), `canary_window = "1s"`, `canary_window = "4s"`, 1))
	_, v := verdict(t, d, from, 20*time.Second)
	load.end()
	t.Logf("%s (p=%s by %s)", v.msg(), v.get("p_value"), v.get("test"))
	if v.get("verdict") != "healthy" || !strings.Contains(v.msg(), "reload continues") {
		t.Fatalf("verdict %s", v.raw)
	}
	if got := statuses(load.results); got[500] == 0 || got[0] != 0 {
		t.Errorf("loops %v: want some 500s of the baseline and no failed connection", got)
	}
	waitReloaded(t, d, from, 15*time.Second)
	d.stop()
}

// A quiet site: no request during the window is inconclusive; the reload
// goes on (and says so), or is aborted with canary_inconclusive = "abort".
func TestCanaryQuietSiteE2E(t *testing.T) {
	t.Parallel()
	up := flakyUpstream(t, 0)
	for _, policy := range []string{"continue", "abort"} {
		t.Run(policy, func(t *testing.T) {
			t.Parallel()
			cfg := canaryConfig(2, up.URL, fmt.Sprintf("canary_inconclusive = %q", policy), "")
			d := startDaemon(t, daemonOptions{config: cfg, admin: true})
			from := reloadTo(d, cfg)
			_, v := verdict(t, d, from, 15*time.Second)
			want := "canary inconclusive: 0 requests, fewer than canary_min_requests 20; 5xx 0.0% (0/0) vs fleet 0.0% (0/0), allowed +2.0 points; reload continues"
			level := "WARN"
			if policy == "abort" {
				want = strings.Replace(want, "reload continues", "reload aborted, slot 0 quarantined", 1)
				level = "ERROR"
			}
			if v.msg() != want || v.get("level") != level || v.get("verdict") != "inconclusive" {
				t.Errorf("verdict %s, want %s %q", v.raw, level, want)
			}
			if policy == "continue" {
				waitReloaded(t, d, from, 15*time.Second)
			} else {
				waitExited(t, d, from, v.int("pid"))
				if n := len(loggedWorkers(d)); n != 1 {
					t.Errorf("%d workers after the abort, want 1", n)
				}
			}
			d.stop()
		})
	}
}

// TERM while a canary is judged: the drain is clean, nothing is respawned,
// and the supervisor exits 0.
func TestCanaryTermDuringWindowE2E(t *testing.T) {
	t.Parallel()
	up := flakyUpstream(t, 0)
	cfg := strings.Replace(canaryConfig(2, up.URL, "", ""), `canary_window = "1s"`, `canary_window = "30s"`, 1)
	d := startDaemon(t, daemonOptions{config: cfg, admin: true})
	load := startLoops(t, 2, d.url("/x"))
	from := reloadTo(d, cfg)
	at, _, ok := d.logs.waitFor(from, 15*time.Second, msgIs("canary ready: judging it"))
	if !ok {
		t.Fatal("no canary")
	}
	time.Sleep(200 * time.Millisecond) // the canary serves
	load.end()
	d.signal(syscall.SIGTERM)
	code, exited := d.wait(15 * time.Second)
	if !exited || code != 0 {
		t.Fatalf("after TERM during the window: exited %v, code %d", exited, code)
	}
	d.logs.waitEOF(5 * time.Second)
	drain, _, ok := d.logs.waitFor(at, time.Second, msgIs("drain begun"))
	if !ok {
		t.Fatal("no drain")
	}
	for _, l := range d.logs.snapshot()[drain:] {
		switch {
		case l.msg() == "worker started", l.get("verdict") != "":
			t.Errorf("after TERM: %s", l.raw)
		case l.msg() == "worker exited" && l.get("status") != "exit status 0":
			t.Errorf("%s", l.raw)
		}
	}
	if got := statuses(load.results); got[200] != len(load.results) {
		t.Errorf("loops: %v", got)
	}
}

// max_requests = 1000 under load: workers are replaced, each after about
// 1000 requests, and no request fails.
func TestRecycleMaxRequestsE2E(t *testing.T) {
	t.Parallel()
	up := flakyUpstream(t, 0)
	d := startDaemon(t, daemonOptions{config: canaryConfig(2, up.URL, "", "max_requests = 1000"), admin: true})
	load := startLoops(t, 4, d.url("/x"))
	asked, exits := map[int]bool{}, 0
	d.logs.waitFor(0, 40*time.Second, func(l logLine) bool {
		switch l.msg() {
		case "worker recycling":
			asked[l.int("pid")] = true
		case "worker exited":
			if asked[l.int("pid")] {
				exits++
			}
		}
		return exits >= 3
	})
	load.end()
	got := statuses(load.results)
	recycled := 0
	for _, l := range d.logs.snapshot() {
		if l.msg() != "worker recycling" {
			continue
		}
		recycled++
		n, limit := l.int("requests"), l.int("limit")
		if l.get("reason") != "max_requests" || limit < 900 || limit > 1100 || n != limit {
			t.Errorf("recycling logged as %s", l.raw)
		}
	}
	t.Logf("%d requests, %d workers recycled; %v", len(load.results), recycled, got)
	if recycled < 3 {
		t.Fatalf("%d workers recycled, want 3 or more", recycled)
	}
	if got[200] != len(load.results) {
		t.Errorf("loops: %v, want every request 200 (first error: %s)", got, firstErr(load.results))
	}
	for _, l := range recycledExits(d) {
		if l.get("status") != "exit status 0" {
			t.Errorf("%s", l.raw)
		}
	}
	// A recycling begun as the load ended finishes: its successor is
	// ready before it leaves, so for a moment there are three.
	n := len(loggedWorkers(d))
	for deadline := time.Now().Add(5 * time.Second); n != 2 && time.Now().Before(deadline); n = len(loggedWorkers(d)) {
		time.Sleep(20 * time.Millisecond)
	}
	if n != 2 {
		t.Errorf("%d workers left, want 2", n)
	}
	d.stop()
}

// recycledExits are the exit lines of the workers that asked to be recycled.
func recycledExits(d *daemon) []logLine {
	asked := map[int]bool{}
	var out []logLine
	for _, l := range d.logs.snapshot() {
		switch {
		case l.msg() == "worker recycling":
			asked[l.int("pid")] = true
		case l.msg() == "worker exited" && asked[l.int("pid")]:
			out = append(out, l)
		}
	}
	return out
}

// While a canary is judged, /status and the admin actions follow the
// running configuration, the one every worker but the canary serves: the
// generation and rules are its, a key of a rule the reload drops can
// still be inspected. The canary is shown apart (canary.generation, its
// worker's). Once it passes, the new configuration is the running one.
func TestCanaryStatusShowsRunningConfig(t *testing.T) {
	t.Parallel()
	const token = "0123456789abcdef-canary-token"
	base := strings.Replace(baseServer(2, ""), shortCanary, `canary_window = "3s"`, 1) + adminSection +
		fmt.Sprintf("token_file = %q\n", writeToken(t, 0o600, token))
	d := startDaemon(t, daemonOptions{config: base + rule("old", "/old", "gcra", 5, "1h"), admin: true})
	admin := newClient(t, nil, false)
	type statusView struct {
		Generation int
		Rules      []struct{ Name string }
		Canary     *struct {
			Generation int
			Verdict    string
		}
	}
	look := func(when string, gen int, rule string) {
		t.Helper()
		r := get(admin, "http://"+d.admin+"/status")
		var st statusView
		if err := json.Unmarshal(r.body, &st); r.status != 200 || err != nil {
			t.Fatalf("%s: /status %d %v", when, r.status, err)
		}
		if st.Generation != gen || len(st.Rules) != 1 || st.Rules[0].Name != rule {
			t.Errorf("%s: /status generation %d rules %+v, want %d [%s]", when, st.Generation, st.Rules, gen, rule)
		}
		h := http.Header{"Authorization": {"Bearer " + token}}
		if r := do(admin, "GET", "http://"+d.admin+"/ratelimit/"+rule+"?key=192.0.2.7", h); r.status != 200 {
			t.Errorf("%s: GET /ratelimit/%s: %d %s, want 200", when, rule, r.status, r.body)
		}
	}
	look("before the reload", 0, "old")

	from := reloadTo(d, base+rule("new", "/new", "gcra", 5, "1h"))
	if _, _, ok := d.logs.waitFor(from, 10*time.Second, msgIs("canary ready: judging it")); !ok {
		t.Fatal("no canary ready")
	}
	look("while the canary is judged", 0, "old")
	r := get(admin, "http://"+d.admin+"/status")
	var st statusView
	json.Unmarshal(r.body, &st)
	if _, _, judged := d.logs.waitFor(from, 0, func(l logLine) bool { return l.get("verdict") != "" }); judged {
		t.Fatal("the canary was judged before the checks: the machine is too slow for this test")
	}
	if st.Canary == nil || st.Canary.Generation != 1 || st.Canary.Verdict != "" {
		t.Errorf("while the canary is judged: /status canary %+v, want generation 1 without a verdict", st.Canary)
	}

	waitReloaded(t, d, from, 20*time.Second)
	look("after the reload", 1, "new")
}
