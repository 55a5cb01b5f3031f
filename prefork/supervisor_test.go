//go:build linux

package prefork

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

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
	now     time.Time
	nextPID int
	starts  []spawnSpec
	pids    []int // pid of each start
	signals []sent
	// sup is the supervisor driven (set after newSupervisor). A worker
	// told TERM stops accepting at once, as if it said so before the
	// next event, unless holdStops: then only onStopped or its exit tell.
	sup       *supervisor
	holdStops bool
	reaps     []int
	notes     []string
	stopped   int
	startErr  error
	load      func(running Settings) (Settings, error)
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
				if sig == syscall.SIGTERM && !f.holdStops && f.sup != nil && f.sup.procs[pid] != nil {
					f.sup.procs[pid].stopped = true
				}
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

// noCanary is s with canary reloads off, for the tests of the roll itself.
func noCanary(s Settings) Settings {
	s.Canary.Off = true
	return s
}

// defaulted is s with its defaults, as Run hands the supervisor its
// first settings.
func defaulted(s Settings) Settings {
	s, err := s.withDefaults()
	if err != nil {
		panic(err) // a test's own settings
	}
	return s
}

func quietLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// newTestSupervisor returns a supervisor of n workers that has run its
// first step (started its workers).
func newTestSupervisor(f *fakeSys, n int) *supervisor {
	s := newSupervisor(f.env(), quietLog(), defaulted(Settings{ShutdownTimeout: 5 * time.Second}), n, minMaxWorkers(n))
	f.sup = s
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
	next := noCanary(Settings{ShutdownTimeout: time.Second})
	var given []Settings
	f.load = func(running Settings) (Settings, error) {
		given = append(given, running)
		return next, nil
	}
	s := newTestSupervisor(f, 2)
	ready(s, 100, 101)
	running := s.cfg

	sendSignal(s, syscall.SIGHUP)
	if len(f.notes) != 2 || f.notes[1][:len("RELOADING=1\nMONOTONIC_USEC=")] != "RELOADING=1\nMONOTONIC_USEC=" {
		t.Fatalf("notes %q, want RELOADING=1 with MONOTONIC_USEC", f.notes)
	}
	// One successor at a time; the old worker gets TERM only once its
	// successor is ready.
	if len(given) != 1 || !reflect.DeepEqual(given[0], running) {
		t.Fatalf("Reload was given %+v, want once the running settings %+v", given, running)
	}
	if len(f.starts) != 3 || f.starts[2].Gen != 1 || f.starts[2].Settings.ShutdownTimeout != time.Second {
		t.Fatalf("starts %+v, want one successor with the new configuration", f.starts)
	}
	if len(f.signals) != 0 {
		t.Fatalf("signals %v before the successor was ready", f.signals)
	}
	// (A successor that exits before it is ready aborts the reload:
	// TestReloadWithoutCanaryFailsLikeACanary.)
	ready(s, 102)
	if !slices.Equal(f.signalled(syscall.SIGTERM), []int{100}) || len(f.starts) != 4 {
		t.Fatalf("after the first successor: TERM %v, starts %d", f.signalled(syscall.SIGTERM), len(f.starts))
	}
	exit(s, 100, true) // the retired worker drained: no respawn
	ready(s, 103)
	if !slices.Equal(f.signalled(syscall.SIGTERM), []int{100, 101}) || len(f.starts) != 4 {
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
	if len(f.starts) != 4 {
		t.Fatal("a retired worker was replaced")
	}
}

// A reload is over (READY=1, a ready Status) only once every worker it
// retired stopped accepting, as it says, or exited: until then a client
// that connects may still get the old configuration.
func TestReloadEndsOnceTheRetiredStopAccepting(t *testing.T) {
	f := newFake()
	f.holdStops = true
	f.load = func(Settings) (Settings, error) { return noCanary(Settings{ShutdownTimeout: time.Second}), nil }
	s := newTestSupervisor(f, 2)
	ready(s, 100, 101)
	sendSignal(s, syscall.SIGHUP)
	ready(s, 102)
	exit(s, 100, true) // said nothing: its exit is enough
	ready(s, 103)
	if !slices.Equal(f.signalled(syscall.SIGTERM), []int{100, 101}) {
		t.Fatalf("TERM %v, want both old workers", f.signalled(syscall.SIGTERM))
	}
	if n := f.notes[len(f.notes)-1]; n == notifyReady || !s.reloading || s.status().Ready {
		t.Fatalf("notes %q, reloading %v: the reload ended while retired 101 may still accept", f.notes, s.reloading)
	}
	s.procs[101].stopped = true // as the loop takes its stoppedEvent
	s.step()
	if f.notes[len(f.notes)-1] != notifyReady || s.reloading || !s.status().Ready {
		t.Fatalf("notes %q, reloading %v: want READY=1 once 101 stopped accepting", f.notes, s.reloading)
	}
}

// An aborted reload ends (READY=1, a ready Status) as one that finished
// does: once every worker it retired stopped accepting or exited, the
// canary or trial worker of the failed configuration first, so that a
// client that connects then never gets it. The abort's ERROR line is its
// one record: its end logs no "reload finished". A HUP meanwhile starts a
// reload that finishes as any; a TERM ends the wait with no READY=1; a
// USR2 is refused as during any reload.
func TestAbortedReloadEndsOnceTheRetiredStopAccepting(t *testing.T) {
	for _, tc := range []string{"canary", "trial", "hup", "term", "usr2"} {
		t.Run(tc, func(t *testing.T) {
			var f *fakeSys
			var s *supervisor
			var logs *logSink
			var failed int // the retired worker of the failed configuration
			if tc == "trial" {
				f, s, logs = rollFixture(t, 3) // 100, 101, 102
				f.holdStops = true
				sendSignal(s, syscall.SIGHUP)
				ready(s, 103)       // slot 0 runs generation 1; 100 retires
				exit(s, 104, false) // slot 1's fails: the abort
				ready(s, 105)       // slot 0 back to generation 0: 103 retires
				failed = 103
			} else {
				f, s, logs = canaryFixture(t, 2, canaryConfig(func(c *Canary) { c.Inconclusive = InconclusiveAbort }))
				f.holdStops = true
				sendSignal(s, syscall.SIGHUP)
				ready(s, 102)             // the canary takes slot 0; 100 retires
				advance(f, s, testWindow) // inconclusive: aborted, 102 retires
				failed = 102
			}
			exit(s, 100, true) // generation 0's retiree is gone
			abortLine(t, logs)
			if !slices.Contains(f.signalled(syscall.SIGTERM), failed) {
				t.Fatalf("TERM to %v, want the failed configuration's %d", f.signalled(syscall.SIGTERM), failed)
			}
			if n := f.notes[len(f.notes)-1]; n == notifyReady || !s.reloading || s.status().Ready {
				t.Fatalf("notes %q, reloading %v: the aborted reload ended while %d of the failed configuration may still accept", f.notes, s.reloading, failed)
			}
			switch tc {
			case "hup":
				s.env.load = func(Settings) (Settings, error) {
					return defaulted(noCanary(Settings{ShutdownTimeout: time.Second})), nil
				}
				sendSignal(s, syscall.SIGHUP) // fills slot 0, replaces 101
				if n := len(f.pids); n != 5 {
					t.Fatalf("%d starts, want slot 0 filled and slot 1 replaced", n-3)
				}
				ready(s, f.pids[3:]...) // 101 retires
				s.procs[101].stopped = true
			case "term":
				sendSignal(s, syscall.SIGTERM)
			case "usr2": // refused until the reload is over, as during any
				sendSignal(s, syscall.SIGUSR2)
				if r := logs.all("upgrade refused"); len(r) != 1 || r[0].attrs["why"] != "a reload is under way" {
					t.Fatalf("USR2 during the wait: %v", r)
				}
			}
			if n := f.notes[len(f.notes)-1]; n == notifyReady {
				t.Fatalf("notes %q: READY=1 while %d may still accept", f.notes, failed)
			}
			s.procs[failed].stopped = true // as the loop takes its stoppedEvent
			s.step()
			last := f.notes[len(f.notes)-1]
			finished := len(logs.all("reload finished"))
			switch tc {
			case "term":
				if last != notifyStopping || s.status().Ready {
					t.Fatalf("notes %q: a drain begun during the wait sends no READY=1", f.notes)
				}
			case "hup":
				if last != notifyReady || s.reloading || !s.status().Ready || finished != 1 || s.status().Generation != 2 {
					t.Fatalf("notes %q, reloading %v, %d \"reload finished\": want the newer reload finished", f.notes, s.reloading, finished)
				}
			default:
				if last != notifyReady || s.reloading || !s.status().Ready || finished != 0 {
					t.Fatalf("notes %q, reloading %v, %d \"reload finished\": want READY=1 once %d stopped accepting, and the abort line alone",
						f.notes, s.reloading, finished, failed)
				}
				if st := s.status(); st.Generation != 0 || st.Reloads.Aborted != 1 || (tc != "trial") != (st.Canary != nil && st.Canary.Aborted) {
					t.Fatalf("status after the abort: %+v", st)
				}
			}
		})
	}
}

// A reload whose Reload fails, or whose settings are not valid, is
// refused: the workers stay, and systemd is told the reload ended.
func TestReloadRefused(t *testing.T) {
	for _, tc := range []struct {
		name string
		load func(Settings) (Settings, error)
		err  string
	}{
		{"Reload fails", func(Settings) (Settings, error) { return Settings{}, errors.New("config: bad") }, "config: bad"},
		{"invalid settings", func(Settings) (Settings, error) { return Settings{MaxRequests: -1}, nil },
			"prefork: Settings.MaxRequests (server.max_requests): must not be negative (0 means never), got -1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFake()
			f.load = tc.load
			s := newTestSupervisor(f, 2)
			ready(s, 100, 101)
			running := s.cfg
			sendSignal(s, syscall.SIGHUP)
			if len(f.starts) != 2 || len(f.signals) != 0 || s.gen != 0 || !reflect.DeepEqual(s.cfg, running) {
				t.Fatalf("refused reload started %d, signalled %v, generation %d, settings %+v", len(f.starts)-2, f.signals, s.gen, s.cfg)
			}
			if len(f.notes) != 3 || f.notes[2] != notifyReady {
				t.Fatalf("notes %q, want READY=1, RELOADING=1, READY=1", f.notes)
			}
			if r := s.status().Reloads; r.Refused != 1 || r.Accepted != 0 || r.LastError != tc.err {
				t.Fatalf("reloads %+v, want one refused with %q", r, tc.err)
			}
		})
	}
}

// systemd's Type=notify-reload pairs RELOADING=1 with the HUP it sent
// only when MONOTONIC_USEC, in the same message, is no earlier than the
// instant of the signal (CLOCK_MONOTONIC); else the reload times out.
func TestReloadingCarriesMonotonicTime(t *testing.T) {
	f := newFake()
	f.load = func(Settings) (Settings, error) { return noCanary(Settings{}), nil }
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
	f.load = func(Settings) (Settings, error) {
		if broken {
			return Settings{}, errors.New("config: bad")
		}
		return noCanary(Settings{ShutdownTimeout: time.Second}), nil
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
	f.load = func(Settings) (Settings, error) { return noCanary(Settings{}), nil }
	s := newSupervisor(f.env(), quietLog(), defaulted(Settings{ShutdownTimeout: time.Second}), 2, 3)
	f.sup = s
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

// A start that waits for an index says so, once: a reload that seems to
// do nothing (HUPs in a row while retired workers still drain slow
// requests) is explained by one line, and the start that ends the wait
// is a worker started as usual.
func TestWaitForAnIndexIsLogged(t *testing.T) {
	f := newFake()
	f.load = func(Settings) (Settings, error) { return noCanary(Settings{}), nil }
	var buf logtest.Buffer
	s := newSupervisor(f.env(), slog.New(slog.NewTextHandler(&buf, nil)), defaulted(Settings{ShutdownTimeout: time.Second}), 2, 3)
	f.sup = s
	s.step()
	ready(s, 100, 101)
	sendSignal(s, syscall.SIGHUP)
	ready(s, 102) // index 2; 100 (index 0) retires and holds index 0
	advance(f, s, time.Millisecond)
	advance(f, s, time.Millisecond)
	const msg = "worker start waits for a free index: every one is held by a worker that still drains"
	lines := buf.Lines(msg)
	if len(lines) != 1 || !strings.Contains(lines[0], "slot=1") || !strings.Contains(lines[0], "draining=1") {
		t.Fatalf("lines %q, want one that names slot 1 and the draining worker", lines)
	}
	exit(s, 100, true)
	if len(f.starts) != 4 {
		t.Fatalf("%d starts after the index was freed, want 4", len(f.starts))
	}
	ready(s, 103)
	sendSignal(s, syscall.SIGHUP)
	ready(s, 104)
	if lines := buf.Lines(msg); len(lines) != 2 {
		t.Fatalf("lines %q: the next wait is logged again", lines)
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
	reloaded := noCanary(Settings{Payload: []byte("reloaded"), Config: "the reloaded configuration"})
	var loadErr error
	f.load = func(Settings) (Settings, error) { return reloaded, loadErr }
	var got []Status
	first := defaulted(Settings{ShutdownTimeout: time.Second, Payload: []byte("first"), Config: "the first configuration"})
	s := newSupervisor(f.env(), quietLog(), first, 2, minMaxWorkers(2))
	f.sup = s
	s.onStatus = func(st Status) { got = append(got, st) }
	last := func() Status { return got[len(got)-1] }
	s.step()
	s.publish()
	s.publish() // nothing changed: no snapshot
	if len(got) != 1 || got[0].Ready || got[0].Serving || len(got[0].Workers) != 2 || got[0].Workers[0].PID != 100 ||
		got[0].Workers[0].State() != "starting" || !reflect.DeepEqual(got[0].Settings, first) {
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
	if want := defaulted(reloaded); !reflect.DeepEqual(st.Settings, want) || st.Reloads != (ReloadStatus{Accepted: 1, Last: f.now}) {
		t.Fatalf("during the reload: settings %+v (want %+v), reloads %+v", st.Settings, want, st.Reloads)
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

// Ready says every slot runs a ready worker: not while a crashed worker's
// slot is empty, waiting for its respawn (Serving stays true: the others
// serve), nor while its replacement starts; a worker being recycled
// still fills its slot until its successor takes over.
func TestStatusNotReadyWhileASlotIsEmpty(t *testing.T) {
	f := newFake()
	s := newTestSupervisor(f, 2)
	ready(s, 100, 101)
	if st := s.status(); !st.Ready || !st.Serving {
		t.Fatalf("both ready: Ready %v, Serving %v", st.Ready, st.Serving)
	}
	exit(s, 101, false)
	if st := s.status(); st.Ready || !st.Serving || len(st.Workers) != 1 {
		t.Fatalf("one of two crashed: Ready %v, Serving %v, %d workers; want not ready, serving, 1", st.Ready, st.Serving, len(st.Workers))
	}
	advance(f, s, backoffBase)
	if len(f.starts) != 3 {
		t.Fatalf("%d starts, want the replacement", len(f.starts))
	}
	if st := s.status(); st.Ready {
		t.Fatal("Ready while the replacement starts")
	}
	ready(s, 102)
	if st := s.status(); !st.Ready {
		t.Fatal("not Ready once the replacement is")
	}
	s.onRecycle(recycleEvent{pid: 100, reason: "max_requests", value: 10, limit: 10})
	s.step()
	if st := s.status(); !st.Ready || len(st.Workers) != 3 {
		t.Fatalf("while a worker is recycled: Ready %v, %d workers", st.Ready, len(st.Workers))
	}
}

// A reload logs what its settings say it changes (Settings.LogAttrs), and
// Options.Configured sees the new settings.
func TestReloadLogsChanges(t *testing.T) {
	f := newFake()
	base := defaulted(Settings{Payload: []byte("base")})
	next := Settings{Payload: []byte("next"), LogAttrs: []slog.Attr{
		slog.Any("rules_added", []string{"api"}), slog.Any("rules_changed", []string{"login"}),
	}}
	f.load = func(Settings) (Settings, error) { return next, nil }
	var buf strings.Builder
	s := newSupervisor(f.env(), slog.New(slog.NewTextHandler(&buf, nil)), base, 1, minMaxWorkers(1))
	f.sup = s
	var configured []Settings
	s.onConfig = func(c Settings) { configured = append(configured, c) }
	s.step()
	ready(s, 100)
	sendSignal(s, syscall.SIGHUP)
	if len(configured) != 1 || string(configured[0].Payload) != "next" || configured[0].ShutdownTimeout != DefaultShutdownTimeout {
		t.Errorf("Options.Configured saw %+v after the reload, want the new settings with their defaults", configured)
	}
	var line string
	for l := range strings.Lines(buf.String()) {
		if strings.Contains(l, `msg="reload begun"`) {
			line = l
		}
	}
	for _, want := range []string{"generation=1", "workers=1", "canary_window=10s", "rules_added=[api]", "rules_changed=[login]"} {
		if !strings.Contains(line, want) {
			t.Errorf("reload line %q lacks %s", line, want)
		}
	}
}

// TestAnnouncedAfterPublished: the "ready" and "reload finished" lines
// (and READY=1 with them) come after the status that says so has been
// published, so that whoever sees the line and asks /status or /metrics
// is not told that the workers are not all ready yet.
func TestAnnouncedAfterPublished(t *testing.T) {
	f := newFake()
	reloaded := noCanary(Settings{})
	f.load = func(Settings) (Settings, error) { return reloaded, nil }
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
	s := newSupervisor(f.env(), log, defaulted(Settings{ShutdownTimeout: time.Second}), 2, minMaxWorkers(2))
	f.sup = s
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

// A worker recycled for max_rss soon after it began judging its memory
// (max_rss below what a worker needs): reported once, and its slot's
// successors judge their memory only after a delay that doubles with each
// such recycle up to rssBackoffMax; successors still start at once, and
// the other slot is untouched. A memory recycle later than rssEarly
// resets the delay, and so does a reload that changes max_rss.
func TestMemoryRecyclingBacksOff(t *testing.T) {
	f := newFake()
	var lines logtest.Buffer
	cfg := defaulted(noCanary(Settings{ShutdownTimeout: 5 * time.Second, MaxRSS: 32 << 20}))
	s := newSupervisor(f.env(), slog.New(slog.NewTextHandler(&lines, nil)), cfg, 2, minMaxWorkers(2))
	f.sup = s
	s.step()
	ready(s, 100, 101)
	// recycleNow: the worker of slot 0 passes max_rss after ran, and its
	// successor starts (at once) and becomes ready; it returns the delay
	// the successor was started with.
	pid := 100
	recycleNow := func(ran time.Duration) time.Duration {
		t.Helper()
		advance(f, s, ran)
		starts := len(f.starts)
		s.onRecycle(recycleEvent{pid: pid, reason: "max_rss", value: 40 << 20, limit: 32 << 20})
		s.step()
		if len(f.starts) != starts+1 {
			t.Fatalf("no successor started at once after a recycle at %v", ran)
		}
		succ := f.pids[len(f.pids)-1]
		ready(s, succ)
		exit(s, pid, true)
		pid = succ
		return f.starts[len(f.starts)-1].RSSDelay
	}
	want := []time.Duration{10 * time.Second, 20 * time.Second, 40 * time.Second, 80 * time.Second,
		160 * time.Second, 5 * time.Minute, 5 * time.Minute}
	var got []time.Duration
	delay := time.Duration(0)
	for range want {
		// Each passes max_rss a second after its delay: early.
		delay = recycleNow(delay + time.Second)
		got = append(got, delay)
	}
	if !slices.Equal(got, want) {
		t.Fatalf("delays %v, want %v", got, want)
	}
	if n := len(lines.Lines("worker passed max_rss soon after it started: max_rss may be below what a worker needs; memory recycling backs off")); n != 1 {
		t.Fatalf("%d warnings, want 1:\n%s", n, lines.String())
	}
	if f.starts[1].RSSDelay != 0 {
		t.Errorf("the other slot's worker started with a delay %v", f.starts[1].RSSDelay)
	}
	// Just at rssEarly after its memory was judged: not early, the delay
	// is gone.
	if d := recycleNow(delay + rssEarly); d != 0 {
		t.Fatalf("after a late memory recycle: delay %v, want none", d)
	}
	if d := recycleNow(time.Second); d != rssBackoffBase {
		t.Fatalf("an early recycle after the reset: delay %v, want %v", d, rssBackoffBase)
	}
	// A crash replacement of the slot judges its memory late too.
	advance(f, s, time.Second)
	exit(s, pid, false)
	advance(f, s, backoffMax)
	if sp := f.starts[len(f.starts)-1]; sp.RSSDelay != rssBackoffBase || sp.Index != 0 {
		t.Fatalf("the crash replacement: %+v, want the slot's delay %v", sp, rssBackoffBase)
	}
	// A reload that changes max_rss starts over, and may warn again.
	f.load = func(Settings) (Settings, error) {
		c := cfg
		c.MaxRSS = 64 << 20
		return c, nil
	}
	s.env = f.env()
	sendSignal(s, syscall.SIGHUP)
	if s.slots[0].rssDelay != 0 || s.rssWarned {
		t.Fatalf("after a reload that changed max_rss: delay %v, warned %v", s.slots[0].rssDelay, s.rssWarned)
	}
	if n := len(lines.Lines("worker passed max_rss soon after it started: max_rss may be below what a worker needs; memory recycling backs off")); n != 1 {
		t.Fatalf("%d warnings, want still 1", n)
	}
}

// With a watchdog the loop wakes for WATCHDOG=1 every interval, and goes
// on sending it while it drains.
func TestWatchdogDeadline(t *testing.T) {
	f := newFake()
	env := f.env()
	env.watchdog = 10 * time.Second
	s := newSupervisor(env, quietLog(), defaulted(Settings{ShutdownTimeout: 30 * time.Second}), 1, minMaxWorkers(1))
	f.sup = s
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
	s.beginDrain("TERM", 0)
	f.now = f.now.Add(9 * time.Second)
	s.keepAlive()
	if pings() != 2 {
		t.Fatalf("notes %q, want a second WATCHDOG=1 after 10s and none 9s later", f.notes)
	}
	if at, ok := s.nextDeadline(); !ok || !at.Equal(f.now.Add(time.Second)) {
		t.Fatalf("draining: next deadline %v %v, want the watchdog's, 1s on", at, ok)
	}
}

// QUIT drains as TERM does (nginx's graceful stop), a second one kills;
// USR1 goes on to every worker; a signal the supervisor does not act on
// is logged, and nothing else happens.
func TestSignalsAsNginx(t *testing.T) {
	f := newFake()
	var logs logtest.Buffer
	s := newSupervisor(f.env(), slog.New(slog.NewTextHandler(&logs, nil)), defaulted(Settings{ShutdownTimeout: 5 * time.Second}), 2, minMaxWorkers(2))
	f.sup = s
	s.step()
	ready(s, 100, 101)
	sendSignal(s, syscall.SIGUSR1)
	if got := f.signalled(syscall.SIGUSR1); !slices.Equal(got, []int{100, 101}) {
		t.Errorf("USR1 sent to %v, want both workers", got)
	}
	for _, sig := range []syscall.Signal{syscall.SIGWINCH, syscall.SIGALRM} {
		sendSignal(s, sig)
	}
	if got := logs.Lines("signal ignored"); len(got) != 2 || !strings.Contains(got[0], "signal=SIGWINCH") || !strings.Contains(got[1], "signal=SIGALRM") {
		t.Errorf("ignored signals logged as %q", got)
	}
	if s.draining || len(f.signalled(syscall.SIGTERM)) != 0 {
		t.Fatal("an ignored signal drained")
	}
	sendSignal(s, syscall.SIGQUIT)
	if !s.draining || !slices.Equal(f.signalled(syscall.SIGTERM), []int{100, 101}) {
		t.Fatalf("QUIT: draining %v, TERM sent to %v", s.draining, f.signalled(syscall.SIGTERM))
	}
	sendSignal(s, syscall.SIGQUIT)
	if got := f.signalled(syscall.SIGKILL); !slices.Equal(got, []int{100, 101}) {
		t.Errorf("a second QUIT killed %v, want both", got)
	}
}

// A worker not yet ready may not handle USR1 and USR2 yet (their default
// action ends a process): the supervisor holds them for it until it
// reports ready, then sends them, once each. A USR1 near a reload's start
// (logrotate beside a deploy) killed the canary and aborted the reload.
func TestNotesHeldUntilReady(t *testing.T) {
	f := newFake()
	s := newSupervisor(f.env(), quietLog(), defaulted(Settings{ShutdownTimeout: 5 * time.Second, DrainDelay: 3 * time.Second}), 2, minMaxWorkers(2))
	f.sup = s
	s.step()
	ready(s, 100)
	sendSignal(s, syscall.SIGUSR1)
	sendSignal(s, syscall.SIGUSR1)
	if got := f.signalled(syscall.SIGUSR1); !slices.Equal(got, []int{100, 100}) {
		t.Fatalf("USR1 sent to %v, want the ready worker alone, twice", got)
	}
	sendSignal(s, syscall.SIGTERM) // drain_delay: USR2, "stopping"
	if got := f.signalled(sigDrain); !slices.Equal(got, []int{100}) {
		t.Fatalf("USR2 sent to %v, want the ready worker alone", got)
	}
	ready(s, 101)
	if got := f.signalled(syscall.SIGUSR1); !slices.Equal(got, []int{100, 100, 101}) {
		t.Errorf("USR1 sent to %v once 101 is ready, want it once more, to 101", got)
	}
	if got := f.signalled(sigDrain); !slices.Equal(got, []int{100, 101}) {
		t.Errorf("USR2 sent to %v once 101 is ready, want it to 101 too", got)
	}
}

// With a drain delay, TERM leaves the workers serving, told only that the
// instance stops (USR2: their health answers 503), with readiness off and
// nothing respawned; at the delay's end they drain as without one.
// A worker that passed max_requests just as the drain began (its message
// crossed the drain delay's USR2) is not recycled: it leaves with the
// instance, no successor starts, and neither the log nor Recycled says
// otherwise.
func TestNoRecycleDuringDrainDelay(t *testing.T) {
	f := newFake()
	logs := newLogSink()
	s := newSupervisor(f.env(), slog.New(logs), defaulted(Settings{ShutdownTimeout: 5 * time.Second, DrainDelay: 3 * time.Second}), 2, minMaxWorkers(2))
	f.sup = s
	s.step()
	ready(s, 100, 101)
	sendSignal(s, syscall.SIGTERM)
	s.onRecycle(recycleEvent{pid: 101, reason: "max_requests", value: 10, limit: 10})
	s.step()
	advance(f, s, 3*time.Second)
	if st := s.status(); st.Recycled != 0 || len(f.starts) != 2 {
		t.Fatalf("recycled %d, %d starts; want none and 2", st.Recycled, len(f.starts))
	}
	if r := logs.all("worker recycling"); len(r) != 0 {
		t.Fatalf("logged a recycling during the drain:\n%s", logs.dump())
	}
}

func TestDrainDelay(t *testing.T) {
	f := newFake()
	s := newSupervisor(f.env(), quietLog(), defaulted(Settings{ShutdownTimeout: 5 * time.Second, DrainDelay: 3 * time.Second}), 2, minMaxWorkers(2))
	f.sup = s
	s.step()
	ready(s, 100, 101)
	sendSignal(s, syscall.SIGTERM)
	if got := f.signalled(sigDrain); !slices.Equal(got, []int{100, 101}) {
		t.Fatalf("USR2 sent to %v, want both workers", got)
	}
	if len(f.signalled(syscall.SIGTERM)) != 0 || f.stopped != 0 {
		t.Fatalf("during the delay: TERM sent to %v, listener closed %d times", f.signalled(syscall.SIGTERM), f.stopped)
	}
	if st := s.status(); st.Serving || !st.Draining {
		t.Errorf("during the delay: serving %v, draining %v; want readiness off", st.Serving, st.Draining)
	}
	if at, ok := s.nextDeadline(); !ok || !at.Equal(t0.Add(3*time.Second)) {
		t.Errorf("next deadline %v, want the delay's end", at)
	}
	exit(s, 101, false) // a crash during the delay: not replaced
	advance(f, s, 3*time.Second-time.Millisecond)
	if len(f.signalled(syscall.SIGTERM)) != 0 || len(f.starts) != 2 {
		t.Fatalf("before the delay's end: TERM to %v, %d starts", f.signalled(syscall.SIGTERM), len(f.starts))
	}
	advance(f, s, time.Millisecond)
	if got := f.signalled(syscall.SIGTERM); !slices.Equal(got, []int{100}) || f.stopped != 1 {
		t.Fatalf("at the delay's end: TERM to %v, listener closed %d times", got, f.stopped)
	}
	exit(s, 100, true)
	if !s.finished() {
		t.Error("not finished")
	}
}

// Only a second stop signal shortens a drain. A drain begun otherwise
// (Run's context done, as an embedding program's signal.NotifyContext
// makes it on the very TERM the supervisor also receives; a binary
// upgrade's handover, after which an operator sends QUIT to the old
// supervisor as nginx's upgrade procedure has it) takes the first TERM,
// INT or QUIT as the graceful stop it already is: the workers finish
// their requests. The next one kills them.
func TestFirstStopSignalDuringAnotherDrainIsGraceful(t *testing.T) {
	f := newFake()
	s := newTestSupervisor(f, 2)
	ready(s, 100, 101)
	s.beginDrain(context.Canceled.Error(), s.cfg.DrainDelay) // as run does when ctx is done
	s.step()
	sendSignal(s, syscall.SIGTERM)
	if k := f.signalled(syscall.SIGKILL); len(k) != 0 {
		t.Fatalf("the first TERM killed %v during a drain begun by the context", k)
	}
	sendSignal(s, syscall.SIGQUIT)
	if k := f.signalled(syscall.SIGKILL); !slices.Equal(k, []int{100, 101}) {
		t.Fatalf("the second stop signal killed %v, want [100 101]", k)
	}
}
