package httpcache

import (
	"strings"
	"time"

	"github.com/preforkd/preforkd/internal/httpfield"
)

// Field is one field line of a response, its name in any case.
type Field struct {
	Name  string
	Value []byte
}

// Lines appends the values of the field lines of h called name (in any
// case) to dst.
func Lines(h []Field, name string, dst []string) []string {
	for _, f := range h {
		if strings.EqualFold(f.Name, name) {
			dst = append(dst, string(f.Value))
		}
	}
	return dst
}

// Only is the value of the one field line of h called name. A singleton
// field (Date, Expires, Last-Modified) given on several lines is not one
// value (RFC 9110 §5.3): ok is false then, as when there is none; n says
// how many lines there are.
func Only(h []Field, name string) (value string, n int) {
	for _, f := range h {
		if strings.EqualFold(f.Name, name) {
			if n == 0 {
				value = string(f.Value)
			}
			n++
		}
	}
	if n != 1 {
		value = ""
	}
	return value, n
}

// Has reports whether h has a field line called name.
func Has(h []Field, name string) bool {
	for _, f := range h {
		if strings.EqualFold(f.Name, name) {
			return true
		}
	}
	return false
}

// Policy is what a cache decides freshness by, besides the response.
type Policy struct {
	// TTL caps the freshness lifetime, each stale window and how long a
	// response is kept for revalidation.
	TTL time.Duration
	// Heuristic lets a response without explicit freshness but with a
	// Last-Modified be fresh for a tenth of its age at Date (RFC 9111
	// §4.2.2).
	Heuristic bool
	// Targets is the target list (RFC 9213 §2.2): the targeted fields
	// this cache obeys, most applicable first, in canonical form.
	Targets []string
}

// MaxVary bounds the fields a stored response may vary on.
const MaxVary = 16

// MinKeep is the shortest time a stale response with a validator is kept
// for revalidation after it can no longer be served (when TTL allows).
const MinKeep = 10 * time.Minute

// Plan is what a cache may do with a response.
type Plan struct {
	// Store: the response may be stored. When it may not, Outdates says
	// whether the response stored for its key before must go too (a newer
	// response the origin does not let be stored), rather than stay for
	// stale-if-error (a failure of the origin, an error status without
	// explicit freshness, a partial response).
	Store, Outdates bool
	// Fresh is the freshness lifetime; SWR and SIE the
	// stale-while-revalidate and stale-if-error windows (0 when the
	// response may not be served stale). All capped by Policy.TTL.
	Fresh, SWR, SIE time.Duration
	// Age is the response's age when it arrived (the corrected initial
	// age, RFC 9111 §4.2.3).
	Age time.Duration
	// Keep is how long the response is kept, after it can no longer be
	// served, to be revalidated: 0 without a validator.
	Keep time.Duration
	// Names are the request fields it varies on (ParseVary).
	Names []string
	// NoDate: the response has no valid Date, so the cache adds one, the
	// time it arrived (RFC 9110 §6.6.1).
	NoDate bool
	// Target is the targeted field that decided, "" for Cache-Control.
	Target string
}

// streamed reports whether a response is a stream to pass through, never
// to store (as nginx stores only what it buffers): server-sent events
// (Content-Type text/event-stream), whose events are for the clients
// listening as they come, not a representation to replay, or a response
// whose application asks that it not be buffered (X-Accel-Buffering: no).
func streamed(h []Field) bool {
	ct, _ := Only(h, "Content-Type")
	mt, _, _ := strings.Cut(ct, ";")
	xab, _ := Only(h, "X-Accel-Buffering")
	return strings.EqualFold(strings.TrimSpace(mt), "text/event-stream") || strings.EqualFold(strings.TrimSpace(xab), "no")
}

// Judge says what a shared cache may do with a final response (RFC 9111
// §3 and §4.2): its status, its fields h, the policy p; auth says that
// the request carried Authorization; wall is the wall clock when the
// response arrived and delay the time from the request's start to then
// (response_time − request_time).
//
// Status codes: 206, 304 and 1xx are never stored; an error status (4xx
// beside the heuristically cacheable ones, 5xx) only with explicit
// freshness; nor is a stream (server-sent events, X-Accel-Buffering: no), and a 5xx that may not be stored leaves the stored response
// to stale-if-error. With must-understand, no-store is ignored for a
// status this cache understands, and the response is not stored for one
// it does not.
func Judge(status int, h []Field, p *Policy, auth bool, wall time.Time, delay time.Duration) Plan {
	var plan Plan
	switch {
	case status < 200, status == 206, status == 304, status > 599:
		return plan
	}
	failure := status >= 500
	outdated := func() Plan {
		plan.Outdates = !failure
		return plan
	}
	var lb [8]string
	cc, targeted := Directives{}, false
	for _, name := range p.Targets {
		if cc, targeted = ParseTargeted(Lines(h, name, lb[:0])); targeted {
			plan.Target = name
			break
		}
	}
	if !targeted {
		cc = ParseCacheControl(Lines(h, "Cache-Control", lb[:0]))
	}
	switch {
	case cc.MustUnderstand && !understood(status):
		return outdated()
	case cc.NoStore && !cc.MustUnderstand, cc.Private:
		return outdated()
	case Has(h, "Set-Cookie"):
		// A cookie is for one client: never served to another.
		return outdated()
	case streamed(h):
		return outdated()
	case auth && !cc.Public && cc.SMaxAge < 0 && !cc.MustRevalidate:
		// RFC 9111 §3.5: the response to a request with credentials is
		// for its client only. The stored response (of a request
		// without) is not outdated by it.
		return plan
	}
	names, star := ParseVary(Lines(h, "Vary", lb[:0]))
	if star || len(names) > MaxVary {
		return outdated()
	}
	plan.Names = names

	// Freshness (RFC 9111 §4.2.1): s-maxage, max-age, Expires − Date (not
	// under a targeted field, which replaces Expires too), or a heuristic.
	date, dated := wall, false
	if d, n := Only(h, "Date"); n == 1 {
		if t, ok := ParseHTTPDate(d, wall); ok {
			date, dated = t, true
		}
	}
	plan.NoDate = !dated
	fresh := time.Duration(-1)
	switch {
	case cc.SMaxAge >= 0:
		fresh = time.Duration(cc.SMaxAge) * time.Second
	case cc.MaxAge >= 0:
		fresh = time.Duration(cc.MaxAge) * time.Second
	case !targeted && Has(h, "Expires"):
		fresh = 0 // invalid, or given twice: already expired (RFC 9111 §5.3)
		if e, n := Only(h, "Expires"); n == 1 {
			if t, ok := ParseHTTPDate(e, wall); ok {
				fresh = max(t.Sub(date), 0)
			}
		}
	case p.Heuristic && (heuristicStatus(status) || cc.Public):
		if lm, n := Only(h, "Last-Modified"); n == 1 {
			if t, ok := ParseHTTPDate(lm, wall); ok {
				fresh = max(date.Sub(t)/10, 0)
			}
		}
	}
	if cc.NoCache {
		// Every use needs a validation (RFC 9111 §5.2.2.4), whatever
		// freshness it has, or not.
		fresh = 0
	}
	if fresh < 0 {
		// No freshness: nothing to serve it for. An error status without
		// explicit freshness leaves a stored response alone.
		return outdated()
	}
	fresh = min(fresh, p.TTL)
	swr := min(time.Duration(max(cc.SWR, 0))*time.Second, p.TTL)
	sie := min(time.Duration(max(cc.SIE, 0))*time.Second, p.TTL)
	if cc.NoCache || cc.MustRevalidate || cc.ProxyRevalidate || auth && cc.SMaxAge >= 0 {
		// Never served stale (RFC 9111 §5.2.2.2, §4.2.4). s-maxage
		// carries proxy-revalidate for a shared cache (§5.2.2.10), and
		// is what may have let the response to a request with
		// Authorization be stored, on condition that it is revalidated
		// once stale (§3.5): such a response is never served stale.
		// Elsewhere the stale windows the same field gives beside it
		// hold, as CDNs and reverse proxies read them: frameworks send
		// "s-maxage=1, stale-while-revalidate=59" meaning just that.
		swr, sie = 0, 0
	}

	// Age (RFC 9111 §4.2.3): the larger of what the clocks say and what
	// the Age field plus the round trip say.
	ageValue := time.Duration(0)
	if a, ok := ParseAge(Lines(h, "Age", lb[:0])); ok {
		ageValue = time.Duration(a) * time.Second
	}
	apparent := max(wall.Sub(date), 0)
	age := max(apparent, ageValue+max(delay, 0))

	if validator(h, wall) {
		plan.Keep = min(max(fresh, MinKeep), p.TTL)
	}
	if fresh+max(swr, sie) <= age && plan.Keep == 0 {
		return outdated() // stale on arrival, too stale to serve, and no validator
	}
	plan.Store, plan.Fresh, plan.SWR, plan.SIE, plan.Age = true, fresh, swr, sie, age
	return plan
}

// validator reports whether h has what a conditional request can be made
// with: an entity tag, or a Last-Modified date.
func validator(h []Field, wall time.Time) bool {
	if etag, n := Only(h, "Etag"); n == 1 {
		if _, ok := opaqueTag(httpfield.TrimOWS(etag)); ok {
			return true
		}
	}
	if lm, n := Only(h, "Last-Modified"); n == 1 {
		_, ok := ParseHTTPDate(lm, wall)
		return ok
	}
	return false
}

// heuristicStatus are the status codes heuristically cacheable by default
// (RFC 9110 §15.1) that a shared cache may store (not 206).
func heuristicStatus(s int) bool {
	switch s {
	case 200, 203, 204, 300, 301, 308, 404, 405, 410, 414, 501:
		return true
	}
	return false
}

// understood reports whether this cache knows what RFC 9110 requires of
// a response with status s (RFC 9111 §5.2.2.3, must-understand): the
// final statuses it defines, but 206 (ranges are served from whole
// responses here, never stored).
func understood(s int) bool {
	switch s {
	case 200, 201, 202, 203, 204, 205,
		300, 301, 302, 303, 307, 308,
		400, 401, 402, 403, 404, 405, 406, 407, 408, 409, 410, 411, 412, 413, 414, 415, 416, 417, 421, 422, 426,
		500, 501, 502, 503, 504, 505:
		return true
	}
	return false
}
