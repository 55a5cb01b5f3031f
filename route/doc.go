// Package route matches requests against the routes of preforkd's
// configuration: an exact path ("/login") or a prefix ending in "/*"
// ("/api/*": "/api" and everything below "/api/", never "/apix"), and a
// list of methods (empty: every method; compared without case).
//
// Compile the routes once, then per request split the target at the first
// '?' and normalize the path as sent:
//
//	rt, err := route.Options{CaseSensitive: cs}.Compile("/login", []string{"POST"})
//	match, forward, err := route.Normalize(path) // err: answer 400
//	if rt.Match(r.Method, match) { /* count it */ }
//	// proxy to forward
//
// # Paths
//
// A rule must count every request the application routes to its path, so
// matching is at least as broad as the routing of common applications.
// Percent-encoded unreserved characters are decoded ("/%6Cogin") and
// other bytes encoded ("/users/@me" is "/users/%40me"); dot segments and
// repeated slashes are removed ("/a/../login", "//login"); each segment's
// ';' parameters and trailing dots are dropped ("/login;jsessionid=x",
// "/.;/login", "/login."); a trailing '/' is ignored; and ASCII case is
// folded unless [Options.CaseSensitive]. An encoded ';' ("%3B") is data,
// not a separator, as in Tomcat and Spring.
//
// Paths that applications read in incompatible ways are refused with
// [ErrBadPath]: a backslash, an encoded '/' or '\', an encoded NUL or
// other control byte, a raw control byte, '?' or '#', a bad
// percent-encoding, and a target that does not start with '/' ("*", an
// authority; the caller passes the path of an absolute-form target).
//
// The forward path, which the application receives, only has its dot
// segments removed and slashes merged; the match path is computed from it,
// so what is forwarded is exactly what was matched.
//
// # Cost
//
// Routes are read-only once compiled and safe for concurrent use.
// [Route.Match] never allocates. [Normalize] does not allocate for a path
// that is already normal, for refusals, nor (up to 256 bytes) when the
// match path is a prefix of the forward path; otherwise it allocates its
// results. Time is linear in the path's length.
package route
