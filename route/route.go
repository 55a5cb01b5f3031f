package route

import (
	"fmt"
	"slices"
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
	// get: methods has GET, so HEAD matches too (see Match).
	get bool
}

// Compile is Options{}.Compile: paths compare without ASCII case.
func Compile(p string, methods []string) (Route, error) {
	return Options{}.Compile(p, methods)
}

// An Error is a path or methods that Compile refuses.
type Error struct {
	Field string // the argument at fault: "Path" or "Methods"
	Msg   string // what is wrong, naming the path or method
}

func (e *Error) Error() string { return "route: " + e.Msg }

// Compile parses a configured path ("/login", "/api/*") and methods, each
// an RFC 9110 token listed at most once (case-insensitively). The path is
// normalized like a request path (see Normalize), so "/login/", "/Login."
// and "/%6Cogin" name the route "/login" matches; a path that Normalize
// would refuse is an error, and so are blanks, control characters, a query
// or fragment, and a ';', which would start a parameter that matching
// ignores. Every problem is an *[Error].
// MustCompile is Compile for a route known when the program is written:
// it panics if the route does not compile.
func MustCompile(p string, methods []string) Route {
	r, err := Compile(p, methods)
	if err != nil {
		panic(err)
	}
	return r
}

// compileError is Compile's error. Not inlined: Compile refuses a path in
// eight places, each of which would otherwise carry a copy of it.
//
//go:noinline
func compileError(field, format string, args ...any) error {
	return &Error{Field: field, Msg: fmt.Sprintf(format, args...)}
}

func (o Options) Compile(p string, methods []string) (Route, error) {
	if p == "" || p[0] != '/' {
		return Route{}, compileError("Path", "path %q must start with /", p)
	}
	if i := strings.IndexFunc(p, func(r rune) bool { return r <= ' ' || r == 0x7f }); i >= 0 {
		return Route{}, compileError("Path", "path %q contains a blank or control character", p)
	}
	if strings.ContainsAny(p, "?#") {
		return Route{}, compileError("Path", "path %q: a path has no query or fragment", p)
	}
	rt := Route{caseSensitive: o.CaseSensitive}
	base := p
	if strings.HasSuffix(p, "/*") {
		rt.prefix = true
		base = p[:len(p)-1] // keep the slash: "/api/" normalizes to "/api", "/" stays "/"
	}
	if strings.IndexByte(base, '*') >= 0 {
		return Route{}, compileError("Path", "path %q: '*' is only allowed as a final \"/*\"", p)
	}
	if strings.IndexByte(base, ';') >= 0 {
		return Route{}, compileError("Path", "path %q: ';' starts a parameter, which matching ignores", p)
	}
	match, _, err := Normalize(base)
	if err != nil {
		return Route{}, compileError("Path", "path %q: %s", p, string(err.(badPath)))
	}
	rt.base = match
	if rt.prefix && rt.base == "/" {
		rt.base = "" // "/*" matches every path
	}
	for _, m := range methods {
		if m == "" || !IsToken(m) {
			return Route{}, compileError("Methods", "method %q is not a token", m)
		}
		m = strings.ToUpper(m)
		if slices.Contains(rt.methods, m) {
			return Route{}, compileError("Methods", "method %q is listed twice", m)
		}
		rt.methods = append(rt.methods, m)
		rt.get = rt.get || m == "GET"
	}
	return rt, nil
}

// Match reports whether a request with method for the match path p (see
// Normalize) is covered by rt: methods compare without case, and a route
// with GET covers HEAD. It does not allocate.
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
	// HEAD is GET without the content (RFC 9110 §9.3.2): net/http's
	// ServeMux, Express, Rails, Django and Flask run the GET handler for
	// it, whose status and headers then answer as a GET's would.
	return rt.get && strings.EqualFold(method, "HEAD")
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

// Covers reports whether every path o matches, rt matches too (methods
// aside): the same match path, or one below rt's prefix. Both are
// compiled with the same Options; rt's decide how letters compare. A
// block after one that covers it never applies where the first match
// wins.
func (rt *Route) Covers(o *Route) bool {
	n := len(rt.base)
	if len(o.base) < n || !rt.equal(o.base[:n], rt.base) {
		return false
	}
	if !rt.prefix {
		return !o.prefix && len(o.base) == n
	}
	return len(o.base) == n || o.base[n] == '/'
}

// Methods are the route's methods, upper case; empty means every method.
func (rt *Route) Methods() []string { return slices.Clone(rt.methods) }

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
		if !IsTokenByte(s[i]) {
			return false
		}
	}
	return s != ""
}

// IsTokenByte reports whether c may be in a token (RFC 9110 §5.6.2's
// tchar).
func IsTokenByte(c byte) bool {
	return c < 128 && tokenBytes[c>>6]&(1<<(c&63)) != 0
}

// tokenBytes has bit c%64 of word c/64 set for each tchar c: the digits,
// the letters and !#$%&'*+-.^_`|~. A look-up, not a search of the
// punctuation at each byte of every field name the engines parse.
var tokenBytes = [2]uint64{0x03ff6cfa00000000, 0x57ffffffc7fffffe}
