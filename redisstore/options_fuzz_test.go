package redisstore

import (
	"net"
	"strconv"
	"strings"
	"testing"
)

// FuzzParseSeed: a seed accepted is an address a dial takes, with a port
// from 1 to 65535; a refused one's error never shows the password.
func FuzzParseSeed(f *testing.F) {
	for _, s := range []string{"a:6379", "redis://a:1", "rediss://u:p@a:2/0", "redis://:p@[::1]:3", "a", "redis://a", "redis://a:1/2",
		"redis://a:1?x", "http://a:1", "redis://a:0", "redis://u:s3cret@a:x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		sd, err := parseSeed("seeds", s)
		if err != nil {
			if sd != (seed{}) {
				t.Fatalf("parseSeed(%q) = %+v with %v", s, sd, err)
			}
			// A password put into the userinfo is never shown. (One the
			// rest of the seed does not hold: the host may be shown.)
			secret := "Zq9Secret"
			for strings.Contains(s, secret) {
				secret += "x"
			}
			if i, j := strings.Index(s, "://"), strings.IndexByte(s, '@'); i >= 0 && j > i && !strings.ContainsAny(s[i+3:j], "/?#") {
				in := s[:j] + ":" + secret + s[j:]
				if _, err := parseSeed("seeds", in); err == nil || strings.Contains(err.Error(), secret) {
					t.Fatalf("parseSeed(%q): %v", in, err)
				}
			}
			return
		}
		host, port, err := net.SplitHostPort(sd.addr)
		if n, perr := strconv.Atoi(port); err != nil || perr != nil || n < 1 || n > 65535 {
			t.Fatalf("parseSeed(%q) = %+v: %q %q %v", s, sd, host, port, err)
		}
		if !strings.Contains(s, "://") && (sd != seed{addr: s}) {
			t.Fatalf("parseSeed(%q) = %+v", s, sd)
		}
	})
}

// FuzzParseSync: a sync accepted writes back as a text that parses to
// itself, and is "exact" or from 1ms to 1h.
func FuzzParseSync(f *testing.F) {
	for _, s := range []string{"exact", "100ms", "1h", "1h0m0.001s", "0s", "-1s", "1.5ms", "999us", "61m"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		v, err := ParseSync(s)
		if err != nil {
			if v != 0 {
				t.Fatalf("ParseSync(%q) = %v with %v", s, v, err)
			}
			return
		}
		if v != 0 && (v < Sync(1e6) || v > Sync(3600e9)) {
			t.Fatalf("ParseSync(%q) = %v", s, v)
		}
		again, err := ParseSync(v.String())
		if err != nil || again != v {
			t.Fatalf("ParseSync(%q) = %v, which reads back as %v, %v", s, v, again, err)
		}
	})
}
