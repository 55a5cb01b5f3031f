package main

// The command line as a user meets it (README "Command line"), against the
// built binary.

import (
	"net/http"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/preforkd/preforkd/persist"
	"github.com/preforkd/preforkd/shm"
)

func TestCommandLine(t *testing.T) {
	t.Parallel()
	t.Run("usage once on a bad flag", func(t *testing.T) {
		t.Parallel()
		code, stdout, stderr := runBinary(t, "run", "-bogus")
		if code != exitUsage || stdout != "" {
			t.Errorf("run -bogus: exit %d, stdout %q; want exit 2 and nothing on stdout", code, stdout)
		}
		lower := strings.ToLower(stderr)
		if n := strings.Count(lower, "usage:") + strings.Count(lower, "usage of"); n != 1 || !strings.Contains(stderr, "-bogus") || !strings.Contains(stderr, "usage: preforkd run") {
			t.Errorf("run -bogus: stderr has the usage %d times; want the error and run's usage once:\n%s", n, stderr)
		}
	})
	t.Run("no command", func(t *testing.T) {
		t.Parallel()
		code, _, stderr := runBinary(t)
		if code != exitUsage || strings.Count(stderr, "usage:") != 1 {
			t.Errorf("preforkd: exit %d, stderr:\n%s\nwant exit 2 and the usage once", code, stderr)
		}
	})
	t.Run("help for a command", func(t *testing.T) {
		t.Parallel()
		code, help, stderr := runBinary(t, "help", "run")
		if code != exitOK || stderr != "" || !strings.HasPrefix(help, "usage: preforkd run -config FILE") {
			t.Fatalf("help run: exit %d, stderr %q, stdout:\n%s", code, stderr, help)
		}
		for _, flag := range []string{"-config FILE", "-listen ADDR", "-workers N", "-upstream URL"} {
			if !strings.Contains(help, flag) {
				t.Errorf("help run does not show %s:\n%s", flag, help)
			}
		}
		if strings.Contains(help, "default") {
			t.Errorf("help run shows a default that no user gave (an internal sentinel?):\n%s", help)
		}
		if code, dashH, _ := runBinary(t, "run", "-h"); code != exitOK || dashH != help {
			t.Errorf("run -h: exit %d, output differs from help run:\n%s", code, dashH)
		}
		for _, args := range [][]string{{"help"}, {"-h"}, {"--help"}} {
			if code, out, _ := runBinary(t, args...); code != exitOK || !strings.Contains(out, "example-config") {
				t.Errorf("%v: exit %d, stdout:\n%s", args, code, out)
			}
		}
		if code, _, stderr := runBinary(t, "help", "nope"); code != exitUsage || !strings.Contains(stderr, `"nope"`) {
			t.Errorf("help nope: exit %d, stderr %q; want exit 2 naming it", code, stderr)
		}
	})
	t.Run("version", func(t *testing.T) {
		t.Parallel()
		code, out, _ := runBinary(t, "version")
		if code != exitOK || !strings.HasPrefix(out, "preforkd ") || !strings.Contains(out, "dump format") {
			t.Fatalf("version: exit %d:\n%s", code, out)
		}
		if code, flag, _ := runBinary(t, "-version"); code != exitOK || flag != out {
			t.Errorf("-version: exit %d, %q; want what version prints, %q", code, flag, out)
		}
	})
	t.Run("inspect exits 1 for a refused file", func(t *testing.T) {
		t.Parallel()
		dir := t.TempDir()
		good := filepath.Join(dir, "good.dump")
		r, err := shm.Create(shm.Options{Counters: 64, MaxWorkers: 4})
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		if _, err := persist.Dump(r, persist.Options{Path: good}); err != nil {
			t.Fatal(err)
		}
		if code, out, stderr := runBinary(t, "inspect", good); code != exitOK || !strings.Contains(out, "loadable") {
			t.Errorf("inspect of a good dump: exit %d, stderr %q, stdout:\n%s", code, stderr, out)
		}
		bad := filepath.Join(dir, "bad.dump")
		if err := os.WriteFile(bad, []byte("not a dump at all"), 0o600); err != nil {
			t.Fatal(err)
		}
		code, out, stderr := runBinary(t, "inspect", bad)
		if code != exitRuntime || !strings.Contains(out, "verdict:") || !strings.Contains(stderr, "refuse") {
			t.Errorf("inspect of a refused dump: exit %d, stdout %q, stderr %q; want exit 1, the verdict, and why", code, out, stderr)
		}
		if code, _, _ := runBinary(t, "inspect", filepath.Join(dir, "missing")); code != exitRuntime {
			t.Errorf("inspect of a missing file: exit %d, want 1", code)
		}
	})
	t.Run("check refuses a max_rss below a worker's needs", func(t *testing.T) {
		t.Parallel()
		path := filepath.Join(t.TempDir(), "preforkd.toml")
		if err := os.WriteFile(path, []byte("[server]\nworkers = 1\nmax_rss = \"1MiB\"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		code, _, stderr := runBinary(t, "check", "-config", path)
		if code != exitUsage || !strings.Contains(stderr, path+":3: server.max_rss: must be at least 32MiB") || !strings.Contains(stderr, "got 1MiB") {
			t.Errorf("check with max_rss = 1MiB: exit %d, stderr %q; want 2, naming the key, its line and the least", code, stderr)
		}
	})
	t.Run("example-config is examples/preforkd.toml and starts", func(t *testing.T) {
		t.Parallel()
		want, err := os.ReadFile("../../examples/preforkd.toml")
		if err != nil {
			t.Fatal(err)
		}
		code, out, _ := runBinary(t, "example-config")
		if code != exitOK || out != string(want) {
			t.Fatalf("example-config: exit %d; its output differs from examples/preforkd.toml", code)
		}
		path := filepath.Join(t.TempDir(), "preforkd.toml")
		if err := os.WriteFile(path, []byte(out), 0o600); err != nil {
			t.Fatal(err)
		}
		if code, _, stderr := runBinary(t, "check", "-config", path); code != exitOK {
			t.Fatalf("check of the example: exit %d: %s", code, stderr)
		}
		// What a user with only the binary does next: run it.
		d := startDaemon(t, daemonOptions{config: out})
		if r := do(newClient(t, freshClientIP(), false), http.MethodPost, d.url("/login"), nil); r.status != http.StatusOK || r.header.Get("RateLimit-Policy") == "" {
			t.Errorf("POST /login under the example: %d %v, RateLimit-Policy %q", r.status, r.err, r.header.Get("RateLimit-Policy"))
		}
		d.stop()
	})
}

// What go build records is the version shown when the build stamped none.
func TestVersionFromBuildInfo(t *testing.T) {
	bi := func(version string, settings ...string) *debug.BuildInfo {
		b := &debug.BuildInfo{Main: debug.Module{Path: "github.com/preforkd/preforkd", Version: version}}
		for i := 0; i+1 < len(settings); i += 2 {
			b.Settings = append(b.Settings, debug.BuildSetting{Key: settings[i], Value: settings[i+1]})
		}
		return b
	}
	const rev = "fc4d02406b6ca6f0fd5f9a1041fc23fb2e05fec4"
	for _, tc := range []struct {
		name                   string
		stamped, stampedCommit string
		bi                     *debug.BuildInfo
		version, commit        string
	}{
		{"make build stamps both", "v0.2.0-3-gfc4d024", "fc4d02406b6c", bi("(devel)", "vcs.revision", rev), "v0.2.0-3-gfc4d024", "fc4d02406b6c"},
		{"go build in a checkout", "", "", bi("v0.0.0-20261201044000-fc4d02406b6c+dirty", "vcs.revision", rev, "vcs.modified", "true"),
			"v0.0.0-20261201044000-fc4d02406b6c+dirty", "fc4d02406b6c-dirty"},
		{"go install of a tag", "", "", bi("v0.2.0"), "v0.2.0", "unknown"},
		{"go build without VCS", "", "", bi("(devel)"), "dev", "unknown"},
		{"no build info", "", "", nil, "dev", "unknown"},
	} {
		v, c := versionOf(tc.stamped, tc.stampedCommit, tc.bi)
		if v != tc.version || c != tc.commit {
			t.Errorf("%s: %q (commit %q), want %q (commit %q)", tc.name, v, c, tc.version, tc.commit)
		}
	}
}

// An upstream URL with credentials is refused, and the refusal never
// prints the password: not by check, not at start from the file or from
// -upstream (a CI log, the journal).
func TestUpstreamCredentialsNotPrinted(t *testing.T) {
	t.Parallel()
	const password = "hunter2-upstream-secret"
	dir := t.TempDir()
	withCreds := filepath.Join(dir, "creds.toml")
	os.WriteFile(withCreds, []byte("[server]\nupstream = \"http://app:"+password+"@127.0.0.1:9/\"\n"), 0o600)
	plain := filepath.Join(dir, "plain.toml")
	os.WriteFile(plain, []byte("[server]\nupstream = \"builtin:demo\"\n"), 0o600)
	for _, args := range [][]string{
		{"check", "-config", withCreds},
		{"run", "-config", withCreds, "-listen", "127.0.0.1:0"},
		{"run", "-config", plain, "-listen", "127.0.0.1:0", "-upstream", "http://app:" + password + "@127.0.0.1:9"},
	} {
		code, stdout, stderr := runBinary(t, args...)
		if code != exitUsage || !strings.Contains(stderr, "credentials") {
			t.Errorf("%v: exit %d, stderr %q; want exit 2 saying why", args, code, stderr)
		}
		if strings.Contains(stdout+stderr, password) {
			t.Errorf("%v printed the upstream's password:\n%s%s", args, stdout, stderr)
		}
	}
}
