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
	good, bad := flakyUpstream(t, 0), flakyUpstream(t, 1)
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

	// The binary upgrade: the new supervisor takes the region.
	at = d.logs.len()
	newPID := upgrade(t, d)
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
