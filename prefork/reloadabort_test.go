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

// rollFixture is a supervisor of n ready workers (pids 100.., generation
// 0) whose HUP loads a configuration without a canary, with a log to
// read.
func rollFixture(t *testing.T, n int) (*fakeSys, *supervisor, *logSink) {
	t.Helper()
	return readyFleet(t, n, defaulted(Settings{ShutdownTimeout: 5 * time.Second}), defaulted(noCanary(Settings{ShutdownTimeout: time.Second})))
}

// abortLine returns the one log line that says a reload was aborted.
func abortLine(t *testing.T, logs *logSink) record {
	t.Helper()
	var out []record
	for _, r := range logs.all("") {
		if strings.Contains(r.msg, "reload aborted") {
			out = append(out, r)
		}
	}
	if len(out) != 1 {
		t.Fatalf("%d abort lines, want 1; log:\n%s", len(out), logs.dump())
	}
	return out[0]
}

// Without a canary, a worker of the new configuration that cannot
// start, exits before it is ready, or is not ready in time fails the
// reload as a canary would: it is not respawned, the worker it was to
// replace serves on, and the reload ends (READY=1), reported aborted.
func TestReloadWithoutCanaryFailsLikeACanary(t *testing.T) {
	for _, tc := range []struct {
		name string
		fail func(f *fakeSys, s *supervisor)
		msg  string
	}{
		{"exits at start", func(f *fakeSys, s *supervisor) {
			s.onExit(exitEvent{pid: 102, status: "exit status 78", code: exitNoEngine})
			s.step()
		}, "reload failed: a worker of generation 1 in slot 0 exited before it was ready (exit status 78: it could not build its engine, its log says why); reload aborted, slot 0 keeps generation 0"},
		{"never ready", func(f *fakeSys, s *supervisor) {
			advance(f, s, readyTimeout)
			if k := f.signalled(syscall.SIGKILL); !slices.Equal(k, []int{102}) {
				t.Fatalf("killed %v, want the successor 102", k)
			}
			exit(s, 102, false)
		}, "reload failed: a worker of generation 1 in slot 0 exited before it was ready (signal: killed); reload aborted, slot 0 keeps generation 0"},
		{"cannot start", func(f *fakeSys, s *supervisor) {}, // see below
			"reload failed: a worker of generation 1 in slot 0 could not be started: exec format error; reload aborted, slot 0 keeps generation 0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, s, logs := rollFixture(t, 2)
			if tc.name == "cannot start" {
				f.startErr = errors.New("exec format error")
			}
			sendSignal(s, syscall.SIGHUP)
			tc.fail(f, s)
			f.startErr = nil
			v := abortLine(t, logs)
			if v.msg != tc.msg || v.level != slog.LevelError {
				t.Errorf("abort line %v %q, want ERROR %q", v.level, v.msg, tc.msg)
			}
			starts := len(f.starts)
			advance(f, s, time.Minute)
			if len(f.starts) != starts || len(f.signalled(syscall.SIGTERM)) != 0 {
				t.Fatalf("after the abort: %d starts, TERM to %v; want none: no respawn loop, the old workers serve on",
					len(f.starts)-starts, f.signalled(syscall.SIGTERM))
			}
			if f.notes[len(f.notes)-1] != notifyReady || s.reloading {
				t.Fatalf("notes %q, reloading %v: want READY=1 last, the reload over", f.notes, s.reloading)
			}
			st := s.status()
			if st.Generation != 0 || !st.Ready || len(st.Quarantined) != 0 || st.Canary != nil || st.Crashes != 0 {
				t.Fatalf("status after the abort: %+v", st)
			}
			if r := st.Reloads; r.Accepted != 1 || r.Aborted != 1 || r.LastError != tc.msg {
				t.Fatalf("reloads %+v, want one accepted and aborted, with the abort line as its error", r)
			}
			// The next HUP is a reload again, and one that works finishes.
			sendSignal(s, syscall.SIGHUP)
			ready(s, f.pids[len(f.pids)-1])
			ready(s, f.pids[len(f.pids)-1])
			if st := s.status(); st.Generation != 2 || !st.Ready || st.Reloads.LastError != "" || f.notes[len(f.notes)-1] != notifyReady {
				t.Fatalf("after the next reload: %+v, notes %q", st, f.notes)
			}
		})
	}
}

// A roll without a canary that fails after it replaced some slots goes
// back to the configuration it started from in those too: one
// configuration runs after a reload, as after nginx's or HAProxy's. The
// reload ends once they run it again.
func TestReloadWithoutCanaryFailingLaterRollsBack(t *testing.T) {
	f, s, logs := rollFixture(t, 3) // 100, 101, 102
	sendSignal(s, syscall.SIGHUP)
	ready(s, 103) // slot 0 runs generation 1; 100 retires
	exit(s, 100, true)
	if sp := f.starts[4]; sp.Gen != 1 || !slices.Contains(sp.Keep, 0) {
		t.Fatalf("slot 1's successor %+v: want generation 1, generation 0 kept to go back to", sp)
	}
	exit(s, 104, false) // slot 1's successor exits before it is ready
	want := "reload failed: a worker of generation 1 in slot 1 exited before it was ready (signal: killed); reload aborted, slot 1 keeps generation 0; slot 0 goes back to generation 0"
	if v := abortLine(t, logs); v.msg != want {
		t.Errorf("abort line %q, want %q", v.msg, want)
	}
	if sp := f.starts[len(f.starts)-1]; len(f.starts) != 6 || sp.Gen != 0 || s.slots[0].succ == nil {
		t.Fatalf("starts %+v, want slot 0 replaced with generation 0", f.starts[5:])
	}
	if !s.reloading || f.notes[len(f.notes)-1] == notifyReady {
		t.Fatalf("notes %q: READY=1 before every worker runs generation 0 again", f.notes)
	}
	ready(s, 105) // 103 retires
	if got := f.signalled(syscall.SIGTERM); !slices.Equal(got, []int{100, 103}) {
		t.Fatalf("TERM to %v, want 100 and then generation 1's 103", got)
	}
	advance(f, s, time.Minute)
	if len(f.starts) != 6 || s.reloading || f.notes[len(f.notes)-1] != notifyReady {
		t.Fatalf("%d starts, notes %q: want the reload over once slot 0 went back", len(f.starts), f.notes)
	}
	if st := s.status(); st.Generation != 0 || !st.Ready || st.Reloads.Aborted != 1 {
		t.Fatalf("status %+v", st)
	}
}
