package main

// The harness of the end-to-end tests (e2e_test.go): the preforkd binary,
// built once by TestMain, runs as a real process tree with a config file in
// t.TempDir(); its slog text lines on stderr tell the tests what happened.
// Nothing here sleeps for a fixed time to let something happen: every wait
// is for an observable event, bounded in time.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/preforkd/preforkd/internal/proctest"
)

// binPath is the preforkd binary under test, built by TestMain; empty
// with -short (see preforkdBinary).
var binPath string

func TestMain(m *testing.M) {
	proctest.Main(map[string]proctest.Role{"upstream": upstreamRole}) // the application of the data-plane tests
	os.Exit(testMain(m))
}

func testMain(m *testing.M) int {
	flag.Parse()
	if testing.Short() {
		return m.Run() // no binary: the end-to-end tests skip
	}
	dir, err := os.MkdirTemp("", "preforkd-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	binPath = filepath.Join(dir, "preforkd")
	build := exec.Command("go", "build", "-o", binPath, ".")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building preforkd:", err)
		return 1
	}
	return m.Run()
}

// preforkdBinary is the binary under test. With -short it skips t: the
// end-to-end tests drive a separately built process, which the race
// detector (make test runs it with -short) cannot see into, and they are
// the slow part of the package. Without -short they all run.
func preforkdBinary(t testing.TB) string {
	t.Helper()
	if binPath == "" {
		t.Skip("-short: an end-to-end test of the built binary")
	}
	return binPath
}

// parallel is a subtest that runs f in parallel with its siblings.
func parallel(f func(*testing.T)) func(*testing.T) {
	return func(t *testing.T) { t.Parallel(); f(t) }
}

// ---- log lines ----

// logLine is one slog text line: time=… level=INFO msg="worker started" pid=556 …
type logLine struct {
	raw string
	kv  map[string]string
}

func (l logLine) msg() string           { return l.kv["msg"] }
func (l logLine) get(key string) string { return l.kv[key] }
func (l logLine) int(key string) int {
	n, err := strconv.Atoi(l.kv[key])
	if err != nil {
		return -1
	}
	return n
}

// parseLogfmt parses slog's text format: key=value pairs separated by
// spaces, values quoted (Go syntax) when they need to be.
func parseLogfmt(s string) map[string]string {
	kv := make(map[string]string)
	for s = strings.TrimSpace(s); s != ""; s = strings.TrimLeft(s, " ") {
		eq := strings.IndexByte(s, '=')
		sp := strings.IndexByte(s, ' ')
		if eq < 0 || (sp >= 0 && sp < eq) { // not a key=value pair: skip the word
			if sp < 0 {
				break
			}
			s = s[sp:]
			continue
		}
		key, rest := s[:eq], s[eq+1:]
		if strings.HasPrefix(rest, `"`) {
			end := 1
			for end < len(rest) && rest[end] != '"' {
				if rest[end] == '\\' {
					end++
				}
				end++
			}
			end = min(end+1, len(rest))
			v, err := strconv.Unquote(rest[:end])
			if err != nil {
				v = rest[:end]
			}
			kv[key], s = v, rest[end:]
			continue
		}
		if sp = strings.IndexByte(rest, ' '); sp < 0 {
			kv[key], s = rest, ""
		} else {
			kv[key], s = rest[:sp], rest[sp:]
		}
	}
	return kv
}

// logBuf collects the lines a daemon (supervisor and workers: they share
// its stderr) writes, and wakes whoever waits for one.
type logBuf struct {
	*proctest.Log[logLine]
	mu sync.Mutex
	// starts holds each logged worker's start time (/proc/PID/stat), read
	// when its "worker started" line arrives: with pid_max as low as 32768,
	// a pid is only our worker while its start time matches.
	starts map[int]uint64
}

func newLogBuf() *logBuf {
	return &logBuf{Log: proctest.NewLog[logLine](), starts: make(map[int]uint64)}
}

// parse reads one line of the daemon's stderr, and a worker's start time
// as soon as the line that announces it is read.
func (b *logBuf) parse(s string) (logLine, bool) {
	line := logLine{raw: s, kv: parseLogfmt(s)}
	if line.msg() == "worker started" {
		if start, _ := procStat(line.int("pid")); start != 0 {
			b.mu.Lock()
			b.starts[line.int("pid")] = start
			b.mu.Unlock()
		}
	}
	return line, true
}

// startOf returns the start time of a logged worker.
func (b *logBuf) startOf(pid int) (uint64, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	start, ok := b.starts[pid]
	return start, ok
}

func (b *logBuf) snapshot() []logLine { return b.Lines() }

func (b *logBuf) len() int { return b.Len() }

func (b *logBuf) text() string {
	var sb strings.Builder
	for _, l := range b.snapshot() {
		sb.WriteString(l.raw)
		sb.WriteByte('\n')
	}
	return sb.String()
}

// waitFor returns the index and the first line at or after index from that
// satisfies match, waiting up to timeout for it; ok is false on timeout or
// when the stream ended without one.
func (b *logBuf) waitFor(from int, timeout time.Duration, match func(logLine) bool) (int, logLine, bool) {
	return b.WaitFor(from, timeout, match)
}

// waitEOF waits up to timeout for the end of the stream: every process
// that held the daemon's stderr has exited and every line was read.
func (b *logBuf) waitEOF(timeout time.Duration) bool { return b.WaitEnd(timeout) }

func msgIs(msg string) func(logLine) bool {
	return func(l logLine) bool { return l.msg() == msg }
}

// ---- the daemon ----

// daemon is one preforkd supervisor started by a test, with its workers.
type daemon struct {
	t       testing.TB
	cmd     *exec.Cmd
	addr    string // 127.0.0.1:port of the proxy
	admin   string // 127.0.0.1:port of the admin endpoint, when asked for
	cfgPath string
	logs    *logBuf

	exited  chan struct{} // closed once the supervisor was waited for
	state   *os.ProcessState
	readyAt int // index of the "ready" line
	// wrapper, when set, runs the binary: its command line, followed by
	// the binary's path and arguments (systemd-socket-activate).
	wrapper []string
}

type daemonOptions struct {
	// config is the file's text; "ADMIN_ADDR" in it is replaced by a free
	// address. The listen address is always given with -listen.
	config string
	env    []string // added to the environment
	admin  bool     // config uses ADMIN_ADDR
	args   []string // added to the command line, after -config and -listen
	// ready matches the line that says the daemon serves; nil: msg=ready,
	// as the text format writes it.
	ready func(logLine) bool
}

// startDaemon starts preforkd run with opts and waits for its "ready" line.
// A port that turns out to be taken (by a parallel test) is retried with
// another one.
func startDaemon(t testing.TB, opts daemonOptions) *daemon {
	t.Helper()
	dir := t.TempDir()
	ready := opts.ready
	if ready == nil {
		ready = msgIs("ready")
	}
	for attempt := 1; ; attempt++ {
		addrs := freeAddrs(t, 2) // the listener's, and the admin endpoint's
		d := &daemon{t: t, addr: addrs[0], cfgPath: filepath.Join(dir, "preforkd.toml")}
		text := opts.config
		if opts.admin {
			d.admin = addrs[1]
			text = strings.ReplaceAll(text, "ADMIN_ADDR", d.admin)
		}
		if err := os.WriteFile(d.cfgPath, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		d.start(opts.env, append([]string{"run", "-config", d.cfgPath, "-listen", d.addr}, opts.args...)...)
		i, _, ok := d.logs.waitFor(0, 20*time.Second, ready)
		if ok {
			d.readyAt = i
			return d
		}
		d.kill()
		if attempt < 5 && strings.Contains(d.logs.text(), "address already in use") {
			t.Logf("attempt %d: a port was taken; retrying", attempt)
			continue
		}
		t.Fatalf("preforkd did not become ready; log:\n%s", d.logs.text())
	}
}

// start starts the binary with args as the leader of a new process group.
func (d *daemon) start(env []string, args ...string) {
	t := d.t
	t.Helper()
	d.logs, d.exited = newLogBuf(), make(chan struct{})
	// A file: the processes write to the pipe directly, so that the
	// supervisor's exit is seen (Wait) even while workers still hold it.
	// Stdout stays /dev/null for the same reason: a writer that is not a
	// file would make Wait wait for the workers too. The log stops
	// following it after the cleanup below.
	pw := d.logs.Pipe(t, d.logs.parse)
	bin := preforkdBinary(t)
	if len(d.wrapper) > 0 {
		d.cmd = exec.Command(d.wrapper[0], append(append(d.wrapper[1:len(d.wrapper):len(d.wrapper)], bin), args...)...)
	} else {
		d.cmd = exec.Command(bin, args...)
	}
	d.cmd.Env = append(cleanEnviron(), env...)
	d.cmd.Stderr = pw
	d.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	err := d.cmd.Start()
	pw.Close()
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		d.cmd.Wait()
		d.state = d.cmd.ProcessState
		close(d.exited)
	}()
	t.Cleanup(func() {
		d.kill()
		if t.Failed() {
			t.Logf("preforkd log (pid %d):\n%s", d.cmd.Process.Pid, d.logs.text())
		}
	})
}

// cleanEnviron is this process's environment without what would change
// the daemon's role or reach a real service manager.
func cleanEnviron() []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if k != "NOTIFY_SOCKET" && k != "PREFORKD_WORKER" {
			env = append(env, kv)
		}
	}
	return env
}

// kill ends the supervisor's process group and every worker it logged,
// with SIGKILL, and waits (bounded) for all of them to be gone.
func (d *daemon) kill() {
	pgid := d.cmd.Process.Pid
	select {
	case <-d.exited:
	default:
		syscall.Kill(-pgid, syscall.SIGKILL)
	}
	select {
	case <-d.exited:
	case <-time.After(5 * time.Second):
		d.t.Errorf("supervisor %d survived SIGKILL for 5s", pgid)
	}
	// Workers die with their supervisor: every cleanup is one
	// more witness. Survivors are reported, then killed.
	pids := d.workerPIDs()
	deadline := time.Now().Add(2 * time.Second)
	for _, pid := range pids {
		for d.alive(pid) && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
		if d.alive(pid) {
			d.t.Errorf("worker %d survived its supervisor's death by 2s", pid)
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	deadline = time.Now().Add(5 * time.Second)
	for _, pid := range pids {
		for d.alive(pid) && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// workerPIDs lists every worker the supervisor logged as started.
func (d *daemon) workerPIDs() []int {
	var pids []int
	for _, l := range d.logs.snapshot() {
		if l.msg() == "worker started" {
			pids = append(pids, l.int("pid"))
		}
	}
	return pids
}

func (d *daemon) pid() int { return d.cmd.Process.Pid }

func (d *daemon) signal(sig syscall.Signal) {
	d.t.Helper()
	if err := syscall.Kill(d.pid(), sig); err != nil {
		d.t.Fatalf("kill %d %v: %v", d.pid(), sig, err)
	}
}

// wait waits up to timeout for the supervisor to exit and returns its exit
// code (-1 when killed by a signal).
func (d *daemon) wait(timeout time.Duration) (int, bool) {
	select {
	case <-d.exited:
		return d.state.ExitCode(), true
	case <-time.After(timeout):
		return 0, false
	}
}

func (d *daemon) url(path string) string { return "http://" + d.addr + path }

// reloadTo writes cfg, with ADMIN_ADDR replaced by the daemon's admin
// address, and sends HUP; it returns where the log was.
func reloadTo(d *daemon, cfg string) int {
	d.t.Helper()
	text := strings.ReplaceAll(cfg, "ADMIN_ADDR", d.admin)
	if err := os.WriteFile(d.cfgPath, []byte(text), 0o600); err != nil {
		d.t.Fatal(err)
	}
	from := d.logs.len()
	d.signal(syscall.SIGHUP)
	return from
}

// waitReloaded waits up to timeout for a "reload finished" line at or
// after from.
func waitReloaded(t testing.TB, d *daemon, from int, timeout time.Duration) {
	t.Helper()
	if _, _, ok := d.logs.waitFor(from, timeout, msgIs("reload finished")); !ok {
		t.Fatalf("the reload did not finish within %v", timeout)
	}
}

// waitRetiredGone waits until every worker that a reload begun after log
// line from retired has exited (waitReloaded first): a worker of the old
// generation drains for a while, serving the connections it has with the
// old configuration.
func waitRetiredGone(t *testing.T, d *daemon, from int) {
	t.Helper()
	end, _, ok := d.logs.waitFor(from, 15*time.Second, msgIs("reload finished"))
	if !ok {
		t.Fatal("the reload did not finish")
	}
	for i := from; ; i++ {
		var l logLine
		if i, l, ok = d.logs.waitFor(i, 0, msgIs("worker retiring")); !ok || i > end {
			return
		}
		waitExited(t, d, i, l.int("pid"))
	}
}

// stop sends TERM and requires a clean exit (status 0) within 15 s, with
// the log read to its end.
func (d *daemon) stop() {
	d.t.Helper()
	d.signal(syscall.SIGTERM)
	code, ok := d.wait(15 * time.Second)
	if !ok || code != 0 {
		d.t.Fatalf("preforkd after TERM: exited=%v code=%d; log:\n%s", ok, code, d.logs.text())
	}
	d.logs.waitEOF(5 * time.Second)
}

// freeAddr returns 127.0.0.1 with a port that was free a moment ago.
func freeAddr(t testing.TB) string {
	t.Helper()
	return freeAddrs(t, 1)[0]
}

// freeAddrs is n free loopback addresses, distinct: each is held until all
// are picked (two picks in a row may otherwise get one port twice).
func freeAddrs(t testing.TB, n int) []string {
	t.Helper()
	addrs := make([]string, n)
	for i := range addrs {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		addrs[i] = ln.Addr().String()
	}
	return addrs
}

// alive reports whether pid is a worker of this daemon that has not
// exited. A zombie has exited: an orphaned worker waits for init, which
// may reap it late.
func (d *daemon) alive(pid int) bool {
	want, known := d.logs.startOf(pid)
	start, state := procStat(pid)
	if !known || start != want {
		return false // gone, or the pid now belongs to another process
	}
	return state != 'Z' && state != 'X'
}

// procStat returns a process's start time (clock ticks since boot) and
// state; start is 0 when there is no such process.
func procStat(pid int) (start uint64, state byte) {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0
	}
	// pid (comm) state ppid ...: comm may contain spaces and parentheses.
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, 0
	}
	f := strings.Fields(string(stat[i+1:]))
	if len(f) < 20 {
		return 0, 0
	}
	start, _ = strconv.ParseUint(f[19], 10, 64) // field 22 of stat
	return start, f[0][0]
}

// liveRegionPath is a new path for a live region in /dev/shm; the region
// and its lock file are removed when the test ends.
func liveRegionPath(t testing.TB) string {
	live := filepath.Join("/dev/shm", fmt.Sprintf("preforkd-test-%d-%d", os.Getpid(), time.Now().UnixNano()))
	t.Cleanup(func() { os.Remove(live); os.Remove(live + ".lock") })
	return live
}

// runBinary runs preforkd to completion (bounded) and returns its exit
// code and output.
func runBinary(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, preforkdBinary(t), args...)
	cmd.Env = cleanEnviron()
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
	default:
		t.Fatalf("preforkd %s: %v", strings.Join(args, " "), err)
	}
	if ctx.Err() != nil {
		t.Fatalf("preforkd %s did not exit within 20s", strings.Join(args, " "))
	}
	return cmd.ProcessState.ExitCode(), out.String(), errb.String()
}

// ---- clients ----

// clientIPs hands out loopback addresses: every test client that must be
// "a fresh client" of the rate limiter connects from its own 127.0.x.y,
// which the daemon sees as the TCP peer.
var clientIPs atomic.Uint32

func freshClientIP() net.IP {
	for {
		n := clientIPs.Add(1) + 1 // 127.0.0.2 first: 127.0.0.1 is the trusted proxy
		if b := byte(n); b != 0 && b != 255 {
			return net.IPv4(127, byte(n>>16), byte(n>>8), b)
		}
	}
}

// newClient returns an HTTP client whose connections come from ip (nil:
// the kernel's choice, 127.0.0.1), a new one for every request unless
// keepAlive.
func newClient(t testing.TB, ip net.IP, keepAlive bool) *http.Client {
	dialer := &net.Dialer{Timeout: 5 * time.Second}
	if ip != nil {
		dialer.LocalAddr = &net.TCPAddr{IP: ip}
	}
	tr := &http.Transport{
		Proxy:               nil,
		DialContext:         dialer.DialContext,
		DisableKeepAlives:   !keepAlive,
		MaxIdleConnsPerHost: 8,
	}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 15 * time.Second}
}

// result is one request's outcome.
type result struct {
	status     int
	header     http.Header
	body       []byte
	err        error
	start, end time.Time
}

// demoBody is what the built-in demo application answers.
type demoBody struct {
	Method string `json:"method"`
	Path   string `json:"path"`
	Worker int    `json:"worker"`
	PID    int    `json:"pid"`
}

func (r result) demo() (demoBody, bool) {
	var b demoBody
	err := json.Unmarshal(r.body, &b)
	return b, err == nil && b.PID != 0
}

func do(c *http.Client, method, url string, header http.Header) result {
	return send(c, method, url, header, "")
}

// send is do with a request body.
func send(c *http.Client, method, url string, header http.Header, body string) result {
	res := result{start: time.Now()}
	defer func() { res.end = time.Now() }()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		res.err = err
		return res
	}
	for k, vs := range header {
		req.Header[k] = vs
	}
	resp, err := c.Do(req)
	if err != nil {
		res.err = err
		res.end = time.Now()
		return res
	}
	defer resp.Body.Close()
	res.body, res.err = io.ReadAll(resp.Body)
	res.status, res.header = resp.StatusCode, resp.Header
	res.end = time.Now()
	return res
}

func get(c *http.Client, url string) result { return do(c, http.MethodGet, url, nil) }

// burst sends n GET requests at once, each on its own connection.
func burst(c *http.Client, url string, n int) []result {
	out := make([]result, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			out[i] = get(c, url)
		})
	}
	close(start)
	wg.Wait()
	return out
}

// statuses counts results by status code; transport errors count under 0.
func statuses(rs []result) map[int]int {
	m := make(map[int]int)
	for _, r := range rs {
		if r.err != nil {
			m[0]++
		} else {
			m[r.status]++
		}
	}
	return m
}

// firstErr describes the first transport error among rs, for messages.
func firstErr(rs []result) string {
	for _, r := range rs {
		if r.err != nil {
			return r.err.Error()
		}
	}
	return "none"
}
