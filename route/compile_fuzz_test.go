package route

import (
	"errors"
	"reflect"
	"testing"
)

// FuzzCompile: a configured path compiles to a route whose String
// compiles to the same route, which matches its own path and covers
// itself; a path refused gives no route and an *Error on Path.
func FuzzCompile(f *testing.F) {
	for _, s := range []string{"/", "/*", "/login", "/api/*", "/Login.", "/%6Cogin/", "/a/../b", "/a*", "/a;b", "/a?b", "a", "", "/a/*/b",
		"//*", "/%2F", "/\u00e9"} {
		f.Add(s, false)
	}
	f.Fuzz(func(t *testing.T, p string, caseSens bool) {
		o := Options{CaseSensitive: caseSens}
		rt, err := o.Compile(p, []string{"get"})
		if err != nil {
			var e *Error
			if !errors.As(err, &e) || e.Field != "Path" || !reflect.DeepEqual(rt, Route{}) {
				t.Fatalf("Compile(%q) = %+v, %v", p, rt, err)
			}
			return
		}
		again, err := o.Compile(rt.String(), []string{"GET"})
		if err != nil || !reflect.DeepEqual(again, rt) {
			t.Fatalf("Compile(%q) = %+v; its String %q compiles to %+v, %v", p, rt, rt.String(), again, err)
		}
		if !rt.Covers(&rt) {
			t.Fatalf("Compile(%q): the route does not cover itself", p)
		}
		match := rt.base
		if match == "" {
			match = "/"
		}
		if !rt.Match("HEAD", match) || rt.Match("POST", match) {
			t.Fatalf("Compile(%q): the route's own path %q is not matched by GET's methods alone", p, match)
		}
	})
}
