package route

import (
	"errors"
	"fmt"
	"path"
	"strings"
	"testing"
)

// match normalizes a request path as sent and matches it, as a caller
// does; a refused path matches nothing.
func match(rt *Route, method, raw string) bool {
	p, _, err := Normalize(raw)
	return err == nil && rt.Match(method, p)
}

func TestRouteMatch(t *testing.T) {
	type req struct {
		method, path string
		want         bool
	}
	tests := []struct {
		path    string
		methods []string
		opts    Options
		reqs    []req
	}{
		{"/login", nil, Options{}, []req{
			{"POST", "/login", true},
			{"GET", "/login", true},
			{"GET", "/login/", true},
			{"GET", "//login", true},
			{"GET", "/x/../login", true},
			{"GET", "/./login/.", true},
			{"GET", "/a/b/../../login", true},
			{"GET", "/LOGIN", true}, // case-insensitive routers serve it
			{"GET", "/LoGiN/", true},
			{"GET", "/login;x", true}, // Tomcat, Spring: a parameter
			{"GET", "/login;jsessionid=x", true},
			{"GET", "/.;/login", false},      // refused: ".." to Tomcat, a name to net/http
			{"GET", "/foo/..;/login", false}, // likewise
			{"GET", "/login.", true},         // IIS: trailing dots
			{"GET", "/login%2e", true},
			{"GET", "/%2e%2e/login", true},
			{"GET", "/%6Cogin", true},
			{"GET", "/%4C%4F%47%49%4E", true},
			{"GET", "/login/x", false}, // exact: nothing below
			{"GET", "/logins", false},  // not a prefix match
			{"GET", "/loginx", false},
			{"GET", "/login%3B", false}, // an encoded ';' is data
			{"GET", "/login%20", false},
			{"GET", "/", false},
			{"GET", "", false}, // empty path is "/"
			{"GET", "/login/../x", false},
			{"GET", "/x/login", false},
		}},
		{"/login", nil, Options{CaseSensitive: true}, []req{
			{"GET", "/login", true},
			{"GET", "/%6cogin", true}, // decoding is not case
			{"GET", "/login;x", true},
			{"GET", "/LOGIN", false},
			{"GET", "/Login/", false},
		}},
		{"/Login", nil, Options{}, []req{ // configured in another case
			{"GET", "/login", true},
			{"GET", "/LOGIN", true},
		}},
		{"/login/", nil, Options{}, []req{ // configured unclean: same route as "/login"
			{"GET", "/login", true},
			{"GET", "/login/", true},
		}},
		{"/%6cogin.", nil, Options{}, []req{ // configured encoded: likewise
			{"GET", "/login", true},
		}},
		{"/users/@me", nil, Options{}, []req{ // characters outside unreserved
			{"GET", "/users/@me", true},
			{"GET", "/users/%40me", true},
			{"GET", "/USERS/%40ME", true},
			{"GET", "/users/me", false},
		}},
		{"/café", nil, Options{}, []req{ // UTF-8: bytes, never folded
			{"GET", "/café", true},
			{"GET", "/caf%C3%A9", true},
			{"GET", "/caf%c3%a9", true},
			{"GET", "/CAF%C3%A9", true},
			{"GET", "/CAF%C3%89", false}, // É is not é here
		}},
		{"/api/*", nil, Options{}, []req{
			{"GET", "/api", true}, // the prefix itself
			{"GET", "/api/", true},
			{"GET", "/api/v1/users", true},
			{"GET", "/api//v1", true},
			{"GET", "/API/v1", true},
			{"GET", "/api;x/v1", true},
			{"GET", "/api./v1", true},
			{"GET", "/%61pi/v1", true},
			{"GET", "/admin/../api/x", true},
			{"GET", "/apis", false},
			{"GET", "/apix", false},
			{"GET", "/APIX/v1", false},
			{"GET", "/ap", false},
			{"GET", "/", false},
			{"GET", "/v1/api/x", false},
			{"GET", "/api/../admin", false},
			{"GET", "/api%2Fx", false}, // refused
		}},
		{"/api/*", nil, Options{CaseSensitive: true}, []req{
			{"GET", "/api/v1", true},
			{"GET", "/API/v1", false},
		}},
		{"/*", nil, Options{}, []req{
			{"GET", "/", true},
			{"GET", "", true},
			{"GET", "/anything/at/all", true},
			{"OPTIONS", "*", false}, // not a path: refused
		}},
		{"/orders", []string{"POST", "patch"}, Options{}, []req{
			{"POST", "/orders", true},
			{"PATCH", "/orders", true}, // configured lower case
			{"post", "/orders", true},  // methods compare without case
			{"GET", "/orders", false},
			{"HEAD", "/orders", false},
			{"PUT", "/orders", false},
			{"POST", "/orders/1", false},
		}},
		{"/search", []string{"GET"}, Options{}, []req{
			{"GET", "/search", true},
			{"HEAD", "/search", true}, // HEAD runs the GET handler
			{"head", "/search", true},
			{"OPTIONS", "/search", false},
		}},
	}
	for _, tt := range tests {
		rt, err := tt.opts.Compile(tt.path, tt.methods)
		if err != nil {
			t.Fatalf("Compile(%q, %q): %v", tt.path, tt.methods, err)
		}
		for _, rq := range tt.reqs {
			if got := match(&rt, rq.method, rq.path); got != rq.want {
				t.Errorf("route %q %v %+v: %s %q matched = %v, want %v", tt.path, tt.methods, tt.opts, rq.method, rq.path, got, rq.want)
			}
		}
	}
}

// TestRouteMatchFoldsOnlyASCII checks Match on paths that Normalize never
// produces but a caller of the deprecated Clean may pass.
func TestRouteMatchFoldsOnlyASCII(t *testing.T) {
	for _, tt := range []struct {
		route, path string
		want        bool
	}{
		{"/key", "/KeY", true},
		{"/key", "/\u212aey", false}, // the Kelvin sign is no K here
		{"/key", "/Kez", false},
		{"/~key", "/^key", false}, // '~' and '^' differ only in bit 0x20
		{"/a_b", "/a\x7fb", false},
		{"/a.b", "/a\x0eb", false},
	} {
		rt, err := Compile(tt.route, nil)
		if err != nil {
			t.Fatal(err)
		}
		if got := rt.Match("GET", tt.path); got != tt.want {
			t.Errorf("%q matched %q = %v, want %v", tt.route, tt.path, got, tt.want)
		}
	}
}

func TestRouteString(t *testing.T) {
	for _, tt := range []struct{ path, want string }{
		{"/login", "/login"},
		{"/Login/", "/Login"},
		{"/a/../%6cogin.", "/login"},
		{"/api/*", "/api/*"},
		{"/api/./*", "/api/*"},
		{"/*", "/*"},
		{"/users/@me", "/users/%40me"},
	} {
		rt, err := Compile(tt.path, nil)
		if err != nil {
			t.Fatalf("Compile(%q): %v", tt.path, err)
		}
		if got := rt.String(); got != tt.want {
			t.Errorf("Compile(%q).String() = %q, want %q", tt.path, got, tt.want)
		}
	}
}

// Covers is "every path o matches, rt matches": compared as matched
// (normalized, folded unless case-sensitive), below a prefix at a
// segment boundary only.
func TestRouteCovers(t *testing.T) {
	for _, tt := range []struct {
		rt, o         string
		caseSensitive bool
		want          bool
	}{
		{"/a", "/a", false, true},
		{"/a", "/A/", false, true},
		{"/a", "/A", true, false},
		{"/a/*", "/%61/*", false, true},
		{"/a/*", "/a", false, true},
		{"/a/*", "/a/b/c", false, true},
		{"/a/*", "/ab", false, false},
		{"/a/*", "/ab/*", false, false},
		{"/*", "/x/*", false, true},
		{"/a", "/a/*", false, false},
		{"/a/b", "/a/*", false, false},
		{"/a/b/*", "/a/*", false, false},
	} {
		o := Options{CaseSensitive: tt.caseSensitive}
		rt, err1 := o.Compile(tt.rt, nil)
		other, err2 := o.Compile(tt.o, nil)
		if err1 != nil || err2 != nil {
			t.Fatal(err1, err2)
		}
		if got := rt.Covers(&other); got != tt.want {
			t.Errorf("%q covers %q (case-sensitive %v) = %v, want %v", tt.rt, tt.o, tt.caseSensitive, got, tt.want)
		}
	}
}

func TestCompileRouteErrors(t *testing.T) {
	for _, tt := range []struct {
		path    string
		methods []string
		field   string
		want    string
	}{
		{"", nil, "Path", `path "" must start with /`},
		{"login", nil, "Path", "must start with /"},
		{"*", nil, "Path", "must start with /"},
		{"/a*", nil, "Path", "only allowed"},
		{"/api/*/x", nil, "Path", "only allowed"},
		{"/api/**", nil, "Path", "only allowed"},
		{"/login;x", nil, "Path", "';' starts a parameter"},
		{"/api;v=1/*", nil, "Path", "';' starts a parameter"},
		{"/a%2Fb", nil, "Path", `path "/a%2Fb": encoded slash (%2F)`},
		{"/a\\b", nil, "Path", `path "/a\\b": backslash`},
		{"/a%zz", nil, "Path", "bad percent-encoding"},
		{"/a%00/*", nil, "Path", "encoded NUL"},
		{"/a b", nil, "Path", `path "/a b" contains a blank or control character`},
		{"/a\tb", nil, "Path", "blank or control"},
		{"/a\x7f", nil, "Path", "blank or control"},
		{"/a?b=1", nil, "Path", "no query or fragment"},
		{"/a#top", nil, "Path", "no query or fragment"},
		{"/x", []string{"GE T"}, "Methods", "not a token"},
		{"/x", []string{""}, "Methods", "not a token"},
		{"/x", []string{"GET", "get"}, "Methods", `method "GET" is listed twice`},
	} {
		_, err := Compile(tt.path, tt.methods)
		var e *Error
		if !errors.As(err, &e) || e.Field != tt.field || !strings.Contains(e.Msg, tt.want) || err.Error() != "route: "+e.Msg {
			t.Errorf("Compile(%q, %q) = %v, want a route error on %s containing %q", tt.path, tt.methods, err, tt.field, tt.want)
		}
	}
	// Non-ASCII is not a control character: "/café" is a path.
	if _, err := Compile("/café/*", []string{"GET", "POST"}); err != nil {
		t.Errorf("Compile(/café/*): %v", err)
	}
}

func TestRouteMatchDoesNotAllocate(t *testing.T) {
	for _, opts := range []Options{{}, {CaseSensitive: true}} {
		rt, err := opts.Compile("/api/*", []string{"GET", "POST"})
		if err != nil {
			t.Fatal(err)
		}
		var ok bool
		allocs := testing.AllocsPerRun(100, func() {
			p, _, _ := Normalize("/api/v1/orders")
			ok = rt.Match("POST", p)
		})
		if allocs != 0 || !ok {
			t.Errorf("%+v: match allocated %v times (matched %v)", opts, allocs, ok)
		}
	}
}

func BenchmarkMatch(b *testing.B) {
	for _, opts := range []Options{{}, {CaseSensitive: true}} {
		rt, err := opts.Compile("/api/v1/things", []string{"GET", "POST"})
		if err != nil {
			b.Fatal(err)
		}
		b.Run(fmt.Sprintf("CaseSensitive=%v", opts.CaseSensitive), func(b *testing.B) {
			b.ReportAllocs()
			var ok bool
			for b.Loop() {
				ok = rt.Match("POST", "/api/v1/things")
			}
			if !ok {
				b.Fatal("no match")
			}
		})
	}
}

func FuzzCleanPath(f *testing.F) {
	for _, s := range []string{"/", "", "/a", "/a/", "//", "/a/./b", "/a/../b", "/..", "/.", "/a//b/", "*", "/a/b/.."} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, p string) {
		got := Clean(p)
		switch {
		case p == "":
			if got != "/" {
				t.Fatalf("Clean(%q) = %q, want /", p, got)
			}
		case p[0] == '/':
			if want := path.Clean(p); got != want {
				t.Fatalf("Clean(%q) = %q, want %q", p, got, want)
			}
		default:
			if got != p {
				t.Fatalf("Clean(%q) = %q, want it unchanged", p, got)
			}
		}
	})
}

// TestIsTokenByte checks every byte against RFC 9110 §5.6.2's tchar,
// written out as the RFC lists it.
func TestIsTokenByte(t *testing.T) {
	const tchar = "!#$%&'*+-.^_`|~0123456789" +
		"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
	for c := 0; c < 256; c++ {
		if got, want := IsTokenByte(byte(c)), strings.IndexByte(tchar, byte(c)) >= 0; got != want {
			t.Errorf("IsTokenByte(%#x) = %v, want %v", c, got, want)
		}
	}
}
