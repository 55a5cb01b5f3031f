//go:build linux

package main

// End-to-end tests of the daemon as an operator runs it:
// reloads under keep-alive load and the admin listener under a connection
// flood. Against the built binary.

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
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
		waitRetired(t, d, from) // the retired workers have drained: their connections are gone
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

// 10,000 keep-alive connections to the admin listener, left idle, take at
// most its cap of the supervisor's descriptors (each new one takes the
// slot of the one idle longest), and the supervisor still
// reloads (HUP to "reload finished") in under a second.
func TestAdminConnectionFlood(t *testing.T) {
	t.Parallel()
	const flood = 10_000
	needOpenFiles(t, flood+1000)
	// The reload is timed: without a canary, whose window would be most of it.
	cfg := noCanary(baseServer(2, "")) + "\n[admin]\nlisten = \"ADMIN_ADDR\"\n"
	d := startDaemon(t, daemonOptions{config: cfg, admin: true})
	before := openFiles(t, d.pid())

	conns := make([]net.Conn, flood)
	t.Cleanup(func() {
		for _, c := range conns {
			if c != nil {
				c.Close()
			}
		}
	})
	var wg sync.WaitGroup
	var dialErrs atomic.Int64
	next := atomic.Int64{}
	for range 16 {
		wg.Go(func() {
			dialer := net.Dialer{Timeout: 5 * time.Second}
			for i := int(next.Add(1) - 1); i < flood; i = int(next.Add(1) - 1) {
				c, err := dialer.Dial("tcp", d.admin)
				if err != nil {
					dialErrs.Add(1)
					continue
				}
				conns[i] = c
				// One request, then silence: an idle keep-alive connection.
				// Past the cap the write may meet a closed connection.
				c.SetWriteDeadline(time.Now().Add(time.Second))
				io.WriteString(c, "GET /status HTTP/1.1\r\nHost: admin\r\n\r\n")
			}
		})
	}
	wg.Wait()
	if n := dialErrs.Load(); n > 0 {
		t.Fatalf("%d of %d connections could not be opened", n, flood)
	}
	during := openFiles(t, d.pid())
	t.Logf("supervisor descriptors: %d before, %d with %d admin connections open", before, during, flood)
	if during > before+defaultAdminLimits.maxConns+8 {
		t.Errorf("the supervisor holds %d descriptors with %d admin connections open (%d before): more than the cap of %d",
			during, flood, before, defaultAdminLimits.maxConns)
	}
	from := d.logs.len()
	sent := time.Now()
	d.signal(syscall.SIGHUP)
	if _, _, ok := d.logs.waitFor(from, 10*time.Second, msgIs("reload finished")); !ok {
		t.Fatal("no \"reload finished\" within 10s of HUP")
	}
	took := time.Since(sent)
	t.Logf("reload with %d admin connections open: %v", flood, took.Round(time.Millisecond))
	if took >= time.Second {
		t.Errorf("the reload took %v, want under 1s", took)
	}
	if _, _, ok := d.logs.waitFor(0, time.Second, func(l logLine) bool {
		return strings.HasPrefix(l.msg(), "admin: connection limit reached")
	}); !ok {
		t.Error("no warning that admin connections were closed")
	}

	// Once the clients let go, the endpoint answers again.
	for _, c := range conns {
		c.Close()
	}
	c := newClient(t, nil, false)
	deadline := time.Now().Add(5 * time.Second)
	for r := get(c, "http://"+d.admin+"/status"); r.status != 200; r = get(c, "http://"+d.admin+"/status") {
		if time.Now().After(deadline) {
			t.Fatalf("/status after the flood: %d %v", r.status, r.err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// needOpenFiles raises this test process's soft open-file limit to at
// least n, or fails the test.
func needOpenFiles(t *testing.T, n uint64) {
	t.Helper()
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	if lim.Cur >= n {
		return
	}
	if lim.Max < n {
		t.Fatalf("the hard open-file limit is %d; this test needs %d descriptors", lim.Max, n)
	}
	lim.Cur = lim.Max
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
}

// openFiles counts a process's open descriptors.
func openFiles(t *testing.T, pid int) int {
	t.Helper()
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatal(err)
	}
	return len(fds)
}
