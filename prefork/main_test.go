//go:build linux

package prefork

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/preforkd/preforkd/bucket"
	"github.com/preforkd/preforkd/clientip"
	"github.com/preforkd/preforkd/core"
	"github.com/preforkd/preforkd/engine/nethttp"
	"github.com/preforkd/preforkd/internal/proctest"
	"github.com/preforkd/preforkd/metrics"
	"github.com/preforkd/preforkd/route"
	"github.com/preforkd/preforkd/shm"
)

// The test binary plays three roles (internal/proctest): the test itself,
// a worker (started by a supervisor, detected by IsWorker), and a
// supervisor of its own (role "supervisor", for the tests that kill or
// signal the supervisor's process).
const (
	envTestCrash   = "PREFORK_TEST_CRASH"       // set: a worker exits at once with status 3; "engine": its Engine fails; "engine-panic": it panics; "stdlib-server": it returns a *http.Server
	envTestEngine  = "PREFORK_TEST_ENGINE"      // "fast": workers serve testFastApp with the fast engine (package proxy)
	envTestBallast = "PREFORK_TEST_BALLAST_MIB" // N: a worker holds N MiB more, touched, from its start
	envTestLate    = "PREFORK_TEST_LATE"        // a duration: a worker waits that long before it calls Run
)

// ballast is what a worker of envTestBallast holds for its whole life.
var ballast []byte

func TestMain(m *testing.M) {
	if IsWorker() {
		if d, err := time.ParseDuration(os.Getenv(envTestLate)); err == nil {
			time.Sleep(d) // a program that has work to do before Run
		}
		if n, err := strconv.Atoi(os.Getenv(envTestBallast)); err == nil && n > 0 {
			ballast = make([]byte, n<<20)
			for i := 0; i < len(ballast); i += 4096 {
				ballast[i] = 1
			}
		}
		level := slog.LevelWarn
		if os.Getenv("PREFORK_TEST_LOGS") != "" {
			level = slog.LevelDebug
		}
		log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
		opts := Options{Logger: log, Engine: func(w *Worker) (Engine, error) {
			if f := exampleEngines[string(w.Settings.Payload)]; f != nil {
				return f(w)
			}
			return testEngine(w)
		}}
		if os.Getenv(envTestEngine) == "fast" {
			opts.Engine = testFastEngine
		}
		_ = Run(context.Background(), opts)
		panic("unreachable: Run returned in a worker")
	}
	proctest.Main(map[string]proctest.Role{
		"supervisor": supervisorRole,
		"exit":       func(*proctest.Child) error { return nil },
	})
	// Workers orphaned by a killed supervisor are reparented to this
	// process, which can then wait for them.
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		fmt.Fprintln(os.Stderr, "PR_SET_CHILD_SUBREAPER:", err)
		os.Exit(2)
	}
	code := m.Run()
	if code == 0 {
		if leaked := proctest.Leaked("/prefork/", 2*time.Second); leaked != "" {
			fmt.Fprintf(os.Stderr, "goroutines of package prefork outlived the tests:\n%s\n", leaked)
			code = 1
		}
	}
	os.Exit(code)
}

// supervisorRole runs Run with the testSetup of its spec as a whole
// process, with its logs as JSON on stderr.
func supervisorRole(c *proctest.Child) error {
	var setup testSetup
	if err := c.Spec(&setup); err != nil {
		return err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	log := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	return Run(context.Background(), setup.options(ln, log))
}

// parseJSONRecord reads a line of slog's JSON handler.
func parseJSONRecord(line string) (record, bool) {
	var m map[string]any
	if json.Unmarshal([]byte(line), &m) != nil {
		return record{}, false
	}
	msg, _ := m["msg"].(string)
	return record{msg: msg, attrs: m}, true
}

// testSetup is what a test supervisor runs: its workers, the geometry
// of its region and its settings, whose Payload is a testSpec. It is the
// spec of the supervisor role, as JSON.
type testSetup struct {
	Workers  int
	Region   shm.Options
	Settings Settings
}

// testConfig is a small setup: n workers, a small table, a short drain, a
// short canary window, and the given rules (by X-Client, falling back to
// ip).
func testConfig(n int, rules ...testRule) testSetup {
	region := shm.Options{Counters: 4096}
	metrics.Geometry(&region, len(rules)) // the canary judges by the statistics
	return testSetup{
		Workers: n,
		Region:  region,
		Settings: Settings{
			ShutdownTimeout: 5 * time.Second,
			Canary:          Canary{Window: 300 * time.Millisecond},
			Payload:         testSpec{Rules: rules}.payload(),
		},
	}
}

// options are Run's options for the setup: the test workers serving ln.
func (s testSetup) options(ln net.Listener, log *slog.Logger) Options {
	return Options{
		Listener: ln,
		Workers:  s.Workers,
		Region:   s.Region,
		Settings: s.Settings,
		Engine:   testEngine,
		Logger:   log,
	}
}

// testSpec is the configuration the test workers serve, handed to them
// in Settings.Payload as JSON (as the daemon hands its file's).
type testSpec struct {
	Rules []testRule `json:"rules,omitempty"`
	// Version is the application's version: "broken" is a build that
	// answers 500 to everything.
	Version string `json:"version,omitempty"`
}

// testRule is a rate-limit rule of a testSpec.
type testRule struct {
	Name      string           `json:"name"`
	Path      string           `json:"path"`
	Limit     int64            `json:"limit"`
	Window    time.Duration    `json:"window"`
	Algorithm bucket.Algorithm `json:"algorithm"`
	By        string           `json:"by,omitempty"` // "" is "header:X-Client|ip"
}

// payload is s as Settings.Payload carries it.
func (s testSpec) payload() []byte {
	b, err := json.Marshal(s)
	if err != nil {
		panic(err) // strings, numbers and an algorithm always encode
	}
	return b
}

// compile is the rule as the core takes it, compiled by the packages that
// own each part (as package config compiles a file's).
func (r testRule) compile() (core.RateLimit, error) {
	rt, err := route.Compile(r.Path, nil)
	if err != nil {
		return core.RateLimit{}, err
	}
	by := r.By
	if by == "" {
		by = "header:X-Client|ip"
	}
	key, err := clientip.ParseBy(by)
	if err != nil {
		return core.RateLimit{}, err
	}
	rl := core.RateLimit{
		Rule:  bucket.Rule{Name: r.Name, Limit: r.Limit, Window: r.Window, Algorithm: r.Algorithm},
		Route: rt,
		By:    key,
	}
	return rl, rl.Check()
}

// testCore builds the decision core of a test worker, as an embedding
// program does: the rules of the spec its supervisor handed it, over its
// region, telling the worker of each response (its recycling limits).
// The worker closes it once it has drained.
func testCore(w *Worker) (*core.Core, testSpec, error) {
	var spec testSpec
	if err := json.Unmarshal(w.Settings.Payload, &spec); err != nil {
		return nil, spec, fmt.Errorf("the test spec: %w", err)
	}
	o := core.Options{OnResponse: w.Responded, Logger: w.Logger}
	for _, r := range spec.Rules {
		rl, err := r.compile()
		if err != nil {
			return nil, spec, err
		}
		o.RateLimits = append(o.RateLimits, rl)
	}
	c, err := core.New(w.Region, o)
	if err != nil {
		return nil, spec, err
	}
	w.Defer(c.Close)
	return c, spec, nil
}

// testEngine is the engine of the test workers: testHandler served by
// net/http (engine/nethttp) with the worker's core in front of it.
func testEngine(w *Worker) (Engine, error) {
	if os.Getenv(envTestCrash) == "engine" {
		return nil, errors.New("the test's engine refuses to be built")
	}
	if os.Getenv(envTestCrash) == "stdlib-server" {
		// It has Engine's methods, but neither the drain rule nor the
		// [server] limits.
		return &http.Server{Handler: http.NotFoundHandler()}, nil
	}
	if os.Getenv(envTestCrash) == "engine-panic" {
		// As a route.MustCompile or clientip.MustParseBy of a bad value
		// in the factory does.
		panic("the test's engine panics as it is built")
	}
	if os.Getenv(envTestCrash) != "" || buildMarker() == "crash" {
		os.Exit(3)
	}
	c, spec, err := testCore(w)
	if err != nil {
		return nil, err
	}
	deferClosingLines(w)
	var srv *nethttp.Server
	keyOf := func(rule string, r *http.Request) []byte { return srv.Handler().KeyOf(rule, r) }
	srv, err = nethttp.NewServer(nethttp.ServerOptions{Core: c, Handler: testHandler(w, c, keyOf, spec), Logger: w.Logger})
	if err != nil {
		return nil, err
	}
	return srv, nil
}

// testHandler is the application of the test workers. keyOf is the key
// the core counts a request under for a rule.
func testHandler(w *Worker, c *core.Core, keyOf func(rule string, r *http.Request) []byte, spec testSpec) http.Handler {
	build := buildMarker()
	mux := http.NewServeMux()
	// /build names the build this worker runs (deployBuild).
	mux.HandleFunc("/build", func(rw http.ResponseWriter, _ *http.Request) {
		fmt.Fprint(rw, build)
	})
	// /leak keeps 4 MiB more, touched, and reports the pid and the RSS
	// after it.
	var leakMu sync.Mutex
	var leaked [][]byte
	mux.HandleFunc("/rss", func(rw http.ResponseWriter, _ *http.Request) {
		rss, _ := readRSS()
		fmt.Fprint(rw, rss)
	})
	mux.HandleFunc("/leak", func(rw http.ResponseWriter, _ *http.Request) {
		b := make([]byte, 4<<20)
		for i := 0; i < len(b); i += 4096 {
			b[i] = 1
		}
		leakMu.Lock()
		leaked = append(leaked, b)
		leakMu.Unlock()
		rss, err := readRSS()
		if err != nil {
			rw.WriteHeader(500)
			return
		}
		fmt.Fprintf(rw, "%d %d", os.Getpid(), rss)
	})
	mux.HandleFunc("/pid", func(rw http.ResponseWriter, _ *http.Request) {
		fmt.Fprint(rw, os.Getpid())
	})
	// /slow sends its headers at once, so that the client knows the
	// request is in the handler, and its body after d.
	mux.HandleFunc("/slow", func(rw http.ResponseWriter, r *http.Request) {
		d, _ := time.ParseDuration(r.URL.Query().Get("d"))
		rw.WriteHeader(http.StatusOK)
		rw.(http.Flusher).Flush()
		time.Sleep(d)
		fmt.Fprint(rw, "done")
	})
	mux.HandleFunc("/env", func(rw http.ResponseWriter, _ *http.Request) {
		_, notify := os.LookupEnv(envNotifySocket)
		_, marker := os.LookupEnv(envWorker)
		_, watchdog := os.LookupEnv(envWatchdogUsec)
		json.NewEncoder(rw).Encode(map[string]any{
			"notify": notify, "marker": marker, "watchdog": watchdog, "gomaxprocs": runtime.GOMAXPROCS(0), "index": w.Index,
		})
	})
	// /reset?rule=R forgets what rule R counted for this client, with the
	// core's limiter, as an application does after a successful login.
	mux.HandleFunc("/reset", func(rw http.ResponseWriter, r *http.Request) {
		rule := r.URL.Query().Get("rule")
		lim, key := c.Limiter(rule), keyOf(rule, r)
		if lim == nil || key == nil {
			http.Error(rw, "no such rule", http.StatusNotFound)
			return
		}
		lim.Reset(string(key), w.Region.Now())
	})
	if spec.Version == "broken" {
		return http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) {
			http.Error(rw, "broken build", http.StatusInternalServerError)
		})
	}
	mux.HandleFunc("/", func(rw http.ResponseWriter, _ *http.Request) { fmt.Fprint(rw, "ok") })
	return mux
}

// buildMarker is what deployBuild appended to the binary this process
// runs; "" for the test binary as go test built it.
func buildMarker() string {
	f, err := os.Open("/proc/self/exe")
	if err != nil {
		return ""
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil || st.Size() < 64 {
		return ""
	}
	tail := make([]byte, 64)
	if _, err := f.ReadAt(tail, st.Size()-64); err != nil {
		return ""
	}
	_, marker, ok := strings.Cut(string(tail), buildMarkerPrefix)
	if !ok {
		return ""
	}
	return strings.TrimSpace(marker)
}

// workerListener listens on a loopback port and returns the listener and
// its file as a worker inherits it, both closed at the end of the test.
func workerListener(t *testing.T) (net.Listener, *os.File) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	f, err := ListenerFile(ln)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return ln, f
}

const buildMarkerPrefix = "\nPREFORK-TEST-BUILD:"

// deployBuild deploys "another build" of this program at path, as an
// operator should: written beside it, then renamed over it. It is the
// test binary with marker appended (an ELF file runs the same with bytes
// after its end); its workers serve marker at /build, and exit at start
// with status 3 when marker is "crash".
func deployBuild(t *testing.T, path, marker string) {
	t.Helper()
	proctest.CopyExe(t, path, []byte(buildMarkerPrefix+marker+"\n"))
}

// readRSS is this process's resident set size in bytes.
func readRSS() (int64, error) {
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		return 0, err
	}
	return parseStatmRSS(b, int64(os.Getpagesize()))
}

// record is one log line the supervisor wrote.
type record struct {
	msg   string
	time  time.Time
	level slog.Level
	attrs map[string]any
}

func (r record) int(key string) int {
	switch v := r.attrs[key].(type) {
	case int64:
		return int(v)
	case float64: // from JSON
		return int(v)
	}
	return -1
}

// logSink is the supervisor's log for the test to wait on: an
// slog.Handler that keeps every record, or the lines of a supervisor
// process (Pipe).
type logSink struct {
	*proctest.Log[record]
}

func newLogSink() *logSink { return &logSink{proctest.NewLog[record]()} }

func (l *logSink) Enabled(context.Context, slog.Level) bool { return true }
func (l *logSink) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *logSink) WithGroup(string) slog.Handler            { return l }

func (l *logSink) Handle(_ context.Context, r slog.Record) error {
	rec := record{msg: r.Message, level: r.Level, attrs: map[string]any{}, time: r.Time}
	r.Attrs(func(a slog.Attr) bool {
		rec.attrs[a.Key] = a.Value.Resolve().Any()
		return true
	})
	l.Add(rec)
	return nil
}

// all returns the records with message msg ("" = every record).
func (l *logSink) all(msg string) []record {
	var out []record
	for _, r := range l.Lines() {
		if msg == "" || r.msg == msg {
			out = append(out, r)
		}
	}
	return out
}

// wait waits until at least n records with message msg were logged.
func (l *logSink) wait(t *testing.T, msg string, n int, timeout time.Duration) []record {
	t.Helper()
	seen := 0
	if _, _, ok := l.WaitFor(0, timeout, func(r record) bool {
		if r.msg == msg {
			seen++
		}
		return seen >= n
	}); !ok {
		t.Fatalf("after %v: %d %q log lines, want %d; log:\n%s", timeout, len(l.all(msg)), msg, n, l.dump())
	}
	return l.all(msg)
}

func (l *logSink) dump() string {
	var b strings.Builder
	for _, r := range l.all("") {
		fmt.Fprintf(&b, "  %s %s %s %v\n", r.time.Format("15:04:05.000"), r.level, r.msg, r.attrs)
	}
	return b.String()
}

// pids returns the "pid" attribute of the records with message msg.
func (l *logSink) pids(msg string) []int {
	var out []int
	for _, r := range l.all(msg) {
		out = append(out, r.int("pid"))
	}
	return out
}

// harness is a supervisor running in this process (Run in a goroutine)
// with real worker processes.
type harness struct {
	t      *testing.T
	url    string
	logs   *logSink
	region *shm.Region // as Prepare saw it
	cancel context.CancelFunc
	result chan error
	ended  bool
}

// startSupervisor runs Run with setup on a loopback listener and waits
// for its first READY (unless wait is false).
func startSupervisor(t *testing.T, setup testSetup, wait bool, edit func(*Options)) *harness {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	h := &harness{t: t, url: "http://" + ln.Addr().String(), logs: newLogSink(), cancel: cancel, result: make(chan error, 1)}
	opts := setup.options(ln, slog.New(h.logs))
	opts.Prepare = func(r *shm.Region, _ *slog.Logger) error {
		h.region = r
		return nil
	}
	if edit != nil {
		edit(&opts)
	}
	go func() { h.result <- Run(ctx, opts) }()
	t.Cleanup(func() {
		if !h.ended {
			h.stop(30 * time.Second)
		}
		if t.Failed() || os.Getenv("PREFORK_TEST_LOGS") != "" {
			t.Logf("supervisor log:\n%s", h.logs.dump())
		}
	})
	if wait {
		h.logs.wait(t, "ready", 1, 15*time.Second)
	}
	return h
}

// stop cancels Run's context and returns Run's result.
func (h *harness) stop(timeout time.Duration) error {
	h.cancel()
	return h.wait(timeout)
}

// wait returns Run's result, failing the test if it takes longer than timeout.
func (h *harness) wait(timeout time.Duration) error {
	h.t.Helper()
	select {
	case err := <-h.result:
		h.ended = true
		return err
	case <-time.After(timeout):
		h.t.Fatalf("Run did not return within %v", timeout)
		return nil
	}
}

// signal sends sig to this process, where Run's signal.Notify receives it.
func (h *harness) signal(sig unix.Signal) {
	h.t.Helper()
	if h.ended {
		h.t.Fatal("signal after Run returned")
	}
	if err := unix.Kill(os.Getpid(), sig); err != nil {
		h.t.Fatal(err)
	}
}

// client makes every request on a new connection, so that requests spread
// over the workers and a killed worker's connection is never reused.
var client = &http.Client{
	Timeout:   10 * time.Second,
	Transport: &http.Transport{DisableKeepAlives: true},
}

// get returns the status and body of a GET of path, with header X-Client
// set to clientKey when it is not "".
func (h *harness) get(path, clientKey string) (int, string, error) {
	req, err := http.NewRequest(http.MethodGet, h.url+path, nil)
	if err != nil {
		return 0, "", err
	}
	if clientKey != "" {
		req.Header.Set("X-Client", clientKey)
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// statuses sends n sequential GETs and counts the statuses.
func (h *harness) statuses(path, clientKey string, n int) map[int]int {
	h.t.Helper()
	out := map[int]int{}
	for range n {
		code, _, err := h.get(path, clientKey)
		if err != nil {
			h.t.Fatalf("GET %s: %v", path, err)
		}
		out[code]++
	}
	return out
}

// supervisorProcess is Run in a child process, the supervisor role, with
// its JSON log (and its workers' text lines, skipped) read into logs.
type supervisorProcess struct {
	*proctest.Proc
	logs *logSink
	addr string // its listener
}

// startSupervisorProcess starts the supervisor role with setup from exe
// ("" is this test binary; a copy of it runs the same roles) with env
// added to its environment and its workers', and waits for its first
// READY. At the end of the test it is killed, and its workers must be
// gone within 10s.
func startSupervisorProcess(t *testing.T, exe string, setup testSetup, env ...string) *supervisorProcess {
	t.Helper()
	sp := &supervisorProcess{logs: newLogSink()}
	stderr := sp.logs.Pipe(t, parseJSONRecord)
	sp.Proc = proctest.Start(t, proctest.Options{Role: "supervisor", Exe: exe, Spec: setup, Env: env, Stderr: stderr})
	stderr.Close()     // the supervisor's and its workers' now
	t.Cleanup(func() { // before the Proc's own: kill, then wait for the workers
		sp.Signal(unix.SIGKILL)
		<-sp.Done()
		if !sp.logs.WaitEnd(10 * time.Second) {
			t.Error("the supervisor's workers outlived it by 10s")
		}
		if t.Failed() {
			t.Logf("supervisor log:\n%s", sp.logs.dump())
		}
	})
	sp.logs.wait(t, "ready", 1, 15*time.Second)
	sp.addr, _ = sp.logs.all("supervisor started")[0].attrs["listen"].(string)
	return sp
}

// exit sends sig and returns the supervisor's exit code, once it and
// every worker are gone (its stderr ended), within timeout.
func (sp *supervisorProcess) exit(t *testing.T, sig unix.Signal, timeout time.Duration) int {
	t.Helper()
	if err := sp.Signal(sig); err != nil {
		t.Fatal(err)
	}
	if !sp.logs.WaitEnd(timeout) {
		t.Fatalf("the supervisor and its workers still run %v after %v", timeout, sig)
	}
	sp.Wait(time.Second)
	return sp.State().ExitCode()
}

// processGone reports whether pid no longer exists: it exited and was
// waited for.
func processGone(pid int) bool {
	_, err := os.Stat(fmt.Sprintf("/proc/%d", pid))
	return os.IsNotExist(err)
}
