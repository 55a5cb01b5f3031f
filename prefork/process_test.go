//go:build linux

package prefork

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/preforkd/preforkd/bucket"
	"github.com/preforkd/preforkd/internal/cpuquota"
	"github.com/preforkd/preforkd/internal/looptest"
	"github.com/preforkd/preforkd/shm"
)

// Tests with real processes: the supervisor runs in this process (or, to
// be killed, in a child), the workers are this test binary started again.

func TestDrainFinishesInFlightRequest(t *testing.T) {
	var mu sync.Mutex
	var statuses []Status
	h := startSupervisor(t, testConfig(2), true, func(o *Options) {
		o.OnStatus = func(st Status) {
			mu.Lock()
			statuses = append(statuses, st)
			mu.Unlock()
		}
	})
	workers := h.logs.pids("worker started")

	// The headers arrive when the request is in the handler; the body 2s later.
	resp, err := client.Get(h.url + "/slow?d=2s")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	began := time.Now()
	h.signal(unix.SIGTERM)
	type result struct {
		body string
		err  error
	}
	slow := make(chan result, 1)
	go func() {
		b, err := io.ReadAll(resp.Body)
		slow <- result{string(b), err}
	}()

	if err := h.wait(10 * time.Second); err != nil {
		t.Fatalf("Run: %v", err)
	}
	took := time.Since(began)
	r := <-slow
	if r.err != nil || resp.StatusCode != 200 || r.body != "done" {
		t.Fatalf("in-flight request: %d %q %v, want 200 done", resp.StatusCode, r.body, r.err)
	}
	if took < 1500*time.Millisecond {
		t.Errorf("Run returned after %v: before the in-flight request (2s) finished", took)
	}
	if n := len(h.logs.all("worker started")); n != 2 {
		t.Errorf("%d workers started, want 2: none during the drain", n)
	}
	drainAt, _, ok := h.logs.WaitFor(0, 0, func(r record) bool { return r.msg == "drain begun" })
	if !ok {
		t.Fatal(`no "drain begun" line`)
	}
	for _, r := range h.logs.Lines()[drainAt:] {
		if r.msg == "worker started" || r.msg == "worker crashed" {
			t.Errorf("during the drain: %s %v", r.msg, r.attrs)
		}
	}
	if n := len(h.logs.all("drain finished")); n != 1 {
		t.Errorf(`%d "drain finished" lines, want 1`, n)
	}
	exits := h.logs.all("worker exited")
	if len(exits) != 2 {
		t.Errorf("%d worker exits logged, want 2", len(exits))
	}
	for _, e := range exits {
		if e.attrs["status"] != "exit status 0" {
			t.Errorf("worker %d: %v, want exit status 0", e.int("pid"), e.attrs["status"])
		}
	}
	for _, pid := range workers {
		if !processGone(pid) {
			t.Errorf("worker %d still exists after Run returned", pid)
		}
	}
	if _, _, err := h.get("/pid", ""); err == nil {
		t.Error("the listener still accepts after the drain")
	}
	mu.Lock()
	defer mu.Unlock()
	if !slices.ContainsFunc(statuses, func(st Status) bool { return st.Ready && len(st.Workers) == 2 }) {
		t.Errorf("no status with 2 ready workers in %+v", statuses)
	}
	if last := statuses[len(statuses)-1]; !last.Draining || len(last.Workers) != 0 {
		t.Errorf("last status %+v, want draining with no worker", last)
	}
}

// kill -9 of a worker under load: only a request in flight at that
// instant fails, the worker is replaced and reaped in the region, the
// service keeps answering, and the limit stays exact.
func TestKilledWorkerIsReplaced(t *testing.T) {
	const limit = 5
	h := startSupervisor(t, testConfig(2,
		testRule{Name: "exact", Path: "/limited", Limit: limit, Window: time.Hour},
	), true, nil)

	// Load on an unlimited path while the worker dies: two clients, one
	// new connection a request.
	const clients = 2
	load := startLoops(t, h.url, loop{"/pid", client}, loop{"/pid", client})
	defer load.end()

	time.Sleep(200 * time.Millisecond)
	victim, _ := strconv.Atoi(load.last().body) // a worker that is serving this load
	victimIndex := -1
	for _, r := range h.logs.all("worker started") {
		if r.int("pid") == victim {
			victimIndex = r.int("index")
		}
	}
	if victimIndex < 0 {
		t.Fatalf("pid %d from a response is not a worker of this supervisor", victim)
	}
	killAt := time.Now()
	if err := unix.Kill(victim, unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	crash := h.logs.wait(t, "worker crashed", 1, 10*time.Second)[0]
	if crash.int("pid") != victim || crash.attrs["status"] != "signal: killed" {
		t.Fatalf("crash logged as %v, want pid %d killed", crash.attrs, victim)
	}
	started := h.logs.wait(t, "worker started", 3, 10*time.Second)
	replacement := started[2].int("pid")
	if replacement == victim {
		t.Fatal("replacement has the victim's pid")
	}
	h.logs.wait(t, "worker ready", 3, 10*time.Second)
	if inc := h.region.Workers()[victimIndex].Incarnation; inc < 2 {
		t.Errorf("victim's index %d has incarnation %d: not reaped in the region", victimIndex, inc)
	}
	served := load.len()
	time.Sleep(300 * time.Millisecond)
	outcomes := load.end()
	if len(outcomes) == served {
		t.Fatal("no request served after the replacement")
	}
	// Only a request on a connection the dead worker had accepted can
	// fail: one in flight at the instant of the kill, one per client at
	// most. The listening socket is shared: no connection waiting in its
	// queue is lost.
	var failed []string
	for _, o := range outcomes {
		if o.err == nil {
			continue
		}
		failed = append(failed, fmt.Sprintf("%v (started %v after the kill, took %v)", o.err,
			o.start.Sub(killAt).Round(time.Millisecond), o.end.Sub(o.start).Round(time.Millisecond)))
		if o.start.After(killAt.Add(250*time.Millisecond)) || o.end.Before(killAt) {
			t.Errorf("a request failed away from the instant of the kill: %v", o.err)
		}
	}
	t.Logf("load: %d requests, %d failed: %q", len(outcomes), len(failed), failed)
	if len(failed) > clients {
		t.Errorf("%d requests failed, want at most %d (one per client in flight at the kill)", len(failed), clients)
	}

	// The limit is still exact across the workers.
	if got := h.statuses("/limited", "after-crash", 2*limit); got[200] != limit || got[429] != limit {
		t.Fatalf("statuses %v, want exactly %d×200 and %d×429", got, limit, limit)
	}
	// The application resets the client with the limiter of the core its
	// worker built: every worker sees it.
	if code, _, err := h.get("/reset?rule=exact", "after-crash"); err != nil || code != 200 {
		t.Fatalf("/reset: %d %v", code, err)
	}
	if got := h.statuses("/limited", "after-crash", limit+1); got[200] != limit || got[429] != 1 {
		t.Fatalf("after the reset: %v, want exactly %d×200 and 1×429", got, limit)
	}
	if code, _, err := h.get("/reset?rule=nope", "after-crash"); err != nil || code != 404 {
		t.Fatalf("/reset of an unknown rule: %d %v, want 404", code, err)
	}
	if err := h.stop(15 * time.Second); err != nil {
		t.Fatal(err)
	}
}

// kill -9 of the supervisor takes every worker with it, at once: also a
// worker in the middle of a request (a drain would wait for it).
func TestWorkersExitWhenSupervisorIsKilled(t *testing.T) {
	sp := startSupervisorProcess(t, "", testConfig(2))
	workers := sp.logs.pids("worker started")
	// The headers arrive when the request is in the handler; the body 10s later.
	resp, err := client.Get("http://" + sp.addr + "/slow?d=10s")
	if err != nil {
		t.Fatalf("a request to the supervisor's listener: %v", err)
	}
	defer resp.Body.Close()

	sp.Kill()
	// The workers are reparented to this process (a subreaper): wait for them.
	deadline := time.Now().Add(2 * time.Second)
	for _, pid := range workers {
		for {
			var ws unix.WaitStatus
			got, err := unix.Wait4(pid, &ws, unix.WNOHANG, nil)
			if got == pid || errors.Is(err, unix.ECHILD) && processGone(pid) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("worker %d still running 2s after its supervisor was killed", pid)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	// Nobody holds the supervisor's stderr any more.
	if !sp.logs.WaitEnd(5 * time.Second) {
		t.Error("the supervisor's stderr is still open 5s after its workers exited")
	}
}

func TestReload(t *testing.T) {
	setup := func(bLimit int64) testSetup {
		st := testConfig(2,
			testRule{Name: "a", Path: "/a", Limit: 3, Window: time.Hour, Algorithm: bucket.FixedWindow},
			testRule{Name: "b", Path: "/b", Limit: bLimit, Window: time.Hour, Algorithm: bucket.FixedWindow},
			testRule{Name: "c", Path: "/c", Limit: 4, Window: time.Hour, Algorithm: bucket.GCRA},
		)
		st.Settings.Canary.Off = true
		return st
	}
	first := setup(2)
	var mu sync.Mutex
	var given []Settings // the running settings each Reload was given
	next := func(Settings) (Settings, error) { return setup(4).Settings, nil }
	h := startSupervisor(t, first, true, func(o *Options) {
		o.Reload = func(running Settings) (Settings, error) {
			mu.Lock()
			defer mu.Unlock()
			given = append(given, running)
			return next(running)
		}
	})
	expect := func(path, client string, n, ok int) {
		t.Helper()
		if got := h.statuses(path, client, n); got[200] != ok || got[429] != n-ok {
			t.Fatalf("%s for %s: %v, want %d×200 and %d×429", path, client, got, ok, n-ok)
		}
	}
	expect("/a", "k", 2, 2)
	expect("/b", "k", 3, 2)
	expect("/c", "k", 2, 2)

	// Client loops run through the reload: new connections (where a
	// worker that drains could drop one it has accepted), a kept-alive
	// one, and requests held in flight while their worker is told to go.
	// No request may fail.
	keepAlive := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{}}
	defer keepAlive.CloseIdleConnections()
	load := startLoops(t, h.url, loop{"/pid", client}, loop{"/pid", client}, loop{"/pid", client},
		loop{"/pid", keepAlive}, loop{"/slow?d=20ms", client}, loop{"/slow?d=20ms", client})
	defer load.end()
	from := h.logs.Len()
	hupAt := time.Now()
	h.signal(unix.SIGHUP)
	h.logs.wait(t, "reload finished", 1, 20*time.Second)
	finishedAt := time.Now()
	// Let the old workers finish their drain under the loops too.
	exits := h.logs.wait(t, "worker exited", 2, 10*time.Second)
	outcomes := load.end()
	failed, during := 0, 0
	var firstErr error
	for _, o := range outcomes {
		if o.err != nil {
			failed++
			firstErr = cmp.Or(firstErr, o.err)
		}
		if o.end.After(hupAt) && o.start.Before(finishedAt) {
			during++
		}
	}
	t.Logf("loops: %d requests, %d of them during the reload (%v)", len(outcomes), during, finishedAt.Sub(hupAt).Round(time.Millisecond))
	if failed != 0 || len(outcomes) == 0 {
		t.Fatalf("during the reload: %d requests, %d failed (first: %v)", len(outcomes), failed, firstErr)
	}
	if during == 0 {
		t.Errorf("no request overlapped the reload: it proved nothing")
	}
	if n := len(h.logs.all("worker started")); n != 4 {
		t.Errorf("%d workers started, want 2 + 2 replacements", n)
	}
	for _, r := range h.logs.Lines()[from:] {
		if r.msg == "worker started" && r.int("generation") != 1 {
			t.Errorf("the reload started a worker of generation %d, want 1", r.int("generation"))
		}
	}
	for _, e := range exits {
		if e.attrs["status"] != "exit status 0" {
			t.Errorf("retired worker %d: %v", e.int("pid"), e.attrs["status"])
		}
	}
	if n := len(h.logs.all("worker crashed")); n != 0 {
		t.Errorf("%d crashes", n)
	}
	// Replay the log: a worker retires only while the others ready are
	// still 2 (its successor is ready before it is told to drain).
	readySet := map[int]bool{}
	retired := 0
	for _, r := range h.logs.all("") {
		switch r.msg {
		case "worker ready":
			readySet[r.int("pid")] = true
		case "worker retiring":
			retired++
			delete(readySet, r.int("pid"))
			if len(readySet) < 2 {
				t.Errorf("worker %d retired with %d workers left ready, want 2", r.int("pid"), len(readySet))
			}
		case "worker exited", "worker crashed":
			delete(readySet, r.int("pid"))
		}
	}
	if retired != 2 {
		t.Errorf("%d workers retired, want 2", retired)
	}
	// The counts carried over; the new limit applies.
	expect("/a", "k", 2, 1)  // 2 of 3 used before the reload
	expect("/b", "k", 3, 2)  // 2 used, the limit is now 4
	expect("/b", "k2", 5, 4) // a fresh client gets the new limit
	expect("/c", "k", 6, 2)  // unchanged (gcra): 2 of 4 used before

	// A reload that fails (a file that does not load) is refused with its
	// error, and so are settings that are not valid: same workers, same
	// rules.
	mu.Lock()
	if len(given) != 1 || string(given[0].Payload) != string(first.Settings.Payload) || given[0].ShutdownTimeout != 5*time.Second {
		t.Errorf("Reload was given %+v, want once the running settings", given)
	}
	loadErr := errors.New("config: preforkd.toml:3: unknown key \"lisen\"")
	next = func(Settings) (Settings, error) { return setup(100).Settings, loadErr }
	mu.Unlock()
	h.signal(unix.SIGHUP)
	refused := h.logs.wait(t, "reload refused: keeping the running configuration", 1, 10*time.Second)[0]
	if err := fmt.Sprint(refused.attrs["err"]); err != loadErr.Error() {
		t.Errorf("refusal %q, want Reload's error %q", err, loadErr)
	}
	mu.Lock()
	next = func(Settings) (Settings, error) {
		st := setup(100).Settings
		st.MaxRSS = 1 << 20
		return st, nil
	}
	mu.Unlock()
	h.signal(unix.SIGHUP)
	refused = h.logs.wait(t, "reload refused: keeping the running configuration", 2, 10*time.Second)[1]
	if err := fmt.Sprint(refused.attrs["err"]); !strings.Contains(err, "Settings.MaxRSS (server.max_rss)") {
		t.Errorf("refusal %q does not name the bad setting", err)
	}
	if n := len(h.logs.all("reload begun")); n != 1 {
		t.Errorf("%d reloads begun, want 1", n)
	}
	expect("/b", "k3", 5, 4)
	if n := len(h.logs.all("worker started")); n != 4 {
		t.Errorf("%d workers started, want no new one after the refused reloads", n)
	}
	if err := h.stop(15 * time.Second); err != nil {
		t.Fatal(err)
	}
}

func TestCrashLoopBacksOff(t *testing.T) {
	t.Setenv(envTestCrash, "1")
	h := startSupervisor(t, testConfig(1), false, nil)
	time.Sleep(2 * time.Second)
	starts := len(h.logs.all("worker started"))
	crashes := h.logs.all("worker crashed")
	// Delays 100, 200, 400, 800ms: 4 or 5 starts in 2s, never a spin.
	if starts < 3 || starts > 6 {
		t.Errorf("%d starts in 2s of a crash loop, want 3..6", starts)
	}
	for _, c := range crashes {
		if c.attrs["status"] != "exit status 3" {
			t.Errorf("crash logged with status %v", c.attrs["status"])
		}
	}
	if n := len(h.logs.all("ready")); n != 0 {
		t.Errorf("announced ready %d times", n)
	}
	h.signal(unix.SIGTERM)
	if err := h.wait(10 * time.Second); err != nil {
		t.Fatalf("Run after a crash loop: %v", err)
	}
	for _, pid := range h.logs.pids("worker started") {
		if !processGone(pid) {
			t.Errorf("worker %d left behind", pid)
		}
	}
}

// A worker whose Options.Engine fails before the workers were ever ready
// would fail again: Run stops and says so, where a crash is respawned
// (TestCrashLoopBacksOff).
func TestEngineFailureAtStartStops(t *testing.T) {
	t.Setenv(envTestCrash, "engine")
	h := startSupervisor(t, testConfig(2), false, nil)
	err := h.wait(10 * time.Second)
	if err == nil || !strings.Contains(err.Error(), "could not build its engine") {
		t.Fatalf("Run = %v, want the engine failure", err)
	}
	if n := len(h.logs.all("worker started")); n > 2 {
		t.Errorf("%d workers started, want no respawn", n)
	}
	if len(h.logs.all("worker could not build its engine: stopping")) == 0 {
		t.Errorf("no line says why it stops")
	}
	// The other worker failed too, and may be gone before it is told to
	// drain: a worker already gone is no failure to warn about.
	for _, l := range h.logs.all("signalling a worker failed") {
		t.Errorf("a warning about a worker that had exited: %v", l.attrs)
	}
	for _, pid := range h.logs.pids("worker started") {
		if !processGone(pid) {
			t.Errorf("worker %d left behind", pid)
		}
	}
}

// A net/http *http.Server has Engine's methods, but would serve without
// the drain rule and the [server] limits: a worker refuses it as an
// engine that failed, and Run stops.
func TestStdlibServerEngineRefused(t *testing.T) {
	t.Setenv(envTestCrash, "stdlib-server")
	h := startSupervisor(t, testConfig(1), false, nil)
	err := h.wait(10 * time.Second)
	if err == nil || !strings.Contains(err.Error(), "could not build its engine") {
		t.Fatalf("Run = %v, want the engine refused", err)
	}
	if err := checkEngine(&http.Server{}); err == nil || !strings.Contains(err.Error(), "nethttp.NewServer") {
		t.Errorf("checkEngine(*http.Server) = %v, want an error naming nethttp.NewServer", err)
	}
}

// An Options.Engine that panics (a Must function given a bad value, as
// the factory of README's example may call) fails as one that returns
// an error: it would panic again in every worker, so Run stops and says
// why (the worker's stack trace gives the panic), instead of respawning workers
// for ever.
func TestEnginePanicAtStartStops(t *testing.T) {
	t.Setenv(envTestCrash, "engine-panic")
	h := startSupervisor(t, testConfig(2), false, nil)
	err := h.wait(10 * time.Second)
	if err == nil || !strings.Contains(err.Error(), "could not build its engine") {
		t.Fatalf("Run = %v, want the engine failure", err)
	}
	if n := len(h.logs.all("worker started")); n > 2 {
		t.Errorf("%d workers started, want no respawn", n)
	}
	if len(h.logs.all("worker could not build its engine: stopping")) == 0 {
		t.Errorf("no line says why it stops")
	}
	for _, pid := range h.logs.pids("worker started") {
		if !processGone(pid) {
			t.Errorf("worker %d left behind", pid)
		}
	}
}

// The supervisor, and only the supervisor, tells systemd: READY=1 once the
// workers are ready, RELOADING=1 with MONOTONIC_USEC and READY=1 again
// around a reload, STOPPING=1 at TERM; the workers do not see
// NOTIFY_SOCKET.
func TestSystemdNotify(t *testing.T) {
	sock := t.TempDir() + "/notify"
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: sock, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// The kernel tells the sender's pid with each datagram.
	raw, err := conn.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	raw.Control(func(fd uintptr) {
		err = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_PASSCRED, 1)
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv(envNotifySocket, sock)
	read := func(timeout time.Duration) (string, int, error) {
		buf, oob := make([]byte, 256), make([]byte, 1024)
		conn.SetReadDeadline(time.Now().Add(timeout))
		n, oobn, _, _, err := conn.ReadMsgUnix(buf, oob)
		if err != nil {
			return "", 0, err
		}
		pid := 0
		if msgs, err := unix.ParseSocketControlMessage(oob[:oobn]); err == nil {
			for _, m := range msgs {
				if cred, err := unix.ParseUnixCredentials(&m); err == nil {
					pid = int(cred.Pid)
				}
			}
		}
		return string(buf[:n]), pid, nil
	}
	next := func() string {
		t.Helper()
		state, pid, err := read(15 * time.Second)
		if err != nil {
			t.Fatalf("no notification: %v", err)
		}
		if pid != os.Getpid() {
			t.Errorf("notification %q from pid %d, want the supervisor %d", state, pid, os.Getpid())
		}
		return state
	}

	h := startSupervisor(t, testConfig(2), false, nil)
	if got := next(); got != "READY=1" {
		t.Fatalf("first notification %q, want READY=1", got)
	}
	if n := len(h.logs.all("worker ready")); n != 2 {
		t.Errorf("READY=1 with %d workers ready, want 2", n)
	}
	_, body, err := h.get("/env", "")
	if err != nil {
		t.Fatal(err)
	}
	var env map[string]any
	if err := json.Unmarshal([]byte(body), &env); err != nil {
		t.Fatal(err)
	}
	if env["notify"] != false || env["marker"] != false {
		t.Errorf("worker environment: %v, want neither NOTIFY_SOCKET nor the worker marker", env)
	}
	if _, set := os.LookupEnv("GOMAXPROCS"); !set {
		if want := max(1, cpuquota.CPUs()/2); env["gomaxprocs"] != float64(want) {
			t.Errorf("worker GOMAXPROCS %v, want %d", env["gomaxprocs"], want)
		}
	}

	h.signal(unix.SIGHUP)
	got := next()
	us, ok := strings.CutPrefix(got, "RELOADING=1\nMONOTONIC_USEC=")
	if _, err := strconv.ParseUint(us, 10, 64); !ok || err != nil {
		t.Fatalf("on HUP: %q, want RELOADING=1 and MONOTONIC_USEC", got)
	}
	if got := next(); got != "READY=1" {
		t.Fatalf("after the reload: %q, want READY=1", got)
	}
	if n := len(h.logs.all("reload finished")); n != 1 {
		t.Errorf("READY=1 with %d reloads finished", n)
	}
	h.signal(unix.SIGTERM)
	if got := next(); got != "STOPPING=1" {
		t.Fatalf("on TERM: %q, want STOPPING=1", got)
	}
	if err := h.wait(15 * time.Second); err != nil {
		t.Fatal(err)
	}
	// Every process is gone: whatever else was sent is queued by now.
	if state, pid, err := read(100 * time.Millisecond); err == nil {
		t.Errorf("unexpected notification %q from pid %d", state, pid)
	}
}

// With systemd's watchdog (WATCHDOG_USEC, WATCHDOG_PID) the supervisor
// sends WATCHDOG=1 at half its interval, from its loop: a loop held up in
// a handler (here OnStatus, which runs on it) sends none until it goes
// on. The workers do not see the watchdog's variables.
func TestSystemdWatchdog(t *testing.T) {
	sock := t.TempDir() + "/notify"
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: sock, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	t.Setenv(envNotifySocket, sock)
	t.Setenv(envWatchdogUsec, "300000") // 300ms: a ping every 150ms
	t.Setenv(envWatchdogPID, strconv.Itoa(os.Getpid()))
	// count reads notifications for d and counts them by state.
	count := func(d time.Duration) map[string]int {
		got := map[string]int{}
		buf := make([]byte, 256)
		for end := time.Now().Add(d); time.Now().Before(end); {
			conn.SetReadDeadline(end)
			n, err := conn.Read(buf)
			if err != nil {
				break
			}
			got[strings.SplitN(string(buf[:n]), "\n", 2)[0]]++
		}
		return got
	}

	var stall atomic.Bool
	stuck := make(chan struct{})
	h := startSupervisor(t, testConfig(2), true, func(o *Options) {
		o.OnStatus = func(Status) {
			if stall.Load() {
				<-stuck
			}
		}
	})
	if got := count(time.Second); got[notifyWatchdog] < 3 {
		t.Fatalf("a healthy supervisor sent %v in a second; want WATCHDOG=1 about every 150ms", got)
	}
	_, body, err := h.get("/env", "")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(body, `"watchdog":false`) {
		t.Errorf("worker environment %s: the watchdog's variables reached a worker", body)
	}

	// HUP: the loop publishes a status, and OnStatus holds it up.
	stall.Store(true)
	h.signal(unix.SIGHUP)
	count(200 * time.Millisecond) // RELOADING=1, and a ping that may have been under way
	if got := count(time.Second); got[notifyWatchdog] != 0 {
		t.Errorf("a stuck loop sent %v", got)
	}
	stall.Store(false)
	close(stuck)
	if got := count(time.Second); got[notifyWatchdog] < 3 {
		t.Errorf("once the loop went on: %v in a second, want WATCHDOG=1 again", got)
	}
	if err := h.stop(15 * time.Second); err != nil {
		t.Fatal(err)
	}
}

func TestWatchdogPings(t *testing.T) {
	for _, tc := range []struct {
		usec, pid string
		want      time.Duration
		err       bool
	}{
		{"", "", 0, false},
		{"30000000", "", 15 * time.Second, false},
		{"30000000", "4242", 15 * time.Second, false}, // this process
		{"30000000", "1", 0, false},                   // meant for another process
		{"0", "", 0, true},
		{"30s", "", 0, true},
	} {
		got, err := watchdogPings(tc.usec, tc.pid, 4242)
		if got != tc.want || (err != nil) != tc.err {
			t.Errorf("watchdogPings(%q, %q) = %v, %v; want %v, error %v", tc.usec, tc.pid, got, err, tc.want, tc.err)
		}
	}
}

func TestNotifyAbstractSocket(t *testing.T) {
	name := fmt.Sprintf("@preforkd-test-%d", os.Getpid())
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: name, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	n, err := newNotifier(name)
	if err != nil {
		t.Fatal(err)
	}
	if err := n.send(notifyStopping); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	k, err := conn.Read(buf)
	if err != nil || string(buf[:k]) != notifyStopping {
		t.Fatalf("read %q %v", buf[:k], err)
	}
	if _, err := newNotifier("vsock:2:1"); err == nil {
		t.Error("an unsupported NOTIFY_SOCKET was accepted")
	}
	if n, err := newNotifier(""); n != nil || err != nil || n.send("X") != nil {
		t.Error("no NOTIFY_SOCKET must mean a silent notifier")
	}
}

// handWorker is a worker process started by hand as the supervisor
// would start it, on region as index 2, with the test binary's own
// settings: its listener, the write end of its lifeline, the read end of
// its readiness pipe, and its exit (sent once). Cleanup kills it.
type handWorker struct {
	cmd    *exec.Cmd
	ln     net.Listener
	lifeW  *os.File
	readyR *os.File
	exited chan error
}

func startHandWorker(t *testing.T, region *shm.Region, stderr io.Writer) *handWorker {
	t.Helper()
	ln, lnFile := workerListener(t)
	settings, err := testConfig(1).Settings.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	cfgFile, err := settingsFile(settings)
	if err != nil {
		t.Fatal(err)
	}
	defer cfgFile.Close()
	lifeR, lifeW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lifeW.Close() })
	readyR, readyW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { readyR.Close() })
	cmd := exec.Command("/proc/self/exe")
	cmd.Env = append(workerEnviron(os.Environ(), 1), envWorker+"=2")
	cmd.Stderr = stderr
	cmd.ExtraFiles = []*os.File{region.File(), lnFile, lifeR, readyW, cfgFile}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lifeR.Close()
	readyW.Close()
	w := &handWorker{cmd: cmd, ln: ln, lifeW: lifeW, readyR: readyR, exited: make(chan error, 1)}
	go func() { w.exited <- cmd.Wait() }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		w.exited <- <-w.exited
	})
	return w
}

// A worker whose supervisor is gone (its lifeline pipe at EOF) drains and
// exits 0 on its own. This worker is started by hand, without Pdeathsig, so
// that only the lifeline can tell it.
func TestWorkerExitsAtLifelineEOF(t *testing.T) {
	region, err := shm.Create(regionOptions(Options{Region: shm.Options{Counters: 64, MaxWorkers: 4}}, 1))
	if err != nil {
		t.Fatal(err)
	}
	defer region.Close()
	w := startHandWorker(t, region, os.Stderr)
	cmd, ln, exited := w.cmd, w.ln, w.exited

	w.readyR.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := w.readyR.Read(make([]byte, 1)); err != nil {
		t.Fatalf("no readiness report: %v", err)
	}
	resp, err := client.Get("http://" + ln.Addr().String() + "/pid")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(body) != strconv.Itoa(cmd.Process.Pid) {
		t.Fatalf("served by %q, want the worker %d", body, cmd.Process.Pid)
	}
	if region.Workers()[0].PID != cmd.Process.Pid || region.Workers()[0].Index != 2 {
		t.Errorf("region worker table %+v: the worker did not join as index 2", region.Workers())
	}

	w.lifeW.Close() // the "supervisor" is gone
	select {
	case err := <-exited:
		exited <- err
		if err != nil {
			t.Fatalf("worker exit at lifeline EOF: %v, want status 0", err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("worker still running 2s after its lifeline closed")
	}
}

func TestPrepareAndFinish(t *testing.T) {
	t.Run("prepare fails", func(t *testing.T) {
		h := startSupervisor(t, testConfig(2), false, func(o *Options) {
			o.Prepare = func(*shm.Region, *slog.Logger) error { return errors.New("no dump for you") }
		})
		if err := h.wait(10 * time.Second); err == nil || !strings.Contains(err.Error(), "no dump for you") {
			t.Fatalf("Run: %v, want the Prepare error", err)
		}
		if n := len(h.logs.all("worker started")); n != 0 {
			t.Fatalf("%d workers started after Prepare failed", n)
		}
	})
	t.Run("finish after the last worker", func(t *testing.T) {
		var finished []shm.WorkerInfo
		var ran Settings
		calls := 0
		setup := testConfig(2)
		h := startSupervisor(t, setup, true, func(o *Options) {
			o.Finish = func(r *shm.Region, s Settings, _ *slog.Logger) error {
				calls++
				finished, ran = r.Workers(), s
				return errors.New("disk full")
			}
		})
		err := h.stop(15 * time.Second)
		if err == nil || !strings.Contains(err.Error(), "disk full") {
			t.Fatalf("Run: %v, want the Finish error", err)
		}
		if calls != 1 || len(finished) != 2 {
			t.Fatalf("Finish called %d times, saw workers %+v", calls, finished)
		}
		if string(ran.Payload) != string(setup.Settings.Payload) || ran.ShutdownTimeout != 5*time.Second || ran.Canary.MinRequests != DefaultCanaryMinRequests {
			t.Errorf("Finish saw settings %+v, want the running ones with their defaults", ran)
		}
		for _, w := range finished {
			if w.PID != 0 || w.Incarnation < 2 {
				t.Errorf("worker %+v not reaped when Finish ran", w)
			}
		}
	})
}

// Workers take their supervisor's process name (here the test binary's,
// as for any embedding program) instead of "exe", and their command line
// is their title alone; a reload's workers say their generation.
func TestWorkersAreNamed(t *testing.T) {
	name := processName()
	if name == "" || name == "exe" {
		t.Fatalf("the test's own process name is %q", name)
	}
	h := startSupervisor(t, testConfig(2), true, nil)
	check := func(gen int) {
		t.Helper()
		n := 0
		for _, r := range h.logs.all("worker started") {
			if r.int("generation") != gen {
				continue
			}
			n++
			pid := r.int("pid")
			comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
			if err != nil || string(comm) != name+"\n" {
				t.Errorf("worker %d: comm %q (%v), want %q", pid, comm, err, name)
			}
			cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
			// The title as ps shows it, spelled out: operators read it.
			want := fmt.Sprintf("%s: worker %d (generation %d)\x00", name, r.int("index"), gen)
			if err != nil || string(cmdline) != want {
				t.Errorf("worker %d: cmdline %q (%v), want %q", pid, cmdline, err, want)
			}
		}
		if n != 2 {
			t.Fatalf("%d workers of generation %d", n, gen)
		}
	}
	check(0)
	h.signal(unix.SIGHUP)
	h.logs.wait(t, "reload finished", 1, 15*time.Second)
	check(1)
	if err := h.stop(15 * time.Second); err != nil {
		t.Fatal(err)
	}
}

// The soft limit on open files is raised to the hard limit, and the
// supervisor says so.
func TestOpenFileLimitRaised(t *testing.T) {
	var orig unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &orig); err != nil {
		t.Fatal(err)
	}
	if orig.Max < 64 {
		t.Fatalf("hard open-file limit %d: too low to test", orig.Max)
	}
	lowered := unix.Rlimit{Cur: 64, Max: orig.Max}
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, (*syscall.Rlimit)(&lowered)); err != nil {
		t.Fatal(err)
	}
	defer syscall.Setrlimit(syscall.RLIMIT_NOFILE, (*syscall.Rlimit)(&orig))
	got, err := raiseOpenFileLimit()
	var now unix.Rlimit
	unix.Getrlimit(unix.RLIMIT_NOFILE, &now)
	if err != nil || got != orig.Max || now.Cur != orig.Max {
		t.Fatalf("raised to %d (%v), limit now %d; want the hard limit %d", got, err, now.Cur, orig.Max)
	}

	// Run raises the lowered limit again, logs it, and the workers run
	// at the hard limit too.
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, (*syscall.Rlimit)(&lowered)); err != nil {
		t.Fatal(err)
	}
	h := startSupervisor(t, testConfig(1), true, nil)
	if got := h.logs.all("supervisor started")[0].attrs["open_files"]; got != orig.Max {
		t.Errorf("supervisor started with open_files=%v, want %d", got, orig.Max)
	}
	pid := h.logs.pids("worker started")[0]
	limits, err := os.ReadFile(fmt.Sprintf("/proc/%d/limits", pid))
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf(`Max open files\s+%d\s+%d\s`, orig.Max, orig.Max)
	if !regexp.MustCompile(want).Match(limits) {
		t.Errorf("worker %d limits:\n%s\nwant soft = hard = %d", pid, limits, orig.Max)
	}
	if err := h.stop(15 * time.Second); err != nil {
		t.Fatal(err)
	}
}

// loop is a client loop of startLoops: GETs of path with c, one after
// another.
type loop struct {
	path string
	c    *http.Client
}

// outcome is one request of a loop: anything but a 200 is an error.
type outcome struct {
	body       string
	err        error
	start, end time.Time
}

// loops are client loops running until end.
type loops struct {
	run      *looptest.Loops
	mu       sync.Mutex
	outcomes []outcome
}

// startLoops runs one goroutine a loop against url until end is called,
// at the end of the test at the latest (or after 30s).
func startLoops(t *testing.T, url string, ls ...loop) *loops {
	l := &loops{run: looptest.Start(t, 30*time.Second)}
	for _, lp := range ls {
		l.run.Go(func() {
			o := outcome{start: time.Now()}
			resp, err := lp.c.Get(url + lp.path)
			if err == nil {
				var b []byte
				b, err = io.ReadAll(resp.Body)
				resp.Body.Close()
				o.body = string(b)
				if err == nil && resp.StatusCode != 200 {
					err = fmt.Errorf("status %d", resp.StatusCode)
				}
			}
			o.end, o.err = time.Now(), err
			l.mu.Lock()
			l.outcomes = append(l.outcomes, o)
			l.mu.Unlock()
		})
	}
	return l
}

// end stops the loops, waits for them, and returns every outcome.
func (l *loops) end() []outcome {
	l.run.Stop()
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.outcomes
}

// len is the number of requests done so far.
func (l *loops) len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.outcomes)
}

// last is the latest request done, with a 200 (zero if none).
func (l *loops) last() outcome {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i := len(l.outcomes) - 1; i >= 0; i-- {
		if l.outcomes[i].err == nil {
			return l.outcomes[i]
		}
	}
	return outcome{}
}

// A worker of a build whose statistics rows are laid out otherwise than
// its supervisor's region (a reload that started a newer binary with
// other metrics) exits before it serves, saying why: its counts would be
// misread, the canary judged by them.
func TestWorkerRefusesAnotherStatLayout(t *testing.T) {
	o := regionOptions(Options{Region: shm.Options{Counters: 64, MaxWorkers: 4}}, 1)
	o.StatLayout++
	region, err := shm.Create(o)
	if err != nil {
		t.Fatal(err)
	}
	defer region.Close()
	var stderr bytes.Buffer
	w := startHandWorker(t, region, &stderr)
	select {
	case err := <-w.exited:
		w.exited <- err
		if err == nil || !strings.Contains(stderr.String(), "restart the service to run it") {
			t.Fatalf("the worker exited with %v:\n%s", err, stderr.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the worker serves under a region of another layout")
	}
	if n, _ := w.readyR.Read(make([]byte, 1)); n != 0 {
		t.Error("the worker reported ready")
	}
	if w := region.Workers(); len(w) != 0 {
		t.Errorf("the worker joined the region: %+v", w)
	}
}

// A handler that ignores the end of shutdown_timeout keeps its request,
// which the drain then cuts; the worker still exits by itself, running
// what it deferred (a core's last counts to a shared store), before the
// supervisor's patience ends: it is not killed.
func TestDrainPastTheTimeoutRunsTheDeferred(t *testing.T) {
	setup := testConfig(1)
	setup.Settings.ShutdownTimeout = time.Second
	sup := startSupervisorProcess(t, "", setup)
	resp, err := client.Get("http://" + sup.addr + "/slow?d=8s") // sleeps on, whatever the drain
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if err := sup.Signal(unix.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := sup.Wait(15 * time.Second); err != nil {
		t.Errorf("supervisor after TERM: %v", err)
	}
	if !sup.logs.WaitEnd(10 * time.Second) {
		t.Fatal("the supervisor's stderr is still open 10s after it exited")
	}
	if r := sup.logs.all("worker did not drain in time: killing it"); len(r) > 0 {
		t.Errorf("the worker was killed: %v", r[0].attrs)
	}
	if n := len(sup.logs.all("test worker closing")); n != 2 {
		t.Errorf("the worker ran %d of its 2 deferred functions", n)
	}
}

// A worker ignores the supervisor's signals (INT, HUP, USR2) and takes
// USR1 as a reopen, but a program may have work to do before it calls
// Run (its flags, its logs): a HUP that `systemctl kill` sends every
// process of the unit, or a logrotate USR1, must not kill a worker then
// (a canary that dies so aborts the reload). From the package's
// initialization on, they are ignored until Run listens.
func TestWorkerSurvivesSignalsBeforeRun(t *testing.T) {
	t.Parallel()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envWorker+"=1", envTestLate+"=400ms")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(150 * time.Millisecond) // past the runtime's start, into the wait
	for _, sig := range []syscall.Signal{syscall.SIGHUP, syscall.SIGUSR1, syscall.SIGUSR2, syscall.SIGINT} {
		if err := cmd.Process.Signal(sig); err != nil {
			t.Fatal(err)
		}
	}
	err := cmd.Wait()
	// Run then fails: the test started it without a supervisor's
	// descriptors. What matters is that it got there.
	if st, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && st.Signaled() {
		t.Fatalf("the worker was killed by %v before Run (%v)", st.Signal(), err)
	}
}
