package main

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// edgeValues are values past the edge of their key's range, each with
// what the one line that refuses it says: in the test's configuration,
// from is replaced by extra, or extra is added at its end.
var edgeValues = []struct{ name, from, extra, msg string }{
	// A worker built its Redis client with this and panicked.
	{"redis pool past int32", "", "[redis]\nurl = \"redis://127.0.0.1:1\"\npool_size = 2147483648\n",
		"redis.pool_size: must be between 0 and 10000, got 2147483648"},
	// The decoder's own error, which named no key.
	{"20-digit integer", "", "[tls]\nredirect_port = 99999999999999999999\n",
		"tls.redirect_port: 99999999999999999999 is out of range"},
	// Taken, and ignored, while no block made the response table.
	{"responses past the table's", "responses = 64", "responses = 1000000000000",
		"table.responses: must be between 0 and 67108864, got 1000000000000"},
	{"response bytes past the table's", `response_bytes = "64KiB"`, `response_bytes = "8388607TiB"`,
		"table.response_bytes: must be between 0 and 17592186036224 bytes"},
}

// A value past its key's range is refused by check, by run before any
// worker starts, and by a HUP, which keeps the running configuration and
// counts the reload refused: never a worker that panics, or a limit that
// wraps around.
func TestEdgeValuesRefusedE2E(t *testing.T) {
	with := func(cfg string, i int) string {
		if v := edgeValues[i]; v.from != "" {
			return strings.Replace(cfg, v.from, v.extra, 1)
		}
		return cfg + edgeValues[i].extra
	}
	t.Parallel()
	dir := t.TempDir()
	for i, tc := range edgeValues {
		path := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "-")+".toml")
		if err := os.WriteFile(path, []byte(with(baseServer(1, ""), i)), 0o600); err != nil {
			t.Fatal(err)
		}
		for _, cmd := range []string{"check", "run"} {
			code, _, stderr := runBinary(t, cmd, "-config", path, "-listen", "127.0.0.1:0")
			if cmd == "check" {
				code, _, stderr = runBinary(t, cmd, "-config", path)
			}
			if code != exitUsage || !strings.Contains(stderr, tc.msg) || strings.Contains(stderr, `msg="worker`) {
				t.Errorf("%s: %s: exit %d, stderr:\n%s\nwant exit 2 and one line with %q", tc.name, cmd, code, stderr, tc.msg)
			}
		}
	}

	cfg := strings.Replace(baseServer(1, ""), "[table]", "[admin]\nlisten = \"ADMIN_ADDR\"\n\n[table]", 1)
	d := startDaemon(t, daemonOptions{config: cfg, admin: true})
	defer d.stop()
	for i, tc := range edgeValues {
		from := reloadTo(d, with(cfg, i))
		_, l, ok := d.logs.waitFor(from, 10*time.Second, func(l logLine) bool { return strings.HasPrefix(l.msg(), "reload") })
		if !ok || !strings.HasPrefix(l.msg(), "reload refused") || !strings.Contains(l.get("err"), tc.msg) {
			t.Errorf("%s: HUP: %q err=%q; want the reload refused with %q", tc.name, l.msg(), l.get("err"), tc.msg)
		}
	}
	m := scrapeMetrics(t, newClient(t, nil, false), d.admin).samples
	if n := m[`preforkd_reloads_total{result="refused"}`]; n != float64(len(edgeValues)) {
		t.Errorf("reloads refused: %v, want %d", n, len(edgeValues))
	}
	if r := get(newClient(t, freshClientIP(), false), d.url("/")); r.status != http.StatusOK {
		t.Errorf("after the refused reloads: %d %v, want 200 from the running configuration", r.status, r.err)
	}
}

// A [table] that check takes but this machine cannot hold is refused by
// run before any worker starts, on one line that names the keys that
// size the region: not the region's bytes alone.
func TestRegionTooLargeNamesTheKeysE2E(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "preforkd.toml")
	// The largest table check takes: 16 TiB of blocks.
	cfg := strings.Replace(baseServer(1, ""), `response_bytes = "64KiB"`, "response_bytes = 17592186036224", 1) +
		"[[idempotency]]\npath = \"/o\"\n"
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	if code, _, stderr := runBinary(t, "check", "-config", path); code != exitOK {
		t.Fatalf("check: exit %d: %s", code, stderr)
	}
	code, _, stderr := runBinary(t, "run", "-config", path, "-listen", "127.0.0.1:0")
	if code == exitOK || !strings.Contains(stderr, "does not fit in the memory available") ||
		!strings.Contains(stderr, "table.response_bytes = 17179869176KiB") || !strings.Contains(stderr, "table.counters = 1024") || strings.Contains(stderr, `msg="worker`) {
		t.Errorf("run: exit %d, stderr:\n%s\nwant a refusal before any worker, naming the [table] keys and their values", code, stderr)
	}
}

// The longest shutdown_timeout check takes drains as any other: the
// deadline of a retiring worker was now + timeout + a grace, and the sum
// wrapped around to the past, so that every worker was killed at once
// (at a reload, and at TERM) instead of draining.
func TestLongestShutdownTimeoutDrainsE2E(t *testing.T) {
	t.Parallel()
	cfg := strings.Replace(baseServer(1, ""), `shutdown_timeout = "10s"`, `shutdown_timeout = "2562047h47m16s"`, 1)
	d := startDaemon(t, daemonOptions{config: cfg})
	from := reloadTo(d, cfg+rule("r", "/r", "gcra", 5, "1m"))
	waitReloaded(t, d, from, 15*time.Second)
	waitRetiredGone(t, d, from)
	if r := get(newClient(t, freshClientIP(), false), d.url("/")); r.status != http.StatusOK {
		t.Errorf("after the reload: %d %v", r.status, r.err)
	}
	d.stop()
	for _, l := range d.logs.snapshot() {
		if strings.Contains(l.msg(), "did not drain in time") || strings.Contains(l.get("status"), "killed") {
			t.Errorf("a worker was killed instead of draining: %s %v", l.msg(), l.kv)
		}
	}
}
