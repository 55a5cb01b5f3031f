//go:build linux

package main

// What a long life with many deploys must not grow: the supervisor's
// descriptors and shared-memory mappings, its unreaped children, the
// files of the persist directory, and each new worker's descriptors, per
// reload (HUP, also a refused one), binary upgrade (USR2) and worker
// recycled by max_requests.

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// footprint is what the test counts of one process.
type footprint struct {
	fds     int // open descriptors
	region  int // mappings of the shared region (persist.live: a /dev/shm file)
	zombies int // children exited and not reaped
}

func footprintOf(t *testing.T, pid int, region string) footprint {
	t.Helper()
	var f footprint
	f.fds = openFiles(t, pid)
	maps, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(maps), "\n") {
		if strings.HasSuffix(line, " "+region) {
			f.region++
		}
	}
	procs, _ := os.ReadDir("/proc")
	for _, p := range procs {
		stat, err := os.ReadFile("/proc/" + p.Name() + "/stat")
		if err != nil {
			continue
		}
		fields := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
		if len(fields) > 1 && fields[0] == "Z" && fields[1] == strconv.Itoa(pid) {
			f.zombies++
		}
	}
	return f
}

func TestNothingGrowsPerEvent(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	live := liveRegionPath(t)
	cfg := func(limit int) string {
		return strings.Replace(baseServer(2, "max_requests = 20"), "[table]",
			fmt.Sprintf("[admin]\nlisten = \"ADMIN_ADDR\"\n[persist]\npath = %q\nlive = %q\n\n[table]", filepath.Join(dir, "dump"), live), 1) +
			rule("r", "/r", "gcra", limit, "1m")
	}
	d := startDaemon(t, daemonOptions{config: cfg(1000), admin: true})
	sup := d.pid()
	c := newClient(t, nil, false)
	// measure waits for the retired workers to be gone and reaped, then
	// counts the supervisor and its newest worker; persist-directory
	// entries too. The supervisor's descriptors are the least of a few
	// samples: a worker it starts meanwhile (max_requests) holds a pipe
	// pair for a moment; a leak stays.
	measure := func() (footprint, footprint, int) {
		t.Helper()
		var s footprint
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			alive := 0
			for _, pid := range d.workerPIDs() {
				if d.alive(pid) {
					alive++
				}
			}
			if s = footprintOf(t, sup, live); (s.zombies == 0 && alive == 2) || time.Now().After(deadline) {
				break
			}
		}
		for range 5 {
			time.Sleep(100 * time.Millisecond)
			s.fds = min(s.fds, openFiles(t, sup))
		}
		// The newest worker, once it has started: mapped the region,
		// and a moment more to open what it serves with.
		var w footprint
		for deadline := time.Now().Add(5 * time.Second); w.region == 0 && time.Now().Before(deadline); {
			time.Sleep(200 * time.Millisecond)
			pids := d.workerPIDs()
			w = footprintOf(t, pids[len(pids)-1], live)
		}
		ents, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		return s, w, len(ents)
	}
	// hup writes the file, then sends HUP to the supervisor of the day.
	hup := func(text string) int {
		t.Helper()
		if err := os.WriteFile(d.cfgPath, []byte(strings.ReplaceAll(text, "ADMIN_ADDR", d.admin)), 0o600); err != nil {
			t.Fatal(err)
		}
		from := d.logs.len()
		if err := syscall.Kill(sup, syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
		return from
	}
	// event i is a reload (two in three of them a good one) or, with
	// upgrade, a binary upgrade.
	event := func(i int, upgrade bool) {
		t.Helper()
		switch {
		case upgrade:
			from := d.logs.len()
			if err := syscall.Kill(sup, syscall.SIGUSR2); err != nil {
				t.Fatal(err)
			}
			_, begun, ok := d.logs.waitFor(from, 10*time.Second, msgIs("upgrade begun: new supervisor started"))
			if !ok {
				t.Fatalf("event %d: no upgrade begun; log:\n%s", i, d.logs.text())
			}
			if _, _, ok := d.logs.waitFor(from, 20*time.Second, msgIs("upgrade finished: the old supervisor's workers are gone")); !ok {
				t.Fatalf("event %d: the upgrade did not finish; log:\n%s", i, d.logs.text())
			}
			sup = begun.int("pid")
		case i%3 != 2: // a reload
			waitReloaded(t, d, hup(cfg(1000+i)), 15*time.Second)
		default: // a refused reload, then the file as it was
			from := hup(cfg(1000+i) + "\n[[ratelimit]]\nname = \"bad\"\n")
			if _, _, ok := d.logs.waitFor(from, 10*time.Second, msgIs("reload refused: keeping the running configuration")); !ok {
				t.Fatalf("event %d: the refused reload was not logged; log:\n%s", i, d.logs.text())
			}
			os.WriteFile(d.cfgPath, []byte(strings.ReplaceAll(cfg(1000+i), "ADMIN_ADDR", d.admin)), 0o600)
		}
		// Enough requests that max_requests recycles each worker at
		// least once.
		for range 50 {
			get(c, d.url("/r"))
		}
	}
	// Reloads in one supervisor first (an upgrade replaces it, and what
	// it leaked with it), then upgrades: each new supervisor holds what
	// it was handed.
	compare := func(what string, warm, events int, upgrade bool) {
		t.Helper()
		for i := range warm {
			event(i, upgrade)
		}
		sup0, worker0, files0 := measure()
		for i := warm; i < events; i++ {
			event(i, upgrade)
		}
		sup1, worker1, files1 := measure()
		t.Logf("%s: after %d: supervisor %+v, worker %+v, %d files; after %d: %+v, %+v, %d",
			what, warm, sup0, worker0, files0, events, sup1, worker1, files1)
		if sup1.zombies != 0 || worker1.zombies != 0 {
			t.Errorf("%s: after %d: %d unreaped children of the supervisor, %d of a worker", what, events, sup1.zombies, worker1.zombies)
		}
		// Exact: every count is the same at each event's end.
		if sup1.fds != sup0.fds || sup1.region != sup0.region {
			t.Errorf("%s: the supervisor grew: %+v after %d, %+v after %d", what, sup0, warm, sup1, events)
		}
		if worker1.fds != worker0.fds || worker1.region != worker0.region {
			t.Errorf("%s: a new worker holds more: %+v after %d, %+v after %d", what, worker0, warm, worker1, events)
		}
		if files1 != files0 {
			t.Errorf("%s: the persist directory grew: %d entries after %d, %d after %d", what, files0, warm, files1, events)
		}
	}
	compare("reloads", 3, 12, false)
	compare("upgrades", 1, 4, true)
	stopPID(t, d, sup)
}
