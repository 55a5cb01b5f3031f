package persist

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/preforkd/preforkd/shm"
)

func TestInspect(t *testing.T) {
	dir := t.TempDir()
	good := goodDump(t, "k")
	at := offsetsOf(good)
	bad := bytes.Clone(good)
	bad[at.countersPayload+5] ^= 1
	seeded := bytes.Clone(good)
	seeded[at.countersPayload+3] ^= 1
	seeded = fixChecksums(seeded)
	live := filepath.Join(dir, "live")
	r, lock, _, err := OpenRegion(Options{Live: live}, shm.Options{Counters: 64, MaxWorkers: 8}, quiet)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Unlock()
	defer r.Close()
	exhaust(t, r, "c")

	files := map[string][]byte{"good": good, "bad": bad, "seeded": seeded, "notadump": []byte("hello, world")}
	for name, data := range files {
		os.WriteFile(filepath.Join(dir, name), data, 0o600)
	}
	os.Mkdir(filepath.Join(dir, "adir"), 0o700)
	os.WriteFile(filepath.Join(dir, "shared"), good, 0o600)
	os.Chmod(filepath.Join(dir, "shared"), 0o666)
	if data, err := os.ReadFile(live); err != nil {
		t.Fatal(err)
	} else {
		os.WriteFile(filepath.Join(dir, "sharedlive"), data, 0o600)
		os.Chmod(filepath.Join(dir, "sharedlive"), 0o666)
	}
	for _, tc := range []struct {
		file    string
		want    []string // regexps, each must match
		refused bool     // Inspect returns ErrRefused
	}{
		{"good", []string{`dump, \d+ bytes, mode -rw-------`, `build:\s+"v1"`, `section 1:\s+counters, \d+ bytes at \d+, checksum ok`,
			`7 entries \(10.94% of 64 slots\), 2 rules`, `rule "login":\s+gcra 1 per 1h0m0s, tag 0x[0-9a-f]+, 1 entries`,
			`rule "api":\s+fixed-window 2 per 1m0s, tag 0x[0-9a-f]+, 6 entries`, `section 2:\s+responses`, `verdict:\s+loadable`}, false},
		{"bad", []string{`refused:\s+counters: checksum`, `verdict:\s+partly refused: counters: checksum`}, true},
		{"seeded", []string{`counters: seed: section seeds 0x[0-9a-f]+/0x[0-9a-f]+, header seeds 0x[0-9a-f]+/0x[0-9a-f]+`,
			`verdict:\s+partly refused: counters: seed`}, true},
		{"notadump", []string{`dump, 12 bytes,`, `verdict:\s+refused: dump: bad magic`}, true},
		{"shared", []string{`section 1:\s+counters`, `verdict:\s+refused: dump: untrusted: mode 0666: writable by group or others`}, true},
		{"adir", []string{`verdict:\s+refused: dump: unreadable: not a regular file \(d---------\)`}, true},
		{"live", []string{`live region`, `lock:\s+last taken by pid \d+, which is running`, `occupancy:\s+3.12%: 2 live`,
			`worker 1:\s+incarnation 1, pid \d+`, `verdict:\s+re-attachable`}, false},
		{"sharedlive", []string{`live region`, `verdict:\s+refused: live region: untrusted: mode 0666: writable by group or others`}, true},
	} {
		var out bytes.Buffer
		err := Inspect(filepath.Join(dir, tc.file), &out)
		if tc.refused && !errors.Is(err, ErrRefused) || !tc.refused && err != nil {
			t.Fatalf("%s: %v, want ErrRefused %v", tc.file, err, tc.refused)
		}
		for _, re := range tc.want {
			if !regexp.MustCompile(re).Match(out.Bytes()) {
				t.Errorf("%s: no match for %q in\n%s", tc.file, re, out.String())
			}
		}
	}
	if err := Inspect(filepath.Join(dir, "missing"), &bytes.Buffer{}); err == nil || errors.Is(err, ErrRefused) {
		t.Errorf("a missing file: %v, want an error other than ErrRefused", err)
	}
}

// An override's state is named by its rule and its key's hash, never the
// key: "api\x00key\x00gold-customer-key" is the state of a customer's
// API key.
func TestRuleLabel(t *testing.T) {
	sum := sha256.Sum256([]byte("gold-customer-key"))
	for name, want := range map[string][2]string{
		"login":                           {"login", ""},
		"api\x00key\x00gold-customer-key": {"api", fmt.Sprintf(" override key sha256:%x", sum[:8])},
		"api\x00clients\x0010.0.0.0/8\x00192.0.2.0/24": {"api", " override clients 10.0.0.0/8,192.0.2.0/24"},
		"api\x00other\x00secret":                       {"api", ""},
	} {
		rule, override := ruleLabel(name)
		if rule != want[0] || (want[1] != "" && override != want[1]) || strings.Contains(override, "secret") ||
			strings.Contains(override, "gold-customer-key") {
			t.Errorf("ruleLabel(%q) = %q, %q; want %q, %q", name, rule, override, want[0], want[1])
		}
	}
}
