//go:build linux

package main

import (
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// signalsConfig is two workers, the admin endpoint, a fixed-window rule of
// 3 per hour on /u and a dump: what every test here counts with.
func signalsConfig(t *testing.T) string {
	dump := filepath.Join(t.TempDir(), "table.dump")
	return strings.Replace(baseServer(2, ""), "[table]", "[admin]\nlisten = \"ADMIN_ADDR\"\n\n[table]", 1) +
		rule("three", "/u", "fixed-window", 3, "1h") + fmt.Sprintf("\n[persist]\npath = %q\n", dump)
}

// sendU sends n requests to /u and counts the answers by status.
func sendU(t *testing.T, d *daemon, n int) map[int]int {
	t.Helper()
	c := newClient(t, nil, false)
	var rs []result
	for range n {
		rs = append(rs, get(c, d.url("/u")))
	}
	return statuses(rs)
}

// startTwoUsed starts the daemon on cfg and uses 2 of the 3 requests
// its rule admits.
func startTwoUsed(t *testing.T, cfg string) *daemon {
	t.Helper()
	d := startDaemon(t, daemonOptions{config: cfg, admin: true})
	if got := sendU(t, d, 2); got[200] != 2 {
		t.Fatalf("before: %v", got)
	}
	return d
}

// killSupervisor kills d's supervisor with SIGKILL and waits for its end.
func killSupervisor(t *testing.T, d *daemon) {
	t.Helper()
	syscall.Kill(d.pid(), syscall.SIGKILL)
	if _, ok := d.wait(5 * time.Second); !ok {
		t.Fatal("the supervisor survived SIGKILL")
	}
}

// wantOneLeft restarts on cfg (the dump of a limit of 3 with 2 used) and
// requires exactly one more request admitted.
func wantOneLeft(t *testing.T, cfg string) {
	t.Helper()
	d := startDaemon(t, daemonOptions{config: cfg, admin: true})
	if got := sendU(t, d, 3); got[200] != 1 || got[429] != 2 {
		t.Errorf("after the restart: %v, want exactly 1 admitted (3 - 2), then 429", got)
	}
	d.stop()
}

// A HUP while a reload's canary is judged supersedes that reload: the
// canary is dropped, the newer file is rolled out, both HUPs count as
// accepted, and the counts carry over.
func TestHUPDuringReloadSupersedesItE2E(t *testing.T) {
	t.Parallel()
	cfg := signalsConfig(t)
	slow := strings.Replace(cfg, shortCanary, `canary_window = "1m"`, 1)
	d := startTwoUsed(t, slow)
	from := reloadTo(d, slow+"\n# first edit\n")
	if _, _, ok := d.logs.waitFor(from, 10*time.Second, msgIs("canary ready: judging it")); !ok {
		t.Fatal("no canary judged")
	}
	second := reloadTo(d, noCanary(cfg))
	if _, _, ok := d.logs.waitFor(second, 10*time.Second, msgIs("canary superseded by a newer reload")); !ok {
		t.Fatal("the canary was not superseded")
	}
	_, l, ok := d.logs.waitFor(second, 10*time.Second, msgIs("reload finished"))
	if !ok || l.int("generation") != 2 {
		t.Fatalf("the second reload did not finish: %v %q", ok, l.raw)
	}
	waitRetiredGone(t, d, second)
	m := scrapeMetrics(t, newClient(t, nil, false), d.admin)
	if a, r := m.samples[`preforkd_reloads_total{result="accepted"}`], m.samples[`preforkd_reloads_total{result="refused"}`]; a != 2 || r != 0 {
		t.Errorf("reloads accepted %v, refused %v; want 2 and 0", a, r)
	}
	d.stop()
	wantOneLeft(t, cfg)
}

// TERM to the supervisor while the new one of a binary upgrade starts
// abandons the upgrade: the new one is killed, this one drains and dumps,
// as for any TERM.
func TestStopBeforeUpgradeHandoverE2E(t *testing.T) {
	t.Parallel()
	cfg := signalsConfig(t)
	d := startTwoUsed(t, cfg)
	from, newPID := beginUpgrade(t, d)
	d.signal(syscall.SIGTERM)
	if code, ok := d.wait(15 * time.Second); !ok || code != 0 {
		t.Fatalf("after TERM: exited %v, code %d", ok, code)
	}
	if !d.logs.waitEOF(10 * time.Second) {
		t.Fatalf("a process of the upgrade outlived the old supervisor; log:\n%s", d.logs.text())
	}
	for _, msg := range []string{"upgrade abandoned: draining", "dump written"} {
		if _, _, ok := d.logs.waitFor(from, 0, msgIs(msg)); !ok {
			t.Errorf("no %q line", msg)
		}
	}
	if syscall.Kill(newPID, 0) == nil {
		t.Errorf("the new supervisor %d is still running", newPID)
	}
	wantOneLeft(t, cfg)
}

// kill -9 of the supervisor while the new one of a binary upgrade starts:
// the new one is the main process from then on, serves, and dumps at its
// stop.
func TestOldSupervisorKilledDuringUpgradeE2E(t *testing.T) {
	t.Parallel()
	cfg := signalsConfig(t)
	d := startTwoUsed(t, cfg)
	from, newPID := beginUpgrade(t, d)
	killSupervisor(t, d)
	if _, _, ok := d.logs.waitFor(from, 10*time.Second, msgIs("upgrade: the old supervisor exited")); !ok {
		t.Fatal("the new supervisor did not see the old one gone")
	}
	if _, _, ok := d.logs.waitFor(from, 10*time.Second, msgIs("ready")); !ok {
		t.Fatal("the new supervisor did not become ready")
	}
	if r := get(newClient(t, nil, false), d.url("/")); r.status != 200 {
		t.Errorf("the new supervisor does not serve: %d %v", r.status, r.err)
	}
	stopPID(t, d, newPID)
	if _, _, ok := d.logs.waitFor(from, 0, msgIs("dump written")); !ok {
		t.Errorf("the new supervisor wrote no dump at its stop")
	}
	wantOneLeft(t, cfg)
}

// kill -9 of a supervisor that loaded a dump, without persist.interval:
// the dump it loaded was consumed (PATH.loaded) and none was written
// since, so the next start has none and its counts start from nothing.
// It says so at warn, naming the file, rather than as a first start.
func TestKilledAfterLoadSaysTheStateIsLostE2E(t *testing.T) {
	t.Parallel()
	cfg := signalsConfig(t)
	d := startTwoUsed(t, cfg)
	d.stop()
	d2 := startDaemon(t, daemonOptions{config: cfg, admin: true})
	if _, l, ok := d2.logs.waitFor(0, 0, msgIs("persist: dump loaded")); !ok {
		t.Fatalf("no dump loaded; log:\n%s", d2.logs.text())
	} else {
		t.Log(l.raw)
	}
	killSupervisor(t, d2)
	d3 := startDaemon(t, daemonOptions{config: cfg, admin: true})
	_, l, ok := d3.logs.waitFor(0, 0, func(l logLine) bool { return strings.HasPrefix(l.msg(), "persist: no dump to load") })
	if !ok || l.get("level") != "WARN" || !strings.HasSuffix(l.get("loaded"), ".loaded") {
		t.Errorf("the start after the kill says %q; want a warning naming the consumed dump", l.raw)
	}
	if got := sendU(t, d3, 4); got[200] != 3 || got[429] != 1 {
		t.Errorf("after the kill: %v, want the counts started from nothing (3 admitted)", got)
	}
	d3.stop()
}

// upgradeHeldAtHandover starts an instance with two counts used and
// upgrades it, its workers held stopped (SIGSTOP) so that the handover,
// begun once the new supervisor is ready, cannot finish: it returns the
// instance, where its log stood before the upgrade, the new supervisor's
// pid, and cont, which lets the old workers go on.
func upgradeHeldAtHandover(t *testing.T, cfg string) (d *daemon, from int, newPID int, cont func()) {
	t.Helper()
	d = startTwoUsed(t, cfg)
	old := d.workerPIDs()
	for _, pid := range old {
		syscall.Kill(pid, syscall.SIGSTOP)
	}
	cont = func() {
		for _, pid := range old {
			syscall.Kill(pid, syscall.SIGCONT)
		}
	}
	t.Cleanup(cont)
	from, newPID = beginUpgrade(t, d)
	if _, _, ok := d.logs.waitFor(from, 10*time.Second, msgIs("upgrade: the new supervisor serves; draining the old workers")); !ok {
		t.Fatalf("no handover begun; log:\n%s", d.logs.text())
	}
	return d, from, newPID, cont
}

// The new supervisor of an upgrade dies after it reported ready but
// before the old one made it the main process (the old workers had not
// all stopped accepting yet: here they are held stopped until it is
// gone). The old one cannot serve on, its workers told to drain, and it
// is still the service's main process: it must not exit 0 without a dump
// as if it had handed over. It dumps, says why, and exits with an error
// (systemd's Restart=on-failure restarts it, the dump loaded).
func TestNewSupervisorDiesBeforeHandoverE2E(t *testing.T) {
	t.Parallel()
	cfg := signalsConfig(t)
	d, from, newPID, cont := upgradeHeldAtHandover(t, cfg)
	syscall.Kill(newPID, syscall.SIGKILL)
	seen := func(l logLine) bool {
		return l.msg() == "the new supervisor exited while this one drains" || strings.HasPrefix(l.msg(), "upgrade failed")
	}
	if _, _, ok := d.logs.waitFor(from, 10*time.Second, seen); !ok {
		t.Fatalf("the old supervisor did not see the new one exit; log:\n%s", d.logs.text())
	}
	cont()
	code, ok := d.wait(20 * time.Second)
	if !ok || code != exitRuntime {
		t.Errorf("the old supervisor: exited %v, code %d; want %d, for a restart", ok, code, exitRuntime)
	}
	if !d.logs.waitEOF(10 * time.Second) {
		t.Fatalf("a process outlived the old supervisor; log:\n%s", d.logs.text())
	}
	for _, l := range d.logs.snapshot()[from:] {
		if l.msg() == "upgrade: the old supervisor exits; the new one serves" {
			t.Errorf("the old supervisor says the dead one serves: %s", l.raw)
		}
	}
	if _, _, ok := d.logs.waitFor(from, 0, msgIs("dump written")); !ok {
		t.Errorf("no dump written")
	}
	wantOneLeft(t, cfg)
}

// TERM to the old supervisor while the new one of an upgrade is not
// ready yet, but its workers already serve (each accepts on the shared
// socket once it is ready itself): the upgrade is abandoned, and a
// request one of those workers has in flight is finished, as TERM
// promises, not cut by the new supervisor's kill. Here the old workers
// are held stopped, so that only a new one accepts the request, and the
// new supervisor is held stopped from its first worker's start, so that
// it does not report ready meanwhile.
func TestStopBeforeUpgradeHandoverFinishesTheNewWorkersRequestsE2E(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	up := idemStartUpstream(t, func(_ int64, w http.ResponseWriter, _ *http.Request) {
		select {
		case <-release:
		case <-time.After(10 * time.Second):
		}
		io.WriteString(w, "done")
	})
	d := startDaemon(t, daemonOptions{config: baseServer(2, fmt.Sprintf("upstream = \"http://%s\"", up.addr))})
	var held []int
	cont := func() {
		for _, pid := range held {
			syscall.Kill(pid, syscall.SIGCONT)
		}
	}
	t.Cleanup(cont)
	for _, pid := range d.workerPIDs() {
		syscall.Kill(pid, syscall.SIGSTOP)
		held = append(held, pid)
	}
	from, newPID := beginUpgrade(t, d)
	if _, _, ok := d.logs.waitFor(from, 10*time.Second, func(l logLine) bool { return l.msg() == "worker started" && l.int("index") >= 2 }); !ok {
		t.Fatalf("the new supervisor started no worker; log:\n%s", d.logs.text())
	}
	syscall.Kill(newPID, syscall.SIGSTOP)
	held = append(held, newPID)
	if _, _, ok := d.logs.waitFor(from, 0, msgIs("upgrade: the new supervisor serves; draining the old workers")); ok {
		t.Fatal("the new supervisor reported ready before it was held: nothing to test")
	}
	c := newClient(t, nil, false)
	done := inFlight(t, up, func() result { return get(c, d.url("/slow")) })
	d.signal(syscall.SIGTERM)
	if _, _, ok := d.logs.waitFor(from, 10*time.Second, msgIs("upgrade abandoned: draining")); !ok {
		t.Fatalf("the upgrade was not abandoned; log:\n%s", d.logs.text())
	}
	cont()
	// Until the new supervisor is gone (killed) or drains too (its own
	// "drain begun", the second since the upgrade began), whichever it does.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		drains := 0
		for _, l := range d.logs.snapshot()[from:] {
			if l.msg() == "drain begun" {
				drains++
			}
		}
		if _, state := procStat(newPID); state == 0 || state == 'Z' || drains >= 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the new supervisor neither exited nor drains; log:\n%s", d.logs.text())
		}
	}
	close(release)
	if r := <-done; r.err != nil || r.status != http.StatusOK || string(r.body) != "done" {
		t.Errorf("the request in flight on the new supervisor's worker: %d %q %v; want 200 done", r.status, r.body, r.err)
	}
	// Well before the new supervisor's kill (shutdown_timeout and 5 s):
	// it waits for no handover once the old one abandoned the upgrade,
	// even when it reported ready meanwhile.
	if code, ok := d.wait(5 * time.Second); !ok || code != 0 {
		t.Errorf("the old supervisor: exited %v, code %d", ok, code)
	}
	if !d.logs.waitEOF(5 * time.Second) {
		t.Fatalf("a process of the upgrade outlived the old supervisor; log:\n%s", d.logs.text())
	}
}

// TERM to the old supervisor once the new one reported ready but before
// the old one made it the main process (its workers have not all stopped
// accepting: here they are held stopped until then). The old one is
// still the service's main process, the one systemctl stop signals: the
// stop is the service's. It abandons the upgrade, the new one stops too
// (its workers finish what they serve), and the old one dumps and exits
// 0, the state kept.
func TestStopDuringUpgradeHandoverE2E(t *testing.T) {
	t.Parallel()
	cfg := signalsConfig(t)
	d, from, _, cont := upgradeHeldAtHandover(t, cfg)
	d.signal(syscall.SIGTERM)
	if _, _, ok := d.logs.waitFor(from, 10*time.Second, func(l logLine) bool {
		return strings.HasPrefix(l.msg(), "upgrade abandoned") || strings.HasPrefix(l.msg(), "already draining")
	}); !ok {
		t.Fatalf("the TERM was not taken; log:\n%s", d.logs.text())
	}
	cont()
	if code, ok := d.wait(10 * time.Second); !ok || code != 0 {
		t.Fatalf("the old supervisor: exited %v, code %d", ok, code)
	}
	if !d.logs.waitEOF(10 * time.Second) {
		t.Fatalf("the new supervisor serves on after the stop; log:\n%s", d.logs.text())
	}
	if _, _, ok := d.logs.waitFor(from, 0, msgIs("dump written")); !ok {
		t.Errorf("no dump written")
	}
	wantOneLeft(t, cfg)
}
