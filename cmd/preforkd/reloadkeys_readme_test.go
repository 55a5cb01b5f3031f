package main

import (
	"log/slog"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/preforkd/preforkd/config"
	"github.com/preforkd/preforkd/internal/logtest"
)

// Every key a reload keeps until a restart (keepRestartOnly names it in
// its warning) is said to need one by README twice: in the HUP row of
// the signals, and in the key's own row of the configuration reference,
// which is where an operator looks a key up.
func TestRestartOnlyKeysDocumented(t *testing.T) {
	running := config.Config{
		Server:  config.Server{Listen: "127.0.0.1:1", Workers: 2},
		Table:   config.Table{Counters: 1024, Responses: 64, ResponseBytes: 1 << 16},
		Persist: config.Persist{Path: "/a/dump", Live: "/a/live", Key: "v1", Interval: 1e9},
		Admin:   config.Admin{Listen: "127.0.0.1:3"},
		TLS:     config.TLS{CleartextListen: "127.0.0.1:5", Certificates: []config.Certificate{{Cert: "c", Key: "k"}}},
	}
	next := config.Config{
		Server:  config.Server{Listen: "127.0.0.1:2", Workers: 5},
		Table:   config.Table{Counters: 2048, Responses: 128, ResponseBytes: 1 << 17},
		Persist: config.Persist{Path: "/b/dump", Live: "/b/live", Key: "v2", Interval: 2e9},
		Admin:   config.Admin{Listen: "127.0.0.1:4"},
		TLS:     config.TLS{CleartextListen: "127.0.0.1:6", Certificates: []config.Certificate{{Cert: "c", Key: "k"}}},
	}
	var lines logtest.Buffer
	log := slog.New(slog.NewTextHandler(&lines, nil))
	keepRestartOnly(log, running, next)
	next.TLS = config.TLS{} // TLS turned off: the [[tls.certificate]] key
	keepRestartOnly(log, running, next)
	keys := map[string]bool{}
	for _, m := range regexp.MustCompile(`(\[tls\]|[a-z_]+\.[a-z_]+) `).FindAllStringSubmatch(strings.Join(regexp.MustCompile(`ignored="\[(.*)\]"`).FindAllString(lines.String(), -1), " "), -1) {
		keys[m[1]] = true
	}
	if len(keys) < 12 {
		t.Fatalf("found %d keys in the warnings, want every restart-only one:\n%s", len(keys), lines.String())
	}
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	readme := string(b)
	row := func(head string) string {
		i := strings.Index(readme, "\n| "+head+" |")
		if i < 0 {
			t.Fatalf("README has no row %s", head)
		}
		r, _, _ := strings.Cut(readme[i+1:], "\n")
		return r
	}
	hup := row("`HUP`")
	for k := range keys {
		name, inHUP := "`"+k+"`", "`"+k+"`"
		switch {
		case k == "[tls]":
			name, inHUP = "`[[tls.certificate]]`", "TLS on or off"
		case strings.HasPrefix(k, "table."):
			inHUP = "`[table]`"
		}
		if !strings.Contains(hup, inHUP) {
			t.Errorf("README's HUP row does not list %s among the settings that need a restart", inHUP)
		}
		if !strings.Contains(row(name), "restart") {
			t.Errorf("README's row of %s does not say that a reload keeps it until a restart", name)
		}
	}
}
