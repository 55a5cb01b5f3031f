package main

import (
	"context"
	"flag"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/preforkd/preforkd/bucket"
	"github.com/preforkd/preforkd/config"
	"github.com/preforkd/preforkd/internal/logtest"
	"github.com/preforkd/preforkd/prefork"
	"github.com/preforkd/preforkd/shm"
)

// A reload keeps what only a restart can change, and says so by key.
func TestReloadKeepsRestartOnlySettings(t *testing.T) {
	running := config.Config{
		Server:  config.Server{Listen: "127.0.0.1:1", Workers: 2, Upstream: "http://a"},
		Table:   config.Table{Counters: 1024},
		Persist: config.Persist{Path: "/var/lib/preforkd/dump", Key: "v1"},
		Admin:   config.Admin{Listen: "127.0.0.1:3"},
		TLS:     config.TLS{CleartextListen: "127.0.0.1:5"},
	}
	next := config.Config{
		Server:  config.Server{Listen: "127.0.0.1:2", Workers: 5, Upstream: "http://b"},
		Table:   config.Table{Counters: 2048},
		Persist: config.Persist{Path: "/elsewhere/dump", Key: "v2", Live: "/dev/shm/x"},
		Admin:   config.Admin{Listen: "127.0.0.1:4", TokenFile: "/etc/token"},
		TLS:     config.TLS{CleartextListen: "127.0.0.1:6", Cleartext: config.CleartextServe},
	}
	var lines logtest.Buffer
	got := keepRestartOnly(slog.New(slog.NewTextHandler(&lines, nil)), running, next)
	want := running
	want.Server.Upstream = "http://b"
	// persist.key too: the responses stored are the running version's
	// until the next start.
	if got.Server.Listen != want.Server.Listen || got.Server.Workers != 2 || got.Table != want.Table ||
		got.Persist != want.Persist || got.Server.Upstream != "http://b" ||
		got.Admin.Listen != running.Admin.Listen || got.Admin.TokenFile != "/etc/token" ||
		got.TLS.CleartextListen != "127.0.0.1:5" || got.TLS.Cleartext != config.CleartextServe {
		t.Fatalf("got %+v", got)
	}
	for _, ignored := range []string{"server.listen", "tls.cleartext_listen", "server.workers", "table.counters 2048", "persist.path", "persist.live", "persist.key", "admin.listen"} {
		if !strings.Contains(lines.String(), ignored) {
			t.Errorf("the warning does not name %s:\n%s", ignored, lines.String())
		}
	}
	if strings.Contains(lines.String(), "v2") {
		t.Errorf("the warning shows persist.key's value:\n%s", lines.String())
	}
	if strings.Contains(lines.String(), "table.responses") || strings.Contains(lines.String(), "Counters:") {
		t.Errorf("the warning names a [table] key that did not change, or no key:\n%s", lines.String())
	}
}

// Removing the last [[idempotency]] block, or adding one back, changes no
// key of [table]: no restart-only warning, though the geometry made from
// it differs.
func TestReloadOfBlocksKeepsTableQuiet(t *testing.T) {
	with := config.Config{Table: config.Table{Counters: 4096, Responses: 1024, ResponseBytes: 1 << 20},
		Idempotency: []config.Idempotency{{Path: "/orders"}}}
	without := with
	without.Idempotency = nil
	for _, tc := range []struct {
		name          string
		running, next config.Config
	}{{"removed", with, without}, {"added back", without, with}} {
		var lines logtest.Buffer
		got := keepRestartOnly(slog.New(slog.NewTextHandler(&lines, nil)), tc.running, tc.next)
		if lines.String() != "" || got.Table != tc.next.Table {
			t.Errorf("%s: table %+v, logged:\n%s", tc.name, got.Table, lines.String())
		}
	}
}

// The reload reads the file again, with the command line's overrides:
// its settings carry the new configuration, and what changed by key,
// never a value (a changed upstream stays out of the log); a
// file that does not load keeps the running settings, its error naming
// the line.
func TestReloader(t *testing.T) {
	var buf logtest.Buffer
	write, running, reload := reloadFixture(t, "[server]\nworkers = 1\nupstream = \"http://127.0.0.1:9000\"\n\n[[ratelimit]]\nname = \"login\"\npath = \"/login\"\nlimit = 5\nwindow = \"1m\"\n",
		overrides{listen: "127.0.0.1:7"}, &buf)

	write("[server]\nworkers = 1\nupstream = \"http://127.0.0.1:9001/s3cret\"\n\n" +
		"[[ratelimit]]\nname = \"login\"\npath = \"/login\"\nlimit = 10\nwindow = \"1m\"\n\n" +
		"[[ratelimit]]\nname = \"api\"\npath = \"/api/*\"\nlimit = 100\nwindow = \"1m\"\n")
	next, err := reload(running)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := configOf(next)
	base, _ := configOf(running)
	if err != nil || len(cfg.RateLimits) != 2 || cfg.Server.Listen != base.Server.Listen {
		t.Fatalf("the new settings' configuration: %+v, %v (listen is restart-only, whatever -listen says)", cfg, err)
	}
	var attrs strings.Builder
	slog.New(slog.NewTextHandler(&attrs, nil)).LogAttrs(t.Context(), slog.LevelInfo, "reload begun", next.LogAttrs...)
	for _, want := range []string{"rules_added=[api]", "rules_changed=[login]", "keys_changed=\"[server.upstream ratelimit.login.limit]\""} {
		if !strings.Contains(attrs.String(), want) {
			t.Errorf("the reload's attributes %q lack %s", attrs.String(), want)
		}
	}
	if strings.Contains(attrs.String()+buf.String(), "s3cret") {
		t.Errorf("a changed value is logged:\n%s%s", attrs.String(), buf.String())
	}
	same, err := reload(next)
	if err != nil || len(same.LogAttrs) != 1 || same.LogAttrs[0].String() != "changed=nothing" {
		t.Errorf("a reload of the same file: %v, %v; want changed=nothing", same.LogAttrs, err)
	}

	write("[server]\nworkers = 1\nlisen = \"x\"\n")
	if _, err := reload(next); err == nil || !strings.Contains(err.Error(), "preforkd.toml:3") || !strings.Contains(err.Error(), "lisen") {
		t.Errorf("a broken file: %v, want its line and key", err)
	}
}

// The configuration reaches a worker as its settings' payload, whole.
func TestConfigPayloadRoundTrip(t *testing.T) {
	cfg := config.Config{
		Server: config.Server{
			Listen: "127.0.0.1:9", Workers: 3, Upstream: "http://127.0.0.1:1",
			TrustedProxies: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("2001:db8::/32")},
			IPv6Prefix:     56, ShutdownTimeout: 7 * time.Second, Headers: config.HeadersIETF, MaxRequestBody: 1234,
		},
		Admin:   config.Admin{Listen: "127.0.0.1:10", TokenFile: "/t"},
		Table:   config.Table{Counters: 1024, Responses: 10, ResponseBytes: 4096},
		Persist: config.Persist{Path: "/p", Key: "k", Live: "/dev/shm/x"},
		RateLimits: []config.RateLimit{{
			Name: "login", Path: "/login", Methods: []string{"POST"}, Limit: 5, Window: 5 * time.Minute,
			Algorithm: bucket.FixedWindow, Burst: 2, By: "header:X|ip", Mode: config.Shadow, OnFull: bucket.Closed,
		}},
		Idempotency: []config.Idempotency{{
			Path: "/orders", Methods: []string{"POST"}, Header: "Idempotency-Key", Required: true,
			TTL: time.Hour, Wait: config.IdemWait(time.Second), By: "ip", MaxBody: 99,
		}},
	}
	s, err := settingsOf(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if s.ShutdownTimeout != 7*time.Second {
		t.Errorf("settings: shutdown timeout %v", s.ShutdownTimeout)
	}
	got, err := configOf(prefork.Settings{Payload: s.Payload}) // as a worker decodes it
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, cfg) {
		t.Fatalf("round trip:\n got %+v\nwant %+v", got, cfg)
	}
}

// /status lists the rules as they run: under [server] shadow (or run
// -shadow) every one is in shadow mode, as check says.
func TestStatusRulesShadow(t *testing.T) {
	cfg := config.Config{RateLimits: []config.RateLimit{{Name: "login", Mode: config.Enforce}}}
	if got := rulesJSON(cfg)[0].Mode; got != "enforce" {
		t.Errorf("mode %q, want enforce", got)
	}
	cfg.Server.Shadow = true
	if got := rulesJSON(cfg)[0].Mode; got != "shadow" {
		t.Errorf("under server.shadow: mode %q, want shadow", got)
	}
}

// A reload is checked as it will run: the file with the running values of
// the restart-only keys. An [[idempotency]] max_body that fits the file's
// own [table] but not the running one is refused, not run invalid.
func TestReloadCheckedWithTheRunningTable(t *testing.T) {
	var lines logtest.Buffer
	write, running, reload := reloadFixture(t, "[server]\nworkers = 1\n[table]\nresponse_bytes = \"1MiB\"\n[[idempotency]]\npath = \"/orders\"\nmax_body = \"512KiB\"\n",
		overrides{}, &lines)
	write("[server]\nworkers = 1\n[table]\nresponse_bytes = \"8MiB\"\n[[idempotency]]\npath = \"/orders\"\nmax_body = \"4MiB\"\n")
	if _, err := reload(running); err == nil || !strings.Contains(err.Error(), "max_body") || !strings.Contains(err.Error(), "need a restart") {
		t.Fatalf("reload: %v; want it refused, naming max_body and the restart", err)
	}
}

// reloadFixture writes first as the configuration file and loads it as
// running; write rewrites the file, and reload is the reloader over it,
// with o, logging to log.
func reloadFixture(t *testing.T, first string, o overrides, log io.Writer) (write func(string), running prefork.Settings, reload func(prefork.Settings) (prefork.Settings, error)) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "preforkd.toml")
	write = func(s string) {
		if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(first)
	base, err := loadConfig(path, overrides{})
	if err != nil {
		t.Fatal(err)
	}
	if running, err = settingsOf(base); err != nil {
		t.Fatal(err)
	}
	return write, running, reloader(path, o, func() *shm.Region { return nil }, slog.New(slog.NewTextHandler(log, nil)))
}

// A flag's bad value is blamed on the flag, not on the key it overrides
// (the file alone was valid); a bad value in the file keeps its line.
func TestFlagErrorsNameTheFlag(t *testing.T) {
	path := filepath.Join(t.TempDir(), "preforkd.toml")
	if err := os.WriteFile(path, []byte("[server]\nworkers = 1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		o    overrides
		want string
	}{
		{overrides{upstream: "ftp://x"}, `-upstream: "ftp://x": want an absolute http:// or https:// URL with a host`},
		{overrides{listen: "nonsense"}, `-listen: invalid address "nonsense"`},
	} {
		if _, err := loadConfig(path, tc.o); err == nil || !strings.HasPrefix(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want %q", tc.o, err, tc.want)
		}
	}
	if err := os.WriteFile(path, []byte("[server]\nupstream = \"ftp://y\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := loadConfig(path, overrides{listen: "127.0.0.1:1"}); err == nil || !strings.Contains(err.Error(), "preforkd.toml:2: server.upstream") {
		t.Errorf("a bad file value with a flag given: %v", err)
	}
}

// A reload that adds a [[cache]] block (back) has it serve only what is
// stored from then on; a block that stays keeps its time, over any
// number of reloads, and one running since the start serves everything.
func TestReloadSetsCacheSince(t *testing.T) {
	const small = "[server]\nworkers = 1\n[table]\nresponses = 64\nresponse_bytes = \"1MiB\"\n"
	path := filepath.Join(t.TempDir(), "preforkd.toml")
	write := func(s string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(small+s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("[[cache]]\npath = \"/a/*\"\nmax_body = \"64KiB\"\n")
	base, err := loadConfig(path, overrides{})
	if err != nil {
		t.Fatal(err)
	}
	r, err := shm.Create(base.RegionOptions())
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	running, err := settingsOf(base)
	if err != nil {
		t.Fatal(err)
	}
	reload := reloader(path, overrides{}, func() *shm.Region { return r }, slog.New(slog.NewTextHandler(io.Discard, nil)))
	step := func(file string) config.Config {
		t.Helper()
		write(file)
		if running, err = reload(running); err != nil {
			t.Fatal(err)
		}
		cfg, err := configOf(prefork.Settings{Payload: running.Payload}) // as a worker gets it
		if err != nil {
			t.Fatal(err)
		}
		return cfg
	}
	time.Sleep(time.Millisecond)
	if kept := step("[[cache]]\npath = \"/a/*\"\nmax_body = \"64KiB\"\n"); kept.Caches[0].Since != 0 {
		t.Fatalf("a block running since the start serves from %v, want 0 (everything)", kept.Caches[0].Since)
	}
	removed := step("[[idempotency]]\npath = \"/orders\"\nmax_body = \"64KiB\"\n")
	if len(removed.Caches) != 0 {
		t.Fatalf("caches %+v", removed.Caches)
	}
	t0 := r.Now()
	both := "[[cache]]\npath = \"/a/*\"\nmax_body = \"64KiB\"\n[[cache]]\npath = \"/b/*\"\nmax_body = \"64KiB\"\n"
	back := step(both)
	if s := back.Caches[0].Since; s < t0 || s > r.Now() {
		t.Fatalf("the block added back serves from %v, want the reload's time (after %v)", s, t0)
	}
	time.Sleep(time.Millisecond)
	if again := step(both); again.Caches[0].Since != back.Caches[0].Since || again.Caches[1].Since != back.Caches[1].Since {
		t.Errorf("a reload that keeps the blocks moved their times: %v, then %v", back.Caches, again.Caches)
	}
}

// Every flag of a command is in its synopsis, which the usage and
// README's "Command line" show.
func TestSynopsisShowsEveryFlag(t *testing.T) {
	for _, c := range commands() {
		fs := commandFlags(c)
		c.setup(fs)
		fs.VisitAll(func(f *flag.Flag) {
			if !strings.Contains(c.synopsis+" ", "-"+f.Name+" ") && !strings.Contains(c.synopsis+" ", "-"+f.Name+"]") {
				t.Errorf("preforkd %s: the synopsis %q does not show -%s", c.name, c.synopsis, f.Name)
			}
		})
	}
}

// What only the daemon checks of a key (a file it reads, a directory it
// writes to) is refused, by check as by run, at the key's line, as the
// configuration's own checks are.
func TestDaemonChecksNameTheLine(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "missing", "x")
	for _, tc := range []struct{ src, want string }{
		{"[server]\nworkers = 1\n\n[admin]\nlisten = \"127.0.0.1:1\"\ntoken_file = " + strconv.Quote(missing) + "\n", ":6: admin.token_file: "},
		{"[server]\nworkers = 1\n\n[log]\naccess = " + strconv.Quote(missing) + "\n", ":5: log.access: "},
		{"[server]\nworkers = 1\n\n[persist]\nkey = \"v1\"\npath = " + strconv.Quote(missing) + "\n", ":6: persist: persist.path "},
		{"[server]\nworkers = 1\n\n[persist]\nlive = " + strconv.Quote(missing) + "\n", ":5: persist: persist.live "},
		{"[server]\nworkers = 1\n\n[admin]\nlisten = \"unix:" + missing + "\"\n", ":5: admin.listen "},
	} {
		path := filepath.Join(dir, "preforkd.toml")
		if err := os.WriteFile(path, []byte(tc.src), 0o600); err != nil {
			t.Fatal(err)
		}
		var stdout, stderr strings.Builder
		code := run(context.Background(), []string{"check", "-config", path}, &stdout, &stderr)
		if code != exitUsage || !strings.Contains(stderr.String(), "preforkd: config: "+path+tc.want) {
			t.Errorf("check of\n%s: exit %d, stderr %q; want exit 2 and %q", tc.src, code, stderr.String(), path+tc.want)
		}
	}
}
