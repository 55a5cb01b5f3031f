package main

// End-to-end tests of what an operator meets in the first week: the
// memory an instance maps, its health check, its admin socket, its
// metrics of the worker processes.

import (
	"bufio"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/preforkd/preforkd/config"
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

// admin.listen = "unix:PATH": the socket is made with mode 0600 over a
// stale one a killed supervisor left, answers the admin paths (problem+json
// 404 and 405 for what no route serves), `preforkd health` reads it, a
// second instance refuses to take it over, and it is gone after the
// drain.
func TestAdminUnixSocket(t *testing.T) {
	t.Parallel()
	sock := filepath.Join(t.TempDir(), "admin.sock")
	// What a supervisor killed with -9 leaves: a socket file nobody
	// accepts on.
	stale, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	stale.SetUnlinkOnClose(false)
	stale.Close()

	cfg := "[server]\nworkers = 1\nshutdown_timeout = \"10s\"\n[admin]\nlisten = \"unix:" + sock + "\"\n"
	d := startDaemon(t, daemonOptions{config: cfg})
	fi, err := os.Lstat(sock)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Type() != os.ModeSocket || fi.Mode().Perm() != 0o600 {
		t.Errorf("%s: mode %v, want a socket of mode 0600", sock, fi.Mode())
	}
	c, base := adminClient("unix:"+sock, 5*time.Second)
	for path, want := range map[string]int{"/healthz": 200, "/readyz": 200, "/metrics": 200, "/status": 200} {
		if r := get(c, base+path); r.status != want {
			t.Errorf("GET %s on the socket: %d %v, want %d", path, r.status, r.err, want)
		}
	}
	r := get(c, base+"/nope")
	if r.status != 404 || r.header.Get("Content-Type") != "application/problem+json" || !strings.Contains(string(r.body), `"status":404`) {
		t.Errorf("GET /nope: %d %q %s, want a problem+json 404", r.status, r.header.Get("Content-Type"), r.body)
	}
	r = do(c, http.MethodPost, base+"/healthz", nil)
	if r.status != 405 || r.header.Get("Content-Type") != "application/problem+json" || r.header.Get("Allow") != "GET, HEAD" {
		t.Errorf("POST /healthz: %d %q Allow %q %s, want a problem+json 405 with Allow: GET, HEAD", r.status, r.header.Get("Content-Type"), r.header.Get("Allow"), r.body)
	}
	if code, out, errs := runBinary(t, "health", "-admin", "unix:"+sock); code != 0 || strings.TrimSpace(out) != "ready" {
		t.Errorf("preforkd health on the socket: exit %d, %q %q; want 0 and ready", code, out, errs)
	}

	// A second instance on the same socket fails to start and leaves it.
	second := filepath.Join(t.TempDir(), "second.toml")
	os.WriteFile(second, []byte(cfg), 0o600)
	code, _, errs := runBinary(t, "run", "-config", second, "-listen", freeAddr(t))
	if code == 0 || !strings.Contains(errs, "another process serves on this socket") {
		t.Errorf("a second instance on the socket: exit %d, stderr:\n%s", code, errs)
	}
	if r := get(c, base+"/healthz"); r.status != 200 {
		t.Errorf("the first instance's socket after the second failed: %d %v", r.status, r.err)
	}

	d.stop()
	if _, err := os.Lstat(sock); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("%s after the drain: %v, want it removed", sock, err)
	}
}

// An admin.listen socket that cannot be made (its directory missing, not
// a directory or not writable, or a file that is not a socket at its
// path, which the listener never replaces) stops check and run with exit
// 2 naming the path and why, as a persist.path that cannot be written
// does: check must not call ok a file that run then refuses.
func TestAdminSocketDirCheckedAtStart(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	notDir := filepath.Join(dir, "file")
	os.WriteFile(notDir, nil, 0o600)
	notSocket := filepath.Join(dir, "admin.sock")
	os.WriteFile(notSocket, []byte("not a socket"), 0o600)
	for _, tc := range []struct {
		name, sock, reason string
	}{
		{"missing directory", filepath.Join(dir, "missing", "admin.sock"), "does not exist"},
		{"not a directory", filepath.Join(notDir, "admin.sock"), "is not a directory"},
		{"not writable", "/proc/self/admin.sock", "is not writable"}, // not even by root
		{"a file that is not a socket", notSocket, "is not a socket"},
		{"a directory", dir, "is not a socket"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cfg := filepath.Join(t.TempDir(), "preforkd.toml")
			os.WriteFile(cfg, []byte(fmt.Sprintf("[admin]\nlisten = %q\n", "unix:"+tc.sock)), 0o600)
			for _, args := range [][]string{
				{"check", "-config", cfg},
				{"run", "-config", cfg, "-listen", freeAddr(t)},
			} {
				code, stdout, stderr := runBinary(t, args...)
				if code != 2 || !strings.Contains(stderr, tc.sock) || !strings.Contains(stderr, tc.reason) || strings.Contains(stdout, "ok") {
					t.Fatalf("preforkd %s: exit %d, want 2 naming %q and %q\nstdout: %s\nstderr: %s",
						args[0], code, tc.sock, tc.reason, stdout, stderr)
				}
			}
		})
	}
}

// A file at the socket's path that is not a socket is never removed.
func TestAdminSocketOverAFile(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "admin.sock")
	if err := os.WriteFile(path, []byte("not a socket"), 0o600); err != nil {
		t.Fatal(err)
	}
	if ln, err := listenAdmin("unix:" + path); err == nil {
		ln.Close()
		t.Fatal("listenAdmin replaced a regular file")
	}
	if b, err := os.ReadFile(path); err != nil || string(b) != "not a socket" {
		t.Fatalf("the file: %q %v", b, err)
	}
}

// 80 connections from one client that send their header a byte at a
// time cannot keep /healthz and /readyz from answering, nor `preforkd
// health` from exiting 0: a new connection takes the slot of the one
// that has waited longest for a request.
func TestAdminSlowloris(t *testing.T) {
	t.Parallel()
	cfg := "[server]\nworkers = 1\nshutdown_timeout = \"10s\"\n" + adminSection
	d := startDaemon(t, daemonOptions{config: cfg, admin: true})
	stop := make(chan struct{})
	var wg sync.WaitGroup
	t.Cleanup(func() {
		close(stop)
		wg.Wait()
	})
	var open atomic.Int64
	for range 80 {
		c, err := net.Dial("tcp", d.admin)
		if err != nil {
			t.Fatal(err)
		}
		open.Add(1)
		wg.Go(func() {
			defer c.Close()
			defer open.Add(-1)
			header := "GET /status HTTP/1.1\r\nHost: admin\r\nX-Slow: " + strings.Repeat("a", 1000)
			for i := 0; ; i = (i + 1) % len(header) {
				c.SetWriteDeadline(time.Now().Add(time.Second))
				if _, err := c.Write([]byte{header[i]}); err != nil {
					return // closed by the server
				}
				select {
				case <-stop:
					return
				case <-time.After(100 * time.Millisecond):
				}
			}
		})
	}
	time.Sleep(300 * time.Millisecond) // every one of them has connected and sends
	c := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true}}
	for i := range 5 {
		for _, path := range []string{"/healthz", "/readyz"} {
			if r := get(c, "http://"+d.admin+path); r.status != 200 {
				t.Fatalf("round %d: GET %s with 80 slow connections open: %d %v", i, path, r.status, r.err)
			}
		}
	}
	if code, out, errs := runBinary(t, "health", "-admin", d.admin); code != 0 {
		t.Errorf("preforkd health with 80 slow connections open: exit %d %q %q", code, out, errs)
	}
	t.Logf("slow connections still open: %d of 80", open.Load())
}

// preforkd health exits 0 with "ready" while the instance serves, 1 with
// the reason once it drains or when nothing answers.
func TestHealthCommand(t *testing.T) {
	t.Parallel()
	code, _, errs := runBinary(t, "health", "-admin", freeAddr(t))
	if code != 1 || !strings.Contains(errs, "connection refused") {
		t.Errorf("health with nothing listening: exit %d, %q; want 1 and the reason", code, errs)
	}
	entered, release := make(chan struct{}, 1), make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		entered <- struct{}{}
		<-release
	}))
	t.Cleanup(up.Close)
	var releaseOnce sync.Once
	t.Cleanup(func() { releaseOnce.Do(func() { close(release) }) })
	cfg := fmt.Sprintf("[server]\nworkers = 1\nshutdown_timeout = \"10s\"\nupstream = %q\n", up.URL) + adminSection
	d := startDaemon(t, daemonOptions{config: cfg, admin: true})
	if code, out, errs := runBinary(t, "health", "-admin", d.admin); code != 0 || out != "ready\n" {
		t.Errorf("health of a ready instance: exit %d, %q %q; want 0 and ready", code, out, errs)
	}
	// A request in flight holds the drain open: /readyz answers 503
	// during it.
	go get(newClient(t, nil, false), d.url("/slow"))
	select {
	case <-entered:
	case <-time.After(5 * time.Second):
		t.Fatal("the request did not reach the upstream")
	}
	d.signal(syscall.SIGTERM)
	deadline := time.Now().Add(5 * time.Second)
	for {
		code, _, errs := runBinary(t, "health", "-admin", d.admin)
		if code == 1 && strings.Contains(errs, "503 not ready: draining") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("health while draining: exit %d, %q; want 1 and 503 not ready: draining", code, errs)
		}
		time.Sleep(20 * time.Millisecond)
	}
	releaseOnce.Do(func() { close(release) })
}

// check warns, on stderr, about an admin.listen that other hosts may
// reach; not about loopback or a unix socket.
func TestCheckWarnsAboutAdminListen(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for listen, warn := range map[string]bool{
		"0.0.0.0:9901":        true,
		":9901":               true,
		"192.0.2.10:9901":     true,
		"127.0.0.1:9901":      false,
		"[::1]:9901":          false,
		"localhost:9901":      false,
		"unix:/run/admin.sck": false,
	} {
		path := filepath.Join(dir, "c.toml")
		os.WriteFile(path, []byte("[admin]\nlisten = \""+listen+"\"\n"), 0o600)
		code, _, errs := runBinary(t, "check", "-config", path)
		if code != 0 {
			t.Errorf("check with admin.listen %q: exit %d: %s", listen, code, errs)
		}
		if got := strings.Contains(errs, "warning: admin.listen"); got != warn {
			t.Errorf("check with admin.listen %q: warning %v, want %v; stderr %q", listen, got, warn, errs)
		}
	}
}

// The image's HEALTHCHECK asks the address that the configuration it
// ships (examples/preforkd.toml) serves the admin endpoint on, and its
// command exits 0 against an instance running that configuration;
// .dockerignore keeps the repository's history and builds out of the
// build context.
func TestDockerfileHealthcheck(t *testing.T) {
	t.Parallel()
	dockerfile, err := os.ReadFile("../../examples/Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	var args []string
	for line := range strings.Lines(strings.ReplaceAll(string(dockerfile), "\\\n", " ")) {
		if rest, ok := strings.CutPrefix(line, "HEALTHCHECK "); ok {
			_, exec, ok := strings.Cut(rest, "CMD ")
			if !ok || json.Unmarshal([]byte(exec), &args) != nil || len(args) < 2 {
				t.Fatalf("HEALTHCHECK %q: want the exec form, CMD [\"/usr/local/bin/preforkd\", \"health\", ...]", rest)
			}
		}
	}
	if len(args) == 0 || args[0] != "/usr/local/bin/preforkd" || args[1] != "health" {
		t.Fatalf("HEALTHCHECK runs %q, want preforkd health", args)
	}
	cfg, err := config.Load("../../examples/preforkd.toml")
	if err != nil {
		t.Fatal(err)
	}
	asked := defaultAdminAddr
	for i, a := range args {
		if a == "-admin" && i+1 < len(args) {
			asked = args[i+1]
		}
	}
	if asked != cfg.Admin.Listen {
		t.Fatalf("HEALTHCHECK asks %q, the image's configuration serves the admin endpoint on %q", asked, cfg.Admin.Listen)
	}

	// That configuration, on addresses of this test, and the check's
	// command against it.
	text, err := os.ReadFile("../../examples/preforkd.toml")
	if err != nil {
		t.Fatal(err)
	}
	example := strings.Replace(string(text), `listen = "`+cfg.Admin.Listen+`"`, `listen = "ADMIN_ADDR"`, 1)
	d := startDaemon(t, daemonOptions{config: example, admin: true})
	run := slices.Clone(args[1:])
	for i := range run {
		if run[i] == cfg.Admin.Listen {
			run[i] = d.admin
		}
	}
	if code, out, errs := runBinary(t, run...); code != 0 {
		t.Errorf("preforkd %s: exit %d %q %q", strings.Join(run, " "), code, out, errs)
	}

	ignore, err := os.ReadFile("../../.dockerignore")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{".git", "bin"} {
		if !slices.Contains(strings.Fields(string(ignore)), want) {
			t.Errorf(".dockerignore does not list %s", want)
		}
	}
}

// systemd-analyze verify finds nothing wrong with examples/*.service on
// this machine's systemd (with ExecStart pointing at the binary under
// test: the unit expects it installed in /usr/local/bin). The unit is
// Type=notify with an ExecReload, which systemd 252 knows; the
// notify-reload drop-in is clean on systemd 253 and later, and on an
// older one draws exactly the complaint it documents.
func TestSystemdUnitsVerify(t *testing.T) {
	t.Parallel()
	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("systemd-analyze is not installed (Debian package systemd), and CI is set")
		}
		t.Skip("systemd-analyze not installed: the units were not verified (install the Debian package systemd)")
	}
	version := systemdVersion(t, analyze)
	units, err := filepath.Glob("../../examples/*.service")
	if err != nil || len(units) == 0 {
		t.Fatalf("no examples/*.service: %v", err)
	}
	verify := func(dir, unit string, text []byte) string {
		t.Helper()
		text = []byte(strings.ReplaceAll(string(text), "/usr/local/bin/preforkd", preforkdBinary(t)))
		path := filepath.Join(dir, unit)
		if err := os.WriteFile(path, text, 0o644); err != nil {
			t.Fatal(err)
		}
		out, _ := exec.Command(analyze, "verify", path).CombinedOutput()
		return strings.TrimSpace(strings.ReplaceAll(string(out), dir+"/", ""))
	}
	for _, u := range units {
		text, err := os.ReadFile(u)
		if err != nil {
			t.Fatal(err)
		}
		if out := verify(t.TempDir(), filepath.Base(u), text); out != "" {
			t.Errorf("systemd-analyze verify %s (systemd %d):\n%s", u, version, out)
		}
		if !strings.Contains(string(text), "\nType=notify\n") || !strings.Contains(string(text), "\nExecReload=/bin/kill -HUP $MAINPID\n") ||
			!strings.Contains(string(text), "\nWatchdogSec=") {
			t.Errorf("%s: want Type=notify, ExecReload=/bin/kill -HUP $MAINPID and a WatchdogSec", u)
		}
	}

	// The socket unit, beside the service it activates.
	socket, err := os.ReadFile("../../examples/preforkd.socket")
	if err != nil {
		t.Fatal(err)
	}
	sdir := t.TempDir()
	service, _ := os.ReadFile("../../examples/preforkd.service")
	verify(sdir, "preforkd.service", service)
	if out := verify(sdir, "preforkd.socket", socket); out != "" {
		t.Errorf("systemd-analyze verify examples/preforkd.socket (systemd %d):\n%s", version, out)
	}

	dropIn, err := os.ReadFile("../../examples/preforkd-notify-reload.conf")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	os.Mkdir(filepath.Join(dir, "preforkd.service.d"), 0o755)
	os.WriteFile(filepath.Join(dir, "preforkd.service.d", "notify-reload.conf"), dropIn, 0o644)
	unit, _ := os.ReadFile("../../examples/preforkd.service")
	out := verify(dir, "preforkd.service", unit)
	switch {
	case version >= 253 && out != "":
		t.Errorf("the unit with the notify-reload drop-in on systemd %d:\n%s", version, out)
	case version < 253 && !regexp.MustCompile(`^preforkd\.service\.d/notify-reload\.conf:\d+: Failed to parse service type, ignoring: notify-reload$`).MatchString(out):
		t.Errorf("the unit with the notify-reload drop-in on systemd %d: want only the complaint about notify-reload, got:\n%s", version, out)
	}
}

// systemdVersion is the version systemd-analyze reports ("systemd 252 (252.38-1~deb12u1)").
func systemdVersion(t *testing.T, analyze string) int {
	t.Helper()
	out, err := exec.Command(analyze, "--version").Output()
	f := strings.Fields(string(out))
	if err != nil || len(f) < 2 {
		t.Fatalf("systemd-analyze --version: %q %v", out, err)
	}
	v, err := strconv.Atoi(f[1])
	if err != nil {
		t.Fatalf("systemd-analyze --version: %q", out)
	}
	return v
}

// /metrics shows each worker process, by its index: resident memory,
// open descriptors and their limit, CPU seconds as /proc shows them, and
// the GC cycles it writes itself; preforkd_reload_last_timestamp_seconds
// is there from the start. promtool accepts the page.
func TestWorkerProcessMetrics(t *testing.T) {
	t.Parallel()
	cfg := "[server]\nworkers = 2\nshutdown_timeout = \"10s\"\n" + adminSection +
		"[table]\ncounters = 1024\nresponses = 256\nresponse_bytes = \"1MiB\"\n[[idempotency]]\npath = \"/orders\"\nmax_body = 1024\nmax_records = 100\n"
	// GOGC=1: a worker collects at every 1% of heap growth, so that the
	// requests below make it collect (the fast engine reuses its buffers:
	// with the default it may not collect for minutes).
	d := startDaemon(t, daemonOptions{config: cfg, admin: true, env: []string{"GOGC=1"}})
	admin := newClient(t, nil, false)
	first := scrapeMetrics(t, admin, d.admin)
	start := first.samples["preforkd_start_time_seconds"]
	if got, ok := first.samples["preforkd_reload_last_timestamp_seconds"]; !ok || got < start || got > start+5 {
		t.Errorf("preforkd_reload_last_timestamp_seconds before any reload: %v (present %v), want the start, %v", got, ok, start)
	}

	// Request bodies of 512 KiB, each read whole for its fingerprint, on
	// new connections that the kernel spreads over the workers.
	body := strings.Repeat("x", 512<<10)
	client := newClient(t, freshClientIP(), false)
	for i := range 60 {
		r := send(client, http.MethodPost, d.url("/orders"), http.Header{"Idempotency-Key": {fmt.Sprintf("k%d", i)}}, body)
		if r.err != nil || r.status != 200 {
			t.Fatalf("POST /orders: %d %v", r.status, r.err)
		}
	}
	var st struct {
		Workers []struct {
			Index int `json:"index"`
			PID   int `json:"pid"`
		} `json:"workers"`
	}
	if r := get(admin, "http://"+d.admin+"/status"); json.Unmarshal(r.body, &st) != nil || len(st.Workers) != 2 {
		t.Fatalf("/status: %s", r.body)
	}
	var p page
	gc := 0.0
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		p, gc = scrapeMetrics(t, admin, d.admin), 0
		for _, w := range st.Workers {
			gc += p.samples[fmt.Sprintf(`preforkd_worker_gc_cycles_total{worker="%d"}`, w.Index)]
		}
		if gc > 0 || time.Now().After(deadline) {
			break
		}
	}
	if gc == 0 {
		t.Errorf("no GC cycle counted for the workers, with GOGC=1, after 60 requests of 512 KiB:\n%s", p.raw)
	}
	totalCPU := 0.0
	for _, w := range st.Workers {
		sample := func(name string) float64 {
			t.Helper()
			v, ok := p.samples[fmt.Sprintf(`%s{worker="%d"}`, name, w.Index)]
			if !ok {
				t.Errorf("no %s for worker %d", name, w.Index)
			}
			return v
		}
		rss, fds, maxFDs, cpu := sample("preforkd_worker_resident_memory_bytes"), sample("preforkd_worker_open_fds"),
			sample("preforkd_worker_max_fds"), sample("preforkd_worker_cpu_seconds_total")
		// What /proc says now.
		now, ok := readProc(w.PID, d.pid())
		if !ok {
			t.Fatalf("worker %d (pid %d) is not in /proc as the supervisor's child", w.Index, w.PID)
		}
		if rss < float64(now.rss)/2 || rss > float64(now.rss)*2 || rss < 1<<20 {
			t.Errorf("worker %d: resident memory %v, /proc says %d", w.Index, rss, now.rss)
		}
		if fds < float64(now.fds)-8 || fds > float64(now.fds)+8 {
			t.Errorf("worker %d: %v open descriptors, /proc says %d", w.Index, fds, now.fds)
		}
		if maxFDs != float64(now.maxFDs) {
			t.Errorf("worker %d: descriptor limit %v, /proc says %d", w.Index, maxFDs, now.maxFDs)
		}
		if cpu > now.cpu+0.01 || cpu < now.cpu-1 {
			t.Errorf("worker %d: %v CPU seconds, /proc says %v", w.Index, cpu, now.cpu)
		}
		totalCPU += cpu
	}
	if totalCPU <= 0 {
		t.Errorf("the workers used no CPU time for 30 MiB of requests")
	}
	if types := p.types; types["preforkd_worker_cpu_seconds_total"] != "counter" || types["preforkd_worker_gc_cycles_total"] != "counter" ||
		types["preforkd_worker_resident_memory_bytes"] != "gauge" {
		t.Errorf("types: %v", types)
	}
	promtoolCheck(t, p.raw)
}

// inspect never prints a key's value: the dump of a rule with an
// override keyed by a customer's API key shows that override by the key's
// hash, and so does the log when a later configuration drops it.
func TestInspectHidesOverrideKeys(t *testing.T) {
	t.Parallel()
	const key = "gold-customer-key"
	dump := filepath.Join(t.TempDir(), "table.dump")
	rules := `
[[ratelimit]]
name = "api"
path = "/api/*"
limit = 100
window = "1m"
by = "header:X-Api-Key|ip"
`
	// A day's window: the key's state stays short of a fresh key's (which
	// a dump leaves out) until well after the shutdown.
	override := "[[ratelimit.override]]\nkey = \"" + key + "\"\nlimit = 1000\nwindow = \"24h\"\n"
	cfg := fmt.Sprintf("[server]\nworkers = 1\nshutdown_timeout = \"10s\"\n[persist]\npath = %q\n", dump) + rules
	d := startDaemon(t, daemonOptions{config: cfg + override})
	if r := do(newClient(t, freshClientIP(), false), http.MethodGet, d.url("/api/things"), http.Header{"X-Api-Key": {key}}); r.status != 200 {
		t.Fatalf("GET /api/things: %d %v", r.status, r.err)
	}
	d.stop()

	code, out, errs := runBinary(t, "inspect", dump)
	sum := sha256.Sum256([]byte(key))
	want := fmt.Sprintf(`rule "api" override key sha256:%x:`, sum[:8])
	if code != 0 || !strings.Contains(out, want) || !strings.Contains(out, "1 entries") {
		t.Errorf("inspect: exit %d, want a line %q with the override's entry:\n%s%s", code, want, out, errs)
	}
	if strings.Contains(out+errs, key) {
		t.Errorf("inspect prints the override's key:\n%s%s", out, errs)
	}

	// The override is gone: its state is dropped at load, and the log
	// names it by the hash.
	d = startDaemon(t, daemonOptions{config: cfg})
	if _, l, ok := d.logs.waitFor(0, 5*time.Second, func(l logLine) bool { return strings.Contains(l.msg(), "override key sha256:") }); !ok {
		t.Errorf("no log line about the dropped override's state:\n%s", d.logs.text())
	} else if strings.Contains(d.logs.text(), key) {
		t.Errorf("the log prints the override's key: %s", l.raw)
	}
}

// The example configuration over the demo application: a path under
// /cacheable/ is sent with Cache-Control, and the example's [[cache]]
// block stores it, so that the second GET, in any worker, is a HIT with
// the first one's body; other paths are not cacheable.
func TestExampleCachesTheDemo(t *testing.T) {
	t.Parallel()
	text, err := os.ReadFile("../../examples/preforkd.toml")
	if err != nil {
		t.Fatal(err)
	}
	example := strings.Replace(string(text), `listen = "127.0.0.1:9901"`, `listen = "ADMIN_ADDR"`, 1)
	d := startDaemon(t, daemonOptions{config: example, admin: true})
	c := newClient(t, freshClientIP(), false)
	first := get(c, d.url("/cacheable/a"))
	if first.status != 200 || first.header.Get("Cache-Control") != "max-age=60" || first.header.Get("X-Cache") != "MISS" {
		t.Fatalf("first GET /cacheable/a: %d, Cache-Control %q, X-Cache %q", first.status, first.header.Get("Cache-Control"), first.header.Get("X-Cache"))
	}
	for i := range 4 { // new connections: the kernel spreads them over the 4 workers
		r := get(c, d.url("/cacheable/a"))
		if r.status != 200 || r.header.Get("X-Cache") != "HIT" || string(r.body) != string(first.body) {
			t.Fatalf("GET %d of /cacheable/a: %d, X-Cache %q, body %s (first: %s)", i+2, r.status, r.header.Get("X-Cache"), r.body, first.body)
		}
	}
	if r := get(c, d.url("/other")); r.header.Get("Cache-Control") != "" || r.header.Get("X-Cache") != "" {
		t.Errorf("GET /other: Cache-Control %q, X-Cache %q; want neither", r.header.Get("Cache-Control"), r.header.Get("X-Cache"))
	}
}

// make run ARGS="…" hands the flags to preforkd run.
func TestMakeRunPassesArgs(t *testing.T) {
	t.Parallel()
	makeTool, err := exec.LookPath("make")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("make is not installed, and CI is set")
		}
		t.Skip("make not installed")
	}
	out, err := exec.Command(makeTool, "-n", "--no-print-directory", "-C", "../..", "run", "ARGS=-workers 2 -shadow").Output()
	if err != nil {
		t.Fatalf("make -n run: %v\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if last := lines[len(lines)-1]; !strings.HasSuffix(last, "run -config examples/preforkd.toml -workers 2 -shadow") {
		t.Errorf("make run ARGS=\"-workers 2 -shadow\" runs %q", last)
	}
}

// A reload whose [log] access names a FIFO that nothing reads (a log
// shipper that died) is refused, saying so, and the supervisor goes on
// answering signals: opening such a FIFO would block its loop for good.
func TestReloadToAnUnreadFIFOIsRefused(t *testing.T) {
	t.Parallel()
	fifo := filepath.Join(t.TempDir(), "access.fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := baseServer(2, "")
	d := startDaemon(t, daemonOptions{config: cfg})
	from := reloadTo(d, cfg+"\n[log]\naccess = \""+fifo+"\"\n")
	_, l, ok := d.logs.waitFor(from, 10*time.Second, msgIs("reload refused: keeping the running configuration"))
	if !ok || !strings.Contains(l.get("err"), "a FIFO that nothing reads") {
		t.Fatalf("the reload was not refused naming the FIFO: %v %s", ok, l.raw)
	}
	d.signal(syscall.SIGTERM)
	if code, exited := d.wait(10 * time.Second); !exited || code != 0 {
		t.Fatalf("TERM after the refused reload: exited %v, code %d", exited, code)
	}
}

// health and tune take the address as admin.listen does: one that is not
// host:port nor unix:PATH (a URL, a host without its port) is a mistake
// on the command line (exit 2), not an instance found unhealthy after a
// DNS lookup of "http" or a dial of port 80.
func TestAdminAddrFlagChecked(t *testing.T) {
	t.Parallel()
	for _, addr := range []string{"http://127.0.0.1:9901", "127.0.0.1", "unix:run/admin.sock"} {
		for _, cmd := range []string{"health", "tune"} {
			code, _, errs := runBinary(t, cmd, "-admin", addr)
			if code != exitUsage || !strings.Contains(errs, "-admin") || !strings.Contains(errs, "usage: preforkd "+cmd) {
				t.Errorf("%s -admin %s: exit %d, stderr %q; want 2 naming -admin, and the usage", cmd, addr, code, errs)
			}
		}
	}
}
