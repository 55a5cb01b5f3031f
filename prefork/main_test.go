package prefork

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/preforkd/preforkd/config"
	"github.com/preforkd/preforkd/internal/proctest"
	"github.com/preforkd/preforkd/shm"
)

// The test binary plays three roles (internal/proctest): the test itself,
// a worker (started by a supervisor, detected by IsWorker), and a
// supervisor of its own (role "supervisor", for the tests that kill or
// signal the supervisor's process).
const (
	envTestCrash  = "PREFORK_TEST_CRASH"  // set: a worker exits at once with status 3
	envTestEngine = "PREFORK_TEST_ENGINE" // "fast": workers serve testFastHandler with Options.FastHandler
)

func TestMain(m *testing.M) {
	if IsWorker() {
		level := slog.LevelWarn
		if os.Getenv("PREFORK_TEST_LOGS") != "" {
			level = slog.LevelDebug
		}
		log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
		opts := Options{Handler: testHandler, Logger: log}
		if os.Getenv(envTestEngine) == "fast" {
			opts = Options{FastHandler: testFastHandler, Logger: log}
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

// supervisorRole runs Run with the config.Config of its spec as a whole
// process, with its logs as JSON on stderr.
func supervisorRole(c *proctest.Child) error {
	var cfg config.Config
	if err := c.Spec(&cfg); err != nil {
		return err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	log := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	return Run(context.Background(), Options{Config: cfg, Listener: ln, Handler: testHandler, Logger: log})
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

// testHandler is the application of the test workers.
func testHandler(w *Worker) (http.Handler, error) {
	build := buildMarker()
	if os.Getenv(envTestCrash) != "" || build == "crash" {
		os.Exit(3)
	}
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
	mux.HandleFunc("/reset", func(rw http.ResponseWriter, r *http.Request) {
		rule := r.URL.Query().Get("rule")
		w.Limiter(rule).Reset(w.ClientKey(rule, r), w.Region.Now())
	})
	// A configuration whose application version (persist.key) is
	// "broken" is a build that answers 500 to everything.
	if w.Config.Persist.Key == "broken" {
		return http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) {
			http.Error(rw, "broken build", http.StatusInternalServerError)
		}), nil
	}
	mux.HandleFunc("/", func(rw http.ResponseWriter, _ *http.Request) { fmt.Fprint(rw, "ok") })
	return mux, nil
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
	f, err := listenerFile(ln)
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

// startSupervisor runs Run with cfg on a loopback listener and waits for
// its first READY (unless wait is false).
func startSupervisor(t *testing.T, cfg config.Config, wait bool, edit func(*Options)) *harness {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	h := &harness{t: t, url: "http://" + ln.Addr().String(), logs: newLogSink(), cancel: cancel, result: make(chan error, 1)}
	opts := Options{
		Config:   cfg,
		Listener: ln,
		Handler:  testHandler,
		Logger:   slog.New(h.logs),
		Prepare: func(r *shm.Region, _ config.Config, _ *slog.Logger) error {
			h.region = r
			return nil
		},
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

// testConfig is a small configuration: n workers, a small table, a short
// drain, a short canary window, and the given rules (by X-Client, falling
// back to ip).
func testConfig(n int, rules ...config.RateLimit) config.Config {
	cfg := config.Config{
		Server: config.Server{Workers: n, ShutdownTimeout: 5 * time.Second},
		Table:  config.Table{Counters: 4096},
		Reload: config.Reload{CanaryWindow: 300 * time.Millisecond},
	}
	for _, r := range rules {
		if r.By == "" {
			r.By = "header:X-Client|ip"
		}
		cfg.RateLimits = append(cfg.RateLimits, r)
	}
	return cfg
}

// supervisorProcess is Run in a child process, the supervisor role, with
// its JSON log (and its workers' text lines, skipped) read into logs.
type supervisorProcess struct {
	*proctest.Proc
	logs *logSink
	addr string // its listener
}

// startSupervisorProcess starts the supervisor role with cfg from exe (""
// is this test binary; a copy of it runs the same roles) with env added to
// its environment and its workers', and waits for its first READY. At the
// end of the test it is killed, and its workers must be gone within 10s.
func startSupervisorProcess(t *testing.T, exe string, cfg config.Config, env ...string) *supervisorProcess {
	t.Helper()
	sp := &supervisorProcess{logs: newLogSink()}
	stderr := sp.logs.Pipe(t, parseJSONRecord)
	sp.Proc = proctest.Start(t, proctest.Options{Role: "supervisor", Exe: exe, Spec: cfg, Env: env, Stderr: stderr})
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
