package main

// End-to-end tests of the safer defaults (README "Rate limiting",
// "Idempotent replay", "Persistence"; SPEC §22): the warnings that save a
// site, the periodic dump, the reset an application asks for, the
// duplicate that waits for its original, and windows written as bare
// seconds. Each runs the built binary (harness_test.go).

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// writeConfig writes text to a new file and returns its path.
func writeConfig(t *testing.T, text string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "preforkd.toml")
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// A window written as a bare integer is that many seconds: check prints
// it as a duration, and the running rule counts over it (its policy
// header says w=300), in a rule and in an override alike.
func TestWindowInSeconds(t *testing.T) {
	t.Parallel()
	cfg := baseServer(2, "") + `
[[ratelimit]]
name = "login"
path = "/login"
limit = 2
window = 300

[[ratelimit.override]]
key = "10.9.9.9"
limit = 7
window = 60
`
	code, stdout, stderr := runBinary(t, "check", "-config", writeConfig(t, cfg))
	if code != 0 {
		t.Fatalf("check: exit %d, %s", code, stderr)
	}
	for _, want := range []string{"limit=2 window=5m0s", "limit=7 window=1m0s"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("check does not print %q:\n%s", want, stdout)
		}
	}
	d := startDaemon(t, daemonOptions{config: cfg})
	c := newClient(t, freshClientIP(), false)
	var got []int
	for range 3 {
		r := get(c, d.url("/login"))
		got = append(got, r.status)
		if r.status == http.StatusOK && r.header.Get("RateLimit-Policy") != `"login";q=2;w=300` {
			t.Errorf("RateLimit-Policy %q, want \"login\";q=2;w=300", r.header.Get("RateLimit-Policy"))
		}
	}
	if got[0] != 200 || got[1] != 200 || got[2] != 429 {
		t.Errorf("three requests under 2 per 300 s: %v, want 200 200 429", got)
	}
	// A negative number of seconds is refused at its line.
	bad := strings.Replace(cfg, "window = 300", "window = -5", 1)
	if code, _, stderr := runBinary(t, "check", "-config", writeConfig(t, bad)); code != 2 || !strings.Contains(stderr, "window") {
		t.Errorf("window = -5: exit %d, %q; want 2 naming the window", code, stderr)
	}
}
