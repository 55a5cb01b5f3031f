package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Persistence refuses what it cannot trust or cannot write, against the
// built binary: a dump directory that cannot take the dump stops run and
// check with exit 2; a dump or live region that another user owns or may
// write is refused with its reason while the server starts cold; a second
// supervisor on one persist.path refuses to start.

func TestPersistDirCheckedAtStart(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	notDir := filepath.Join(dir, "file")
	os.WriteFile(notDir, nil, 0o600)
	// A directory where a consumed dump goes: the load's rename to it
	// fails (the dump is loaded and stays, to be loaded again after a
	// crash), and so does setting a refused dump aside before a dump.
	consumed := t.TempDir()
	for _, s := range []string{".loaded", ".refused", ".superseded"} {
		os.Mkdir(filepath.Join(consumed, "dump"+s+"-dir"), 0o700)
		os.Mkdir(filepath.Join(consumed, "dump"+s+"-dir", "dump"+s), 0o700)
	}
	for _, tc := range []struct {
		name, dump, reason string
	}{
		{"missing directory", filepath.Join(dir, "missing", "dump"), "does not exist"},
		{"not a directory", filepath.Join(notDir, "dump"), "is not a directory"},
		{"not writable", "/proc/self/dump", "is not writable"}, // not even by root
		{"a directory", dir, "is not a regular file"},          // read as "the state directory"
		{"a directory at PATH.loaded", filepath.Join(consumed, "dump.loaded-dir", "dump"), "dump.loaded is a directory"},
		{"a directory at PATH.refused", filepath.Join(consumed, "dump.refused-dir", "dump"), "dump.refused is a directory"},
		{"a directory at PATH.superseded", filepath.Join(consumed, "dump.superseded-dir", "dump"), "dump.superseded is a directory"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cfg := filepath.Join(t.TempDir(), "preforkd.toml")
			os.WriteFile(cfg, []byte(fmt.Sprintf("[persist]\npath = %q\n", tc.dump)), 0o600)
			for _, args := range [][]string{
				{"check", "-config", cfg},
				{"run", "-config", cfg, "-listen", freeAddr(t)},
			} {
				code, stdout, stderr := runBinary(t, args...)
				if code != 2 || !strings.Contains(stderr, tc.dump) || !strings.Contains(stderr, tc.reason) || strings.Contains(stdout, "ok") {
					t.Fatalf("preforkd %s: exit %d, want 2 naming %q and %q\nstdout: %s\nstderr: %s",
						args[0], code, tc.dump, tc.reason, stdout, stderr)
				}
			}
		})
	}
}

func TestPersistRefusesUntrustedFiles(t *testing.T) {
	t.Parallel()
	rule := `
[[ratelimit]]
name = "login"
path = "/login"
limit = 1
window = "1h"
`
	// limited leaves the client limited in d and returns.
	limited := func(t *testing.T, d *daemon) {
		t.Helper()
		c := newClient(t, nil, false)
		if r := do(c, "POST", d.url("/login"), nil); r.status != 200 {
			t.Fatalf("first: %d %v", r.status, r.err)
		}
		if r := do(c, "POST", d.url("/login"), nil); r.status != 429 {
			t.Fatalf("second: %d %v", r.status, r.err)
		}
	}
	// refusedCold requires the log line of the refusal with its reason,
	// and a server that starts cold: the client limited before is served.
	refusedCold := func(t *testing.T, d *daemon, msg, detail string) {
		t.Helper()
		if _, _, ok := d.logs.waitFor(0, 5*time.Second, func(l logLine) bool {
			return l.msg() == msg && strings.Contains(l.get("detail"), detail)
		}); !ok {
			t.Fatalf("no %q line naming %q:\n%s", msg, detail, d.logs.text())
		}
		if r := do(newClient(t, nil, false), "POST", d.url("/login"), nil); r.status != 200 {
			t.Fatalf("after the refusal: %d %v, want the client served from a cold table", r.status, r.err)
		}
	}

	for _, tc := range []struct {
		name    string
		prepare func(t *testing.T, path string)
		detail  string
	}{
		{"dump writable by others", func(t *testing.T, p string) { os.Chmod(p, 0o666) }, "writable by group or others"},
		{"dump of another user", func(t *testing.T, p string) {
			if os.Geteuid() != 0 {
				t.Skip("giving a file to another user takes root")
			}
			if err := os.Chown(p, 65534, 65534); err != nil {
				t.Fatal(err)
			}
		}, "owned by uid 65534"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dump := filepath.Join(t.TempDir(), "dump")
			cfg := persistConfig(fmt.Sprintf("[persist]\npath = %q\n", dump) + rule)
			d := startDaemon(t, daemonOptions{config: cfg})
			limited(t, d)
			d.stop()
			tc.prepare(t, dump)
			d = startDaemon(t, daemonOptions{config: cfg})
			refusedCold(t, d, "persist: dump refused: untrusted", tc.detail)
			d.stop()
		})
	}

	t.Run("live region writable by others", func(t *testing.T) {
		t.Parallel()
		live := liveRegionPath(t)
		cfg := persistConfig(fmt.Sprintf("[persist]\nlive = %q\n", live) + rule)
		d := startDaemon(t, daemonOptions{config: cfg})
		limited(t, d)
		d.kill() // the region stays behind, as after a crash of the whole tree
		os.Chmod(live, 0o606)
		d = startDaemon(t, daemonOptions{config: cfg})
		refusedCold(t, d, "persist: live region refused: creating a fresh one", "untrusted: mode 0606: writable by group or others")
		d.stop()
	})
}

func TestPersistPathLocked(t *testing.T) {
	t.Parallel()
	dump := filepath.Join(t.TempDir(), "dump")
	cfg := persistConfig(fmt.Sprintf("[persist]\npath = %q\n", dump))
	d := startDaemon(t, daemonOptions{config: cfg})
	second := filepath.Join(t.TempDir(), "second.toml")
	os.WriteFile(second, []byte(cfg), 0o600)
	code, _, stderr := runBinary(t, "run", "-config", second, "-listen", freeAddr(t))
	holder := fmt.Sprintf("pid %d", d.pid())
	if code != 1 || !strings.Contains(stderr, "in use by another supervisor") || !strings.Contains(stderr, dump) || !strings.Contains(stderr, holder) {
		t.Fatalf("second supervisor on the dump path: exit %d, want 1 naming %s and %s:\n%s", code, dump, holder, stderr)
	}
	// The first one is untouched: it serves, and its dump is written.
	if r := get(newClient(t, nil, false), d.url("/")); r.status != 200 {
		t.Fatalf("first supervisor: %d %v", r.status, r.err)
	}
	d.stop()
	if _, err := os.Stat(dump); err != nil {
		t.Fatalf("the first supervisor's dump: %v", err)
	}
}

// A dump refused as untrusted is the state of the last stop: the refusal
// says how to make it trusted again (its owner, its mode), so the server
// that refused it must not destroy it by writing its own dump over it,
// at once with persist.interval or at its stop.
func TestPersistRefusedDumpNotOverwritten(t *testing.T) {
	dump := filepath.Join(t.TempDir(), "dump")
	cfg := persistConfig(fmt.Sprintf("[persist]\npath = %q\ninterval = \"1s\"\n", dump) + `
[[ratelimit]]
name = "login"
path = "/login"
limit = 1
window = "1h"
`)
	d := startDaemon(t, daemonOptions{config: cfg})
	c := newClient(t, nil, false)
	do(c, "POST", d.url("/login"), nil)
	if r := do(c, "POST", d.url("/login"), nil); r.status != 429 {
		t.Fatalf("second: %d %v", r.status, r.err)
	}
	d.stop()
	want, err := os.ReadFile(dump)
	if err != nil {
		t.Fatal(err)
	}
	os.Chmod(dump, 0o664) // restored from a backup under umask 002, say
	d = startDaemon(t, daemonOptions{config: cfg})
	if _, _, ok := d.logs.waitFor(0, 5*time.Second, msgIs("persist: dump refused: untrusted")); !ok {
		t.Fatalf("no refusal:\n%s", d.logs.text())
	}
	time.Sleep(1500 * time.Millisecond) // a periodic dump or two
	d.stop()
	kept := false
	for _, p := range []string{dump, dump + ".refused"} {
		if b, err := os.ReadFile(p); err == nil && bytes.Equal(b, want) {
			kept = true
		}
	}
	if !kept {
		t.Fatalf("the refused dump was overwritten: neither %s nor %s.refused holds it", dump, dump)
	}
	// Made trusted again, it restores the limited client.
	os.Rename(dump+".refused", dump)
	os.Chmod(dump, 0o600)
	d = startDaemon(t, daemonOptions{config: cfg})
	defer d.stop()
	if r := do(c, "POST", d.url("/login"), nil); r.status != 429 {
		t.Fatalf("after restoring the refused dump: %d %v, want 429", r.status, r.err)
	}
}

// persist.live named as one of the files persistence keeps beside
// persist.path (its lock, a consumed dump), or the reverse, would have
// one truncate or rename the other: a live region renamed over by the
// consumed dump, a dump truncated as the live region's lock. run and
// check refuse it (exit 2), naming the key, its line and the clash.
func TestPersistFilesDoNotOverlap(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	dump := filepath.Join(dir, "dump")
	for _, tc := range []struct{ path, live, key string }{
		{dump, dump + ".lock", "persist.live"},
		{dump, dump + ".loaded", "persist.live"},
		{dump, dump + ".refused", "persist.live"},
		{dump + ".lock", dump, "persist.path"},
	} {
		t.Run(filepath.Base(tc.live)+"+"+filepath.Base(tc.path), func(t *testing.T) {
			t.Parallel()
			cfg := filepath.Join(t.TempDir(), "preforkd.toml")
			os.WriteFile(cfg, []byte(fmt.Sprintf("[persist]\nlive = %q\npath = %q\n", tc.live, tc.path)), 0o600)
			line := map[string]string{"persist.live": "preforkd.toml:2: ", "persist.path": "preforkd.toml:3: "}[tc.key]
			for _, args := range [][]string{
				{"check", "-config", cfg},
				{"run", "-config", cfg, "-listen", freeAddr(t)},
			} {
				code, stdout, stderr := runBinary(t, args...)
				if code != 2 || !strings.Contains(stderr, line+"persist: "+tc.key) || strings.Contains(stdout, "ok") {
					t.Fatalf("preforkd %s: exit %d, want 2 naming %s at %s\nstdout: %s\nstderr: %s",
						args[0], code, tc.key, line, stdout, stderr)
				}
			}
		})
	}
}

// persist.path or persist.live in a directory every user can write
// (/dev/shm, /tmp) is warned about by check: another user can take the
// names there first and keep the service from starting. One of the
// service's own is not.
func TestPersistSharedDirWarned(t *testing.T) {
	t.Parallel()
	shared := filepath.Join(t.TempDir(), "shared")
	os.Mkdir(shared, 0o700)
	os.Chmod(shared, 0o1777)
	own := t.TempDir()
	cfg := filepath.Join(t.TempDir(), "preforkd.toml")
	os.WriteFile(cfg, []byte(fmt.Sprintf("[persist]\npath = %q\nlive = %q\n", filepath.Join(own, "dump"), filepath.Join(shared, "region"))), 0o600)
	code, _, stderr := runBinary(t, "check", "-config", cfg)
	if code != 0 || !strings.Contains(stderr, "warning: persist.live") || !strings.Contains(stderr, shared) || strings.Contains(stderr, "persist.path") {
		t.Fatalf("check: exit %d, want 0 with a warning about persist.live's directory alone\nstderr: %s", code, stderr)
	}
}

// persist.live naming a dump (persist.path's file, the two swapped, or
// live set to the dump's name when moving to a live region): the live
// region would be made there, over the dump. run and check refuse it
// (exit 2), naming the key and the file, which is left as it was.
func TestPersistLiveNamingADumpRefused(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	dump, region := filepath.Join(dir, "dump"), filepath.Join(dir, "region")
	rule := "[[ratelimit]]\nname = \"login\"\npath = \"/login\"\nlimit = 1\nwindow = \"1h\"\n"
	d := startDaemon(t, daemonOptions{config: persistConfig(fmt.Sprintf("[persist]\npath = %q\n", dump) + rule)})
	if r := do(newClient(t, nil, false), "POST", d.url("/login"), nil); r.status != 200 {
		t.Fatalf("first: %d %v", r.status, r.err)
	}
	d.stop()
	written, err := os.ReadFile(dump)
	if err != nil {
		t.Fatal(err)
	}
	for _, persist := range []string{
		fmt.Sprintf("[persist]\nlive = %q\n", dump),
		fmt.Sprintf("[persist]\nlive = %q\npath = %q\n", dump, region), // swapped
	} {
		cfg := filepath.Join(t.TempDir(), "preforkd.toml")
		os.WriteFile(cfg, []byte(persist+rule), 0o600)
		for _, args := range [][]string{
			{"check", "-config", cfg},
			{"run", "-config", cfg, "-listen", freeAddr(t)},
		} {
			code, stdout, stderr := runBinary(t, args...)
			if code != 2 || !strings.Contains(stderr, "preforkd.toml:2: persist: persist.live "+fmt.Sprintf("%q", dump)) ||
				!strings.Contains(stderr, "is a dump") || strings.Contains(stdout, "ok") {
				t.Errorf("preforkd %s with %q: exit %d, want 2 naming persist.live and the dump\nstdout: %s\nstderr: %s",
					args[0], persist, code, stdout, stderr)
			}
			if now, _ := os.ReadFile(dump); !bytes.Equal(now, written) {
				t.Fatalf("preforkd %s with %q: the dump was changed (%d bytes, had %d)", args[0], persist, len(now), len(written))
			}
		}
	}
}
