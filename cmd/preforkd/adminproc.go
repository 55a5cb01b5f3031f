package main

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"github.com/preforkd/preforkd/metrics"
	"github.com/preforkd/preforkd/prefork"
	"github.com/preforkd/preforkd/shm"
)

// What /metrics says of each worker process: what /proc tells the
// supervisor at scrape time (resident memory, descriptors and their
// limit, CPU time), and the GC cycles the worker writes into its own row
// of the region (metrics.WorkerGCCycles), so that server.max_rss and the
// raised open-file limit can be watched.

// procFigures are one process's figures from /proc.
type procFigures struct {
	rss    int64   // resident set size, bytes (what server.max_rss is compared with)
	cpu    float64 // user and system CPU time, seconds
	fds    int64   // open descriptors
	maxFDs int64   // the soft limit on open descriptors
}

// readProc reads pid's figures. ok is false when pid is gone, or is not
// a child of parent any more (its pid was reused).
func readProc(pid, parent int) (procFigures, bool) {
	var f procFigures
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return f, false
	}
	ppid, ticks, ok := parseProcStat(stat)
	if !ok || ppid != parent {
		return f, false
	}
	f.cpu = float64(ticks) / userHZ
	statm, err := os.ReadFile(fmt.Sprintf("/proc/%d/statm", pid))
	if err != nil {
		return f, false
	}
	if pages, ok := statmResident(statm); ok {
		f.rss = pages * int64(os.Getpagesize())
	}
	if limits, err := os.ReadFile(fmt.Sprintf("/proc/%d/limits", pid)); err == nil {
		f.maxFDs, _ = openFilesLimit(limits)
	}
	f.fds, err = countFDs(pid)
	return f, err == nil
}

// parseProcStat reads /proc/PID/stat: "pid (comm) state ppid ... utime
// stime ...", comm possibly with spaces and parentheses; utime and stime
// (fields 14 and 15) in USER_HZ ticks.
func parseProcStat(b []byte) (ppid int, ticks int64, ok bool) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, 0, false
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0, 0, false
	}
	ppid, err1 := strconv.Atoi(f[1])
	ut, err2 := strconv.ParseInt(f[11], 10, 64)
	st, err3 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil || err3 != nil {
		return 0, 0, false
	}
	return ppid, ut + st, true
}

// statmResident is the second field of /proc/PID/statm: resident pages.
func statmResident(b []byte) (int64, bool) {
	f := strings.Fields(string(b))
	if len(f) < 2 {
		return 0, false
	}
	n, err := strconv.ParseInt(f[1], 10, 64)
	return n, err == nil
}

// openFilesLimit is the soft limit of "Max open files" in
// /proc/PID/limits; -1 for unlimited.
func openFilesLimit(b []byte) (int64, bool) {
	for line := range strings.Lines(string(b)) {
		rest, ok := strings.CutPrefix(line, "Max open files")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) == 0 {
			return 0, false
		}
		if f[0] == "unlimited" {
			return -1, true
		}
		n, err := strconv.ParseInt(f[0], 10, 64)
		return n, err == nil
	}
	return 0, false
}

// countFDs counts the entries of /proc/PID/fd, a batch at a time.
func countFDs(pid int) (int64, error) {
	d, err := os.Open(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return 0, err
	}
	defer d.Close()
	var n int64
	for {
		names, err := d.Readdirnames(512)
		n += int64(len(names))
		if err == io.EOF {
			return n, nil
		}
		if err != nil {
			return n, err
		}
	}
}

// workerFigures is one worker's line of the page.
type workerFigures struct {
	index int
	proc  procFigures
	own   metrics.Snapshot // its row: what it counted itself
}

// collectWorkers reads the figures of every worker process: the workers
// of st that /proc still shows as this supervisor's children, and during
// a binary upgrade the other supervisor's, which serve or drain beside
// them in the same region until they exit: the processes joined to
// region entries st does not hold, whose parent is this supervisor's
// parent (the old supervisor, seen from the new one) or a child of this
// one (the new supervisor, seen from the old one). It returns how many
// are the old supervisor's, seen from the new one: they drain.
func collectWorkers(st *prefork.Status, r *shm.Region, ws *[]workerFigures) (predecessor int) {
	self, parent := os.Getpid(), os.Getppid()
	all, n := (*ws)[:cap(*ws)], 0 // the snapshots' buffers are kept
	add := func(index int, p procFigures) {
		if n == len(all) {
			all = append(all, workerFigures{})
		}
		all[n].index, all[n].proc = index, p
		n++
	}
	mine := make(map[int]bool, len(st.Workers))
	for _, w := range st.Workers {
		mine[w.Index] = true
		if p, ok := readProc(w.PID, self); ok {
			add(w.Index, p)
		}
	}
	for _, e := range r.Workers() {
		if e.PID == 0 || mine[e.Index] {
			continue
		}
		ppid, ok := parentOf(e.PID)
		if !ok || ppid == self || (ppid != parent && !isChild(ppid, self)) {
			continue
		}
		if p, ok := readProc(e.PID, ppid); ok {
			add(e.Index, p)
			if ppid == parent {
				predecessor++
			}
		}
	}
	*ws = all[:n]
	return predecessor
}

// parentOf is pid's parent, from /proc.
func parentOf(pid int) (int, bool) {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, false
	}
	ppid, _, ok := parseProcStat(stat)
	return ppid, ok
}

// isChild reports whether pid is a child of parent.
func isChild(pid, parent int) bool {
	ppid, ok := parentOf(pid)
	return ok && ppid == parent
}

// appendWorkers writes the figures collectWorkers read.
func appendWorkers(t *metrics.Text, r *shm.Region, ws *[]workerFigures) {
	gauge := func(name, help string, v func(*workerFigures) int64) {
		t.Family(name, "gauge", help)
		for i := range *ws {
			w := &(*ws)[i]
			t.Float(name, float64(v(w)), "worker", strconv.Itoa(w.index))
		}
	}
	gauge("preforkd_worker_resident_memory_bytes", "Resident memory of each worker process, by worker index (what server.max_rss is compared with), from /proc/PID/statm at scrape time.",
		func(w *workerFigures) int64 { return w.proc.rss })
	gauge("preforkd_worker_open_fds", "Open descriptors of each worker process, by worker index (connections, upstream connections, files).",
		func(w *workerFigures) int64 { return w.proc.fds })
	gauge("preforkd_worker_max_fds", "The soft limit on open descriptors of each worker process, by worker index (raised to the hard limit at start; -1: unlimited).",
		func(w *workerFigures) int64 { return w.proc.maxFDs })
	t.Family("preforkd_worker_cpu_seconds_total", "counter", "User and system CPU time of each worker process, by worker index (its process's own: a replaced worker starts again from 0).")
	for i := range *ws {
		w := &(*ws)[i]
		t.Float("preforkd_worker_cpu_seconds_total", w.proc.cpu, "worker", strconv.Itoa(w.index))
	}
	own := make([]metrics.Worker, len(*ws)) // a few workers: no need to keep it
	for i := range *ws {
		w := &(*ws)[i]
		metrics.ReadWorker(r, w.index, &w.own)
		own[i] = metrics.Worker{Index: w.index, Snap: &w.own}
	}
	metrics.AppendWorkers(t, own)
}
