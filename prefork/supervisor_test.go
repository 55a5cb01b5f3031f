package prefork

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/preforkd/preforkd/config"
	"github.com/preforkd/preforkd/internal/logtest"
)

// Unit tests of the supervisor's state machine through its seam: no
// process is started, the clock is a variable.

var t0 = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

type sent struct {
	pid int
	sig syscall.Signal
}

// fakeSys records what the supervisor asks of the operating system.
type fakeSys struct {
	now      time.Time
	nextPID  int
	starts   []spawnSpec
	pids     []int // pid of each start
	signals  []sent
	reaps    []int
	notes    []string
	stopped  int
	startErr error
	load     func() (config.Config, error)
	// counts are what each region worker index counted (never reset, as
	// in the region); retired adds what no index shows any more.
	counts  map[int]RequestCounts
	retired RequestCounts
}

func newFake() *fakeSys {
	return &fakeSys{now: t0, nextPID: 100, counts: map[int]RequestCounts{}}
}

// serve counts requests and 5xx for region worker index.
func (f *fakeSys) serve(index int, requests, errors uint64) {
	c := f.counts[index]
	c.Requests += requests
	c.Errors += errors
	f.counts[index] = c
}

func (f *fakeSys) env() sysEnv {
	e := sysEnv{
		now: func() time.Time { return f.now },
		start: func(sp spawnSpec) (started, error) {
			if f.startErr != nil {
				return started{}, f.startErr
			}
			pid := f.nextPID
			f.nextPID++
			f.starts = append(f.starts, sp)
			f.pids = append(f.pids, pid)
			return started{pid: pid, signal: func(sig syscall.Signal) error {
				f.signals = append(f.signals, sent{pid, sig})
				return nil
			}}, nil
		},
		reap:          func(index int) (int, error) { f.reaps = append(f.reaps, index); return 0, nil },
		notify:        func(state string) error { f.notes = append(f.notes, state); return nil },
		stopListening: func() { f.stopped++ },
		requests:      func(index int) RequestCounts { return f.counts[index] },
		fleetRequests: func(except int) RequestCounts {
			t := f.retired
			for i, c := range f.counts {
				if i != except {
					t.Requests += c.Requests
					t.Errors += c.Errors
				}
			}
			return t
		},
	}
	if f.load != nil {
		e.load = f.load
	}
	return e
}

// signalled lists the pids that got sig, in order.
func (f *fakeSys) signalled(sig syscall.Signal) []int {
	var out []int
	for _, s := range f.signals {
		if s.sig == sig {
			out = append(out, s.pid)
		}
	}
	return out
}

// noCanary is cfg with canary reloads off, for the tests of the roll itself.
func noCanary(cfg config.Config) config.Config {
	cfg.Reload.Canary = config.Off
	return cfg
}

func quietLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// newTestSupervisor returns a supervisor of n workers that has run its
// first step (started its workers).
func newTestSupervisor(f *fakeSys, n int) *supervisor {
	cfg := config.Config{Server: config.Server{Workers: n, ShutdownTimeout: 5 * time.Second}}
	s := newSupervisor(f.env(), quietLog(), cfg, minMaxWorkers(n))
	s.step()
	return s
}

// The loop runs step after every event; so do these helpers.
func ready(s *supervisor, pids ...int) {
	for _, pid := range pids {
		s.onReady(pid)
		s.step()
	}
}

func exit(s *supervisor, pid int, clean bool) {
	status := "signal: killed"
	if clean {
		status = "exit status 0"
	}
	s.onExit(exitEvent{pid: pid, status: status, clean: clean})
	s.step()
}

func sendSignal(s *supervisor, sig syscall.Signal) {
	s.onSignal(sig)
	s.step()
}

func advance(f *fakeSys, s *supervisor, d time.Duration) {
	f.now = f.now.Add(d)
	s.step()
}

func TestBackoff(t *testing.T) {
	b := newBackoff()
	short := 50 * time.Millisecond
	var got []time.Duration
	for range 9 {
		got = append(got, b.failure(short))
	}
	want := []time.Duration{100 * time.Millisecond, 200 * time.Millisecond, 400 * time.Millisecond,
		800 * time.Millisecond, 1600 * time.Millisecond, 3200 * time.Millisecond, 6400 * time.Millisecond,
		10 * time.Second, 10 * time.Second}
	if !slices.Equal(got, want) {
		t.Fatalf("delays %v, want %v", got, want)
	}
	if d := b.failure(backoffStable - time.Millisecond); d != 10*time.Second {
		t.Errorf("after a run just short of stable: %v, want the maximum", d)
	}
	if d := b.failure(backoffStable); d != backoffBase {
		t.Errorf("after a stable run: %v, want %v", d, backoffBase)
	}
	if d := b.failure(short); d != 2*backoffBase {
		t.Errorf("crash after the reset: %v, want %v", d, 2*backoffBase)
	}
}

func TestStartAndAnnounce(t *testing.T) {
	f := newFake()
	s := newTestSupervisor(f, 3)
	if len(f.starts) != 3 {
		t.Fatalf("%d starts, want 3", len(f.starts))
	}
	for i, sp := range f.starts {
		if sp.Index != i || sp.Gen != 0 {
			t.Errorf("start %d: %+v", i, sp)
		}
	}
	ready(s, 100, 101)
	if len(f.notes) != 0 {
		t.Fatalf("notified %q before every worker was ready", f.notes)
	}
	ready(s, 102)
	if !slices.Equal(f.notes, []string{notifyReady}) {
		t.Fatalf("notes %q, want READY=1 once", f.notes)
	}
}

func TestCrashRespawnsWithBackoff(t *testing.T) {
	f := newFake()
	s := newTestSupervisor(f, 2)
	ready(s, 100, 101)

	// Each crash of a short-lived worker doubles the delay; nothing starts before it.
	pid := 101
	for i, delay := range []time.Duration{100 * time.Millisecond, 200 * time.Millisecond, 400 * time.Millisecond} {
		advance(f, s, 10*time.Millisecond)
		exit(s, pid, false)
		starts := len(f.starts)
		if next, ok := s.nextDeadline(); !ok || next != f.now.Add(delay) {
			t.Fatalf("crash %d: next deadline %v %v, want now+%v", i, next.Sub(f.now), ok, delay)
		}
		advance(f, s, delay-time.Millisecond)
		if len(f.starts) != starts {
			t.Fatalf("crash %d: respawned %v early", i, time.Millisecond)
		}
		advance(f, s, time.Millisecond)
		if len(f.starts) != starts+1 {
			t.Fatalf("crash %d: not respawned after %v", i, delay)
		}
		last := f.starts[len(f.starts)-1]
		if last.Index != 1 {
			t.Errorf("crash %d: replacement got index %d, want the freed 1", i, last.Index)
		}
		pid = f.pids[len(f.pids)-1]
	}
	if !slices.Equal(f.reaps, []int{1, 1, 1}) {
		t.Errorf("reaped %v, want index 1 at every crash", f.reaps)
	}
	// A worker that ran stably resets the delay.
	ready(s, pid)
	advance(f, s, backoffStable)
	exit(s, pid, false)
	if next, _ := s.nextDeadline(); next != f.now.Add(backoffBase) {
		t.Errorf("after a stable run: delay %v, want %v", next.Sub(f.now), backoffBase)
	}
	if len(f.signals) != 0 {
		t.Errorf("signals %v, want none", f.signals)
	}
}

func TestDrainNeverRespawns(t *testing.T) {
	f := newFake()
	s := newTestSupervisor(f, 2)
	ready(s, 100, 101)
	exit(s, 101, false) // a crash: replacement due in 100ms
	sendSignal(s, syscall.SIGTERM)
	if !slices.Equal(f.signalled(syscall.SIGTERM), []int{100}) || f.stopped != 1 {
		t.Fatalf("TERM sent to %v, listener stopped %d times", f.signalled(syscall.SIGTERM), f.stopped)
	}
	if f.notes[len(f.notes)-1] != notifyStopping {
		t.Errorf("notes %q, want STOPPING=1 last", f.notes)
	}
	advance(f, s, time.Second) // past the respawn delay
	exit(s, 100, true)
	if len(f.starts) != 2 {
		t.Fatalf("%d starts while draining, want none after the first 2", len(f.starts)-2)
	}
	if !s.finished() {
		t.Fatal("not finished with every worker reaped")
	}
	if !slices.Equal(f.reaps, []int{1, 0}) {
		t.Errorf("reaped %v, want [1 0]", f.reaps)
	}
}

func TestDrainDeadlineAndSecondSignal(t *testing.T) {
	for _, second := range []bool{false, true} {
		t.Run(fmt.Sprint("second=", second), func(t *testing.T) {
			f := newFake()
			s := newTestSupervisor(f, 2)
			ready(s, 100, 101)
			sendSignal(s, syscall.SIGINT)
			exit(s, 100, true)
			if second {
				sendSignal(s, syscall.SIGTERM)
			} else {
				advance(f, s, 5*time.Second+drainGrace-time.Millisecond)
				if k := f.signalled(syscall.SIGKILL); len(k) != 0 {
					t.Fatalf("killed %v before the deadline", k)
				}
				advance(f, s, time.Millisecond)
			}
			if k := f.signalled(syscall.SIGKILL); !slices.Equal(k, []int{101}) {
				t.Fatalf("killed %v, want [101]", k)
			}
			if s.finished() {
				t.Fatal("finished before the killed worker was reaped")
			}
			exit(s, 101, false)
			if !s.finished() || len(f.starts) != 2 {
				t.Fatalf("finished %v with %d starts", s.finished(), len(f.starts))
			}
		})
	}
}

func TestReloadReplacesOneAtATime(t *testing.T) {
	f := newFake()
	next := noCanary(config.Config{Server: config.Server{Workers: 2, ShutdownTimeout: time.Second}})
	f.load = func() (config.Config, error) { return next, nil }
	s := newTestSupervisor(f, 2)
	ready(s, 100, 101)

	sendSignal(s, syscall.SIGHUP)
	if len(f.notes) != 2 || f.notes[1][:len("RELOADING=1\nMONOTONIC_USEC=")] != "RELOADING=1\nMONOTONIC_USEC=" {
		t.Fatalf("notes %q, want RELOADING=1 with MONOTONIC_USEC", f.notes)
	}
	// One successor at a time; the old worker gets TERM only once its
	// successor is ready.
	if len(f.starts) != 3 || f.starts[2].Gen != 1 || f.starts[2].Config.Server.ShutdownTimeout != time.Second {
		t.Fatalf("starts %+v, want one successor with the new configuration", f.starts)
	}
	if len(f.signals) != 0 {
		t.Fatalf("signals %v before the successor was ready", f.signals)
	}
	// The successor crashes before it is ready: backoff, old still serving.
	exit(s, 102, false)
	if len(f.starts) != 3 || len(f.signals) != 0 {
		t.Fatalf("after the successor's crash: starts %d, signals %v", len(f.starts), f.signals)
	}
	advance(f, s, backoffBase)
	if len(f.starts) != 4 {
		t.Fatalf("successor not restarted after the backoff")
	}
	ready(s, 103)
	if !slices.Equal(f.signalled(syscall.SIGTERM), []int{100}) || len(f.starts) != 5 {
		t.Fatalf("after the first successor: TERM %v, starts %d", f.signalled(syscall.SIGTERM), len(f.starts))
	}
	exit(s, 100, true) // the retired worker drained: no respawn
	ready(s, 104)
	if !slices.Equal(f.signalled(syscall.SIGTERM), []int{100, 101}) || len(f.starts) != 5 {
		t.Fatalf("after the second successor: TERM %v, starts %d", f.signalled(syscall.SIGTERM), len(f.starts))
	}
	if f.notes[len(f.notes)-1] != notifyReady || !s.announced || s.reloading {
		t.Fatalf("notes %q, want READY=1 at the end of the reload", f.notes)
	}
	// A retired worker that does not drain is killed after the shutdown
	// timeout of the configuration it runs (5s; the new one says 1s).
	advance(f, s, time.Second+drainGrace)
	if k := f.signalled(syscall.SIGKILL); len(k) != 0 {
		t.Fatalf("killed %v after the new configuration's timeout", k)
	}
	advance(f, s, 4*time.Second)
	if k := f.signalled(syscall.SIGKILL); !slices.Equal(k, []int{101}) {
		t.Fatalf("killed %v, want the retired 101", k)
	}
	exit(s, 101, false)
	if len(f.starts) != 5 {
		t.Fatal("a retired worker was replaced")
	}
}

func TestReloadRefused(t *testing.T) {
	f := newFake()
	f.load = func() (config.Config, error) { return config.Config{}, errors.New("config: bad") }
	s := newTestSupervisor(f, 2)
	ready(s, 100, 101)
	sendSignal(s, syscall.SIGHUP)
	if len(f.starts) != 2 || len(f.signals) != 0 || s.gen != 0 {
		t.Fatalf("refused reload started %d, signalled %v, generation %d", len(f.starts)-2, f.signals, s.gen)
	}
	if len(f.notes) != 3 || f.notes[2] != notifyReady {
		t.Fatalf("notes %q, want READY=1, RELOADING=1, READY=1", f.notes)
	}
}

// systemd's Type=notify-reload pairs RELOADING=1 with the HUP it sent
// only when MONOTONIC_USEC, in the same message, is no earlier than the
// instant of the signal (CLOCK_MONOTONIC); else the reload times out.
func TestReloadingCarriesMonotonicTime(t *testing.T) {
	f := newFake()
	f.load = func() (config.Config, error) { return noCanary(config.Config{Server: config.Server{Workers: 1}}), nil }
	s := newTestSupervisor(f, 1)
	ready(s, 100)
	usec := func() uint64 {
		var ts unix.Timespec
		if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
			t.Fatal(err)
		}
		return uint64(ts.Nano() / 1000)
	}
	signalled := usec() // what systemd records before it sends HUP
	sendSignal(s, syscall.SIGHUP)
	after := usec()
	if len(f.notes) != 2 {
		t.Fatalf("notes %q, want READY=1 then RELOADING=1", f.notes)
	}
	fields := strings.Split(f.notes[1], "\n")
	if len(fields) != 2 || fields[0] != "RELOADING=1" || !strings.HasPrefix(fields[1], "MONOTONIC_USEC=") {
		t.Fatalf("on HUP: %q, want RELOADING=1 and MONOTONIC_USEC= in one message", f.notes[1])
	}
	got, err := strconv.ParseUint(strings.TrimPrefix(fields[1], "MONOTONIC_USEC="), 10, 64)
	if err != nil || got < signalled || got > after {
		t.Fatalf("MONOTONIC_USEC=%d (%v), want between %d and %d", got, err, signalled, after)
	}
	ready(s, 101)
	if f.notes[len(f.notes)-1] != notifyReady {
		t.Fatalf("notes %q, want READY=1 once the reload finished", f.notes)
	}
}

// A HUP with a broken file while an earlier reload still replaces workers
// must not send READY=1: systemd would take the reload as finished while
// workers of the old configuration still serve. The roll's own READY=1
// ends it.
func TestReloadRefusedDuringAReload(t *testing.T) {
	f := newFake()
	broken := false
	f.load = func() (config.Config, error) {
		if broken {
			return config.Config{}, errors.New("config: bad")
		}
		return noCanary(config.Config{Server: config.Server{Workers: 2, ShutdownTimeout: time.Second}}), nil
	}
	s := newTestSupervisor(f, 2)
	ready(s, 100, 101)
	sendSignal(s, syscall.SIGHUP) // accepted: successor 102 starts
	broken = true
	sendSignal(s, syscall.SIGHUP) // refused while 102 is not ready yet
	for _, n := range f.notes[1:] {
		if n == notifyReady {
			t.Fatalf("notes %q: READY=1 before the first reload finished", f.notes)
		}
	}
	ready(s, 102)
	ready(s, 103)
	readies := 0
	for _, n := range f.notes[1:] {
		if n == notifyReady {
			readies++
		}
	}
	if readies != 1 || f.notes[len(f.notes)-1] != notifyReady {
		t.Fatalf("notes %q, want exactly one READY=1, at the end of the reload", f.notes)
	}
}

func TestReloadKeepsRestartOnlySettings(t *testing.T) {
	running := config.Config{
		Server:  config.Server{Listen: "127.0.0.1:1", Workers: 2, Upstream: "http://a"},
		Table:   config.Table{Counters: 1024},
		Persist: config.Persist{Path: "/var/lib/preforkd/dump", Key: "v1"},
	}
	next := config.Config{
		Server:  config.Server{Listen: "127.0.0.1:2", Workers: 5, Upstream: "http://b"},
		Table:   config.Table{Counters: 2048},
		Persist: config.Persist{Path: "/elsewhere/dump", Key: "v2", Live: "/dev/shm/x"},
	}
	var lines logtest.Buffer
	got := keepRestartOnly(slog.New(slog.NewTextHandler(&lines, nil)), running, next)
	want := running
	want.Server.Upstream = "http://b"
	want.Persist.Key = "v2" // the application's version goes with the reload
	if got.Server.Listen != want.Server.Listen || got.Server.Workers != 2 || got.Table != want.Table ||
		got.Persist != want.Persist || got.Server.Upstream != "http://b" {
		t.Fatalf("got %+v", got)
	}
	for _, ignored := range []string{"server.listen", "server.workers", "table", "persist.path", "persist.live"} {
		if !strings.Contains(lines.String(), ignored) {
			t.Errorf("the warning does not name %s:\n%s", ignored, lines.String())
		}
	}
}

func TestFirstStartFailureIsFatal(t *testing.T) {
	f := newFake()
	f.startErr = errors.New("exec: no such file")
	s := newTestSupervisor(f, 2)
	if !s.finished() || s.fatal == nil {
		t.Fatalf("finished %v, fatal %v", s.finished(), s.fatal)
	}
}

func TestIndexesAreNotReusedWhileHeld(t *testing.T) {
	// A region with room for 3 workers and 2 slots: during a reload the
	// second successor must wait until a retired worker frees its index.
	f := newFake()
	f.load = func() (config.Config, error) { return noCanary(config.Config{Server: config.Server{Workers: 2}}), nil }
	cfg := config.Config{Server: config.Server{Workers: 2, ShutdownTimeout: time.Second}}
	s := newSupervisor(f.env(), quietLog(), cfg, 3)
	s.step()
	ready(s, 100, 101)
	sendSignal(s, syscall.SIGHUP)
	ready(s, 102) // index 2; 100 (index 0) retires
	if len(f.starts) != 3 {
		t.Fatalf("%d starts while every index is held, want 3", len(f.starts))
	}
	exit(s, 100, true)
	if len(f.starts) != 4 || f.starts[3].Index != 0 {
		t.Fatalf("starts %+v, want the freed index 0 next", f.starts)
	}
}

func TestWorkerNotReadyInTimeIsReplaced(t *testing.T) {
	f := newFake()
	s := newTestSupervisor(f, 2)
	ready(s, 100)
	if next, _ := s.nextDeadline(); next != t0.Add(readyTimeout) {
		t.Fatalf("next deadline %v, want the readiness timeout", next.Sub(t0))
	}
	advance(f, s, readyTimeout)
	if k := f.signalled(syscall.SIGKILL); !slices.Equal(k, []int{101}) {
		t.Fatalf("killed %v, want the worker that never got ready", k)
	}
	exit(s, 101, false)
	advance(f, s, backoffBase)
	if len(f.starts) != 3 || f.starts[2].Index != 1 {
		t.Fatalf("starts %+v, want a replacement in index 1", f.starts)
	}
	if _, ok := s.nextDeadline(); !ok {
		t.Fatal("no deadline for the replacement's readiness")
	}
	ready(s, 102)
	if _, ok := s.nextDeadline(); ok || !s.announced {
		t.Fatalf("deadline left or not announced after every worker is ready")
	}
}

func TestStatusSnapshots(t *testing.T) {
	f := newFake()
	reloaded := noCanary(config.Config{Server: config.Server{Workers: 2, Upstream: "http://127.0.0.1:9"}}).WithDefaults()
	var loadErr error
	f.load = func() (config.Config, error) { return reloaded, loadErr }
	var got []Status
	cfg := config.Config{Server: config.Server{Workers: 2, ShutdownTimeout: time.Second}}
	s := newSupervisor(f.env(), quietLog(), cfg, minMaxWorkers(2))
	s.onStatus = func(st Status) { got = append(got, st) }
	last := func() Status { return got[len(got)-1] }
	s.step()
	s.publish()
	s.publish() // nothing changed: no snapshot
	if len(got) != 1 || got[0].Ready || got[0].Serving || len(got[0].Workers) != 2 || got[0].Workers[0].PID != 100 ||
		got[0].Workers[0].State() != "starting" {
		t.Fatalf("first snapshots %+v", got)
	}
	ready(s, 100)
	s.publish()
	if st := last(); st.Ready || st.Serving {
		t.Fatalf("one of two workers ready: Ready %v, Serving %v; want neither", st.Ready, st.Serving)
	}
	ready(s, 101)
	s.publish()
	if st := last(); !st.Ready || !st.Serving || !st.Workers[1].Ready || st.Workers[1].State() != "ready" {
		t.Fatalf("after readiness: %+v", st)
	}

	// A reload: not Ready until every slot runs the new configuration,
	// Serving throughout.
	f.now = f.now.Add(time.Minute)
	sendSignal(s, syscall.SIGHUP)
	s.publish()
	st := last()
	if st.Ready || !st.Serving || st.Generation != 1 || len(st.Workers) != 3 || st.Workers[2].Generation != 1 {
		t.Fatalf("during the reload: %+v", st)
	}
	if st.Config.Server.Upstream != reloaded.Server.Upstream || st.Reloads != (ReloadStatus{Accepted: 1, Last: f.now}) {
		t.Fatalf("during the reload: config upstream %q, reloads %+v", st.Config.Server.Upstream, st.Reloads)
	}
	ready(s, 102)
	s.publish()
	if st := last(); !st.Workers[0].Retiring || st.Workers[0].State() != "retiring" || st.Ready || !st.Serving {
		t.Fatalf("after the first successor: %+v", st)
	}

	// A refused reload is counted, with its reason.
	loadErr = errors.New("config: bad file")
	sendSignal(s, syscall.SIGHUP)
	s.publish()
	if r := last().Reloads; r.Accepted != 1 || r.Refused != 1 || r.LastError != "config: bad file" {
		t.Fatalf("after a refused reload: %+v", r)
	}

	// A crash is counted; the others serve meanwhile.
	exit(s, 101, false)
	s.publish()
	if st := last(); st.Crashes != 1 || !st.Serving {
		t.Fatalf("after a crash: crashes %d, serving %v", st.Crashes, st.Serving)
	}

	sendSignal(s, syscall.SIGTERM)
	s.publish()
	if st := last(); !st.Draining || st.Ready || st.Serving {
		t.Fatalf("draining: %+v", st)
	}
	if len(got) != 8 {
		t.Errorf("%d snapshots, want 8 (one per change)", len(got))
	}
}

// A reload logs what it changes, by key and never by value.
func TestReloadLogsChanges(t *testing.T) {
	f := newFake()
	base := config.Config{
		Server:     config.Server{Workers: 1, Upstream: "http://127.0.0.1:9000"},
		RateLimits: []config.RateLimit{{Name: "login", Path: "/login", Limit: 5, Window: time.Minute}},
	}.WithDefaults()
	next := base
	next.Server.Upstream = "http://user:s3cret@127.0.0.1:9001"
	next.RateLimits = []config.RateLimit{
		{Name: "login", Path: "/login", Limit: 10, Window: time.Minute},
		{Name: "api", Path: "/api/*", Limit: 100, Window: time.Minute},
	}
	next = next.WithDefaults()
	f.load = func() (config.Config, error) { return next, nil }
	var buf strings.Builder
	s := newSupervisor(f.env(), slog.New(slog.NewTextHandler(&buf, nil)), base, minMaxWorkers(1))
	var configured []config.Config
	s.onConfig = func(c config.Config) { configured = append(configured, c) }
	s.step()
	ready(s, 100)
	sendSignal(s, syscall.SIGHUP)
	if len(configured) != 1 || configured[0].Server.Upstream != next.Server.Upstream {
		t.Errorf("Options.Configured saw %d configurations after the reload, want the new one", len(configured))
	}
	var line string
	for l := range strings.Lines(buf.String()) {
		if strings.Contains(l, `msg="reload begun"`) {
			line = l
		}
	}
	for _, want := range []string{"rules_added=[api]", "rules_changed=[login]",
		"keys_changed=\"[server.upstream ratelimit.login.limit]\""} {
		if !strings.Contains(line, want) {
			t.Errorf("reload line %q lacks %s", line, want)
		}
	}
	if strings.Contains(buf.String(), "s3cret") {
		t.Errorf("the log shows a changed value:\n%s", buf.String())
	}
	sendSignal(s, syscall.SIGHUP)
	if !strings.Contains(buf.String(), "changed=nothing") {
		t.Errorf("a reload of the same file does not say that nothing changed:\n%s", buf.String())
	}
}

// TestAnnouncedAfterPublished: the "ready" and "reload finished" lines
// (and READY=1 with them) come after the status that says so has been
// published, so that whoever sees the line and asks /status or /metrics
// is not told that the workers are not all ready yet.
func TestAnnouncedAfterPublished(t *testing.T) {
	f := newFake()
	reloaded := noCanary(config.Config{Server: config.Server{Workers: 2, Upstream: "http://127.0.0.1:9"}}).WithDefaults()
	f.load = func() (config.Config, error) { return reloaded, nil }
	var got []Status
	seen := map[string]int{}
	log := slog.New(onMessage(func(msg string) {
		if msg != "ready" && msg != "reload finished" {
			return
		}
		seen[msg]++
		if len(got) == 0 || !got[len(got)-1].Ready {
			t.Errorf("%q logged while the published status is not Ready", msg)
		}
	}))
	cfg := config.Config{Server: config.Server{Workers: 2, ShutdownTimeout: time.Second}}
	s := newSupervisor(f.env(), log, cfg, minMaxWorkers(2))
	s.onStatus = func(st Status) { got = append(got, st) }
	s.step()
	s.publish()
	ready(s, 100, 101)
	sendSignal(s, syscall.SIGHUP)
	ready(s, 102)
	exit(s, 100, true)
	ready(s, 103)
	exit(s, 101, true)
	if seen["ready"] != 1 || seen["reload finished"] != 1 {
		t.Fatalf("announcements %v, want one ready and one reload finished", seen)
	}
}

// onMessage is a slog handler that passes each record's message to f.
type onMessage func(msg string)

func (h onMessage) Enabled(context.Context, slog.Level) bool      { return true }
func (h onMessage) Handle(_ context.Context, r slog.Record) error { h(r.Message); return nil }
func (h onMessage) WithAttrs([]slog.Attr) slog.Handler            { return h }
func (h onMessage) WithGroup(string) slog.Handler                 { return h }

// With a watchdog the loop wakes for WATCHDOG=1 every interval, and goes
// on sending it while it drains.
func TestWatchdogDeadline(t *testing.T) {
	f := newFake()
	env := f.env()
	env.watchdog = 10 * time.Second
	s := newSupervisor(env, quietLog(), config.Config{Server: config.Server{Workers: 1, ShutdownTimeout: 30 * time.Second}}, minMaxWorkers(1))
	s.step()
	s.keepAlive()
	pings := func() int { return strings.Count(strings.Join(f.notes, " "), notifyWatchdog) }
	if pings() != 1 {
		t.Fatalf("notes %q, want WATCHDOG=1 at once", f.notes)
	}
	ready(s, f.pids...)
	s.keepAlive()
	if at, ok := s.nextDeadline(); !ok || !at.Equal(t0.Add(10*time.Second)) {
		t.Fatalf("next deadline %v %v, want the watchdog's, 10s on", at, ok)
	}
	f.now = f.now.Add(10 * time.Second)
	s.keepAlive()
	s.beginDrain("TERM")
	f.now = f.now.Add(9 * time.Second)
	s.keepAlive()
	if pings() != 2 {
		t.Fatalf("notes %q, want a second WATCHDOG=1 after 10s and none 9s later", f.notes)
	}
	if at, ok := s.nextDeadline(); !ok || !at.Equal(f.now.Add(time.Second)) {
		t.Fatalf("draining: next deadline %v %v, want the watchdog's, 1s on", at, ok)
	}
}
