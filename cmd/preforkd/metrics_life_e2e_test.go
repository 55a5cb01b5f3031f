//go:build linux

package main

// The page's Prometheus semantics across the life of processes: while a
// scraper reads /metrics in a loop, workers are recycled, killed and
// replaced, the configuration is reloaded (a canary promoted, one rolled
// back) and the binary upgraded; no counter goes back, every histogram
// is whole in every scrape, and no connection is counted for a worker
// that is gone.

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// pageProblems checks one page as Prometheus reads it: every sample
// parses, each histogram's buckets are cumulative in increasing le,
// +Inf equals _count, and _sum is 0 when _count is. It returns what is
// wrong, and the page.
func pageProblems(raw []byte) ([]string, page) {
	var bad []string
	p := page{raw: raw, samples: map[string]float64{}, types: map[string]string{}}
	type hist struct {
		les     []float64
		counts  []float64
		inf     float64
		hasInf  bool
		count   float64
		sum     float64
		hasBoth int
	}
	hists := map[string]*hist{}
	sc := bufio.NewScanner(bytes.NewReader(raw))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if f, ok := strings.CutPrefix(line, "# TYPE "); ok {
			name, typ, _ := strings.Cut(f, " ")
			p.types[name] = typ
			if typ == "histogram" {
				hists[name] = &hist{}
			}
			continue
		}
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if i < 0 || err != nil {
			bad = append(bad, fmt.Sprintf("bad sample %q", line))
			continue
		}
		p.samples[line[:i]] = v
		name, labels, _ := strings.Cut(line[:i], "{")
		switch {
		case strings.HasSuffix(name, "_bucket") && hists[strings.TrimSuffix(name, "_bucket")] != nil:
			h := hists[strings.TrimSuffix(name, "_bucket")]
			le, _, _ := strings.Cut(strings.TrimPrefix(labels, `le="`), `"`)
			if le == "+Inf" {
				h.inf, h.hasInf = v, true
				break
			}
			b, err := strconv.ParseFloat(le, 64)
			if err != nil {
				bad = append(bad, fmt.Sprintf("bad le in %q", line))
				break
			}
			h.les, h.counts = append(h.les, b), append(h.counts, v)
		case strings.HasSuffix(name, "_count") && hists[strings.TrimSuffix(name, "_count")] != nil:
			h := hists[strings.TrimSuffix(name, "_count")]
			h.count = v
			h.hasBoth++
		case strings.HasSuffix(name, "_sum") && hists[strings.TrimSuffix(name, "_sum")] != nil:
			h := hists[strings.TrimSuffix(name, "_sum")]
			h.sum = v
			h.hasBoth++
		}
	}
	names := make([]string, 0, len(hists))
	for n := range hists {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		h := hists[n]
		if !h.hasInf || h.hasBoth != 2 {
			bad = append(bad, fmt.Sprintf("%s: +Inf bucket %v, _sum and _count %d of 2", n, h.hasInf, h.hasBoth))
			continue
		}
		for k := range h.counts {
			if k > 0 && (h.les[k] <= h.les[k-1] || h.counts[k] < h.counts[k-1]) {
				bad = append(bad, fmt.Sprintf("%s: bucket le=%v (%v) after le=%v (%v)", n, h.les[k], h.counts[k], h.les[k-1], h.counts[k-1]))
			}
		}
		if len(h.counts) > 0 && h.inf < h.counts[len(h.counts)-1] {
			bad = append(bad, fmt.Sprintf("%s: +Inf %v below le=%v (%v)", n, h.inf, h.les[len(h.les)-1], h.counts[len(h.counts)-1]))
		}
		if h.inf != h.count {
			bad = append(bad, fmt.Sprintf("%s: _count %v, +Inf %v", n, h.count, h.inf))
		}
		if h.sum < 0 || (h.count == 0 && h.sum != 0) {
			bad = append(bad, fmt.Sprintf("%s: _sum %v with _count %v", n, h.sum, h.count))
		}
	}
	return bad, p
}

// watcher scrapes /metrics in a loop and checks every page, and each
// against the one before (no counter goes back). A scrape that fails
// (the admin endpoint handed over by an upgrade) is skipped.
type watcher struct {
	stop     chan struct{}
	done     chan struct{}
	mu       sync.Mutex
	problems []string
	pages    int
	last     page
}

func watchMetrics(t *testing.T, admin string) *watcher {
	w := &watcher{stop: make(chan struct{}), done: make(chan struct{})}
	c := newClient(t, nil, false)
	go func() {
		defer close(w.done)
		var prev *page
		for {
			select {
			case <-w.stop:
				return
			case <-time.After(3 * time.Millisecond):
			}
			r, err := c.Get("http://" + admin + "/metrics")
			if err != nil {
				continue
			}
			raw, err := io.ReadAll(r.Body)
			r.Body.Close()
			if err != nil || r.StatusCode != 200 {
				continue
			}
			bad, p := pageProblems(raw)
			w.mu.Lock()
			w.pages++
			w.problems = append(w.problems, bad...)
			if prev != nil {
				// Gauges of the instance, not of a process: the
				// generation only goes on, the start stays.
				if g, pg := p.samples["preforkd_reload_generation"], prev.samples["preforkd_reload_generation"]; g < pg {
					w.problems = append(w.problems, fmt.Sprintf("scrape %d: preforkd_reload_generation went from %v to %v", w.pages, pg, g))
				}
				if s, ps := p.samples["preforkd_start_time_seconds"], prev.samples["preforkd_start_time_seconds"]; s != ps {
					w.problems = append(w.problems, fmt.Sprintf("scrape %d: preforkd_start_time_seconds went from %v to %v", w.pages, ps, s))
				}
				now := p.counters()
				for s, v := range prev.counters() {
					if got, ok := now[s]; !ok || got < v {
						w.problems = append(w.problems, fmt.Sprintf("scrape %d: %s went from %v to %v (present: %v)", w.pages, s, v, got, ok))
					}
				}
			}
			w.last = p
			w.mu.Unlock()
			prev = &p
		}
	}()
	return w
}

// check reports the problems seen so far, once each kind, and how many.
func (w *watcher) check(t *testing.T, when string) {
	t.Helper()
	w.mu.Lock()
	defer w.mu.Unlock()
	seen := map[string]bool{}
	for _, s := range w.problems {
		if len(seen) < 20 && !seen[s] {
			t.Errorf("%s: %s", when, s)
		}
		seen[s] = true
	}
	w.problems = nil
	t.Logf("%s: %d scrapes checked", when, w.pages)
}

func (w *watcher) end() {
	close(w.stop)
	<-w.done
}

func TestMetricsAcrossProcessLifeE2E(t *testing.T) {
	t.Parallel()
	hold := &holder{arrived: make(chan struct{}, 1), release: make(chan struct{})}
	good, bad := flakyUpstream(t, 0, hold), flakyUpstream(t, 1, hold)
	cfg := canaryConfig(2, good.URL, "", "max_requests = 1000")
	d := startDaemon(t, daemonOptions{config: cfg, admin: true})
	load := startLoops(t, 2, d.url("/x"))
	w := watchMetrics(t, d.admin)
	defer w.end()

	// A worker recycled for max_requests.
	at, l, ok := d.logs.waitFor(0, 15*time.Second, msgIs("worker recycling"))
	if !ok {
		t.Fatal("no worker was recycled")
	}
	waitExited(t, d, at, l.int("pid"))
	w.check(t, "a recycle")

	// kill -9 of a worker, replaced.
	from := d.logs.len()
	live := loggedWorkers(d)
	victim := 0
	for pid := range live {
		victim = pid
	}
	if err := syscall.Kill(victim, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if _, _, ok := d.logs.waitFor(from, 10*time.Second, msgIs("worker crashed")); !ok {
		t.Fatal("the crash was not seen")
	}
	time.Sleep(500 * time.Millisecond)
	w.check(t, "a kill -9")

	// A canary promoted, then one rolled back.
	from = reloadTo(d, cfg+"\n# promoted\n")
	// (inconclusive on a machine too busy for the window's requests:
	// the reload goes on all the same)
	if _, v := verdict(t, d, from, 15*time.Second); v.get("verdict") != "healthy" && v.get("verdict") != "inconclusive" {
		t.Fatalf("verdict %s", v.raw)
	}
	waitReloaded(t, d, from, 15*time.Second)
	w.check(t, "a promoted canary")
	from = reloadTo(d, canaryConfig(2, bad.URL, "", "max_requests = 1000"))
	if at, v := verdict(t, d, from, 15*time.Second); v.get("verdict") == "unhealthy" {
		waitExited(t, d, at, v.int("pid"))
	} else {
		t.Logf("no roll back to watch: %s", v.raw)
		waitReloaded(t, d, from, 15*time.Second)
	}
	time.Sleep(300 * time.Millisecond)
	w.check(t, "a rolled back canary")

	// The binary upgrade: the new supervisor takes the region. A request
	// in flight holds an old worker draining: once the new supervisor
	// serves the page, the old workers that still live are on it, and
	// counted retiring; the generation goes on (the upgrade loaded the
	// file again) and the start time stays.
	before := scrapeMetrics(t, newClient(t, nil, false), d.admin)
	oldWorkers := loggedWorkers(d)
	heldDone := make(chan struct{})
	go func() {
		defer close(heldDone)
		get(newClient(t, nil, false), d.url("/hold"))
	}()
	select {
	case <-hold.arrived:
	case <-time.After(10 * time.Second):
		t.Fatal("the held request did not reach the upstream")
	}
	at, newPID := beginUpgrade(t, d)
	if _, _, ok := d.logs.waitFor(at, 20*time.Second, msgIs("upgrade: the new supervisor serves; draining the old workers")); !ok {
		t.Fatalf("no handover; log:\n%s", d.logs.text())
	}
	checkOldWorkersShown(t, d, newPID, before, oldWorkers)
	close(hold.release)
	<-heldDone
	endUpgrade(t, d, at)
	if _, _, ok := d.logs.waitFor(at, 10*time.Second, msgIs("upgrade finished: the old supervisor's workers are gone")); !ok {
		t.Errorf("the new supervisor did not see the old workers gone")
	}
	time.Sleep(500 * time.Millisecond)
	w.check(t, "an upgrade")

	// Once the load ends and its connections close, none is counted open.
	load.end()
	var open float64
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		w.mu.Lock()
		p := w.last
		w.mu.Unlock()
		open = 0
		for _, st := range []string{"reading", "writing", "idle"} {
			open += p.samples[fmt.Sprintf(`preforkd_connections{state=%q}`, st)]
		}
		if open == 0 {
			break
		}
	}
	if open != 0 {
		t.Errorf("%v connections counted open once every client is gone", open)
	}
	w.check(t, "the end")
	w.mu.Lock()
	promtoolCheck(t, w.last.raw)
	w.mu.Unlock()
	stopPID(t, d, newPID)
}

// checkOldWorkersShown checks the page of the new supervisor (newPID) of
// an upgrade while the old workers drain: each old worker that still
// lives after the scrape lived during it, and is on the page; the
// generation is the one before the upgrade's and one more, in /status
// too, and the start time is the one before.
func checkOldWorkersShown(t *testing.T, d *daemon, newPID int, before page, old map[int]logLine) {
	t.Helper()
	c := newClient(t, nil, false) // a connection each: the old supervisor's endpoint is closed
	var st struct {
		PID        int
		Generation int
		Started    string
	}
	for deadline := time.Now().Add(10 * time.Second); st.PID != newPID; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("/status is not the new supervisor's (pid %d): %+v", newPID, st)
		}
		r := get(c, "http://"+d.admin+"/status")
		if r.err == nil && r.status == 200 {
			json.Unmarshal(r.body, &st)
		}
	}
	bad, p := pageProblems(scrapeMetrics(t, c, d.admin).raw)
	for _, b := range bad {
		t.Error(b)
	}
	alive := 0
	for pid, l := range old {
		if !pidLives(pid) {
			continue
		}
		alive++
		if _, ok := p.samples[fmt.Sprintf(`preforkd_worker_cpu_seconds_total{worker="%d"}`, l.int("index"))]; !ok {
			t.Errorf("the old worker %d (index %d) still drains, but the new supervisor's page has no series of it", pid, l.int("index"))
		}
	}
	if alive == 0 {
		t.Error("no old worker lived on: the held request did not hold one")
	}
	if r := p.samples[`preforkd_workers{state="retiring"}`]; r < float64(alive) {
		t.Errorf(`preforkd_workers{state="retiring"} = %v while %d old workers drain`, r, alive)
	}
	gen := before.samples["preforkd_reload_generation"]
	if got := p.samples["preforkd_reload_generation"]; got != gen+1 || st.Generation != int(gen+1) {
		t.Errorf("after the upgrade: preforkd_reload_generation %v, /status generation %d; want %v: one more than before it", got, st.Generation, gen+1)
	}
	start := before.samples["preforkd_start_time_seconds"]
	if got := p.samples["preforkd_start_time_seconds"]; got != start {
		t.Errorf("after the upgrade: preforkd_start_time_seconds %v, want %v as before it", got, start)
	}
	if want := time.Unix(int64(start), 0).UTC().Format(time.RFC3339); st.Started != want {
		t.Errorf("after the upgrade: /status started %s, want %s as before it", st.Started, want)
	}
}

// pidLives reports whether pid is a process that has not exited.
func pidLives(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	i := bytes.LastIndexByte(b, ')')
	return err == nil && i > 0 && i+2 < len(b) && b[i+2] != 'Z' && b[i+2] != 'X'
}

// A restart with persist: with a dump, every counter starts again at
// zero, the supervisor's and the workers' alike; with persist.live the
// region is attached again and every counter goes on from where it was
// (as the table's occupancy, reckoned from them, must), the supervisor's
// reloads and replaced workers included.
func TestMetricsAcrossRestartE2E(t *testing.T) {
	t.Parallel()
	for _, live := range []bool{false, true} {
		t.Run(fmt.Sprintf("live=%v", live), parallel(func(t *testing.T) {
			cfg := baseServer(2, "") + adminSection + rule("r", "/r", "gcra", 100, "1h") +
				fmt.Sprintf("\n[persist]\npath = %q\n", filepath.Join(t.TempDir(), "table.dump"))
			if live {
				cfg += fmt.Sprintf("live = %q\n", liveRegionPath(t))
			}
			d := startDaemon(t, daemonOptions{config: cfg, admin: true})
			c := newClient(t, freshClientIP(), false)
			for range 5 {
				get(c, d.url("/r"))
			}
			waitReloaded(t, d, reloadTo(d, cfg+"\n# again\n"), 15*time.Second)
			admin := newClient(t, nil, false)
			var before page
			for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
				if before = scrapeMetrics(t, admin, d.admin); before.samples["preforkd_http_request_duration_seconds_count"] == 5 {
					break
				}
			}
			d.stop()
			d = startDaemon(t, daemonOptions{config: cfg, admin: true})
			after := scrapeMetrics(t, admin, d.admin)
			reloads := `preforkd_reloads_total{result="accepted"}`
			if before.samples[reloads] != 1 || before.samples[`preforkd_http_requests_total{code="200"}`] != 5 {
				t.Fatalf("before the restart: %v reloads, %v responses of 200; want 1 and 5", before.samples[reloads], before.samples[`preforkd_http_requests_total{code="200"}`])
			}
			// The key the requests left is in the table again either way.
			if b, a := before.samples["preforkd_table_slots_used"], after.samples["preforkd_table_slots_used"]; b != 1 || a != 1 {
				t.Errorf("preforkd_table_slots_used: %v before the restart, %v after; want 1 and 1", b, a)
			}
			if live {
				noneWentBack(t, "a restart with persist.live", before, after)
				return
			}
			for s, v := range after.counters() {
				if v != 0 && !strings.HasPrefix(s, "preforkd_table_loaded_total") {
					t.Errorf("after a restart from a dump: %s = %v, want 0: counters start again", s, v)
				}
			}
		}))
	}
}

// A supervisor without admin.listen counts into the region all the same:
// upgraded to a file with one, the new supervisor's page has the reload
// its predecessor took.
func TestMetricsCountedWithoutAdminE2E(t *testing.T) {
	t.Parallel()
	cfg := baseServer(1, "")
	d := startDaemon(t, daemonOptions{config: cfg})
	waitReloaded(t, d, reloadTo(d, cfg+"\n# again\n"), 15*time.Second)
	d.admin = freeAddr(t)
	if err := os.WriteFile(d.cfgPath, []byte(cfg+adminSection[:len(adminSection)-len("\"ADMIN_ADDR\"\n")]+fmt.Sprintf("%q\n", d.admin)), 0o600); err != nil {
		t.Fatal(err)
	}
	newPID := upgrade(t, d)
	p := scrapeMetrics(t, newClient(t, nil, false), d.admin)
	if got := p.samples[`preforkd_reloads_total{result="accepted"}`]; got != 1 {
		t.Errorf(`preforkd_reloads_total{result="accepted"} = %v after the upgrade, want 1: the reload before it`, got)
	}
	stopPID(t, d, newPID)
}
