//go:build linux

package main

// End-to-end tests of reloads as an operator sends them: signals that
// arrive at awkward moments.

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// A HUP, USR1 or USR2 sent as the supervisor starts, before it listens
// for signals (here while it reads its configuration), neither kills it
// nor is lost: it serves, and the HUP is taken as one before the first
// ready is, the file read again (README, Signals).
func TestSignalsAtStartE2E(t *testing.T) {
	t.Parallel()
	for _, sig := range []syscall.Signal{syscall.SIGHUP, syscall.SIGUSR1, syscall.SIGUSR2} {
		t.Run(sig.String(), parallel(func(t *testing.T) {
			// The configuration is a FIFO: the supervisor reads it once
			// the test writes it, so the signal comes while it starts.
			d := &daemon{t: t, addr: freeAddr(t), cfgPath: filepath.Join(t.TempDir(), "preforkd.toml")}
			if err := syscall.Mkfifo(d.cfgPath, 0o600); err != nil {
				t.Fatal(err)
			}
			d.start(nil, "run", "-config", d.cfgPath, "-listen", d.addr)
			feed := func() {
				t.Helper()
				f, err := os.OpenFile(d.cfgPath, os.O_WRONLY, 0) // until the supervisor opens it
				if err != nil {
					t.Fatal(err)
				}
				defer f.Close()
				if _, err := f.WriteString(baseServer(1, "")); err != nil {
					t.Fatal(err)
				}
			}
			opened := make(chan *os.File, 1)
			go func() {
				f, _ := os.OpenFile(d.cfgPath, os.O_WRONLY, 0)
				opened <- f
			}()
			var f *os.File
			select {
			case f = <-opened:
			case <-time.After(10 * time.Second):
				t.Fatal("the supervisor did not open its configuration")
			}
			d.signal(sig) // it reads its configuration: it does not listen yet
			time.Sleep(50 * time.Millisecond)
			f.WriteString(baseServer(1, ""))
			f.Close()
			if sig == syscall.SIGHUP {
				// Once the start read it, the HUP reads the file again.
				if _, _, ok := d.logs.waitFor(0, 10*time.Second, msgIs("preforkd starting")); ok {
					feed()
				}
			}
			if _, _, ok := d.logs.waitFor(0, 20*time.Second, msgIs("ready")); !ok {
				code, exited := d.wait(time.Second)
				t.Fatalf("no ready after %v at start (exited %v, code %d); log:\n%s", sig, exited, code, d.logs.text())
			}
			if sig == syscall.SIGHUP {
				if _, _, ok := d.logs.waitFor(0, 10*time.Second, msgIs("reload begun")); !ok {
					t.Errorf("the HUP sent at start was lost: no reload begun")
				}
			}
			d.stop()
		}))
	}
}

// A HUP that arrives during a drain is refused, and counted so: the
// running configuration is kept until the workers exit, and /metrics
// says the reload asked for did not happen (preforkd_reloads_total
// refused, preforkd_reload_last_success 0), as for any refused reload.
func TestReloadDuringDrainCountedRefusedE2E(t *testing.T) {
	t.Parallel()
	cfg := strings.Replace(baseServer(1, `drain_delay = "3s"`), "[table]", "[admin]\nlisten = \"ADMIN_ADDR\"\n\n[table]", 1)
	d := startDaemon(t, daemonOptions{config: cfg, admin: true})
	admin := newClient(t, nil, false)
	from := d.logs.len()
	d.signal(syscall.SIGTERM)
	if _, _, ok := d.logs.waitFor(from, 5*time.Second, msgIs("drain begun")); !ok {
		t.Fatal("no drain begun")
	}
	d.signal(syscall.SIGHUP)
	if _, _, ok := d.logs.waitFor(from, 5*time.Second, func(l logLine) bool { return strings.HasPrefix(l.msg(), "reload refused: draining") }); !ok {
		t.Fatal("no line of the HUP refused")
	}
	m := scrapeMetrics(t, admin, d.admin).samples
	if _, _, over := d.logs.waitFor(from, 0, msgIs("drain delay over")); over {
		t.Fatal("the delay ended before the scrape: the machine is too slow for this test")
	}
	if m[`preforkd_reloads_total{result="refused"}`] != 1 || m[`preforkd_reloads_total{result="accepted"}`] != 0 || m["preforkd_reload_last_success"] != 0 {
		t.Errorf("after a HUP during the drain: reloads refused %v, accepted %v, last success %v; want 1, 0, 0",
			m[`preforkd_reloads_total{result="refused"}`], m[`preforkd_reloads_total{result="accepted"}`], m["preforkd_reload_last_success"])
	}
	if code, ok := d.wait(15 * time.Second); !ok || code != 0 {
		t.Fatalf("exit %v %d, want 0", ok, code)
	}
}
