package clientip

import (
	"errors"
	"strings"
	"testing"
)

// FuzzParseKeyRef: an operator's key parses to an element By.Elements
// could list, with a value a request could make; a key refused gives no
// KeyRef and an error that wraps ErrKeyRef and does not repeat the value
// (it may be a secret: an API key).
func FuzzParseKeyRef(f *testing.F) {
	for _, s := range []string{"global", "1.2.3.4", "ip:::ffff:10.0.0.1", "ip:fe80::1%eth0", "header:x-api-key:abc:def",
		"cookie:s:v", "query:k:", "path:/a", "path:a", "func:alice", "func:", "header::v", "header:a b:v", "x:y", "ip"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		k, err := ParseKeyRef(s)
		if err != nil {
			if !errors.Is(err, ErrKeyRef) || k != (KeyRef{}) {
				t.Fatalf("ParseKeyRef(%q) = %+v, %v", s, k, err)
			}
			// The value: what follows header:NAME:, func: or path:.
			word, v, _ := strings.Cut(s, ":")
			switch word {
			case "header", "cookie", "query":
				_, v, _ = strings.Cut(v, ":")
			case "func", "path":
			default:
				return
			}
			// The error is the same for another value refused alike (its
			// letters and digits rotated): it does not carry the value.
			// (Asking that it not contain v asks too much: a value may be
			// a piece of the error's own text, "path:clientip".)
			other := s[:len(s)-len(v)] + rotated(v)
			if _, err2 := ParseKeyRef(other); err2 == nil || err2.Error() != err.Error() {
				t.Fatalf("ParseKeyRef(%q): %v; ParseKeyRef(%q): %v: the error carries the value", s, err, other, err2)
			}
			return
		}
		switch el, name, _ := strings.Cut(k.Element, ":"); el {
		case "ip":
			if !k.Addr.IsValid() || k.Addr.Is4In6() || k.Addr.Zone() != "" || k.Value != "" {
				t.Fatalf("ParseKeyRef(%q) = %+v", s, k)
			}
		case "global":
			if k.Addr.IsValid() || k.Value != "" || name != "" {
				t.Fatalf("ParseKeyRef(%q) = %+v", s, k)
			}
		case "header", "cookie", "query", "func", "path":
			if k.Addr.IsValid() || !usable(k.Value) || el == "path" && k.Value[0] != '/' ||
				(el == "func" || el == "path") != (name == "") || !strings.HasSuffix(s, ":"+k.Value) {
				t.Fatalf("ParseKeyRef(%q) = %+v", s, k)
			}
			// ('|' is a token byte, but separates a By's elements: no
			// rule counts by such a name, and the control says so.)
			if name != "" && !strings.Contains(name, "|") {
				b, err := ParseBy(k.Element)
				if err != nil || b.Elements()[0] != k.Element {
					t.Fatalf("ParseKeyRef(%q) = %+v: the element is not one By lists (%v)", s, k, err)
				}
			}
		default:
			t.Fatalf("ParseKeyRef(%q) = %+v", s, k)
		}
	})
}

// rotated is v with its ASCII letters and digits rotated (ROT13, digits by
// five): a different value, refused or taken alike by ParseKeyRef.
func rotated(v string) string {
	b := []byte(v)
	for i, c := range b {
		switch {
		case c >= 'a' && c <= 'z':
			b[i] = 'a' + (c-'a'+13)%26
		case c >= 'A' && c <= 'Z':
			b[i] = 'A' + (c-'A'+13)%26
		case c >= '0' && c <= '9':
			b[i] = '0' + (c-'0'+5)%10
		}
	}
	return string(b)
}
