package engine_test

import (
	"net"
	"strconv"
	"strings"
	"testing"

	"github.com/preforkd/preforkd/engine"
)

// FuzzParseTarget: an upstream URL accepted has a port a dial can reach
// and an address made of its host and port, and it reads back the same
// from its own parts; one refused never shows its password.
func FuzzParseTarget(f *testing.F) {
	for _, s := range []string{"http://a", "https://a:8443/p/", "http://[::1]:80/x%2Fy", "http://u:s3cret@a/", "http://a:0",
		"http://a?x", "http://a#f", "ftp://a", "http://:80", "http://a:99999", "//a", "http://u:s3cret@a:x/"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		tg, err := engine.ParseTarget(s)
		if err != nil {
			if tg != (engine.Target{}) {
				t.Fatalf("ParseTarget(%q) = %+v with %v", s, tg, err)
			}
			// A password put into the userinfo is never shown. (One the
			// rest of the URL does not hold: the host may be shown.)
			secret := "Zq9Secret"
			for strings.Contains(s, secret) {
				secret += "x"
			}
			if i, j := strings.Index(s, "://"), strings.IndexByte(s, '@'); i >= 0 && j > i && !strings.ContainsAny(s[i+3:j], "/?#") {
				in := s[:j] + ":" + secret + s[j:]
				if _, err := engine.ParseTarget(in); err == nil || strings.Contains(err.Error(), secret) {
					t.Fatalf("ParseTarget(%q): %v", in, err)
				}
			}
			return
		}
		host, port, err := net.SplitHostPort(tg.Addr)
		if n, perr := strconv.ParseUint(port, 10, 16); err != nil || perr != nil || n != uint64(tg.Port) || tg.Port == 0 ||
			host != tg.Hostname || host == "" {
			t.Fatalf("ParseTarget(%q) = %+v", s, tg)
		}
		scheme := "http://"
		if tg.TLS {
			scheme = "https://"
		}
		again, err := engine.ParseTarget(scheme + tg.Authority + tg.Prefix + "/")
		if err != nil || again != tg {
			t.Fatalf("ParseTarget(%q) = %+v, but its parts read %+v, %v", s, tg, again, err)
		}
	})
}

// FuzzParseLength agrees with strconv on what a Content-Length of digits
// is, and takes nothing else.
func FuzzParseLength(f *testing.F) {
	for _, s := range []string{"0", "007", "123456789012345678", "1234567890123456789", "+1", "-1", " 1", "1,1", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, ok := engine.ParseLength([]byte(s))
		want, err := strconv.ParseInt(s, 10, 64)
		digits := s != "" && strings.Trim(s, "0123456789") == ""
		if ok != (digits && len(s) <= 18 && err == nil) || ok && n != want || !ok && n != 0 {
			t.Fatalf("ParseLength(%q) = %d, %v; strconv: %d, %v", s, n, ok, want, err)
		}
	})
}
