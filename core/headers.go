package core

import (
	"net/http"
	"strconv"
	"time"

	"github.com/preforkd/preforkd/bucket"
	"github.com/preforkd/preforkd/internal/jsonstring"
	"github.com/preforkd/preforkd/internal/textvalue"
)

// HeaderMode selects the rate-limit header families: a set of bits. The
// zero value is both families.
type HeaderMode uint8

const (
	// HeadersBoth sends the IETF fields and the X-RateLimit-* ones.
	HeadersBoth HeaderMode = 0
	// HeadersIETF sends RateLimit-Policy and RateLimit
	// (draft-ietf-httpapi-ratelimit-headers).
	HeadersIETF HeaderMode = 1
	// HeadersX sends X-RateLimit-Limit, -Remaining and -Reset.
	HeadersX HeaderMode = 2
	// HeadersNone sends no rate-limit header.
	HeadersNone HeaderMode = 3
)

// headerModeNames are the names ParseHeaderMode reads and String writes,
// indexed by mode.
var headerModeNames = textvalue.Enum[HeaderMode]{HeadersBoth: "both", HeadersIETF: "ietf", HeadersX: "x", HeadersNone: "none"}

// ParseHeaderMode parses "both", "ietf", "x" or "none".
func ParseHeaderMode(s string) (HeaderMode, error) { return headerModeNames.Parse("core", s) }

// String is the mode as ParseHeaderMode reads it.
func (m HeaderMode) String() string { return headerModeNames.String(m, "HeaderMode") }

// MarshalText is the mode's name; a value without one is an error.
func (m HeaderMode) MarshalText() ([]byte, error) { return headerModeNames.Marshal("core", m) }

// UnmarshalText makes a HeaderMode a configuration value.
func (m *HeaderMode) UnmarshalText(b []byte) error { return headerModeNames.Unmarshal("core", b, m) }

func (m HeaderMode) ietf() bool { return m == HeadersBoth || m == HeadersIETF }
func (m HeaderMode) x() bool    { return m == HeadersBoth || m == HeadersX }

// Header names in Go's canonical form (http.CanonicalHeaderKey), so that
// an engine's own fields merge with them; field names are case-insensitive
// on the wire.
const (
	hdrPolicy     = "Ratelimit-Policy"
	hdrLimit      = "Ratelimit"
	hdrXLimit     = "X-Ratelimit-Limit"
	hdrXRemaining = "X-Ratelimit-Remaining"
	hdrXReset     = "X-Ratelimit-Reset"
)

// maxSFInt is the largest Integer a structured field can carry (RFC 9651
// §3.3.1: at most 15 digits).
const maxSFInt = 999_999_999_999_999

// ruleHeaders is what a rule contributes to the headers that does not
// change from request to request, formatted once.
type ruleHeaders struct {
	quotedName string // the name as an sf-string: "login"
	policyItem string // its RateLimit-Policy item: "login";q=5;w=300
	limitText  string // X-RateLimit-Limit: 5
}

func newRuleHeaders(name string, limit int64, window time.Duration) ruleHeaders {
	q := string(appendSFString(nil, name))
	return ruleHeaders{
		quotedName: q,
		policyItem: string(appendPolicyItem(nil, q, limit, window)),
		limitText:  strconv.FormatInt(clampSF(limit), 10),
	}
}

// appendSFString appends s as a structured-field String (RFC 9651 §3.3.3):
// in double quotes, with '"' and '\' escaped. Bytes a String cannot hold
// (controls, DEL, non-ASCII) become '?'; New refuses rule names with such
// bytes, so this is defence, not a feature.
func appendSFString(dst []byte, s string) []byte {
	dst = append(dst, '"')
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '"' || c == '\\':
			dst = append(dst, '\\', c)
		case c < 0x20 || c > 0x7e:
			dst = append(dst, '?')
		default:
			dst = append(dst, c)
		}
	}
	return append(dst, '"')
}

// appendPolicyItem appends one RateLimit-Policy item: the quota q is the
// rule's limit, the window w its window in whole seconds, rounded up (the
// draft has no sub-second windows, and rounding down would announce a
// faster rate than the rule allows).
func appendPolicyItem(dst []byte, quotedName string, limit int64, window time.Duration) []byte {
	dst = append(dst, quotedName...)
	dst = append(dst, ";q="...)
	dst = strconv.AppendInt(dst, clampSF(limit), 10)
	dst = append(dst, ";w="...)
	return strconv.AppendInt(dst, max(ceilSeconds(window), 1), 10)
}

// appendLimitItem appends one RateLimit item: r remaining, t seconds.
func appendLimitItem(dst []byte, quotedName string, remaining int64, reset time.Duration) []byte {
	dst = append(dst, quotedName...)
	dst = append(dst, ";r="...)
	dst = strconv.AppendInt(dst, clampSF(remaining), 10)
	dst = append(dst, ";t="...)
	return strconv.AppendInt(dst, ceilSeconds(reset), 10)
}

// limitValues is what a decision says to a client: requests remaining and
// the seconds they are counted over. For a decision that refuses (a rule
// that refused this request, or would have), nothing remains until the
// rule lets the next request through, so t is RetryAfter: this keeps t and
// Retry-After telling the same story (the draft: Retry-After SHOULD NOT be
// earlier than the end of the effective window). Otherwise t is the time
// until the rule's state is as a fresh client's (ResetAfter).
func limitValues(d *bucket.Decision) (remaining int64, reset time.Duration) {
	if !d.Allowed {
		return 0, d.RetryAfter
	}
	return max(d.Remaining, 0), d.ResetAfter
}

// ceilSeconds rounds d up to whole seconds; negative durations are 0.
func ceilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	s := d / time.Second // not (d + 1s - 1) / 1s: that overflows near the largest d
	if d%time.Second != 0 {
		s++
	}
	return clampSF(int64(s))
}

func clampSF(v int64) int64 { return min(max(v, 0), maxSFInt) }

// retryAfterSeconds is the Retry-After of a refusal: whole seconds rounded
// up, so a client that obeys it is never early, and at least 1.
func retryAfterSeconds(d time.Duration) int64 { return max(ceilSeconds(d), 1) }

// mostConstraining returns the index of the hit the conventional headers
// describe. On a refusal it is the rule that refused (of several, the one
// with the latest retry, as the refusal's Retry-After is), so that
// X-RateLimit-Reset is never before Retry-After and a shadow rule never
// speaks for a refusal; otherwise fewest remaining, ties broken by the
// soonest reset.
func mostConstraining(hits []hit) int {
	refusing := -1
	for i := range hits {
		if hits[i].refused && (refusing < 0 || hits[i].d.RetryAfter > hits[refusing].d.RetryAfter) {
			refusing = i
		}
	}
	if refusing >= 0 {
		return refusing
	}
	best := 0
	br, bt := limitValues(&hits[0].d)
	for i := 1; i < len(hits); i++ {
		r, t := limitValues(&hits[i].d)
		if r < br || r == br && t < bt {
			best, br, bt = i, r, t
		}
	}
	return best
}

// rateLimitFields adds the header families of the core's mode from the
// decisions in the exchange's hits (one per matching rule, in
// configuration order).
//
// A rule that let the request through because the table had no slot for
// its key (on_full "open") knows nothing about the client: it sends no
// item, and is never the most constraining.
func (ex *Exchange) rateLimitFields() {
	mode := ex.c.headers
	if mode == HeadersNone || len(ex.rl.hits) == 0 {
		return
	}
	hits := ex.rl.hits
	for i := range hits {
		if blind(&hits[i]) {
			hits = ex.knowing()
			break
		}
	}
	if len(hits) == 0 {
		return
	}
	if mode.ietf() {
		ex.addField(hdrPolicy, func(b []byte) []byte {
			for i := range hits {
				if i > 0 {
					b = append(b, ", "...)
				}
				b = append(b, hits[i].v.hdr.policyItem...)
			}
			return b
		})
		ex.addField(hdrLimit, func(b []byte) []byte {
			for i := range hits {
				if i > 0 {
					b = append(b, ", "...)
				}
				r, t := limitValues(&hits[i].d)
				b = appendLimitItem(b, hits[i].v.hdr.quotedName, r, t)
			}
			return b
		})
	}
	if mode.x() {
		most := &hits[mostConstraining(hits)]
		r, t := limitValues(&most.d)
		ex.addField(hdrXLimit, func(b []byte) []byte { return append(b, most.v.hdr.limitText...) })
		ex.addField(hdrXRemaining, func(b []byte) []byte { return strconv.AppendInt(b, r, 10) })
		wall := ex.c.wall()
		ex.addField(hdrXReset, func(b []byte) []byte { return strconv.AppendInt(b, unixCeil(wall, t), 10) })
	}
}

// blind reports whether a hit knows nothing of the client's state: it
// was let through by on_full "open".
func blind(h *hit) bool { return h.unknown || h.d.Full && h.d.Allowed }

// knowing returns the hits that are not blind, in a copy (the hits
// themselves stay for the counters).
func (ex *Exchange) knowing() []hit {
	var buf [inlineHits]hit
	out := buf[:0]
	for i := range ex.rl.hits {
		if !blind(&ex.rl.hits[i]) {
			out = append(out, ex.rl.hits[i])
		}
	}
	return out
}

// unixCeil is wall + d in Unix seconds, rounded up.
func unixCeil(wall time.Time, d time.Duration) int64 {
	d = min(max(d, 0), bucket.MaxWindow) // no overflow, whatever the decision says
	secs, frac := wall.Unix(), int64(wall.Nanosecond())+int64(d)
	secs += frac / int64(time.Second)
	if frac%int64(time.Second) != 0 {
		secs++
	}
	return secs
}

// Problem type URIs. A refusal uses the "quota-exceeded" problem type of
// draft-ietf-httpapi-ratelimit-headers, the draft whose fields the core
// sends, so a client that speaks the draft recognises it; a full table is
// nothing a client can act on beyond the status code, which is what
// "about:blank" means (RFC 9457 §4.2.1).
const problemQuotaExceeded = "https://iana.org/assignments/http-problem-types#quota-exceeded"

// refusalProblem is the answer to a refused request: the refusing rule's
// status (429, or 503 by its choice; 503 about:blank when its table was
// full), the Retry-After of the rule that refused (refusing, one of hits),
// a detail that names the rule and when to retry, and nothing about
// internals; a quota refusal also lists every rule that refused
// (violated-policies, as the draft's problem type defines it). The detail
// and that list are appended to buf, which the problem aliases.
func refusalProblem(refusing *hit, hits []hit, buf []byte) (Problem, []byte) {
	secs := retryAfterSeconds(refusing.d.RetryAfter)
	p := Problem{Status: refusing.r.status, Type: problemQuotaExceeded, RetryAfter: secs}
	what := `" exceeded; retry in `
	if refusing.d.Full || refusing.unavailableClosed() {
		p.Status, p.Type, what = http.StatusServiceUnavailable, "", `" is temporarily unavailable; retry in `
	}
	from := len(buf)
	buf = append(buf, `rate limit "`...)
	buf = append(buf, refusing.r.name...)
	buf = append(buf, what...)
	buf = strconv.AppendInt(buf, secs, 10)
	if secs == 1 {
		buf = append(buf, " second"...)
	} else {
		buf = append(buf, " seconds"...)
	}
	p.DetailText = buf[from:len(buf):len(buf)]
	if !refusing.d.Full && !refusing.unavailableClosed() {
		from = len(buf)
		buf = append(buf, `,"violated-policies":[`...)
		n := 0
		for i := range hits {
			if hits[i].refused {
				if n > 0 {
					buf = append(buf, ',')
				}
				buf = jsonstring.Append(buf, hits[i].r.name, jsonstring.Replace)
				n++
			}
		}
		buf = append(buf, ']')
		p.Extra = buf[from:len(buf):len(buf)]
	}
	return p, buf
}
