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
			if len(v) >= 8 && !strings.Contains(s[:len(s)-len(v)], v) && strings.Contains(err.Error(), v) {
				t.Fatalf("ParseKeyRef(%q): the error repeats the value: %v", s, err)
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
