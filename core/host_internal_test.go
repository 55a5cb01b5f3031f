package core

import (
	"strings"
	"testing"
)

// RFC 9112 §3.2, RFC 3986 §3.2.2: a Host is an IP-literal ("["
// IPv6address "]" or "[" IPvFuture "]"), an IPv4 address or a reg-name,
// with an optional port of digits; anything else is a 400. A zone id has
// no place in it (RFC 6874: clients strip it).
func TestHostProblem(t *testing.T) {
	for _, h := range []string{"[example.com]", "[1.2.3.4]", "[::1::2]", "[zz]", "[:]", "[!$&]:80", "[fe80::1%25eth0]", "[v.x]", "[vz.x]", "[v1.]",
		"[::1", "[::1]x", "::1", "a b", "a/b", "a?b", "a#b", `a"b`, "a<b", "a:8o", "a%zz", "a%4", "u@a"} {
		if why := hostProblem(h); why == "" {
			t.Errorf("Host %q accepted, want a 400", h)
		}
	}
	// legitimate ones stay accepted
	for _, h := range []string{"[::1]", "[::1]:8080", "[::ffff:1.2.3.4]", "[v1.fe]", "[V1F.a:b]", "EXAMPLE.com.", "xn--bcher-kva.example", "example.com:", "10.0.0.1:80", "a_b.example", "a,b", "a%41",
		":", ":80"} { // an empty reg-name is one (RFC 3986), and must not crash a worker
		if why := hostProblem(h); why != "" {
			t.Errorf("Host %q refused: %s", h, why)
		}
	}
}

// hostProblem never panics, and what it accepts has none of the bytes a
// Host cannot carry: blanks, controls, "/", "?", "#", quotes, "<", ">",
// "@", "\".
func FuzzHostProblem(f *testing.F) {
	for _, s := range []string{"a", ":", ":80", "[::1]:8080", "[v1.x]", "a%41", "[", "]", "%", "a:", "[::1", "u@a"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, host string) {
		if host == "" {
			return
		}
		if fast, full := hostProblem(host), hostProblemOf(host); fast != full {
			t.Fatalf("%q: %q, and %q by the general check", host, fast, full)
		}
		if hostProblem(host) != "" {
			return
		}
		if i := strings.IndexAny(host, " \t\r\n\x00/?#\"<>@\\"); i >= 0 {
			t.Errorf("%q accepted, with %q", host, host[i])
		}
	})
}
