// Package httplimit applies the [[ratelimit]] rules of a preforkd
// configuration to HTTP requests: an http.Handler in front of the
// application that counts each request in the shared counter table of an
// shm.Region, refuses it with 429 when a rule says so, and tells clients
// where they stand in rate-limit headers.
//
// The call most users want, once per worker process after
// shm.Region.Join:
//
//	mw, err := httplimit.New(cfg, region, app, httplimit.Options{})
//	...
//	srv := &http.Server{Handler: mw}
//
// and, in a handler behind it, to forgive a client its failed attempts
// after a successful login:
//
//	if lim := mw.Limiter("login"); lim != nil {
//		lim.Reset(string(mw.KeyOf("login", r)), region.Now())
//	}
//
// # Which rules count a request
//
// Every rule whose path and methods match counts the request. A path is
// either exact ("/login" matches "/login" only) or a prefix ending in "/*":
// "/api/*" matches "/api" itself and everything below "/api/", never
// "/apis"; "/*" matches every path. Paths are compared after cleaning, on
// both sides: the request's r.URL.Path (already percent-decoded) with "."
// and ".." resolved, repeated slashes collapsed and a trailing slash
// dropped, so that "/x/../login", "//login" and "/login/" all count under a
// rule on "/login" and cannot be used to dodge it. Matching is
// case-sensitive for paths. An empty methods list matches every method;
// otherwise the method must be one of the list, compared without regard to
// case (a "post" that some upstream might serve as POST is counted as POST),
// and HEAD is not GET. Routes are compiled once; matching a request
// allocates nothing.
//
// # One request, several rules: nothing is charged for a refusal
//
// The request is refused if any enforcing rule refuses it, and a refused
// request is charged to no rule. That takes two phases:
//
//  1. Peek: each matching enforcing rule reports, without taking anything,
//     whether it would let the request through. If one would not, the
//     request is refused and nothing has been charged.
//  2. Charge: each enforcing rule takes the request (one CAS in the shared
//     table). Between the peek and the charge another worker may have
//     taken the last request a rule had; that rule then refuses here, and
//     the charges already made for this request are refunded
//     (bucket.Limiter.RefundKey) before the 429 is sent. In that window a
//     concurrent request may see the refunded rule one request short and be
//     refused too: the race errs on the side of refusing, never of letting
//     more than the limit through.
//
// With a single enforcing rule the peek is skipped: its own refusal
// charges nothing. Shadow rules never refuse; they are charged after the
// enforcing ones, only when the request is served. When several enforcing
// rules refuse at once, Retry-After is the latest of their retry times, so
// that a client that obeys it is not refused again by any of them.
//
// Keys come from each rule's `by` (package clientip) with one resolver
// built from trusted_proxies and ipv6_prefix: a direct client can never
// choose its own key.
//
// # Refusals
//
// A refused request gets 429 with Retry-After (whole seconds, rounded up,
// at least 1: never earlier than the refusing rule allows), Cache-Control:
// no-store and an RFC 9457 problem+json body:
//
//	{"type":"https://iana.org/assignments/http-problem-types#quota-exceeded",
//	 "title":"Too Many Requests","status":429,
//	 "detail":"rate limit \"login\" exceeded; retry in 41 seconds",
//	 "violated-policies":["login"]}
//
// The type and the violated-policies member are those the rate-limit
// headers draft (draft-ietf-httpapi-ratelimit-headers, whose fields this
// package sends) defines for exactly this refusal; "about:blank" would say
// nothing beyond the status code. The body names the rule and the wait,
// nothing about the table or the worker.
//
// When the table has no slot for a new key, the rule's on_full decides:
// "open" lets the request through (counted in [RuleStats].Full), "closed"
// refuses it with 503, Retry-After: 1 (bucket.FullRetryAfter) and a
// problem+json body of type "about:blank" ("Service Unavailable": a
// client can do nothing about it but wait).
//
// # Headers
//
// Every response to a request that matches at least one rule carries the
// rate-limit headers selected by the server's `headers` setting, on 2xx
// and 429 alike, for shadow rules too. They are set on the ResponseWriter
// before the next handler runs, so they are part of whatever it sends
// (a handler may still overwrite them on purpose). Field names are set in
// Go's canonical form ("Ratelimit-Policy"); field names are
// case-insensitive.
//
// "ietf" (draft-ietf-httpapi-ratelimit-headers-10/-11, structured fields,
// RFC 9651): one list item per matching rule, in configuration order, in
// one field line each:
//
//	RateLimit-Policy: "login";q=5;w=300, "api";q=100;w=60
//	RateLimit: "login";r=2;t=41, "api";r=99;t=1
//
// The item is the rule name as an sf-string; q is the limit, w the window
// in seconds rounded up (at least 1), r the requests remaining and t the
// seconds, rounded up, until the rule is as for a fresh client
// (ResetAfter). For a rule that refuses the request, or would have in
// shadow mode, r is 0 and t is the seconds until it lets the next request
// through, which is what Retry-After says: the draft's effective window is
// the time within which no more than r requests can pass, and it asks that
// Retry-After not end before it. q is the limit even when a gcra burst is
// larger; r may then exceed it.
//
// "x" (the conventional fields), for the most constraining matching rule:
// fewest remaining, ties broken by the soonest reset:
//
//	X-RateLimit-Limit: 5
//	X-RateLimit-Remaining: 2
//	X-RateLimit-Reset: 1767225641
//
// Reset is the wall clock plus t, in Unix seconds rounded up. "both"
// sends both families, "none" neither (a refusal still has Retry-After).
// For a served request the values come from the charges; for a refused
// one, from the peeks (the state without the request).
//
// # Shadow mode
//
// A shadow rule counts, sends headers, and never refuses. A request it
// would have refused is counted in [RuleStats].ShadowRefused and logged
// at warning level, at most one line per rule per second of region time,
// each line carrying the number of would-be refusals left out since the
// previous one. The line names the rule, method, path and client address,
// never the key (a header key may be a credential).
//
// # Concurrency and cost
//
// A Middleware is safe for concurrent use. It holds no lock, and none
// across the next handler, and starts no goroutine. Exactness across
// processes is the table's: with N workers a limit of L lets L requests
// through, never L × N. A request that matches no rule costs a path scan
// and no allocation; one that matches reads the region clock once, builds
// keys in a stack buffer, makes one table operation per rule (two with
// several enforcing rules), and allocates only the header values (two
// allocations for all of them). Up to 8 matching rules are handled
// without allocating for the rules themselves. [Middleware.Stats] counts
// per process; the table's own counters (shm.Counters.Stats) cover all.
package httplimit
