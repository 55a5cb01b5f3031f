package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"
)

// A binary upgrade is announced done, to systemd (MAINPID= names the new
// supervisor) and on /status (the new supervisor's pid, ready), only once
// no worker of the old supervisor accepts any more: a client that
// connects at once is served by the new binary's workers, on either
// cleartext engine.
func TestUpgradeAnnouncedServesOnlyTheNewWorkers(t *testing.T) {
	t.Parallel()
	for _, eng := range []string{"loop", "fasthttp"} {
		for _, by := range []string{"MAINPID", "status"} {
			t.Run(eng+"/"+by, parallel(func(t *testing.T) {
				ns := newNotifySocket(t)
				cfg := strings.Replace(baseServer(2, fmt.Sprintf("engine = %q", eng)), "[table]", "[admin]\nlisten = \"ADMIN_ADDR\"\n\n[table]", 1)
				d := startDaemon(t, daemonOptions{config: cfg, admin: true, env: []string{"NOTIFY_SOCKET=" + ns.path}})
				if state, _ := ns.next(t, 10*time.Second, false); state != "READY=1" {
					t.Fatalf("first notification %q", state)
				}
				c := newClient(t, nil, false)
				sup := d.pid()
				for round := 1; round <= 3; round++ {
					old := map[int]bool{}
					for _, pid := range d.workerPIDs() {
						old[pid] = true
					}
					from := d.logs.len()
					if err := syscall.Kill(sup, syscall.SIGUSR2); err != nil {
						t.Fatal(err)
					}
					_, begun, ok := d.logs.waitFor(from, 10*time.Second, msgIs("upgrade begun: new supervisor started"))
					if !ok {
						t.Fatalf("no upgrade begun; log:\n%s", d.logs.text())
					}
					newPID := begun.int("pid")
					switch by {
					case "MAINPID":
						if state, _ := ns.next(t, 20*time.Second, false); state != fmt.Sprintf("MAINPID=%d", newPID) {
							t.Fatalf("notification %q, want MAINPID=%d", state, newPID)
						}
					case "status":
						for deadline := time.Now().Add(20 * time.Second); ; {
							var st struct {
								PID   int  `json:"pid"`
								Ready bool `json:"ready"`
							}
							if json.Unmarshal(get(c, "http://"+d.admin+"/status").body, &st) == nil && st.PID == newPID && st.Ready {
								break
							}
							if time.Now().After(deadline) {
								t.Fatalf("the new supervisor's /status never said ready; log:\n%s", d.logs.text())
							}
							time.Sleep(time.Millisecond)
						}
					}
					var served []int
					for _, r := range burst(c, d.url("/x"), 16) {
						if b, ok := r.demo(); ok && old[b.PID] {
							served = append(served, b.PID)
						}
					}
					if len(served) > 0 {
						t.Errorf("upgrade %d: once announced (%s), %d of 16 new connections were served by the old supervisor's workers %v", round, by, len(served), served)
					}
					// The next USR2 is taken once the old workers are gone.
					if _, _, ok := d.logs.waitFor(from, 20*time.Second, msgIs("upgrade finished: the old supervisor's workers are gone")); !ok {
						t.Fatalf("upgrade %d did not finish; log:\n%s", round, d.logs.text())
					}
					sup = newPID
				}
				stopPID(t, d, sup)
			}))
		}
	}
}
