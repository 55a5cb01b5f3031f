package engine_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/preforkd/preforkd/engine"
)

func TestParseTarget(t *testing.T) {
	good := []struct {
		url  string
		want engine.Target
	}{
		{"http://app:3000", engine.Target{Addr: "app:3000", Hostname: "app", Port: 3000, Authority: "app:3000"}},
		{"http://app", engine.Target{Addr: "app:80", Hostname: "app", Port: 80, Authority: "app"}},
		{"https://app.internal/base/", engine.Target{Addr: "app.internal:443", TLS: true, Hostname: "app.internal", Port: 443,
			Authority: "app.internal", Prefix: "/base"}},
		{"http://[::1]:8080/a%2Fb", engine.Target{Addr: "[::1]:8080", Hostname: "::1", Port: 8080, Authority: "[::1]:8080", Prefix: "/a%2Fb"}},
	}
	for _, g := range good {
		got, err := engine.ParseTarget(g.url)
		if err != nil || got != g.want {
			t.Errorf("ParseTarget(%q) = %+v, %v; want %+v", g.url, got, err, g.want)
		}
	}
	bad := []struct{ url, why string }{
		{"ftp://x", "absolute http:// or https://"},
		{"localhost:8080", "absolute http:// or https://"},
		{"http://", "absolute http:// or https://"},
		{"http://u:p@app", "credentials"},
		{"http://u:secret@app:x", "absolute http:// or https://"}, // no URL: masked all the same
		{"http://u:se/cret@app", "absolute http:// or https://"},  // a password with a '/': no URL, masked whole
		{"http://u:se?cret@app", "absolute http:// or https://"},
		{"http://app/#f", "no fragment"},
		{"http://app/?q=1", "no query"},
		{"http://app:0", "port"},
		{"http://app:70000", "port"},
		// url.Parse takes these, and no dial ever would.
		{"http://]", "host"},
		{"http://a]b:8080/p", "host"},
	}
	for _, b := range bad {
		_, err := engine.ParseTarget(b.url)
		var te *engine.TargetError
		want := strings.NewReplacer(":p@", ":xxxxx@", ":secret@", ":xxxxx@", ":se/cret@", ":xxxxx@", ":se?cret@", ":xxxxx@").Replace(b.url)
		if !errors.As(err, &te) || te.URL != want || !strings.Contains(te.Why, b.why) {
			t.Errorf("ParseTarget(%q) = %v, want a TargetError about %q saying %q", b.url, err, want, b.why)
		}
	}
}
