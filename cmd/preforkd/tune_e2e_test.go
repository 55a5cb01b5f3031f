package main

// End-to-end test of preforkd tune against running instances and
// upstreams of a known CPU profile, each a process of its own (this test
// binary in the upstream role, upstream_e2e_test.go).

import (
	"fmt"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"testing"
)

// tune on a CPU-bound upstream and on a sleeping one advises different
// worker counts (on a host of two CPUs or more), each with the CPU and
// wall times it saw, and says what it did not measure.
func TestTune(t *testing.T) {
	t.Parallel()
	advised := map[string]int{}
	for _, mode := range []string{"cpu", "sleep"} {
		up := "http://" + startUpstreamProcess(t)
		d := startDaemon(t, daemonOptions{admin: true,
			config: baseServer(2, fmt.Sprintf("upstream = %q", up)) + adminSection})
		code, out, stderr := runBinary(t, "tune", "-admin", d.admin, "-path", "/"+mode, "-requests", "20")
		if code != 0 {
			t.Fatalf("tune (%s): exit %d, %s", mode, code, stderr)
		}
		t.Logf("tune against the %s upstream:\n%s", mode, out)
		m := regexp.MustCompile(`advice:   server\.workers = (\d+)`).FindStringSubmatch(out)
		if m == nil {
			t.Fatalf("%s: no advice on server.workers:\n%s", mode, out)
		}
		advised[mode], _ = strconv.Atoi(m[1])
		want := map[string]string{"cpu": "CPU-bound", "sleep": "mostly waiting"}[mode]
		for _, s := range []string{
			"the upstream's process (pid ", want, // its CPU against its wall time
			"20 GETs of " + up + "/" + mode + ": median", "the workers used", // the evidence
			"counter table (table.counters = 1024)", "evidence: 0 of 1024 slots hold a key",
			"\nnot measured\n", "workers under load",
		} {
			if !strings.Contains(out, s) {
				t.Errorf("%s: the report lacks %q", mode, s)
			}
		}
		d.stop()
	}
	// Usage mistakes.
	if code, _, stderr := runBinary(t, "tune"); code != 2 || !strings.Contains(stderr, "-admin") {
		t.Errorf("tune without -admin: exit %d, %q", code, stderr)
	}
	if code, _, stderr := runBinary(t, "tune", "-admin", "127.0.0.1:1"); code != 1 || !strings.Contains(stderr, "admin endpoint") {
		t.Errorf("tune of nothing: exit %d, %q; want 1 and a message about the admin endpoint", code, stderr)
	}
	if runtime.NumCPU() < 2 {
		t.Logf("one CPU: both advise %v workers; the difference needs two CPUs", advised)
		return
	}
	if advised["cpu"] >= advised["sleep"] {
		t.Errorf("advised %d workers for a CPU-bound upstream and %d for a sleeping one: want fewer for the CPU-bound one", advised["cpu"], advised["sleep"])
	}

}
