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
	"slices"
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

// An Error is a path or methods that Compile refuses.
type Error struct {
	Field string // the argument at fault: "Path" or "Methods"
	Msg   string // what is wrong, naming the path or method
}

func (e *Error) Error() string { return "route: " + e.Msg }

// Compile parses a configured path ("/login", "/api/*") and methods, each
// an RFC 9110 token listed at most once (case-insensitively). A path has no
// blanks, control characters, query or fragment. Paths are cleaned like
// request paths, so that "/login/" and "/login" name the same route.
// Every problem is an *[Error].
func Compile(p string, methods []string) (Route, error) {
	bad := func(field, format string, args ...any) (Route, error) {
		return Route{}, &Error{Field: field, Msg: fmt.Sprintf(format, args...)}
	}
	if p == "" || p[0] != '/' {
		return bad("Path", "path %q must start with /", p)
	}
	if i := strings.IndexFunc(p, func(r rune) bool { return r <= ' ' || r == 0x7f }); i >= 0 {
		return bad("Path", "path %q contains a blank or control character", p)
	}
	if strings.ContainsAny(p, "?#") {
		return bad("Path", "path %q: a path has no query or fragment", p)
	}
	rt := Route{}
	base := p
	if strings.HasSuffix(p, "/*") {
		rt.prefix = true
		base = p[:len(p)-1] // keep the slash: "/api/" cleans to "/api", "/" stays "/"
	}
	if strings.IndexByte(base, '*') >= 0 {
		return bad("Path", "path %q: '*' is only allowed as a final \"/*\"", p)
	}
	rt.base = path.Clean(base)
	if rt.prefix && rt.base == "/" {
		rt.base = "" // "/*" matches every path
	}
	for _, m := range methods {
		if m == "" || !IsToken(m) {
			return bad("Methods", "method %q is not a token", m)
		}
		m = strings.ToUpper(m)
		if slices.Contains(rt.methods, m) {
			return bad("Methods", "method %q is listed twice", m)
		}
		rt.methods = append(rt.methods, m)
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

// Clean returns the request path routes match against: r.URL.Path with
// "." and ".." elements resolved, repeated slashes collapsed and a trailing
// slash dropped (path.Clean), so that "/x/../login", "//login" and
// "/login/" cannot dodge a rule on "/login". An empty path is "/". It
// allocates only when the path is not already clean.
func Clean(p string) string {
	if p == "" {
		return "/"
	}
	if isClean(p) {
		return p
	}
	if p[0] != '/' {
		return p // "*" (OPTIONS *) and other non-paths: they match no route
	}
	return path.Clean(p)
}

// isClean reports whether path.Clean(p) == p for p starting with '/'.
func isClean(p string) bool {
	if p[0] != '/' {
		return true
	}
	// Look at every element: empty ("//", a trailing "/"), "." or "..".
	for i := 0; i < len(p); {
		j := i + 1
		for j < len(p) && p[j] != '/' {
			j++
		}
		switch e := p[i+1 : j]; e {
		case ".", "..":
			return false
		case "":
			if j < len(p) || i > 0 {
				return false
			}
		}
		i = j
	}
	return true
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
