package route

import (
	"errors"
	"path"
	"strings"
	"testing"
)

func TestRouteMatch(t *testing.T) {
	type req struct {
		method, path string
		want         bool
	}
	tests := []struct {
		path    string
		methods []string
		reqs    []req
	}{
		{"/login", nil, []req{
			{"POST", "/login", true},
			{"GET", "/login", true},
			{"GET", "/login/", true},      // trailing slash cleaned away
			{"GET", "//login", true},      // repeated slash
			{"GET", "/x/../login", true},  // dot-dot resolved
			{"GET", "/./login/.", true},   // dots
			{"GET", "/login/x", false},    // exact: nothing below
			{"GET", "/logins", false},     // not a prefix match
			{"GET", "/LOGIN", false},      // paths are case-sensitive
			{"GET", "/", false},           //
			{"GET", "", false},            // empty path is "/"
			{"GET", "/login/../x", false}, //
			{"GET", "/x/login", false},    //
			{"OPTIONS", "*", false},       // not a path
			{"GET", "/login%2F", false},   // decoded paths only: "%2F" is literal text here
			{"GET", "/a/b/../../login", true},
		}},
		{"/login/", nil, []req{ // configured unclean: same route as "/login"
			{"GET", "/login", true},
			{"GET", "/login/", true},
		}},
		{"/api/*", nil, []req{
			{"GET", "/api", true}, // the prefix itself
			{"GET", "/api/", true},
			{"GET", "/api/v1/users", true},
			{"GET", "/api//v1", true},
			{"GET", "/apis", false},
			{"GET", "/ap", false},
			{"GET", "/", false},
			{"GET", "/v1/api/x", false},
			{"GET", "/api/../admin", false},
			{"GET", "/admin/../api/x", true},
		}},
		{"/*", nil, []req{
			{"GET", "/", true},
			{"GET", "", true},
			{"GET", "/anything/at/all", true},
			{"OPTIONS", "*", false},
		}},
		{"/orders", []string{"POST", "patch"}, []req{
			{"POST", "/orders", true},
			{"PATCH", "/orders", true}, // configured lower case
			{"post", "/orders", true},  // methods compare without case
			{"GET", "/orders", false},
			{"HEAD", "/orders", false},
			{"PUT", "/orders", false},
			{"POST", "/orders/1", false},
		}},
		{"/search", []string{"GET"}, []req{
			{"GET", "/search", true},
			{"HEAD", "/search", false}, // HEAD is not GET
		}},
	}
	for _, tt := range tests {
		rt, err := Compile(tt.path, tt.methods)
		if err != nil {
			t.Fatalf("Compile(%q, %q): %v", tt.path, tt.methods, err)
		}
		for _, rq := range tt.reqs {
			if got := rt.Match(rq.method, Clean(rq.path)); got != rq.want {
				t.Errorf("route %q %v: %s %q matched = %v, want %v", tt.path, tt.methods, rq.method, rq.path, got, rq.want)
			}
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
		{"", nil, "Path", "must start with /"},
		{"login", nil, "Path", "must start with /"},
		{"*", nil, "Path", "must start with /"},
		{"/a*", nil, "Path", "only allowed"},
		{"/api/*/x", nil, "Path", "only allowed"},
		{"/api/**", nil, "Path", "only allowed"},
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
	rt, err := Compile("/api/*", []string{"GET", "POST"})
	if err != nil {
		t.Fatal(err)
	}
	var ok bool
	allocs := testing.AllocsPerRun(100, func() {
		ok = rt.Match("POST", Clean("/api/v1/orders"))
	})
	if allocs != 0 || !ok {
		t.Errorf("match allocated %v times (matched %v)", allocs, ok)
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
