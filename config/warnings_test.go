package config

import (
	"strings"
	"testing"
)

// Warnings and Notes: which configurations get one, and what each names.
func TestWarnings(t *testing.T) {
	const rules = `
[[ratelimit]]
name = "login"
path = "/login"
limit = 5
window = 300

[[ratelimit]]
name = "pages"
path = "/p/*"
limit = 5
window = "1m"
by = "cookie:s|path"
`
	for _, tc := range []struct {
		name, file string
		warnings   []string // substrings, one per warning, in order
		notes      int
	}{
		{"ip rule, no trusted proxy", rules, []string{`rule "login" counts clients by their address`}, 1},
		{"trusted proxies", "[server]\ntrusted_proxies = [\"10.0.0.0/8\"]\n" + rules, nil, 1},
		{"cache, dump, no key", "[persist]\npath = \"/tmp/d\"\n[[cache]]\npath = \"/c/*\"\n", []string{"[[cache]] blocks store responses, persist.path is set and persist.key is empty"}, 0},
		{"idempotency, dump, no key", "[persist]\npath = \"/tmp/d\"\n[[idempotency]]\npath = \"/o\"\n", []string{"[[idempotency]] blocks store responses"}, 0},
		{"cache, dump, key", "[persist]\npath = \"/tmp/d\"\nkey = \"v1\"\n[[cache]]\npath = \"/c/*\"\n", nil, 0},
		{"cache, no dump", "[[cache]]\npath = \"/c/*\"\n", nil, 0},
		// A key override matches the value of a header, cookie, query
		// parameter or path: a rule by ip or global has none, and the
		// override never applies.
		{"key override by ip", "[server]\ntrusted_proxies = [\"10.0.0.0/8\"]\n[[ratelimit]]\nname = \"a\"\npath = \"/a\"\nlimit = 1\nwindow = \"1s\"\n[[ratelimit.override]]\nkey = \"192.0.2.7\"\nlimit = 5\n",
			[]string{`rule "a" override 1: a key override never applies to a rule by "ip"`}, 0},
		{"key override by global", "[[ratelimit]]\nname = \"a\"\npath = \"/a\"\nlimit = 1\nwindow = \"1s\"\nby = \"global\"\n[[ratelimit.override]]\nkey = \"k\"\nlimit = 5\n",
			[]string{`rule "a" override 1: a key override never applies to a rule by "global"`}, 0},
		{"key override by path, not a path", "[[ratelimit]]\nname = \"a\"\npath = \"/a/*\"\nlimit = 1\nwindow = \"1s\"\nby = \"path\"\n[[ratelimit.override]]\nkey = \"a/b\"\nlimit = 5\n",
			[]string{`rule "a" override 1: a key override never applies to a rule by "path"`}, 0},
		{"key override by header", "[[ratelimit]]\nname = \"a\"\npath = \"/a\"\nlimit = 1\nwindow = \"1s\"\nby = \"header:X-Api-Key|ip\"\n[[ratelimit.override]]\nkey = \"k\"\nlimit = 5\n[[ratelimit.override]]\nclient = [\"192.0.2.0/24\"]\nlimit = 5\n",
			[]string{`rule "a" counts clients by their address`}, 1},
		{"key override by path", "[[ratelimit]]\nname = \"a\"\npath = \"/a/*\"\nlimit = 1\nwindow = \"1s\"\nby = \"path\"\n[[ratelimit.override]]\nkey = \"/a/b\"\nlimit = 5\n", nil, 0},
	} {
		c, err := Parse([]byte(tc.file), "t.toml")
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		got := c.Warnings()
		if len(got) != len(tc.warnings) {
			t.Errorf("%s: warnings %q, want %d", tc.name, got, len(tc.warnings))
			continue
		}
		for i, w := range tc.warnings {
			if !strings.Contains(got[i], w) {
				t.Errorf("%s: warning %q lacks %q", tc.name, got[i], w)
			}
		}
		if n := len(c.Notes()); n != tc.notes {
			t.Errorf("%s: %d notes %q, want %d", tc.name, n, c.Notes(), tc.notes)
		}
	}
	// A key read from persist.key_file counts as a key.
	c, _ := Parse([]byte("[persist]\npath = \"/tmp/d\"\nkey_file = \"/k\"\n[[cache]]\npath = \"/c/*\"\n"), "t.toml")
	c.Persist.FileKey = "v2"
	if w := c.Warnings(); len(w) != 0 || c.Persist.AppKey() != "v2" {
		t.Errorf("key_file read: warnings %q, key %q", w, c.Persist.AppKey())
	}
}
