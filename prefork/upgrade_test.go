//go:build linux

package prefork

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/preforkd/preforkd/shm"
)

// upgradeFake records the seam's upgrade calls.
type upgradeFake struct {
	held     [][]int // indexes handed to each upgrade
	gens     []int   // and the generation
	pid      int
	mains    int // msgMain sent
	abandons int // msgAbandon sent
	waits    [][]int
	readies  int // tellReady calls
}

func withUpgrades(f *fakeSys, u *upgradeFake, e sysEnv) sysEnv {
	e.upgrade = func(indexes []int, gen int) (upgradeProc, error) {
		u.held, u.gens = append(u.held, slices.Clone(indexes)), append(u.gens, gen)
		u.pid = 900 + len(u.held)
		pid := u.pid
		return upgradeProc{
			started: started{pid: pid, signal: func(sig syscall.Signal) error { f.signals = append(f.signals, sent{pid, sig}); return nil }},
			tell: func(msg byte) error {
				if msg == msgMain {
					u.mains++
				} else {
					u.abandons++
				}
				return nil
			},
		}, nil
	}
	e.waitGone = func(indexes []int) { u.waits = append(u.waits, slices.Clone(indexes)) }
	return e
}

func upgradingSupervisor(t *testing.T, f *fakeSys, u *upgradeFake, n int) *supervisor {
	t.Helper()
	s := newSupervisor(withUpgrades(f, u, f.env()), quietLog(), defaulted(Settings{ShutdownTimeout: 5 * time.Second, UpgradeTimeout: 10 * time.Second}), n, minMaxWorkers(n))
	f.sup = s
	s.step()
	return s
}

// The old side: USR2 hands the held indexes to the new supervisor and
// starts nothing while it starts; once it is ready it becomes the main
// process, HandedOver runs, and the old workers drain without a word to
// systemd and without Finish.
func TestUpgradeHandsOver(t *testing.T) {
	f, u := newFake(), &upgradeFake{}
	s := upgradingSupervisor(t, f, u, 2)
	handed := 0
	s.onHandedOver = func() { handed++ }
	ready(s, 100, 101)
	sendSignal(s, syscall.SIGUSR2)
	if len(u.held) != 1 || !slices.Equal(u.held[0], []int{0, 1}) {
		t.Fatalf("upgrade handed %v, want the held indexes [0 1]", u.held)
	}
	exit(s, 101, false) // a crash while the new one starts: not replaced yet
	advance(f, s, time.Second)
	if len(f.starts) != 2 {
		t.Fatalf("%d starts during the upgrade", len(f.starts)-2)
	}
	sendSignal(s, syscall.SIGUSR2) // a second one is refused
	if len(u.held) != 1 {
		t.Fatal("a second upgrade started")
	}
	notes := len(f.notes)
	s.onUpgradeReady(upgradeReadyEvent{u.pid})
	s.step()
	if got := f.notes[notes:]; !slices.Equal(got, []string{"MAINPID=901"}) {
		t.Errorf("notifications at the handover %q, want MAINPID=901 alone (no STOPPING=1)", got)
	}
	if u.mains != 1 || handed != 1 || !s.handedOver || !s.draining || s.regionLeft() == "" {
		t.Fatalf("mains %d, HandedOver %d, handed over %v, draining %v", u.mains, handed, s.handedOver, s.draining)
	}
	if got := f.signalled(syscall.SIGTERM); !slices.Equal(got, []int{100}) {
		t.Errorf("TERM to %v, want the old worker", got)
	}
	exit(s, 100, true)
	if !s.finished() || len(f.starts) != 2 {
		t.Errorf("finished %v, starts %d", s.finished(), len(f.starts))
	}
	if got := f.signalled(syscall.SIGKILL); len(got) != 0 {
		t.Errorf("killed %v", got)
	}
}

// A new supervisor that exits before it is ready, or is not ready within
// UpgradeTimeout (it is killed), leaves the old one serving: the indexes
// its workers may hold are reaped once they are gone, and the old one
// starts workers again.
func TestUpgradeFails(t *testing.T) {
	for _, timeout := range []bool{false, true} {
		f, u := newFake(), &upgradeFake{}
		s := upgradingSupervisor(t, f, u, 2)
		ready(s, 100, 101)
		sendSignal(s, syscall.SIGUSR2)
		exit(s, 101, false)
		if timeout {
			advance(f, s, 10*time.Second-time.Millisecond)
			if len(f.signalled(syscall.SIGKILL)) != 0 {
				t.Fatal("killed before upgrade_timeout")
			}
			advance(f, s, time.Millisecond)
			if got := f.signalled(syscall.SIGTERM); !slices.Equal(got, []int{901}) {
				t.Fatalf("at upgrade_timeout: TERM to %v, want the new supervisor", got)
			}
			advance(f, s, 10*time.Second) // not gone within a drain
			if got := f.signalled(syscall.SIGKILL); !slices.Equal(got, []int{901}) {
				t.Fatalf("past the drain: killed %v, want the new supervisor", got)
			}
		}
		s.onUpgradeExit(upgradeExitEvent{u.pid, "exit status 2"})
		s.step()
		if s.up != nil || s.handedOver || s.draining {
			t.Fatalf("timeout=%v: up %v, handed over %v, draining %v", timeout, s.up, s.handedOver, s.draining)
		}
		if len(u.waits) != 1 || !slices.Equal(u.waits[0], []int{1, 2, 3, 4, 5}) {
			t.Fatalf("timeout=%v: waited for %v, want every index not held ([1..5]: 1 was the crashed worker's)", timeout, u.waits)
		}
		advance(f, s, time.Second)
		if len(f.starts) != 2 {
			t.Fatalf("timeout=%v: a worker started on an index not yet reaped", timeout)
		}
		sendSignal(s, syscall.SIGUSR2) // refused until the indexes are reaped
		if len(u.held) != 1 {
			t.Fatalf("timeout=%v: an upgrade began with indexes not yet reaped", timeout)
		}
		for _, i := range u.waits[0] {
			s.onOrphan(orphanEvent{i})
		}
		s.step()
		if !slices.Contains(f.reaps, 5) || s.orphans != 0 {
			t.Errorf("timeout=%v: reaps %v, orphans %d", timeout, f.reaps, s.orphans)
		}
		if len(f.starts) != 3 || f.starts[2].Index != 1 {
			t.Errorf("timeout=%v: after the reaping, starts %+v, want the crashed slot refilled on index 1", timeout, f.starts[2:])
		}
		sendSignal(s, syscall.SIGUSR2) // it may be tried again
		if len(u.held) != 2 {
			t.Errorf("timeout=%v: a second upgrade was refused", timeout)
		}
	}
}

// USR2 is refused while another change is under way: during a reload,
// a drain, before ready.
func TestUpgradeRefused(t *testing.T) {
	f, u := newFake(), &upgradeFake{}
	s := upgradingSupervisor(t, f, u, 2)
	sendSignal(s, syscall.SIGUSR2) // not ready yet
	ready(s, 100, 101)
	s.cfg.Canary.Off = true
	sendSignal(s, syscall.SIGHUP)
	sendSignal(s, syscall.SIGUSR2) // reloading
	if len(u.held) != 0 {
		t.Fatalf("upgrades started: %v", u.held)
	}
}

// TERM while a new supervisor starts stops it: TERM, so that its workers
// that serve already finish what they serve, then KILL past a drain, or
// at a second TERM. The drain finishes only once it exited and the
// indexes its workers may hold are reaped, not as soon as this one's own
// workers are gone.
func TestUpgradeDrainWaitsForTheKilledOne(t *testing.T) {
	for _, second := range []bool{false, true} {
		f, u := newFake(), &upgradeFake{}
		s := upgradingSupervisor(t, f, u, 2)
		ready(s, 100, 101)
		sendSignal(s, syscall.SIGUSR2)
		sendSignal(s, syscall.SIGTERM)
		if got := f.signalled(syscall.SIGTERM); !slices.Equal(got, []int{901, 100, 101}) || u.abandons != 1 {
			t.Fatalf("TERM to %v, abandon told %d times; want the new supervisor and the workers, told once", got, u.abandons)
		}
		if second {
			sendSignal(s, syscall.SIGTERM)
		} else {
			advance(f, s, 10*time.Second-time.Millisecond) // shutdown_timeout and drainGrace
			if got := f.signalled(syscall.SIGKILL); len(got) != 0 {
				t.Fatalf("killed %v within the drain", got)
			}
			advance(f, s, time.Millisecond)
		}
		if got := f.signalled(syscall.SIGKILL); !slices.Contains(got, 901) {
			t.Fatalf("second TERM %v: killed %v, want the new supervisor", second, got)
		}
		drainWaitsForTheKilledOne(t, s, u)
	}
}

func drainWaitsForTheKilledOne(t *testing.T, s *supervisor, u *upgradeFake) {
	t.Helper()
	exit(s, 100, true)
	exit(s, 101, true)
	if s.finished() {
		t.Fatal("finished before the new supervisor's exit was seen")
	}
	s.onUpgradeExit(upgradeExitEvent{u.pid, "signal: killed"})
	if s.finished() || len(u.waits) != 1 {
		t.Fatalf("finished %v before its indexes were reaped (waits %v)", s.finished(), u.waits)
	}
	for _, i := range u.waits[0] {
		s.onOrphan(orphanEvent{i})
	}
	if !s.finished() {
		t.Error("not finished once they are reaped")
	}
}

// HUP while a new supervisor starts is refused, as USR2 is during a
// reload: this one starts no worker until the handover, which would drop
// the reload. systemd's reload ends at once: RELOADING=1, then READY=1.
func TestUpgradeRefusesReload(t *testing.T) {
	f, u := newFake(), &upgradeFake{}
	s := upgradingSupervisor(t, f, u, 2)
	s.cfg.Canary.Off = true
	ready(s, 100, 101)
	sendSignal(s, syscall.SIGUSR2)
	notes := len(f.notes)
	sendSignal(s, syscall.SIGHUP)
	got := f.notes[notes:]
	if len(got) != 2 || !strings.HasPrefix(got[0], "RELOADING=1") || got[1] != notifyReady {
		t.Errorf("notifications for the HUP %q, want RELOADING=1 then READY=1", got)
	}
	if s.reloading || s.reloads.Refused != 1 || s.reloads.Accepted != 0 || s.reloads.LastError == "" {
		t.Errorf("reloading %v, reloads %+v; want one refused", s.reloading, s.reloads)
	}
}

// The new side: the old supervisor's indexes are left alone until it and
// its workers are gone; ready is reported to it instead of READY=1, and
// notifications wait until it made this one the main process. Its
// generations go on from the old one's.
func TestUpgradeInherits(t *testing.T) {
	f, u := newFake(), &upgradeFake{}
	e := withUpgrades(f, u, f.env())
	e.tellReady = func() error { u.readies++; return nil }
	e.watchdog = time.Second
	s := newSupervisor(e, quietLog(), defaulted(Settings{ShutdownTimeout: 5 * time.Second}), 2, minMaxWorkers(2))
	f.sup = s
	s.inherit([]int{0, 1}, 4)
	s.step()
	s.keepAlive()
	if f.starts[0].Index != 2 || f.starts[1].Index != 3 {
		t.Fatalf("started on %d and %d, want 2 and 3", f.starts[0].Index, f.starts[1].Index)
	}
	if f.starts[0].Gen != 5 || f.starts[1].Gen != 5 {
		t.Errorf("workers of generations %d and %d, want 5: the old supervisor's 4, and one more", f.starts[0].Gen, f.starts[1].Gen)
	}
	ready(s, 100, 101)
	if u.readies != 1 || len(f.notes) != 0 {
		t.Fatalf("ready reported %d times; notifications %q, want none before it is main", u.readies, f.notes)
	}
	sendSignal(s, syscall.SIGUSR2) // the old one still runs
	if len(u.held) != 0 {
		t.Fatal("an upgrade started before the previous one finished")
	}
	s.onMain(mainEvent{})
	if !slices.Contains(f.notes, notifyWatchdog) {
		t.Errorf("notifications %q once main, want WATCHDOG=1", f.notes)
	}
	s.onMain(mainEvent{gone: true})
	if len(u.waits) != 1 || !slices.Equal(u.waits[0], []int{0, 1}) {
		t.Fatalf("waited for %v, want the old indexes", u.waits)
	}
	s.onOrphan(orphanEvent{0})
	s.onOrphan(orphanEvent{1})
	if s.inUse[0] || s.inUse[1] || len(s.oldIndexes) != 0 || !slices.Equal(f.reaps, []int{0, 1}) {
		t.Errorf("in use %v, old %v, reaps %v", s.inUse, s.oldIndexes, f.reaps)
	}
	if !strings.Contains(strings.Join(f.notes, ","), "WATCHDOG=1") {
		t.Error("no watchdog")
	}
}

// A reload after an upgrade goes on from the generation the new
// supervisor started at: the numbers never go back.
func TestUpgradeGenerationGoesOnAtReload(t *testing.T) {
	f, u := newFake(), &upgradeFake{}
	e := withUpgrades(f, u, f.env())
	e.tellReady = func() error { return nil }
	s := newSupervisor(e, quietLog(), defaulted(Settings{ShutdownTimeout: 5 * time.Second, Canary: Canary{Off: true}}), 1, minMaxWorkers(1))
	f.sup = s
	s.inherit([]int{0}, 4)
	s.step()
	ready(s, 100)
	s.onMain(mainEvent{})
	sendSignal(s, syscall.SIGHUP)
	if got := s.status().Generation; got != 6 {
		t.Fatalf("generation %d after a reload, want 6: one more than the upgrade's 5", got)
	}
	if sp := f.starts[len(f.starts)-1]; sp.Gen != 6 {
		t.Errorf("the reload's worker is of generation %d, want 6", sp.Gen)
	}
}

// A new supervisor whose old one died before it handed over (kill -9
// between USR2 and the new one's readiness) cannot report ready to it:
// it makes itself the main process and sends READY=1 itself, or systemd
// would never hear it is ready.
func TestUpgradeOrphanedNewSupervisorTellsSystemd(t *testing.T) {
	f, u := newFake(), &upgradeFake{}
	e := withUpgrades(f, u, f.env())
	e.tellReady = func() error { u.readies++; return errors.New("write: broken pipe") }
	e.pid = 4242
	s := newSupervisor(e, quietLog(), defaulted(Settings{ShutdownTimeout: 5 * time.Second}), 2, minMaxWorkers(2))
	f.sup = s
	s.inherit([]int{0, 1}, -1)
	s.step()
	ready(s, 100, 101)
	if u.readies != 1 || !slices.Contains(f.notes, "MAINPID=4242\nREADY=1") {
		t.Fatalf("ready reported %d times; notifications %q, want MAINPID=4242 and READY=1", u.readies, f.notes)
	}
}

// A binary upgrade to a build whose statistics rows are laid out
// otherwise (other metrics) is refused: it would judge its canary and
// serve metrics from rows it misreads. The same layout is taken.
func TestUpgradeRefusesAnotherStatLayout(t *testing.T) {
	want := regionOptions(Options{}, 1)
	for _, tc := range []struct {
		name   string
		layout uint64
		ok     bool
	}{
		{"this build's", want.StatLayout, true},
		{"another build's", want.StatLayout + 1, false},
		{"a build without tags", 0, false},
	} {
		o := want
		o.StatLayout = tc.layout
		old, err := shm.Create(o)
		if err != nil {
			t.Fatal(err)
		}
		f, err := os.OpenFile(fmt.Sprintf("/proc/self/fd/%d", old.File().Fd()), os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		r, err := (&inheritance{region: f}).attach(1, want.StatLayout)
		switch {
		case tc.ok && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case !tc.ok && (err == nil || !strings.Contains(err.Error(), "needs a restart")):
			t.Errorf("%s: attached (%v)", tc.name, err)
		}
		if r != nil {
			r.Close()
		}
		old.Close()
	}
}

// A new supervisor told to stop once it is the main process finishes (and
// so dumps) only after the old supervisor's workers are gone: a request
// one of them still serves stores its response in the region the dump
// is made of. Told to stop before, while the old one still serves (and
// will dump), it does not wait for them.
func TestUpgradeStopWaitsForTheOldWorkers(t *testing.T) {
	for _, main := range []bool{true, false} {
		f, u := newFake(), &upgradeFake{}
		s := newSupervisor(withUpgrades(f, u, f.env()), quietLog(), defaulted(Settings{ShutdownTimeout: 5 * time.Second}), 2, minMaxWorkers(2))
		f.sup = s
		s.inherit([]int{0, 1}, -1)
		s.step()
		ready(s, 100, 101)
		if main {
			s.onMain(mainEvent{})
		}
		sendSignal(s, syscall.SIGTERM)
		exit(s, 100, true)
		exit(s, 101, true)
		if s.finished() != !main {
			t.Fatalf("main=%v: finished %v with the old workers still running", main, s.finished())
		}
		if !main {
			// Nor does it dump: the old one serves on, and will.
			if s.regionLeft() == "" {
				t.Fatal("stopped before the handover, it would finish the old supervisor's region")
			}
			continue
		}
		s.onMain(mainEvent{gone: true})
		s.onOrphan(orphanEvent{0})
		if s.finished() {
			t.Fatal("finished with an old worker still running")
		}
		s.onOrphan(orphanEvent{1})
		if !s.finished() || s.regionLeft() != "" {
			t.Fatalf("finished %v, region left %q, once the old workers are gone", s.finished(), s.regionLeft())
		}
	}
}

// The wait for the old supervisor's workers has a bound: twice
// shutdown_timeout from the drain (an old supervisor that hangs), or a
// second TERM. The dump is then made without them, rather than never.
func TestUpgradeStopGivesUpTheOldWorkers(t *testing.T) {
	for _, by := range []string{"time", "TERM"} {
		f, u := newFake(), &upgradeFake{}
		s := newSupervisor(withUpgrades(f, u, f.env()), quietLog(), defaulted(Settings{ShutdownTimeout: 5 * time.Second}), 2, minMaxWorkers(2))
		f.sup = s
		s.inherit([]int{0, 1}, -1)
		s.step()
		ready(s, 100, 101)
		s.onMain(mainEvent{})
		sendSignal(s, syscall.SIGTERM)
		exit(s, 100, true)
		exit(s, 101, true)
		if by == "time" {
			advance(f, s, 10*time.Second-time.Millisecond)
			if s.finished() {
				t.Fatal("gave the old workers up before twice shutdown_timeout")
			}
			if next, ok := s.nextDeadline(); !ok || next.After(f.now.Add(time.Millisecond)) {
				t.Fatalf("no wake-up for the bound: %v %v", next, ok)
			}
			advance(f, s, time.Millisecond)
		} else {
			sendSignal(s, syscall.SIGTERM)
		}
		if !s.finished() {
			t.Errorf("by %s: still waiting for the old workers", by)
		}
	}
}

// After the handover the old supervisor drains its workers by itself. An
// operator who then stops it (QUIT to the old pid, as nginx's upgrade
// procedure has it) asks for the graceful stop it already does: its
// workers' requests are not cut; a second signal cuts them.
func TestUpgradeOldTakesAStopSignalGracefully(t *testing.T) {
	f, u := newFake(), &upgradeFake{}
	s := upgradingSupervisor(t, f, u, 2)
	ready(s, 100, 101)
	sendSignal(s, syscall.SIGUSR2)
	s.onUpgradeReady(upgradeReadyEvent{u.pid})
	s.step()
	sendSignal(s, syscall.SIGQUIT)
	if k := f.signalled(syscall.SIGKILL); len(k) != 0 {
		t.Fatalf("QUIT after the handover killed %v", k)
	}
	sendSignal(s, syscall.SIGQUIT)
	if k := f.signalled(syscall.SIGKILL); !slices.Equal(k, []int{100, 101}) {
		t.Fatalf("a second QUIT killed %v, want [100 101]", k)
	}
}

// A new supervisor that reported ready to the old one is handed over to
// (the old one drains without a dump), even when a TERM reaches it before
// the old one's word that it is the main process. Its drain must wait
// for that word (or the old one's exit) to know whether the dump is its
// own to make: finishing first left the instance without a dump at all.
func TestUpgradeStopAfterTellingReadyWaitsForTheWord(t *testing.T) {
	for _, abandoned := range []bool{false, true} {
		f, u := newFake(), &upgradeFake{}
		e := withUpgrades(f, u, f.env())
		e.tellReady = func() error { u.readies++; return nil }
		s := newSupervisor(e, quietLog(), defaulted(Settings{ShutdownTimeout: 5 * time.Second}), 2, minMaxWorkers(2))
		f.sup = s
		s.inherit([]int{0, 1}, -1)
		s.step()
		ready(s, 100, 101)
		if u.readies != 1 {
			t.Fatalf("ready reported %d times", u.readies)
		}
		sendSignal(s, syscall.SIGTERM) // before the old one's word
		exit(s, 100, true)
		exit(s, 101, true)
		if s.finished() {
			t.Fatal("finished before the old supervisor said whether it handed over")
		}
		if abandoned {
			// The old one stops this one (its ready unread there): no
			// handover comes, and the old one waits for this one's exit.
			s.onMain(mainEvent{abandoned: true})
			if !s.finished() || s.regionLeft() == "" {
				t.Fatalf("abandoned: finished %v, region left %q; want finished, without Finish", s.finished(), s.regionLeft())
			}
			continue
		}
		s.onMain(mainEvent{}) // it did: the dump is this one's
		s.onMain(mainEvent{gone: true})
		s.onOrphan(orphanEvent{0})
		s.onOrphan(orphanEvent{1})
		if !s.finished() || s.regionLeft() != "" {
			t.Fatalf("finished %v, region left %q, once main and the old workers are gone", s.finished(), s.regionLeft())
		}
	}
}

// Workers that a reload replaced hold their indexes while they drain
// their last requests (up to shutdown_timeout): with two reloads' worth
// of them, the new supervisor would find too few indexes for its workers
// and exit asking for a restart. USR2 is refused until they are gone, as
// during a reload, and taken once they are.
func TestUpgradeRefusedWhileReplacedWorkersHoldTheIndexes(t *testing.T) {
	f, u := newFake(), &upgradeFake{}
	s := upgradingSupervisor(t, f, u, 2)
	s.cfg.Canary.Off = true
	ready(s, 100, 101)
	for range 2 {
		sendSignal(s, syscall.SIGHUP)
		ready(s, f.nextPID-1)
		ready(s, f.nextPID-1)
	}
	if s.reloading || slices.Contains(s.inUse, false) {
		t.Fatalf("reloading %v, indexes in use %v: want both reloads done, every index held", s.reloading, s.inUse)
	}
	sendSignal(s, syscall.SIGUSR2)
	if len(u.held) != 0 {
		t.Fatalf("an upgrade began with the indexes %v, leaving none for the new supervisor's workers", u.held)
	}
	for _, pid := range []int{100, 101, 102, 103} {
		exit(s, pid, true)
	}
	sendSignal(s, syscall.SIGUSR2)
	if len(u.held) != 1 || !slices.Equal(u.held[0], []int{4, 5}) {
		t.Fatalf("upgrade handed %v once the replaced workers were gone, want [[4 5]]", u.held)
	}
	if u.gens[0] != 2 {
		t.Errorf("upgrade handed generation %d, want 2: the workers' after two reloads", u.gens[0])
	}
}

// A supervisor started by an upgrade starts its first workers, of the
// generation after the old one's, from its own binary, as a first start
// does with generation 0: not from the file at the program's path, which
// may be gone or another build by then. A reload still opens that file.
func TestUpgradeFirstGenerationRunsOwnBinary(t *testing.T) {
	e := &osEnv{exe: filepath.Join(t.TempDir(), "gone")}
	e.startsAt(5)
	g, err := e.filesFor(spawnSpec{Gen: 5, Settings: defaulted(Settings{}), Keep: []int{5}})
	if err != nil {
		t.Fatalf("the first generation of an upgraded supervisor: %v", err)
	}
	defer g.close()
	if _, err := e.filesFor(spawnSpec{Gen: 6, Settings: defaulted(Settings{}), Keep: []int{5}}); err == nil {
		t.Fatal("a reload did not open the file at the program's path")
	}
}

// The old side hands over (MAINPID=, the new one told it is the main
// process) only once each of its workers said it stopped accepting or
// exited, and pings the watchdog until then; a new supervisor that
// exited meanwhile is not made the main process.
func TestUpgradeHandsOverOnceTheOldWorkersStopAccepting(t *testing.T) {
	for _, exits := range []bool{false, true} {
		f, u := newFake(), &upgradeFake{}
		f.holdStops = true
		e := withUpgrades(f, u, f.env())
		e.watchdog = time.Second
		s := newSupervisor(e, quietLog(), defaulted(Settings{ShutdownTimeout: 5 * time.Second, UpgradeTimeout: 10 * time.Second}), 2, minMaxWorkers(2))
		f.sup = s
		s.step()
		ready(s, 100, 101)
		sendSignal(s, syscall.SIGUSR2)
		notes := len(f.notes)
		s.onUpgradeReady(upgradeReadyEvent{u.pid})
		s.step()
		exit(s, 100, true) // said nothing: its exit is enough
		advance(f, s, 2*time.Second)
		s.keepAlive()
		if got := f.notes[notes:]; u.mains != 0 || !slices.Equal(got, []string{notifyWatchdog}) {
			t.Fatalf("mains %d, notifications %q while worker 101 may accept: want none but WATCHDOG=1", u.mains, got)
		}
		if exits {
			s.onUpgradeExit(upgradeExitEvent{u.pid, "signal: killed"})
		}
		s.procs[101].stopped = true // as the loop takes its stoppedEvent
		s.step()
		s.keepAlive()
		want, mains := []string{notifyWatchdog, "MAINPID=901"}, 1
		if exits {
			// Still the main process, and stopping: it says so.
			want, mains = []string{notifyWatchdog, notifyStopping}, 0
		}
		if got := f.notes[notes:]; u.mains != mains || !slices.Equal(got, want) {
			t.Errorf("new one exited %v: mains %d, notifications %q once no worker accepts; want %d, %q", exits, u.mains, got, mains, want)
		}
		exit(s, 101, true)
		if exits {
			// Nobody took the region over: its dead one's workers'
			// indexes are reaped, then this one finishes it (Finish)
			// and fails, for a restart.
			if s.finished() || len(u.waits) != 1 {
				t.Fatalf("finished %v before the dead one's indexes %v were reaped", s.finished(), u.waits)
			}
			for _, i := range u.waits[0] {
				s.onOrphan(orphanEvent{i})
			}
			if s.regionLeft() != "" || s.fatal == nil {
				t.Errorf("region left %q, fatal %v: want Finish to run, and an error", s.regionLeft(), s.fatal)
			}
		}
		if !s.finished() {
			t.Errorf("new one exited %v: not finished", exits)
		}
	}
}

// A stop signal to the old side while it hands over (the new one said
// it is ready, the old workers have not all stopped accepting) is the
// service's: this one is still its main process. The upgrade is
// abandoned, the new one stopped, and this one finishes the region once
// the new one and its workers are gone, without an error.
func TestUpgradeStopDuringTheHandover(t *testing.T) {
	f, u := newFake(), &upgradeFake{}
	f.holdStops = true
	s := upgradingSupervisor(t, f, u, 2)
	ready(s, 100, 101)
	sendSignal(s, syscall.SIGUSR2)
	notes := len(f.notes)
	s.onUpgradeReady(upgradeReadyEvent{u.pid})
	s.step()
	sendSignal(s, syscall.SIGTERM)
	if got := f.signalled(syscall.SIGTERM); !slices.Contains(got, 901) || u.abandons != 1 {
		t.Fatalf("TERM to %v, abandon told %d times; want the new supervisor, told", got, u.abandons)
	}
	s.procs[100].stopped, s.procs[101].stopped = true, true
	s.step()
	exit(s, 100, true)
	exit(s, 101, true)
	if got := f.notes[notes:]; u.mains != 0 || !slices.Equal(got, []string{notifyStopping}) {
		t.Errorf("mains %d, notifications %q; want no handover, STOPPING=1", u.mains, got)
	}
	if s.finished() {
		t.Fatal("finished before the new supervisor exited")
	}
	s.onUpgradeExit(upgradeExitEvent{u.pid, "exit status 0"})
	if s.finished() || len(u.waits) != 1 {
		t.Fatalf("finished %v before its workers' indexes %v were reaped", s.finished(), u.waits)
	}
	for _, i := range u.waits[0] {
		s.onOrphan(orphanEvent{i})
	}
	if !s.finished() || s.regionLeft() != "" || s.fatal != nil {
		t.Errorf("finished %v, region left %q, fatal %v; want finished, Finish to run, no error", s.finished(), s.regionLeft(), s.fatal)
	}
}

// The new side's Status is ready only once the old supervisor made it
// the main process, which it does once its workers stopped accepting.
func TestUpgradeReadyOnceMain(t *testing.T) {
	f, u := newFake(), &upgradeFake{}
	e := withUpgrades(f, u, f.env())
	e.tellReady = func() error { u.readies++; return nil }
	s := newSupervisor(e, quietLog(), defaulted(Settings{ShutdownTimeout: 5 * time.Second}), 2, minMaxWorkers(2))
	f.sup = s
	s.inherit([]int{0, 1}, 4)
	s.step()
	ready(s, 100, 101)
	if st := s.status(); u.readies != 1 || st.Ready || !st.Serving {
		t.Fatalf("reported %d, Status ready %v serving %v before the handover: want reported, serving, not ready", u.readies, st.Ready, st.Serving)
	}
	s.onMain(mainEvent{})
	if !s.status().Ready {
		t.Error("not ready once main")
	}
}
