package main

// End-to-end tests of what an operator meets in the first week: the
// memory an instance maps, its health check, its admin socket, its
// metrics of the worker processes.

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// An instance that only limits rates maps no response table: its region
// is at most 20 MiB (87 MiB with the table's defaults), /metrics shows no
// record and no block. A reload that adds the first [[cache]] block is
// refused, saying a restart is needed; the running configuration serves
// on.
func TestResponseTableOnlyWithBlocks(t *testing.T) {
	t.Parallel()
	cfg := "[server]\nworkers = 2\nshutdown_timeout = \"10s\"\n" + adminSection + rule("login", "/login", "gcra", 5, "1m")
	d := startDaemon(t, daemonOptions{config: cfg, admin: true})
	if n := regionMapped(t, d.pid()); n > 20<<20 {
		t.Errorf("the supervisor maps a region of %.1f MiB, want at most 20 MiB", float64(n)/(1<<20))
	} else {
		t.Logf("region: %.1f MiB", float64(n)/(1<<20))
	}
	admin := newClient(t, nil, false)
	p := scrapeMetrics(t, admin, d.admin)
	for _, name := range []string{"preforkd_responses_records", "preforkd_responses_blocks"} {
		if v, ok := p.samples[name]; !ok || v != 0 {
			t.Errorf("%s = %v (present %v), want 0", name, v, ok)
		}
	}

	from := reloadTo(d, cfg+"\n[[cache]]\npath = \"/c/*\"\n")
	_, l, ok := d.logs.waitFor(from, 10*time.Second, msgIs("reload refused: keeping the running configuration"))
	if !ok {
		t.Fatal("a reload that adds a [[cache]] block to a region without a response table was not refused")
	}
	if !strings.Contains(l.get("err"), "restart") {
		t.Errorf("the refusal does not say a restart is needed: %s", l.raw)
	}
	if r := get(newClient(t, freshClientIP(), false), d.url("/login")); r.status != 200 {
		t.Errorf("/login after the refused reload: %d %v", r.status, r.err)
	}
	if got := scrapeMetrics(t, admin, d.admin).samples[`preforkd_reloads_total{result="refused"}`]; got != 1 {
		t.Errorf("reloads refused: %v, want 1", got)
	}
}

// regionMapped is the size of the region a process maps (its memfd, or
// a live region's file), from /proc/PID/maps.
func regionMapped(t *testing.T, pid int) int64 {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if !strings.Contains(line, "memfd:preforkd-region") {
			continue
		}
		lo, hi, _ := strings.Cut(strings.Fields(line)[0], "-")
		a, err1 := strconv.ParseInt(lo, 16, 64)
		b, err2 := strconv.ParseInt(hi, 16, 64)
		if err1 != nil || err2 != nil {
			t.Fatalf("/proc/%d/maps: %q", pid, line)
		}
		return b - a
	}
	t.Fatalf("process %d maps no region", pid)
	return 0
}
