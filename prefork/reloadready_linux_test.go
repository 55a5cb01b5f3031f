package prefork

import (
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestReloadFinishedServesOnlyTheNewConfiguration: once a reload is
// announced finished ("reload finished", READY=1, a ready Status), no
// retired worker accepts a connection any more: a client that connects
// at once is served by a worker of the new configuration, on either
// engine of the test workers.
func TestReloadFinishedServesOnlyTheNewConfiguration(t *testing.T) {
	for _, engine := range []string{"nethttp", "fast"} {
		t.Run(engine, func(t *testing.T) {
			if engine == "fast" {
				t.Setenv(envTestEngine, "fast")
			}
			setup := testConfig(2)
			setup.Settings.Canary.Off = true
			h := startSupervisor(t, setup, true, func(o *Options) {
				o.Reload = func(Settings) (Settings, error) { return setup.Settings, nil }
			})
			for gen := 1; gen <= 3; gen++ {
				from := h.logs.Len()
				h.signal(unix.SIGHUP)
				if _, _, ok := h.logs.WaitFor(from, 20*time.Second, func(r record) bool { return r.msg == "reload finished" }); !ok {
					t.Fatalf("reload %d did not finish; log:\n%s", gen, h.logs.dump())
				}
				pids := burst(t, h, engine)
				fresh := startedIn(h, gen)
				var old []int
				for _, pid := range pids {
					if pid != 0 && !fresh[pid] {
						old = append(old, pid)
					}
				}
				if len(old) > 0 {
					t.Errorf("reload %d: once it was announced finished, %d of %d new connections were served by workers %v, not of generation %d %v",
						gen, len(old), len(pids), old, gen, fresh)
				}
			}
			if err := h.stop(15 * time.Second); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestAbortedReloadServesOnlyTheRunningConfiguration: once an aborted
// reload is announced over (READY=1, a ready Status), its canary no
// longer accepts connections: a client that connects at once is served
// by a worker of the running configuration, never by the one that
// failed.
func TestAbortedReloadServesOnlyTheRunningConfiguration(t *testing.T) {
	for _, engine := range []string{"nethttp", "fast"} {
		t.Run(engine, func(t *testing.T) {
			if engine == "fast" {
				t.Setenv(envTestEngine, "fast")
			}
			setup := testConfig(2)
			// No traffic in its window: inconclusive, so aborted.
			setup.Settings.Canary = Canary{Window: 100 * time.Millisecond, Inconclusive: InconclusiveAbort}
			over := make(chan struct{}, 8)
			aborted := 0 // the aborts seen over; only OnStatus's goroutine uses it
			h := startSupervisor(t, setup, true, func(o *Options) {
				o.Reload = func(Settings) (Settings, error) { return setup.Settings, nil }
				o.OnStatus = func(st Status) {
					if st.Ready && st.Reloads.Aborted > aborted {
						aborted = st.Reloads.Aborted
						over <- struct{}{}
					}
				}
			})
			for n := 1; n <= 3; n++ {
				h.signal(unix.SIGHUP)
				select {
				case <-over:
				case <-time.After(20 * time.Second):
					t.Fatalf("reload %d: no ready Status after its abort; log:\n%s", n, h.logs.dump())
				}
				pids := burst(t, h, engine)
				running := startedIn(h, 0)
				for _, pid := range pids {
					if pid != 0 && !running[pid] {
						t.Errorf("reload %d: once its abort was announced over, worker %d of the failed configuration served a new connection (%v)", n, pid, pids)
						break
					}
				}
			}
			if err := h.stop(15 * time.Second); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// burst sends 16 requests on new connections at once, and returns the
// pid of the worker that answered each (0 for none).
func burst(t *testing.T, h *harness, engine string) []int {
	pids := make([]int, 16)
	var wg sync.WaitGroup
	for i := range pids {
		wg.Go(func() {
			_, body, err := h.get(pidPath(engine), "")
			if err != nil {
				t.Errorf("GET: %v", err)
				return
			}
			pids[i] = pidOf(body)
		})
	}
	wg.Wait()
	return pids
}

// startedIn is the set of pids the log says started as workers of
// generation gen.
func startedIn(h *harness, gen int) map[int]bool {
	pids := map[int]bool{}
	for _, r := range h.logs.all("worker started") {
		if r.int("generation") == gen {
			pids[r.int("pid")] = true
		}
	}
	return pids
}

// pidPath is the path a test worker of engine answers its pid on.
func pidPath(engine string) string {
	if engine == "fast" {
		return "/x" // "fast <pid> <index>"
	}
	return "/pid"
}

// pidOf reads the pid out of a /pid or fast answer; 0 if none.
func pidOf(body string) int {
	if n, err := strconv.Atoi(body); err == nil {
		return n
	}
	var pid, index int
	if _, err := fmt.Sscanf(body, "fast %d %d", &pid, &index); err != nil {
		return 0
	}
	return pid
}
