//go:build linux

package prefork

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// loadLoop sends GETs of path, each on a new connection, from n
// goroutines until stop is called, which returns the answers by body and
// the failures (anything but a 200).
func loadLoop(t *testing.T, url, path string, n int) (stop func() (bodies map[string]int, failed int64, first string)) {
	var mu sync.Mutex
	bodies := map[string]int{}
	var failed atomic.Int64
	var firstErr atomic.Value
	done := make(chan struct{})
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); {
				select {
				case <-done:
					return
				default:
				}
				resp, err := client.Get(url + path)
				if err != nil {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, err.Error())
					continue
				}
				b, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				if err != nil || resp.StatusCode != 200 {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, resp.Status)
					continue
				}
				mu.Lock()
				bodies[string(b)]++
				mu.Unlock()
			}
		})
	}
	var once sync.Once
	stop = func() (map[string]int, int64, string) {
		once.Do(func() {
			close(done)
			wg.Wait()
		})
		s, _ := firstErr.Load().(string)
		mu.Lock()
		defer mu.Unlock()
		return bodies, failed.Load(), s
	}
	t.Cleanup(func() { stop() })
	return stop
}

// exeOf is where /proc says pid's binary is: " (deleted)" at the end
// when the file was replaced since.
func exeOf(t *testing.T, pid int) string {
	t.Helper()
	p, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
	if err != nil {
		t.Fatalf("worker %d: %v", pid, err)
	}
	return p
}

// An embedding program deployed by rename: a HUP starts the new binary as
// a canary, while a crash before the HUP is replaced with the binary its
// generation started with; a new build that exits at start aborts its
// reload at once, with no respawn loop, and the old workers serve
// throughout.
func TestCanaryJudgesANewBinary(t *testing.T) {
	dir := t.TempDir()
	app := filepath.Join(dir, "app")
	deployBuild(t, app, "v1")
	cfg := testConfig(2)
	cfg.Settings.Canary.Window = time.Second
	cfg.Settings.Canary.MinRequests = 10
	sp := startSupervisorProcess(t, app, cfg)
	url := "http://" + sp.addr

	// v2 is deployed; a worker crashes before any HUP.
	deployBuild(t, app, "v2")
	victim := sp.logs.pids("worker started")[0]
	if err := unix.Kill(victim, unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	respawn := sp.logs.wait(t, "worker started", 3, 10*time.Second)[2]
	if gen := respawn.int("generation"); gen != 0 {
		t.Fatalf("respawned as generation %d", gen)
	}
	if exe := exeOf(t, respawn.int("pid")); exe != app+" (deleted)" {
		t.Errorf("respawned worker runs %q, want the replaced v1 %q", exe, app+" (deleted)")
	}
	sp.logs.wait(t, "worker ready", 3, 10*time.Second)
	stop := loadLoop(t, url, "/build", 2) // from here on, no request may fail

	// HUP: the canary runs v2, passes, and the roll puts v2 everywhere.
	if err := sp.Signal(unix.SIGHUP); err != nil {
		t.Fatal(err)
	}
	sp.logs.wait(t, "reload finished", 1, 20*time.Second)
	verdicts := verdictsOf(sp.logs)
	if len(verdicts) != 1 || verdicts[0].attrs["verdict"] != string(VerdictHealthy) {
		t.Fatalf("verdicts %v, want one healthy", verdicts)
	}
	for _, r := range sp.logs.all("worker started")[3:] {
		if exe := exeOf(t, r.int("pid")); exe != app {
			t.Errorf("worker %d of generation %d runs %q, want %q", r.int("pid"), r.int("generation"), exe, app)
		}
	}

	// A build that exits at start.
	deployBuild(t, app, "crash")
	hup := time.Now()
	if err := sp.Signal(unix.SIGHUP); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(15 * time.Second)
	for len(verdictsOf(sp.logs)) < 2 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	verdicts = verdictsOf(sp.logs)
	if len(verdicts) != 2 {
		t.Fatalf("no verdict on the crashing build after 15s")
	}
	took := time.Since(hup)
	want := "canary failed: exited before it was ready (exit status 3); reload aborted, slot 0 keeps generation 1"
	if verdicts[1].msg != want {
		t.Errorf("verdict %q, want %q", verdicts[1].msg, want)
	}
	starts := len(sp.logs.all("worker started"))
	time.Sleep(1600 * time.Millisecond) // a respawn loop would start 4 more by now
	if n := len(sp.logs.all("worker started")); n != starts {
		t.Errorf("%d workers started after the abort, want none", n-starts)
	}
	bodies, failed, first := stop()
	if failed != 0 {
		t.Errorf("%d requests failed (first: %s)", failed, first)
	}
	if bodies["crash"] != 0 || bodies["v1"] == 0 || bodies["v2"] == 0 {
		t.Errorf("builds served %v", bodies)
	}
	t.Logf("abort %v after the HUP; served by build: %v", took.Round(time.Millisecond), bodies)
	if code := sp.exit(t, unix.SIGTERM, 15*time.Second); code != 0 {
		t.Errorf("exit code %d after TERM", code)
	}
}

// verdictsOf returns the log lines that give a canary's verdict.
func verdictsOf(logs *logSink) []record {
	var out []record
	for _, r := range logs.all("") {
		if r.attrs["verdict"] != nil {
			out = append(out, r)
		}
	}
	return out
}

// A handler that leaks: its worker is replaced once its RSS passed
// max_rss, and serves no request after the one that took it past. It
// leaks fast (within 10 s of its start), so memory recycling backs off:
// the successors judge their memory only after a delay, and serve past
// the limit meanwhile.
func TestRecycleMaxRSS(t *testing.T) {
	const growth = 4 << 20 // per /leak
	// The limit is 32 MiB above what a fresh worker takes (more under the
	// race detector): measured first, then set by a reload.
	cfg := testConfig(2)
	var mu sync.Mutex
	next := cfg
	h := startSupervisor(t, cfg, true, func(o *Options) {
		o.Reload = func(Settings) (Settings, error) {
			mu.Lock()
			defer mu.Unlock()
			return next.Settings, nil
		}
	})
	var base int
	for range 4 {
		_, body, err := h.get("/rss", "")
		n, _ := strconv.Atoi(body)
		if err != nil || n == 0 {
			t.Fatalf("/rss: %q %v", body, err)
		}
		base = max(base, n)
	}
	limit := base + 32<<20
	mu.Lock()
	next.Settings.MaxRSS = int64(limit)
	mu.Unlock()
	h.signal(unix.SIGHUP)
	h.logs.wait(t, "reload finished", 1, 15*time.Second)
	for _, r := range h.logs.all("worker retiring") {
		for !processGone(r.int("pid")) {
			time.Sleep(10 * time.Millisecond)
		}
	}
	h.logs.wait(t, "worker exited", 2, 15*time.Second)
	exitedBefore := len(h.logs.all("worker exited"))
	first := h.logs.pids("worker started")[2:]
	type answer struct{ pid, rss int }
	var answers []answer
	for i := 0; i < 200 && len(h.logs.all("worker exited")) < exitedBefore+2; i++ {
		code, body, err := h.get("/leak", "")
		if err != nil || code != 200 {
			t.Fatalf("request %d: %d %v", i, code, err)
		}
		f := strings.Fields(body)
		pid, _ := strconv.Atoi(f[0])
		rss, _ := strconv.Atoi(f[1])
		answers = append(answers, answer{pid, rss})
	}
	recycled := h.logs.wait(t, "worker recycling", 2, 10*time.Second)
	judged := map[int]bool{} // the workers that judge their memory from their start
	for _, r := range recycled[:2] {
		judged[r.int("pid")] = true
	}
	over := map[int]int{} // answers past the limit, by pid
	for _, a := range answers {
		if a.rss > limit && judged[a.pid] {
			over[a.pid]++
			if a.rss > limit+growth+growth/2 {
				t.Errorf("worker %d answered with RSS %d MiB: past the limit by more than one request", a.pid, a.rss>>20)
			}
		}
	}
	for _, r := range recycled[:2] {
		pid := r.int("pid")
		if r.attrs["reason"] != "max_rss" || r.int("limit_bytes") != limit || r.int("rss_bytes") > limit+growth+growth/2 {
			t.Errorf("recycling logged as %v", r.attrs)
		}
		if over[pid] != 1 {
			t.Errorf("worker %d served %d requests past the limit, want 1", pid, over[pid])
		}
	}
	for _, r := range h.logs.all("worker exited")[exitedBefore:] {
		if r.attrs["status"] != "exit status 0" {
			t.Errorf("recycled worker %d: %v", r.int("pid"), r.attrs["status"])
		}
	}
	for _, r := range h.logs.all("worker started")[4:] {
		if fmt.Sprint(r.attrs["memory_checked_after"]) != rssBackoffBase.String() {
			t.Errorf("a successor of a worker recycled soon after its start: %v, want memory checked after %v", r.attrs, rssBackoffBase)
		}
	}
	if n := len(h.logs.all("worker crashed")); n != 0 {
		t.Errorf("%d crashes", n)
	}
	t.Logf("%d requests; first workers %v; recycled %v", len(answers), first, []int{recycled[0].int("pid"), recycled[1].int("pid")})
	if err := h.stop(15 * time.Second); err != nil {
		t.Fatal(err)
	}
}

// What Options.OnStatus shows of an aborted reload: the verdict, the
// quarantined slot, the fleet one short, the generation of each worker;
// and of the good reload that fills the slot again.
func TestCanaryStatus(t *testing.T) {
	cfg := testConfig(3)
	cfg.Settings.Canary.Window = time.Second
	cfg.Settings.Canary.MinRequests = 20
	var mu sync.Mutex
	next := cfg
	var last Status
	h := startSupervisor(t, cfg, true, func(o *Options) {
		o.Reload = func(Settings) (Settings, error) {
			mu.Lock()
			defer mu.Unlock()
			return next.Settings, nil
		}
		o.OnStatus = func(st Status) {
			mu.Lock()
			last = st
			mu.Unlock()
		}
	})
	status := func() Status {
		mu.Lock()
		defer mu.Unlock()
		return last
	}
	reload := func(version string) {
		mu.Lock()
		next.Settings.Payload = testSpec{Version: version}.payload()
		mu.Unlock()
		h.signal(unix.SIGHUP)
	}

	stop := loadLoop(t, h.url, "/", 3)
	reload("broken")
	deadline := time.Now().Add(15 * time.Second)
	for len(verdictsOf(h.logs)) == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	v := verdictsOf(h.logs)
	if len(v) != 1 || !strings.HasPrefix(v[0].msg, "canary unhealthy: 5xx 100.0% (") {
		t.Fatalf("verdicts %v", v)
	}
	canary := v[0].int("pid")
	deadline = time.Now().Add(15 * time.Second)
	for slices.ContainsFunc(status().Workers, func(w WorkerStatus) bool { return w.PID == canary }) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond) // the canary drains
	}
	stop()
	st := status()
	c := st.Canary
	if c == nil || c.Verdict != VerdictUnhealthy || !c.Aborted || c.Generation != 1 || c.Slot != 0 || c.PID != canary ||
		c.Canary.Errors != c.Canary.Requests || c.Fleet.Errors != 0 || c.Fleet.Requests == 0 || c.Test == "" || c.Summary != v[0].msg {
		t.Errorf("canary status %+v", c)
	}
	if !slices.Equal(st.Quarantined, []int{0}) || st.Generation != 0 || !st.Ready {
		t.Errorf("after the abort: quarantined %v, generation %d, ready %v", st.Quarantined, st.Generation, st.Ready)
	}
	if len(st.Workers) != 2 {
		t.Errorf("workers after the abort %+v, want 2: one short", st.Workers)
	}
	for _, w := range st.Workers {
		if w.Generation != 0 || w.Slot == 0 {
			t.Errorf("after the abort: %+v", w)
		}
	}

	stop = loadLoop(t, h.url, "/", 3)
	reload("v2")
	h.logs.wait(t, "reload finished", 1, 15*time.Second)
	_, failed, first := stop()
	if failed != 0 {
		t.Errorf("%d requests failed during the good reload (first: %s)", failed, first)
	}
	deadline = time.Now().Add(15 * time.Second)
	for len(status().Workers) != 3 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond) // the retired ones drain
	}
	st = status()
	if len(st.Quarantined) != 0 || st.Generation != 2 || st.Canary.Verdict != VerdictHealthy || st.Canary.Generation != 2 {
		t.Errorf("after the good reload: quarantined %v, generation %d, canary %+v", st.Quarantined, st.Generation, st.Canary)
	}
	slots := map[int]bool{}
	for _, w := range st.Workers {
		slots[w.Slot] = true
		if w.Generation != 2 || !w.Ready || w.Retiring {
			t.Errorf("after the good reload: %+v", w)
		}
	}
	if len(slots) != 3 {
		t.Errorf("workers %+v: want one in each of the 3 slots", st.Workers)
	}
	if err := h.stop(15 * time.Second); err != nil {
		t.Fatal(err)
	}
}

// Workers over max_rss from their start (max_rss at its least, workers
// holding more): each is recycled at its first response, but the
// successors judge their memory only after memory recycling's delay, so
// that 2 slots start 4 workers in all within the window, not a storm; it
// is reported once, and every request is answered.
func TestRecycleMaxRSSNoStorm(t *testing.T) {
	t.Setenv(envTestBallast, "40")
	cfg := testConfig(2)
	cfg.Settings.MaxRSS = MinMaxRSS
	h := startSupervisor(t, cfg, true, nil)
	const window = 4 * time.Second // within rssBackoffBase: the successors are not judged yet
	answered, failed := 0, 0
	for end := time.Now().Add(window); time.Now().Before(end); {
		if code, _, err := h.get("/pid", ""); err != nil || code != 200 {
			failed++
		} else {
			answered++
		}
	}
	starts := h.logs.all("worker started")
	warnings := h.logs.all("worker passed max_rss soon after it started: max_rss may be below what a worker needs; memory recycling backs off")
	recycled := h.logs.all("worker recycling")
	t.Logf("%d answered in %v; %d starts, %d recycled", answered, window, len(starts), len(recycled))
	if failed != 0 {
		t.Errorf("%d of %d requests failed", failed, answered+failed)
	}
	if len(starts) > 4 || len(recycled) == 0 || len(recycled) > 2 {
		t.Errorf("%d workers started and %d recycled in %v, want at most 4 and 1..2", len(starts), len(recycled), window)
	}
	if len(warnings) != 1 {
		t.Errorf("%d warnings, want 1", len(warnings))
	}
	for _, r := range starts[2:] {
		if fmt.Sprint(r.attrs["memory_checked_after"]) != rssBackoffBase.String() {
			t.Errorf("a successor started with %v, want memory checked after %v", r.attrs, rssBackoffBase)
			break
		}
	}
	if err := h.stop(15 * time.Second); err != nil {
		t.Fatal(err)
	}
}
