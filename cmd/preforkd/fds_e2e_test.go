//go:build linux

package main

// End-to-end tests of a worker out of file descriptors: on every engine
// and port, it says so in a log line a second at most, spends no CPU
// retrying accept, keeps serving the connections it has, answers a
// request whose upstream connection it cannot open with a 502, is not
// taken for a dead worker, and accepts again on its own once
// descriptors are free.

import (
	"bufio"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/preforkd/preforkd/internal/tlstest"
)

func TestWorkerOutOfDescriptors(t *testing.T) {
	// Every request to /fresh ends its upstream connection, so that the
	// next needs a new one.
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Connection", "close")
		io.WriteString(w, "ok")
	}))
	t.Cleanup(up.Close)
	server := fmt.Sprintf("upstream = %q\nread_header_timeout = \"60s\"\nidle_timeout = \"60s\"", up.URL)
	for _, tc := range []struct {
		name  string
		start func(t *testing.T) (d *daemon, addr string, tlsConf *tls.Config)
	}{
		{"loop", func(t *testing.T) (*daemon, string, *tls.Config) {
			d := startDaemon(t, daemonOptions{config: baseServer(1, server+"\nengine = \"loop\"")})
			return d, d.addr, nil
		}},
		{"fasthttp", func(t *testing.T) (*daemon, string, *tls.Config) {
			d := startDaemon(t, daemonOptions{config: baseServer(1, server+"\nengine = \"fasthttp\"")})
			return d, d.addr, nil
		}},
		{"tls", func(t *testing.T) (*daemon, string, *tls.Config) {
			d, ca := startFDTLSDaemon(t, server, "")
			return d, d.addr, &tls.Config{ServerName: "a.example", RootCAs: ca.Pool}
		}},
		{"cleartext-beside-tls", func(t *testing.T) (*daemon, string, *tls.Config) {
			clear := freeAddr(t)
			d, _ := startFDTLSDaemon(t, server, fmt.Sprintf("cleartext_listen = %q\ncleartext = \"serve\"\n", clear))
			return d, clear, nil
		}},
	} {
		t.Run(tc.name, parallel(func(t *testing.T) {
			d, addr, tlsConf := tc.start(t)
			outOfDescriptors(t, d, addr, tlsConf)
		}))
	}
}

// startFDTLSDaemon starts a one-worker TLS daemon (a.example) with
// further [tls] lines tlsKeys.
func startFDTLSDaemon(t *testing.T, server, tlsKeys string) (*daemon, *tlstest.CA) {
	ca := tlstest.NewCA(t)
	cert, key := ca.Files(t, t.TempDir(), "a", "a.example")
	cfg := baseServer(1, server) + fmt.Sprintf("\n[tls]\n%s[[tls.certificate]]\ncert = %q\nkey = %q\n", tlsKeys, cert, key)
	return startDaemon(t, daemonOptions{config: noCanary(cfg)}), ca
}

// outOfDescriptors runs the story against d's one worker, serving at addr
// (TLS when tlsConf is set).
func outOfDescriptors(t *testing.T, d *daemon, addr string, tlsConf *tls.Config) {
	pids := d.workerPIDs()
	if len(pids) != 1 {
		t.Fatalf("workers %v, want one", pids)
	}
	worker := pids[0]
	dial := func() (net.Conn, error) {
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil || tlsConf == nil {
			return c, err
		}
		tc := tls.Client(c, tlsConf)
		tc.SetDeadline(time.Now().Add(5 * time.Second))
		if err := tc.Handshake(); err != nil {
			c.Close()
			return nil, err
		}
		tc.SetDeadline(time.Time{})
		return tc, nil
	}
	request := func(c net.Conn, br *bufio.Reader, path string) int {
		t.Helper()
		c.SetDeadline(time.Now().Add(10 * time.Second))
		defer c.SetDeadline(time.Time{})
		if _, err := fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: a.example\r\n\r\n", path); err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}

	// A keep-alive connection opened before: it must go on being served.
	held, err := dial()
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	heldBr := bufio.NewReader(held)
	if code := request(held, heldBr, "/fresh"); code != 200 {
		t.Fatalf("before: %d", code)
	}

	// What it spends idle with a connection open, for the log.
	const window = 3 * time.Second
	idleAt := cpuTicks(t, worker)
	time.Sleep(window)
	idle := cpuTicks(t, worker) - idleAt

	// The worker gets a few descriptors more than it has, then clients
	// take them all, and more wait in the listen queue.
	const room = 16
	from := d.logs.len()
	limit, release, _ := exhaust(t, worker, room, 2*room, addr)
	if _, _, ok := d.logs.waitFor(from, 10*time.Second, func(l logLine) bool {
		return strings.Contains(l.msg(), "accepting a connection failed")
	}); !ok {
		t.Fatalf("no warning that accept failed; the worker holds %d descriptors of %d", openFiles(t, worker), limit)
	}

	// Out of descriptors for 3 s: little CPU, few log lines.
	logsAt, cpuAt := d.logs.len(), cpuTicks(t, worker)
	time.Sleep(window)
	ticks := cpuTicks(t, worker) - cpuAt
	var warnings int
	for _, l := range d.logs.snapshot()[logsAt:] {
		if l.get("level") == "WARN" || l.get("level") == "warn" {
			warnings++
		}
	}
	t.Logf("out of descriptors for %v: %d CPU ticks (of %d a second; %d idle before), %d warnings, %d descriptors open of %d",
		window, ticks, clockTicks, idle, warnings, openFiles(t, worker), limit)
	if ticks > clockTicks/2 { // half a second of CPU in 3 s: it spins
		t.Errorf("the worker used %d CPU ticks in %v out of descriptors, want at most %d", ticks, window, clockTicks/2)
	}
	if warnings > int(window/time.Second)+1 {
		t.Errorf("%d warnings in %v out of descriptors, want at most one a second:\n%s", warnings, window, d.logs.text())
	}

	// The connection it has is still served: a request its worker answers
	// is a 200, one whose upstream connection it cannot open a 502.
	if code := request(held, heldBr, "/fresh"); code != http.StatusBadGateway && code != http.StatusServiceUnavailable {
		t.Errorf("a request needing an upstream connection, out of descriptors: %d, want 502 or 503", code)
	}

	// Descriptors freed: it accepts again on its own, the same worker.
	release()
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := dial()
		if err == nil {
			code := request(c, bufio.NewReader(c), "/fresh")
			c.Close()
			if code == 200 {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("not served again 10s after the descriptors were freed: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if now := d.workerPIDs(); len(now) != 1 || now[0] != worker {
		t.Errorf("workers %v after, want the same one %d", now, worker)
	}
	for _, l := range d.logs.snapshot() {
		if strings.Contains(l.msg(), "crash") || strings.Contains(l.msg(), "unresponsive") {
			t.Errorf("%s", l.raw)
		}
	}
}

// clockTicks is USER_HZ, the unit of /proc/PID/stat's times: 100 on every
// Linux architecture Go runs on.
const clockTicks = 100

// cpuTicks is the CPU time pid spent, user and system, in clock ticks.
func cpuTicks(t *testing.T, pid int) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	// The fields after the command, which is in parentheses and may
	// hold spaces: state is field 3, utime 14, stime 15.
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	u, _ := strconv.Atoi(f[11])
	s, _ := strconv.Atoi(f[12])
	return u + s
}

// A supervisor out of descriptors says so when its admin endpoint cannot
// accept, once a second at most, spends no CPU on it, and answers again
// once the clients let go.
func TestAdminOutOfDescriptors(t *testing.T) {
	t.Parallel()
	d := startDaemon(t, daemonOptions{config: baseServer(1, "") + adminSection, admin: true})
	sup := d.pid()
	const room = 4
	from := d.logs.len()
	limit, release, _ := exhaust(t, sup, room, 4*room, d.admin)
	if _, _, ok := d.logs.waitFor(from, 10*time.Second, func(l logLine) bool {
		return strings.Contains(l.raw, "too many open files")
	}); !ok {
		t.Fatalf("no line says the admin endpoint is out of descriptors; the supervisor holds %d of %d", openFiles(t, sup), limit)
	}
	const window = 3 * time.Second
	logsAt, cpuAt := d.logs.len(), cpuTicks(t, sup)
	time.Sleep(window)
	ticks := cpuTicks(t, sup) - cpuAt
	var lines int
	for _, l := range d.logs.snapshot()[logsAt:] {
		if strings.Contains(l.raw, "too many open files") {
			lines++
		}
	}
	t.Logf("supervisor out of descriptors for %v: %d CPU ticks, %d lines about it", window, ticks, lines)
	if ticks > clockTicks/2 {
		t.Errorf("the supervisor used %d CPU ticks in %v out of descriptors, want at most %d", ticks, window, clockTicks/2)
	}
	if lines > int(window/time.Second)+1 {
		t.Errorf("%d lines in %v about the admin endpoint out of descriptors, want at most one a second", lines, window)
	}
	release()
	c := newClient(t, nil, false)
	deadline := time.Now().Add(10 * time.Second)
	for r := get(c, "http://"+d.admin+"/healthz"); r.status != 200; r = get(c, "http://"+d.admin+"/healthz") {
		if time.Now().After(deadline) {
			t.Fatalf("/healthz once the clients let go: %d %v", r.status, r.err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if pids := d.workerPIDs(); len(pids) != 1 {
		t.Errorf("workers started: %v, want the first alone", pids)
	}
}

// A supervisor out of descriptors when it stops (its admin endpoint
// took the last ones, and takes those its workers gave back) still
// writes its dump, whole.
func TestDumpOutOfDescriptors(t *testing.T) {
	t.Parallel()
	dump := filepath.Join(t.TempDir(), "dump")
	cfg := baseServer(1, "") + adminSection + fmt.Sprintf("\n[persist]\npath = %q\n", dump) + rule("one", "/one", "gcra", 1, "1h")
	d := startDaemon(t, daemonOptions{config: cfg, admin: true})
	c := newClient(t, nil, false)
	get(c, d.url("/one"))
	if r := get(c, d.url("/one")); r.status != 429 {
		t.Fatalf("second /one: %d", r.status)
	}
	sup := d.pid()
	const room = 4
	limit, _, _ := exhaust(t, sup, room, 8*room, d.admin)
	waitOutOfDescriptors(t, d, sup, limit)
	d.signal(unix.SIGTERM)
	if _, ok := d.wait(20 * time.Second); !ok {
		t.Fatal("the supervisor did not exit")
	}
	if !strings.Contains(d.logs.text(), `msg="dump written"`) {
		t.Errorf("no dump written:\n%s", d.logs.text())
	}
	for _, l := range d.logs.snapshot() {
		if strings.HasPrefix(l.msg(), "persist: out of descriptors") {
			t.Logf("%s", l.raw)
		}
	}
	if code, out, errOut := runBinary(t, "inspect", dump); code != 0 {
		t.Errorf("inspect %s: %d\n%s%s", dump, code, out, errOut)
	}
}

// USR2 to a supervisor out of descriptors fails, says so, and leaves it
// serving as before; once descriptors are free, the next USR2 upgrades.
func TestUpgradeOutOfDescriptors(t *testing.T) {
	t.Parallel()
	d := startDaemon(t, daemonOptions{config: noCanary(baseServer(1, "")) + adminSection, admin: true})
	sup := d.pid()
	const room = 16 // what the upgrade needs, once the clients let go
	before := openFiles(t, sup)
	limit, release, restore := exhaust(t, sup, room, 3*room, d.admin)
	waitOutOfDescriptors(t, d, sup, limit)
	from := d.logs.len()
	d.signal(unix.SIGUSR2)
	_, l, ok := d.logs.waitFor(from, 10*time.Second, func(l logLine) bool {
		return strings.HasPrefix(l.msg(), "upgrade failed") || strings.HasPrefix(l.msg(), "upgrade refused") || strings.HasPrefix(l.msg(), "upgrade begun")
	})
	if !ok {
		t.Fatalf("no line about the upgrade within 10s:\n%s", d.logs.text())
	}
	t.Logf("USR2 out of descriptors: %s", l.raw)
	c := newClient(t, nil, false)
	if r := get(c, d.url("/")); r.status != 200 {
		t.Errorf("after USR2 out of descriptors: %d %v", r.status, r.err)
	}
	if _, state := procStat(sup); state == 0 || state == 'Z' {
		t.Fatal("the supervisor exited")
	}
	release()
	// The failed upgrade left nothing open: what it had opened is closed.
	for deadline := time.Now().Add(5 * time.Second); openFiles(t, sup) > before; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the supervisor holds %d descriptors once its clients are gone, %d before the failed upgrade", openFiles(t, sup), before)
		}
	}
	// Its descriptors back: the admin endpoint still takes, for a moment,
	// the connections of the flood left in its backlog, so the limit goes
	// back up rather than the test race them.
	restore()
	newPID := upgrade(t, d)
	stopPID(t, d, newPID)
}

// A worker that dies while its supervisor is out of descriptors is
// replaced once they are free: meanwhile the supervisor says why it
// cannot start one, without spinning, and does not give up.
func TestRespawnOutOfDescriptors(t *testing.T) {
	t.Parallel()
	d := startDaemon(t, daemonOptions{config: baseServer(1, "") + adminSection, admin: true})
	sup := d.pid()
	const room = 4
	// More than the worker's descriptors will give back when it dies.
	limit, release, _ := exhaust(t, sup, room, 16*room, d.admin)
	waitOutOfDescriptors(t, d, sup, limit)
	from := d.logs.len()
	if err := unix.Kill(d.workerPIDs()[0], unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	const window = 3 * time.Second
	time.Sleep(500 * time.Millisecond)
	cpuAt, logsAt := cpuTicks(t, sup), d.logs.len()
	time.Sleep(window)
	ticks := cpuTicks(t, sup) - cpuAt
	lines := d.logs.len() - logsAt
	var started int
	for _, l := range d.logs.snapshot()[from:] {
		if l.msg() == "worker started" {
			started++
		}
	}
	t.Logf("worker killed, supervisor out of descriptors for %v: %d CPU ticks, %d log lines, %d workers started",
		window, ticks, lines, started)
	if lines > 2*int(window/time.Second)+2 { // the admin's line and the start's, each backing off
		t.Errorf("%d log lines in %v:\n%s", lines, window, d.logs.text())
	}
	if ticks > clockTicks/2 {
		t.Errorf("the supervisor used %d CPU ticks in %v", ticks, window)
	}
	release()
	if _, _, ok := d.logs.waitFor(from, 30*time.Second, msgIs("worker started")); !ok {
		t.Fatalf("no worker started once descriptors were free")
	}
	c := newClient(t, nil, false)
	deadline := time.Now().Add(10 * time.Second)
	for r := get(c, d.url("/")); r.status != 200; r = get(c, d.url("/")) {
		if time.Now().After(deadline) {
			t.Fatalf("not served after the respawn: %d %v", r.status, r.err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// exhaust gives process pid room descriptors more than it holds (its
// soft limit: raising a hard one back takes a privilege a container may
// not give), then opens n connections to addr, which take them all and
// wait in its listen queue. It returns the limit, a function that closes
// the connections (the test's end does too) and one that puts the limit
// back.
func exhaust(t *testing.T, pid, room, n int, addr string) (limit uint64, release, restore func()) {
	t.Helper()
	var was unix.Rlimit
	if err := unix.Prlimit(pid, unix.RLIMIT_NOFILE, nil, &was); err != nil {
		t.Fatal(err)
	}
	limit = uint64(openFiles(t, pid) + room)
	if err := unix.Prlimit(pid, unix.RLIMIT_NOFILE, &unix.Rlimit{Cur: limit, Max: was.Max}, nil); err != nil {
		t.Fatal(err)
	}
	var conns []net.Conn
	release = func() {
		for _, c := range conns {
			c.Close()
		}
		conns = nil
	}
	t.Cleanup(release)
	for i := range n {
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
		conns = append(conns, c)
	}
	restore = func() {
		if err := unix.Prlimit(pid, unix.RLIMIT_NOFILE, &was, nil); err != nil {
			t.Fatal(err)
		}
	}
	return limit, release, restore
}

// waitOutOfDescriptors waits for d's log to say that the supervisor sup,
// whose limit is limit, ran out of descriptors.
func waitOutOfDescriptors(t *testing.T, d *daemon, sup int, limit uint64) {
	t.Helper()
	if _, _, ok := d.logs.waitFor(0, 10*time.Second, func(l logLine) bool {
		return strings.Contains(l.raw, "too many open files")
	}); !ok {
		t.Fatalf("the supervisor is not out of descriptors: %d of %d", openFiles(t, sup), limit)
	}
}
