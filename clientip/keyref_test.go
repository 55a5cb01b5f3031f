package clientip

import (
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"
)

func TestParseKeyRef(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want KeyRef
	}{
		{"192.0.2.1", KeyRef{Element: "ip", Addr: netip.MustParseAddr("192.0.2.1")}},
		{"ip:192.0.2.1", KeyRef{Element: "ip", Addr: netip.MustParseAddr("192.0.2.1")}},
		{"2001:db8::1", KeyRef{Element: "ip", Addr: netip.MustParseAddr("2001:db8::1")}},
		{"ip:::ffff:192.0.2.1", KeyRef{Element: "ip", Addr: netip.MustParseAddr("192.0.2.1")}},
		{"fe80::1%eth0", KeyRef{Element: "ip", Addr: netip.MustParseAddr("fe80::1")}},
		{"global", KeyRef{Element: "global"}},
		{"header:x-api-key:k:with:colons", KeyRef{Element: "header:X-Api-Key", Value: "k:with:colons"}},
		{"cookie:session:abc", KeyRef{Element: "cookie:session", Value: "abc"}},
		{"query:api_key:a b", KeyRef{Element: "query:api_key", Value: "a b"}},
		{"path:/api/Users", KeyRef{Element: "path", Value: "/api/Users"}},
	} {
		got, err := ParseKeyRef(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("ParseKeyRef(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
		}
	}
	for _, in := range []string{"", "nope", "ip:", "ip:999.0.0.1", "header:X-Api-Key", "header::v",
		"header:X Key:s3cret", "header:X-Api-Key:", "cookie:s:s3cret\x01", "path:relative", "path:/s3cret\x7f", "host:s3cret"} {
		got, err := ParseKeyRef(in)
		if !errors.Is(err, ErrKeyRef) {
			t.Errorf("ParseKeyRef(%q) = %+v, %v; want an ErrKeyRef", in, got, err)
		}
		if err != nil && strings.Contains(err.Error(), "s3cret") {
			t.Errorf("ParseKeyRef(%q): %v shows the value, which may be a secret", in, err)
		}
	}
}

func TestElements(t *testing.T) {
	for by, want := range map[string][]string{
		"ip":                               {"ip"},
		"global":                           {"global"},
		"header:x-api-key|cookie:s|path":   {"header:X-Api-Key", "cookie:s", "path", "ip"},
		"query:k|ip":                       {"query:k", "ip"},
		"header:Authorization|header:X-Id": {"header:Authorization", "header:X-Id", "ip"},
	} {
		b, err := ParseBy(by)
		if err != nil {
			t.Fatal(err)
		}
		if got := b.Elements(); !slices.Equal(got, want) {
			t.Errorf("%q: Elements() = %q, want %q", by, got, want)
		}
		// What ParseKeyRef names, an element of Elements matches.
		for _, e := range want {
			ref := e
			switch {
			case e == "ip":
				ref = "ip:192.0.2.1"
			case e == "path":
				ref = "path:/x"
			case e != "global":
				ref = e + ":v"
			}
			if r, err := ParseKeyRef(ref); err != nil || r.Element != e {
				t.Errorf("ParseKeyRef(%q).Element = %q, %v; want %q", ref, r.Element, err, e)
			}
		}
	}
}

// ByAddress and ClientChosen say what a rule's budget rests on: the
// client address (a proxy that is not trusted shares it among everyone
// behind it) and values the client sends (each a fresh budget).
func TestByTrade(t *testing.T) {
	for _, tc := range []struct {
		by        string
		byAddress bool
		chosen    string
	}{
		{"ip", true, ""},
		{"global", false, ""},
		{"header:X-Api-Key|ip", true, "header:X-Api-Key"},
		{"cookie:session|query:token", true, "cookie:session,query:token"},
		{"header:x-key|path", false, "header:X-Key"},
		{"path", false, ""},
	} {
		b := MustParseBy(tc.by)
		if got := b.ByAddress(); got != tc.byAddress {
			t.Errorf("%s: ByAddress %v, want %v", tc.by, got, tc.byAddress)
		}
		if got := strings.Join(b.ClientChosen(), ","); got != tc.chosen {
			t.Errorf("%s: ClientChosen %q, want %q", tc.by, got, tc.chosen)
		}
	}
}
