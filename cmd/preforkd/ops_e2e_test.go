package main

// End-to-end tests of the daemon as an operator runs it (SPEC §7, §17):
// reloads under keep-alive load, the admin listener under a connection
// flood, process names and limits. Against the built binary.

import (
	"context"
	"fmt"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// wrk -c50 across 3 HUPs sees no error: a retiring worker tells its
// keep-alive clients (Connection: close) before it stops reading from them,
// so no request is lost to a connection closed under it.
func TestReloadUnderKeepAliveLoad(t *testing.T) {
	t.Parallel()
	wrk, err := exec.LookPath("wrk")
	if err != nil {
		t.Fatal("wrk is not installed (apt-get install wrk; .ci/run installs it): ", err)
	}
	d := startDaemon(t, daemonOptions{config: baseServer(2, "")})
	const run = 5 * time.Second
	ctx, cancel := context.WithTimeout(context.Background(), run+10*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, wrk, "-t1", "-c50", fmt.Sprintf("-d%ds", int(run.Seconds())), "--timeout", "5s", d.url("/"))
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	time.Sleep(500 * time.Millisecond) // wrk's 50 connections are open and busy
	for hup := 1; hup <= 3; hup++ {
		from := d.logs.len()
		sent := time.Now()
		d.signal(syscall.SIGHUP)
		if _, _, ok := d.logs.waitFor(from, run, msgIs("reload finished")); !ok {
			t.Fatalf("HUP %d: no \"reload finished\"", hup)
		}
		// The retired workers have drained: their connections are gone.
		for _, l := range d.logs.snapshot()[from:] {
			if l.msg() != "worker retiring" {
				continue
			}
			pid := l.int("pid")
			if _, _, ok := d.logs.waitFor(from, run, func(l logLine) bool { return l.msg() == "worker exited" && l.int("pid") == pid }); !ok {
				t.Fatalf("HUP %d: retired worker %d did not exit", hup, pid)
			}
		}
		t.Logf("HUP %d: reloaded and drained in %v", hup, time.Since(sent).Round(time.Millisecond))
	}
	if time.Since(began) > run-500*time.Millisecond {
		t.Fatalf("the reloads took %v, too close to wrk's %v to have run under load", time.Since(began), run)
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
		t.Fatalf("wrk -c50 across 3 HUPs: %d requests, errors %v; want none\n%s", requests, errs, out.String())
	}
	for _, l := range d.logs.snapshot() {
		if l.msg() == "worker crashed" {
			t.Errorf("%s", l.raw)
		}
	}
}

var (
	wrkRequests     = regexp.MustCompile(`(?m)^\s*(\d+) requests in `)
	wrkSocketErrors = regexp.MustCompile(`(?m)^\s*Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)`)
	wrkNon2xx       = regexp.MustCompile(`(?m)^\s*Non-2xx or 3xx responses: (\d+)`)
)

// wrkResults reads wrk's summary: the number of requests, and every
// nonzero error count by kind. wrk prints the error lines only when there
// were errors.
func wrkResults(out string) (requests int, errs map[string]int, err error) {
	m := wrkRequests.FindStringSubmatch(out)
	if m == nil {
		return 0, nil, fmt.Errorf("no request count")
	}
	requests, _ = strconv.Atoi(m[1])
	errs = map[string]int{}
	if m := wrkSocketErrors.FindStringSubmatch(out); m != nil {
		for i, kind := range []string{"connect", "read", "write", "timeout"} {
			if n, _ := strconv.Atoi(m[i+1]); n > 0 {
				errs[kind] = n
			}
		}
	} else if strings.Contains(out, "Socket errors") {
		return 0, nil, fmt.Errorf("an unreadable socket error line")
	}
	if m := wrkNon2xx.FindStringSubmatch(out); m != nil {
		if n, _ := strconv.Atoi(m[1]); n > 0 {
			errs["non-2xx"] = n
		}
	} else if strings.Contains(out, "Non-2xx") {
		return 0, nil, fmt.Errorf("an unreadable non-2xx line")
	}
	return requests, errs, nil
}
