//go:build linux

package prefork

import (
	"errors"
	"log/slog"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Canary reloads through the seam: the fake's counts stand for what the
// workers served.

const testWindow = 2 * time.Second

// canaryConfig is the settings of a reload with a canary of testWindow,
// whose workers get the payload "next".
func canaryConfig(edit func(*Canary)) Settings {
	s := Settings{ShutdownTimeout: 5 * time.Second, Canary: Canary{Window: testWindow}, Payload: []byte("next")}
	if edit != nil {
		edit(&s.Canary)
	}
	return defaulted(s)
}

// canaryFixture is a supervisor of n ready workers (pids 100.., indexes
// 0..n-1, generation 0, payload "good") whose HUP loads next, with a log
// to read.
func canaryFixture(t *testing.T, n int, next Settings) (*fakeSys, *supervisor, *logSink) {
	t.Helper()
	first := canaryConfig(nil)
	first.Payload = []byte("good")
	return readyFleet(t, n, first, next)
}

// readyFleet is a supervisor of n ready workers (pids 100.., indexes
// 0..n-1, generation 0) started with first, whose HUP loads next, with a
// log to read.
func readyFleet(t *testing.T, n int, first, next Settings) (*fakeSys, *supervisor, *logSink) {
	t.Helper()
	f := newFake()
	f.load = func(Settings) (Settings, error) { return next, nil }
	logs := newLogSink()
	s := newSupervisor(f.env(), slog.New(logs), first, n, minMaxWorkers(n))
	f.sup = s
	s.step()
	for i := range n {
		ready(s, 100+i)
	}
	if !s.announced {
		t.Fatal("not ready")
	}
	return f, s, logs
}

// verdictLine returns the one log line that starts with "canary " and
// says a verdict.
func verdictLine(t *testing.T, logs *logSink) record {
	t.Helper()
	var out []record
	for _, r := range logs.all("") {
		if r.attrs["verdict"] != nil {
			out = append(out, r)
		}
	}
	if len(out) != 1 {
		t.Fatalf("%d verdict lines, want 1; log:\n%s", len(out), logs.dump())
	}
	return out[0]
}

func TestCanaryHealthyRollsOn(t *testing.T) {
	next := canaryConfig(nil)
	f, s, logs := canaryFixture(t, 3, next)
	sendSignal(s, syscall.SIGHUP)
	if len(f.starts) != 4 || f.starts[3].Gen != 1 || string(f.starts[3].Settings.Payload) != "next" {
		t.Fatalf("starts %+v, want one canary of generation 1", f.starts)
	}
	ready(s, 103) // the canary takes slot 0: 100 retires
	if got := f.signalled(syscall.SIGTERM); !slices.Equal(got, []int{100}) {
		t.Fatalf("TERM to %v, want the canary's predecessor 100", got)
	}
	st := s.status()
	if st.Canary == nil || st.Canary.Verdict != "" || st.Canary.PID != 103 || st.Canary.Slot != 0 || st.Ready {
		t.Fatalf("during the window: %+v", st.Canary)
	}
	if next, _ := s.nextDeadline(); next != f.now.Add(testWindow) {
		t.Errorf("next deadline in %v, want the end of the window", next.Sub(f.now))
	}

	// A fleet worker crashes during the window: its replacement runs the
	// good configuration, not the one being judged.
	exit(s, 101, false)
	advance(f, s, backoffBase)
	if sp := f.starts[4]; sp.Gen != 0 || string(sp.Settings.Payload) != "good" {
		t.Fatalf("respawn during the window: generation %d, payload %q; want the good generation 0", sp.Gen, sp.Settings.Payload)
	}
	ready(s, 104)

	// What the fleet served before the window does not count; what the
	// canary and the fleet (every other index, also the reaped 101's)
	// served during it does.
	f.serve(3, 120, 1)
	f.serve(1, 40, 0)
	f.serve(2, 200, 2)
	f.serve(4, 60, 0)
	advance(f, s, testWindow-backoffBase-time.Millisecond)
	if len(f.starts) != 5 {
		t.Fatalf("the roll went on before the verdict: %d starts", len(f.starts))
	}
	advance(f, s, time.Millisecond)
	v := verdictLine(t, logs)
	if want := "canary healthy: 5xx 0.8% (1/120) vs fleet 0.7% (2/300), allowed +2.0 points; reload continues"; v.msg != want {
		t.Errorf("verdict %q, want %q", v.msg, want)
	}
	// The roll goes on with generation 1: slot 1 (the respawned 104, of
	// generation 0), then slot 2.
	if len(f.starts) != 6 || f.starts[5].Gen != 1 {
		t.Fatalf("starts %+v, want a successor of generation 1", f.starts)
	}
	ready(s, 105)
	ready(s, 106)
	if f.notes[len(f.notes)-1] != notifyReady || s.reloading {
		t.Fatalf("notes %q, reloading %v: want READY=1 at the end", f.notes, s.reloading)
	}
	st = s.status()
	if st.Canary == nil || st.Canary.Verdict != VerdictHealthy || st.Canary.Aborted || st.Generation != 1 || len(st.Quarantined) != 0 {
		t.Fatalf("after the roll: %+v %+v", st, st.Canary)
	}
	for _, w := range st.Workers {
		if !w.Retiring && w.Generation != 1 {
			t.Errorf("worker %d serves generation %d", w.PID, w.Generation)
		}
	}
}

func TestCanaryUnhealthyAborts(t *testing.T) {
	next := canaryConfig(nil)
	f, s, logs := canaryFixture(t, 3, next)
	sendSignal(s, syscall.SIGHUP)
	ready(s, 103)
	f.serve(3, 112, 71)
	f.serve(1, 150, 0)
	f.serve(2, 155, 0)
	advance(f, s, testWindow)
	v := verdictLine(t, logs)
	if want := "canary unhealthy: 5xx 63.4% (71/112) vs fleet 0.0% (0/305), allowed +2.0 points; reload aborted, slot 0 quarantined"; v.msg != want {
		t.Errorf("verdict %q, want %q", v.msg, want)
	}
	if v.level != slog.LevelError || v.attrs["test"] != testZ {
		t.Errorf("verdict logged at %v by test %v", v.level, v.attrs["test"])
	}
	if got := f.signalled(syscall.SIGTERM); !slices.Equal(got, []int{100, 103}) {
		t.Fatalf("TERM to %v, want the predecessor and then the canary", got)
	}
	if n := len(f.notes); f.notes[n-2][:11] != "RELOADING=1" || f.notes[n-1] != notifyReady {
		t.Fatalf("notes %q, want RELOADING=1 then READY=1", f.notes)
	}
	st := s.status()
	if st.Generation != 0 || !slices.Equal(st.Quarantined, []int{0}) || st.Canary.Verdict != VerdictUnhealthy || !st.Canary.Aborted ||
		st.Canary.Canary.Requests != 112 || st.Canary.Fleet.Errors != 0 || !st.Ready {
		t.Fatalf("after the abort: %+v %+v", st, st.Canary)
	}
	// The quarantined slot is not refilled, however long; the canary's
	// exit is no crash.
	exit(s, 100, true)
	exit(s, 103, true)
	advance(f, s, time.Minute)
	if len(f.starts) != 4 {
		t.Fatalf("%d starts after the abort, want none", len(f.starts)-4)
	}
	// A fleet worker that crashes now is replaced with the good configuration.
	exit(s, 101, false)
	advance(f, s, backoffBase)
	if sp := f.starts[4]; sp.Gen != 0 || string(sp.Settings.Payload) != "good" {
		t.Fatalf("respawn after the abort: %+v", sp)
	}
	ready(s, 104)

	// The next reload's canary takes the quarantined slot; once it
	// passes, the slot is back and the others are replaced.
	f.load = func(Settings) (Settings, error) { return canaryConfig(nil), nil }
	sendSignal(s, syscall.SIGHUP)
	if sp := f.starts[5]; sp.Gen != 2 || f.pids[5] != 105 {
		t.Fatalf("second canary %+v, want generation 2", sp)
	}
	if s.canary.slot != 0 {
		t.Fatalf("second canary in slot %d, want the quarantined 0", s.canary.slot)
	}
	ready(s, 105)
	if got := f.signalled(syscall.SIGTERM); len(got) != 2 {
		t.Fatalf("TERM to %v: the canary of an empty slot retires nobody", got)
	}
	for _, w := range s.status().Workers {
		f.serve(w.Index, 100, 0) // the canary and the two others
	}
	advance(f, s, testWindow)
	if st := s.status(); len(st.Quarantined) != 0 || st.Canary.Verdict != VerdictHealthy || st.Canary.Generation != 2 {
		t.Fatalf("after the second canary: %+v %+v", st, st.Canary)
	}
	ready(s, 106)
	ready(s, 107)
	if st := s.status(); !st.Ready || st.Generation != 2 || len(st.Workers) != 5 {
		t.Fatalf("after the second reload: %+v", st)
	}
}

// The fleet-wide-count bug: old workers with a 5% error baseline, and a
// canary with the same, must not abort; the canary's own errors are not
// in the baseline it is compared with.
func TestCanaryComparesWithTheRestOfTheFleet(t *testing.T) {
	f, s, logs := canaryFixture(t, 4, canaryConfig(nil))
	f.serve(1, 10000, 9000) // before the window: not counted
	sendSignal(s, syscall.SIGHUP)
	ready(s, 104)
	f.serve(4, 200, 10)
	for i := 1; i <= 3; i++ {
		f.serve(i, 200, 10)
	}
	f.retired.Requests += 100 // a worker reaped during the window
	f.retired.Errors += 5
	advance(f, s, testWindow)
	v := verdictLine(t, logs)
	if want := "canary healthy: 5xx 5.0% (10/200) vs fleet 5.0% (35/700), allowed +2.0 points; reload continues"; v.msg != want {
		t.Errorf("verdict %q, want %q", v.msg, want)
	}
}

func TestCanaryInconclusive(t *testing.T) {
	for _, tc := range []struct {
		policy Inconclusive
		msg    string
	}{
		{InconclusiveContinue, "canary inconclusive: 0 requests, fewer than canary_min_requests 50; 5xx 0.0% (0/0) vs fleet 0.0% (0/0), allowed +2.0 points; reload continues"},
		{InconclusiveAbort, "canary inconclusive: 0 requests, fewer than canary_min_requests 50; 5xx 0.0% (0/0) vs fleet 0.0% (0/0), allowed +2.0 points; reload aborted, slot 0 quarantined"},
	} {
		t.Run(map[Inconclusive]string{InconclusiveContinue: "continue", InconclusiveAbort: "abort"}[tc.policy], func(t *testing.T) {
			next := canaryConfig(func(c *Canary) { c.Inconclusive = tc.policy })
			f, s, logs := canaryFixture(t, 2, next)
			sendSignal(s, syscall.SIGHUP)
			ready(s, 102)
			advance(f, s, testWindow) // a quiet site: nothing served
			v := verdictLine(t, logs)
			if v.msg != tc.msg {
				t.Errorf("verdict %q, want %q", v.msg, tc.msg)
			}
			aborted := tc.policy == InconclusiveAbort
			if wantLevel := map[bool]slog.Level{false: slog.LevelWarn, true: slog.LevelError}[aborted]; v.level != wantLevel {
				t.Errorf("logged at %v, want %v", v.level, wantLevel)
			}
			st := s.status()
			if st.Canary.Verdict != VerdictInconclusive || st.Canary.Aborted != aborted || (len(st.Quarantined) == 1) != aborted {
				t.Fatalf("status %+v %+v", st, st.Canary)
			}
			if wantStarts := map[bool]int{false: 4, true: 3}[aborted]; len(f.starts) != wantStarts {
				t.Fatalf("%d starts, want %d", len(f.starts), wantStarts)
			}
		})
	}
}

// A canary that cannot start, exits, or never becomes ready aborts the
// reload at once and is never respawned; its slot's worker never stopped
// serving.
func TestCanaryFailureAbortsAtOnce(t *testing.T) {
	for _, tc := range []struct {
		name string
		fail func(f *fakeSys, s *supervisor)
		msg  string
	}{
		{"exits at start", func(f *fakeSys, s *supervisor) { exit(s, 103, false) },
			"canary failed: exited before it was ready (signal: killed); reload aborted, slot 0 keeps generation 0"},
		{"never ready", func(f *fakeSys, s *supervisor) {
			advance(f, s, readyTimeout)
			if k := f.signalled(syscall.SIGKILL); !slices.Equal(k, []int{103}) {
				panic("not killed")
			}
			exit(s, 103, false)
		}, "canary failed: exited before it was ready (signal: killed); reload aborted, slot 0 keeps generation 0"},
		{"exits during its window", func(f *fakeSys, s *supervisor) {
			ready(s, 103)
			advance(f, s, time.Second)
			exit(s, 103, false)
		}, "canary failed: exited during its window (signal: killed); reload aborted, slot 0 quarantined"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, s, logs := canaryFixture(t, 3, canaryConfig(nil))
			sendSignal(s, syscall.SIGHUP)
			tc.fail(f, s)
			if v := verdictLine(t, logs); v.msg != tc.msg {
				t.Errorf("verdict %q, want %q", v.msg, tc.msg)
			}
			advance(f, s, time.Minute)
			if len(f.starts) != 4 {
				t.Fatalf("%d starts after the canary failed, want none: no respawn loop", len(f.starts)-4)
			}
			st := s.status()
			if st.Canary.Verdict != VerdictFailed || !st.Canary.Aborted || st.Generation != 0 || !st.Ready ||
				st.Reloads.Aborted != 1 || st.Reloads.LastError != tc.msg {
				t.Fatalf("status %+v %+v", st, st.Canary)
			}
			if f.notes[len(f.notes)-1] != notifyReady {
				t.Errorf("notes %q, want READY=1 last", f.notes)
			}
		})
	}
	t.Run("cannot start", func(t *testing.T) {
		f, s, logs := canaryFixture(t, 2, canaryConfig(nil))
		f.startErr = errors.New("exec format error")
		sendSignal(s, syscall.SIGHUP)
		if v := verdictLine(t, logs); v.msg != "canary failed: could not be started: exec format error; reload aborted, slot 0 keeps generation 0" {
			t.Errorf("verdict %q", v.msg)
		}
		f.startErr = nil
		advance(f, s, time.Minute)
		if len(f.starts) != 2 || len(f.signals) != 0 {
			t.Fatalf("starts %d, signals %v after the failed start", len(f.starts), f.signals)
		}
	})
}

// One worker: the canary serves beside its predecessor, which is the
// fleet it is compared with, and which stays if the reload is aborted.
func TestCanaryOfTheOnlyWorker(t *testing.T) {
	for _, bad := range []bool{false, true} {
		t.Run(map[bool]string{false: "healthy", true: "unhealthy"}[bad], func(t *testing.T) {
			f, s, logs := canaryFixture(t, 1, canaryConfig(nil))
			sendSignal(s, syscall.SIGHUP)
			ready(s, 101)
			if len(f.signals) != 0 {
				t.Fatalf("signals %v: the only worker retired before the verdict", f.signals)
			}
			f.serve(0, 100, 0)
			f.serve(1, 100, map[bool]uint64{false: 0, true: 100}[bad])
			advance(f, s, testWindow)
			verdictLine(t, logs)
			want := []int{100} // healthy: the predecessor retires
			if bad {
				want = []int{101} // the canary does
			}
			if got := f.signalled(syscall.SIGTERM); !slices.Equal(got, want) {
				t.Fatalf("TERM to %v, want %v", got, want)
			}
			if st := s.status(); len(st.Quarantined) != 0 || !st.Ready {
				t.Fatalf("status %+v", st)
			}
		})
	}
}

// A canary judged unhealthy while it is the one worker left serving (the
// other crashed, and its respawn is not ready yet) keeps serving until a
// worker of the good generation is ready in its slot: the fleet never
// goes below one worker.
func TestCanaryAbortKeepsTheLastServingWorker(t *testing.T) {
	f, s, logs := canaryFixture(t, 2, canaryConfig(nil)) // 100, 101
	sendSignal(s, syscall.SIGHUP)                        // canary 102 in slot 0
	ready(s, 102)                                        // 100 retires
	f.serve(1, 100, 0)
	exit(s, 101, false)        // crashed during the window
	advance(f, s, backoffBase) // respawned as 103, not ready yet
	f.serve(2, 100, 100)       // the canary answers 5xx
	advance(f, s, testWindow)
	if v := verdictLine(t, logs); !strings.HasSuffix(v.msg, "reload aborted, slot 0 keeps the canary until a worker of generation 0 replaces it: the fleet never goes below one worker") {
		t.Fatalf("verdict %q", v.msg)
	}
	serving := func() (pids []int) {
		for _, p := range s.sortedProcs() {
			if p.ready && !p.retiring {
				pids = append(pids, p.pid)
			}
		}
		return pids
	}
	if got := serving(); !slices.Equal(got, []int{102}) {
		t.Fatalf("serving after the abort %v, want the canary 102", got)
	}
	advance(f, s, time.Millisecond)
	if sp := f.starts[len(f.starts)-1]; sp.Gen != 0 || s.slots[0].succ == nil || s.slots[0].succ.pid != 104 {
		t.Fatalf("the canary's replacement starts with generation %d (want 0), slot 0's successor %+v (want 104)", sp.Gen, s.slots[0].succ)
	}
	ready(s, 104)
	if got := serving(); !slices.Equal(got, []int{104}) {
		t.Fatalf("serving once the replacement is ready %v, want 104 alone (103 not ready yet)", got)
	}
}

// An aborted canary's slot is filled again rather than quarantined when
// no other slot has a ready worker: the fleet never goes below one.
func TestCanaryAbortNeverEmptiesTheFleet(t *testing.T) {
	f, s, logs := canaryFixture(t, 2, canaryConfig(nil))
	sendSignal(s, syscall.SIGHUP)
	ready(s, 102) // slot 0's 100 retires; 101 serves slot 1
	exit(s, 101, false)
	advance(f, s, time.Millisecond)
	exit(s, 102, false)
	if v := verdictLine(t, logs); !strings.HasSuffix(v.msg, "reload aborted, slot 0 refilled with generation 0: the fleet never goes below one worker") {
		t.Fatalf("verdict %q", v.msg)
	}
	advance(f, s, backoffBase)
	var gens []int
	for _, sp := range f.starts[3:] {
		gens = append(gens, sp.Gen)
	}
	if !slices.Equal(gens, []int{0, 0}) {
		t.Fatalf("generations started after the abort %v, want both slots refilled with 0", gens)
	}
}

// A slot quarantined by an abort is filled again with the good
// configuration once no other worker serves (the fleet never goes below
// one worker): here the one other worker crashes after the verdict, and
// its slot waits for its backoff.
func TestQuarantineLiftedWhenNoOtherWorkerServes(t *testing.T) {
	f, s, logs := canaryFixture(t, 2, canaryConfig(nil))
	sendSignal(s, syscall.SIGHUP)
	ready(s, 102)
	f.serve(2, 112, 71)
	f.serve(1, 150, 0)
	advance(f, s, testWindow)
	if v := verdictLine(t, logs); !strings.HasSuffix(v.msg, "slot 0 quarantined") {
		t.Fatalf("verdict %q", v.msg)
	}
	exit(s, 100, true)
	exit(s, 102, true)
	starts := len(f.starts)
	exit(s, 101, false) // the one worker left crashes
	if len(f.starts) != starts+1 {
		t.Fatalf("%d starts after the last serving worker crashed, want the quarantined slot refilled", len(f.starts)-starts)
	}
	if sp := f.starts[starts]; sp.Gen != 0 || string(sp.Settings.Payload) != "good" {
		t.Fatalf("refilled with %+v, want the good generation 0", sp)
	}
	if st := s.status(); len(st.Quarantined) != 0 || s.slots[0].cur == nil {
		t.Fatalf("quarantined %v, slot 0 %v", st.Quarantined, s.slots[0].cur)
	}
	advance(f, s, backoffBase)
	if len(f.starts) != starts+2 {
		t.Fatalf("%d starts, want slot 1 respawned after its backoff too", len(f.starts)-starts)
	}
}

func TestCanaryTermDuringWindow(t *testing.T) {
	f, s, logs := canaryFixture(t, 2, canaryConfig(nil))
	sendSignal(s, syscall.SIGHUP)
	ready(s, 102)
	advance(f, s, testWindow/2)
	sendSignal(s, syscall.SIGTERM)
	if got := f.signalled(syscall.SIGTERM); !slices.Equal(got, []int{100, 101, 102}) {
		t.Fatalf("TERM to %v", got)
	}
	if next, _ := s.nextDeadline(); next.Sub(f.now) <= testWindow/2 {
		t.Errorf("next deadline in %v: the window must not wake a draining supervisor", next.Sub(f.now))
	}
	advance(f, s, testWindow)
	for _, pid := range []int{100, 101, 102} {
		exit(s, pid, true)
	}
	if !s.finished() || len(f.starts) != 3 || len(logs.all("")) == 0 {
		t.Fatalf("finished %v after %d starts", s.finished(), len(f.starts))
	}
	for _, r := range logs.all("") {
		if r.attrs["verdict"] != nil {
			t.Errorf("a verdict while draining: %s", r.msg)
		}
	}
}

// A HUP during the window replaces the reload: the canary that serves
// beside nobody stays as a worker to replace, the new one is judged.
func TestCanarySupersededByANewReload(t *testing.T) {
	f, s, _ := canaryFixture(t, 2, canaryConfig(nil))
	sendSignal(s, syscall.SIGHUP)
	ready(s, 102)
	sendSignal(s, syscall.SIGHUP)
	if s.canary == nil || s.canary.gen != 2 || s.canary.slot != 0 || f.starts[3].Gen != 2 {
		t.Fatalf("canary %+v, starts %+v", s.canary, f.starts)
	}
	ready(s, 103) // replaces 102 (generation 1) in slot 0
	if got := f.signalled(syscall.SIGTERM); !slices.Equal(got, []int{100, 102}) {
		t.Fatalf("TERM to %v", got)
	}
	f.serve(3, 100, 0)
	f.serve(1, 100, 0)
	advance(f, s, testWindow)
	ready(s, 104)
	if st := s.status(); !st.Ready || st.Generation != 2 || st.Canary.Generation != 2 || st.Canary.Verdict != VerdictHealthy {
		t.Fatalf("status %+v %+v", st, st.Canary)
	}
}

func TestRecycleReplacesGracefully(t *testing.T) {
	f := newFake()
	s := newTestSupervisor(f, 2)
	ready(s, 100, 101)
	s.onRecycle(recycleEvent{pid: 101, reason: "max_requests", value: 1042, limit: 1042})
	s.step()
	if len(f.starts) != 3 || f.starts[2].Gen != 0 || s.slots[1].succ == nil {
		t.Fatalf("starts %+v, want a successor for slot 1", f.starts)
	}
	s.onRecycle(recycleEvent{pid: 101, reason: "max_requests", value: 1043, limit: 1042}) // once is enough
	s.step()
	if len(f.signals) != 0 || len(f.starts) != 3 {
		t.Fatalf("signals %v, starts %d before the successor was ready", f.signals, len(f.starts))
	}
	ready(s, 102)
	if got := f.signalled(syscall.SIGTERM); !slices.Equal(got, []int{101}) {
		t.Fatalf("TERM to %v, want 101", got)
	}
	exit(s, 101, true)
	if st := s.status(); st.Recycled != 1 || len(st.Workers) != 2 || !st.Ready {
		t.Fatalf("status %+v", st)
	}
	if len(f.starts) != 3 {
		t.Fatalf("%d starts, want 3", len(f.starts))
	}
}

// A slot left quarantined by an aborted canary is filled by the next
// reload's canary (B); a HUP (C) supersedes B during its window, and C's
// canary fails before it is ready. C is aborted: slot 0, where B's canary
// stays, is rolled back to the good generation 0. Slot 0 then serves: it
// is not reported quarantined, and a crash of its worker is respawned
// (the flag once outlived B's promotion, and kept the slot empty).
func TestQuarantineEndsWhenACanaryServesTheSlot(t *testing.T) {
	f, s, _ := canaryFixture(t, 3, canaryConfig(nil)) // pids 100..102
	// A: unhealthy, slot 0 quarantined.
	sendSignal(s, syscall.SIGHUP) // canary 103
	ready(s, 103)
	f.serve(3, 100, 100)
	f.serve(1, 100, 0)
	f.serve(2, 100, 0)
	advance(f, s, testWindow)
	exit(s, 100, true)
	exit(s, 103, true)
	if st := s.status(); !slices.Equal(st.Quarantined, []int{0}) {
		t.Fatalf("after A: quarantined %v", st.Quarantined)
	}
	// B: its canary (104) takes the quarantined slot 0 and becomes ready.
	sendSignal(s, syscall.SIGHUP)
	ready(s, 104)
	if s.slots[0].cur == nil || s.slots[0].cur.pid != 104 {
		t.Fatalf("B's canary not in slot 0")
	}
	// C during B's window: its canary (105) exits before it is ready.
	sendSignal(s, syscall.SIGHUP)
	if s.canary == nil || f.pids[len(f.pids)-1] != 105 {
		t.Fatalf("C's canary not started: %v", f.pids)
	}
	exit(s, 105, false)
	// Slot 0 goes back to generation 0 (a successor, 106).
	ready(s, 106)
	exit(s, 104, true)
	st := s.status()
	t.Logf("status: generation %d, quarantined %v, workers %+v", st.Generation, st.Quarantined, st.Workers)
	if s.slots[0].cur == nil || s.slots[0].cur.gen != 0 {
		t.Fatalf("slot 0 does not run generation 0")
	}
	if len(st.Quarantined) != 0 {
		t.Errorf("quarantined slots %v while slot 0 serves worker %d of the good generation", st.Quarantined, s.slots[0].cur.pid)
	}
	// That worker crashes: it must be respawned.
	n := len(f.starts)
	exit(s, 106, false)
	advance(f, s, time.Minute)
	if len(f.starts) == n {
		t.Errorf("slot 0's worker crashed and was never respawned: the fleet stays at %d workers", len(s.procs))
	}
}

// A HUP before the workers were first ready (one sent during start-up is
// handled before any worker starts) has no fleet to judge a canary
// against: the file is taken as the start takes it. The instance is ready
// once its workers of the new configuration are, never held unready for
// a canary window nor left with a slot quarantined by a canary judged
// inconclusive on no evidence.
func TestReloadBeforeFirstReadyHasNoCanary(t *testing.T) {
	for _, tc := range []struct {
		name    string
		policy  Inconclusive
		started bool // the HUP comes once the first workers started
		starts  int
	}{
		{"during start-up", InconclusiveContinue, false, 2},
		{"during start-up, abort", InconclusiveAbort, false, 2},
		{"workers starting", InconclusiveAbort, true, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFake()
			next := canaryConfig(func(c *Canary) { c.Inconclusive = tc.policy })
			f.load = func(Settings) (Settings, error) { return next, nil }
			logs := newLogSink()
			first := canaryConfig(nil)
			first.Payload = []byte("good")
			s := newSupervisor(f.env(), slog.New(logs), first, 2, minMaxWorkers(2))
			f.sup = s
			if tc.started {
				s.step()
				s.onSignal(syscall.SIGHUP)
			} else {
				s.onSignal(syscall.SIGHUP) // as run does with a signal of the start-up
			}
			s.step()
			for i := 0; i < len(f.pids); i++ {
				ready(s, f.pids[i])
			}
			st := s.status()
			if !st.Ready || !st.Serving || st.Canary != nil || len(st.Quarantined) != 0 || st.Generation != 1 {
				t.Fatalf("after the workers' ready: status %+v, canary %+v; want ready on generation 1 with no canary; log:\n%s", st, st.Canary, logs.dump())
			}
			for _, w := range st.Workers {
				if w.Generation != 1 && !w.Retiring {
					t.Errorf("worker %+v serves generation %d, want 1", w, w.Generation)
				}
			}
			if len(f.starts) != tc.starts {
				t.Errorf("%d workers started, want %d", len(f.starts), tc.starts)
			}
			if !slices.Equal(f.notes, []string{notifyReady}) {
				t.Errorf("notes %q, want READY=1 once", f.notes)
			}
		})
	}
}
