// Package route matches request paths and methods against the routes of
// preforkd's configuration: an exact path ("/login") or a prefix ending in
// "/*" ("/api/*", which matches "/api" and everything below "/api/", never
// "/apix"), and a list of methods (empty: every method).
//
// Request paths are cleaned before matching ([Clean]), so "/x/../login",
// "//login" and "/login/" cannot dodge a rule on "/login". Matching does
// not allocate; most users want [Compile] once and [Route.Match] per request.
package route

import (
	"fmt"
	"path"
	"strings"
)

// Route is a compiled `path` and `methods`: what requests it covers.
type Route struct {
	// base is the cleaned path: the whole path of an exact route, or the
	// prefix without its "/*" ("/api" for "/api/*"; "" for "/*").
	base    string
	prefix  bool
	methods []string // upper case; empty matches every method
}

// Compile parses a configured path ("/login", "/api/*") and methods.
// Paths are cleaned like request paths, so that "/login/" and "/login"
// name the same route.
func Compile(p string, methods []string) (Route, error) {
	if p == "" || p[0] != '/' {
		return Route{}, fmt.Errorf("route: path %q must start with /", p)
	}
	rt := Route{}
	base := p
	if strings.HasSuffix(p, "/*") {
		rt.prefix = true
		base = p[:len(p)-1] // keep the slash: "/api/" cleans to "/api", "/" stays "/"
	}
	if strings.IndexByte(base, '*') >= 0 {
		return Route{}, fmt.Errorf("route: path %q: '*' is only allowed as a final \"/*\"", p)
	}
	rt.base = path.Clean(base)
	if rt.prefix && rt.base == "/" {
		rt.base = "" // "/*" matches every path
	}
	for _, m := range methods {
		if m == "" || !IsToken(m) {
			return Route{}, fmt.Errorf("route: method %q is not a token", m)
		}
		rt.methods = append(rt.methods, strings.ToUpper(m))
	}
	return rt, nil
}

// Match reports whether a request for the cleaned path p (see Clean) with
// method is covered by rt. It does not allocate.
func (rt *Route) Match(method, p string) bool {
	if rt.prefix {
		// "/api/*" matches "/api" and everything below "/api/", never
		// "/apix".
		if !strings.HasPrefix(p, rt.base) || len(p) > len(rt.base) && p[len(rt.base)] != '/' {
			return false
		}
	} else if p != rt.base {
		return false
	}
	if len(rt.methods) == 0 {
		return true
	}
	for _, m := range rt.methods {
		// HTTP methods are case-sensitive, but some upstreams serve "post"
		// as POST; counting it costs nothing and closes the bypass.
		if strings.EqualFold(m, method) {
			return true
		}
	}
	return false
}

// String is the route as configured after cleaning, for errors and logs.
func (rt *Route) String() string {
	if rt.prefix {
		return rt.base + "/*"
	}
	return rt.base
}

// IsToken reports whether s is an RFC 9110 token.
func IsToken(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' ||
			strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return false
		}
	}
	return s != ""
}
