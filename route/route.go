package route

import (
	"fmt"
	"strings"
)

// Options are the matching choices shared by the routes of a
// configuration. The zero value is the default.
type Options struct {
	// CaseSensitive compares paths byte for byte. By default ASCII letters
	// compare without case, because case-insensitive routers (IIS,
	// ASP.NET, Express's default) serve "/LOGIN" from the "/login"
	// handler, and a rule must count every request that handler serves.
	// Non-ASCII letters, percent-encoded in match paths, never fold.
	CaseSensitive bool
}

// Route is a compiled `path` and `methods`: what requests it covers.
type Route struct {
	// base is the match path (see Normalize): the whole path of an exact
	// route, or the prefix without its "/*" ("/api" for "/api/*"; "" for
	// "/*").
	base          string
	prefix        bool
	caseSensitive bool
	methods       []string // upper case; empty matches every method
}

// Compile is Options{}.Compile: paths compare without ASCII case.
func Compile(p string, methods []string) (Route, error) {
	return Options{}.Compile(p, methods)
}

// Compile parses a configured path ("/login", "/api/*") and methods. The
// path is normalized like a request path (see Normalize), so "/login/",
// "/Login." and "/%6Cogin" name the route "/login" matches; a path that
// Normalize would refuse is an error, and so is a ';', which would start a
// parameter that matching ignores.
func (o Options) Compile(p string, methods []string) (Route, error) {
	if p == "" || p[0] != '/' {
		return Route{}, fmt.Errorf("route: path %q must start with /", p)
	}
	rt := Route{caseSensitive: o.CaseSensitive}
	base := p
	if strings.HasSuffix(p, "/*") {
		rt.prefix = true
		base = p[:len(p)-1] // keep the slash: "/api/" normalizes to "/api", "/" stays "/"
	}
	if strings.IndexByte(base, '*') >= 0 {
		return Route{}, fmt.Errorf("route: path %q: '*' is only allowed as a final \"/*\"", p)
	}
	if strings.IndexByte(base, ';') >= 0 {
		return Route{}, fmt.Errorf("route: path %q: ';' starts a parameter, which matching ignores", p)
	}
	match, _, err := Normalize(base)
	if err != nil {
		return Route{}, fmt.Errorf("route: path %q: %s", p, string(err.(badPath)))
	}
	rt.base = match
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

// Match reports whether a request with method for the match path p (see
// Normalize) is covered by rt. It does not allocate.
func (rt *Route) Match(method, p string) bool {
	n := len(rt.base)
	if len(p) < n || !rt.equal(p[:n], rt.base) {
		return false
	}
	if rt.prefix {
		// "/api/*" matches "/api" and everything below "/api/", never
		// "/apix".
		if len(p) > n && p[n] != '/' {
			return false
		}
	} else if len(p) != n {
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

// equal compares two paths of equal length byte by byte, folding ASCII
// letters unless rt is case-sensitive. Folding is done here, per compare,
// so that no request path is ever lower-cased (copied); match paths hold
// every non-ASCII byte percent-encoded, so ASCII is all there is to fold.
func (rt *Route) equal(a, b string) bool {
	if rt.caseSensitive {
		return a == b
	}
	for i := 0; i < len(a); i++ {
		x, y := a[i], b[i]
		if x == y {
			continue
		}
		if x |= 0x20; x != y|0x20 || x < 'a' || x > 'z' {
			return false
		}
	}
	return true
}

// String is the route as configured after normalizing, for errors and logs.
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
