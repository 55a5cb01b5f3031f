package httplimit

import (
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/preforkd/preforkd/bucket"
)

// headerMode selects the rate-limit header families: a set of bits.
type headerMode uint8

const (
	headersIETF headerMode = 1 << iota // RateLimit-Policy and RateLimit
	headersX                           // X-RateLimit-Limit, -Remaining, -Reset
)

func parseHeaderMode(s string) (headerMode, error) {
	switch s {
	case "both", "":
		return headersIETF | headersX, nil
	case "ietf":
		return headersIETF, nil
	case "x":
		return headersX, nil
	case "none":
		return 0, nil
	}
	return 0, fmt.Errorf("httplimit: headers = %q: want \"ietf\", \"x\", \"both\" or \"none\"", s)
}

// Header names in Go's canonical form (http.CanonicalHeaderKey), so that
// Header.Get finds them and an upstream's own fields merge with them; field
// names are case-insensitive on the wire.
const (
	hdrPolicy     = "Ratelimit-Policy"
	hdrLimit      = "Ratelimit"
	hdrXLimit     = "X-Ratelimit-Limit"
	hdrXRemaining = "X-Ratelimit-Remaining"
	hdrXReset     = "X-Ratelimit-Reset"
	hdrRetryAfter = "Retry-After"
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

// validName reports whether a rule name can appear in the headers as it is.
func validName(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return s != ""
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
	return clampSF(int64((d + time.Second - 1) / time.Second))
}

func clampSF(v int64) int64 { return min(max(v, 0), maxSFInt) }

// retryAfterSeconds is the Retry-After of a refusal: whole seconds rounded
// up, so a client that obeys it is never early, and at least 1.
func retryAfterSeconds(d time.Duration) int64 { return max(ceilSeconds(d), 1) }

// mostConstraining returns the index of the hit the conventional headers
// describe: fewest remaining, ties broken by the soonest reset.
func mostConstraining(hits []hit) int {
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

// setRateLimitHeaders sets the header families of mode on h from the
// decisions in hits (one per matching rule, in configuration order). wall
// is the wall clock, for X-RateLimit-Reset only. It makes two allocations:
// one string holding every computed value, and one array holding every
// header's value slice.
func setRateLimitHeaders(h http.Header, mode headerMode, hits []hit, wall time.Time) {
	if mode == 0 || len(hits) == 0 {
		return
	}
	var buf [512]byte
	b := buf[:0]
	type span struct{ from, to int } // a value's place in b
	var pol, lim, rem, reset span
	policy := "" // RateLimit-Policy when it needs no formatting
	nvals := 0
	if mode&headersIETF != 0 {
		nvals += 2
		if len(hits) == 1 {
			policy = hits[0].r.hdr.policyItem
		} else {
			pol.from = len(b)
			for i := range hits {
				if i > 0 {
					b = append(b, ", "...)
				}
				b = append(b, hits[i].r.hdr.policyItem...)
			}
			pol.to = len(b)
		}
		lim.from = len(b)
		for i := range hits {
			if i > 0 {
				b = append(b, ", "...)
			}
			r, t := limitValues(&hits[i].d)
			b = appendLimitItem(b, hits[i].r.hdr.quotedName, r, t)
		}
		lim.to = len(b)
	}
	var most *hit
	if mode&headersX != 0 {
		nvals += 3
		most = &hits[mostConstraining(hits)]
		r, t := limitValues(&most.d)
		rem.from = len(b)
		b = strconv.AppendInt(b, r, 10)
		rem.to = len(b)
		reset.from = len(b)
		b = strconv.AppendInt(b, unixCeil(wall, t), 10)
		reset.to = len(b)
	}
	s := string(b)
	vals := make([]string, nvals)
	n := 0
	put := func(name, v string) {
		vals[n] = v
		h[name] = vals[n : n+1 : n+1] // capped: an Add by next cannot overwrite a neighbour
		n++
	}
	if mode&headersIETF != 0 {
		if policy == "" {
			policy = s[pol.from:pol.to]
		}
		put(hdrPolicy, policy)
		put(hdrLimit, s[lim.from:lim.to])
	}
	if most != nil {
		put(hdrXLimit, most.r.hdr.limitText)
		put(hdrXRemaining, s[rem.from:rem.to])
		put(hdrXReset, s[reset.from:reset.to])
	}
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
// draft-ietf-httpapi-ratelimit-headers, the draft whose fields this package
// sends, so a client that speaks the draft recognises it; a full table is
// nothing a client can act on beyond the status code, which is what
// "about:blank" means (RFC 9457 §4.2.1).
const (
	problemQuotaExceeded = "https://iana.org/assignments/http-problem-types#quota-exceeded"
	problemBlank         = "about:blank"
)

// writeProblem answers a refused request: status (429 or 503), the
// Retry-After of the rule that refused (refusing, one of hits), and an RFC
// 9457 problem+json body that names the rule and when to retry, and
// nothing about internals; a 429 also lists every rule that refused
// (violated-policies, as the draft's problem type defines it). The
// rate-limit headers are already on w.
func writeProblem(w http.ResponseWriter, status int, refusing *hit, hits []hit) {
	secs := retryAfterSeconds(refusing.d.RetryAfter)
	var buf [512]byte
	b := append(buf[:0], `{"type":`...)
	title, typ := "Too Many Requests", problemQuotaExceeded
	if status == http.StatusServiceUnavailable {
		title, typ = "Service Unavailable", problemBlank
	}
	b = appendJSONString(b, typ)
	b = append(b, `,"title":`...)
	b = appendJSONString(b, title)
	b = append(b, `,"status":`...)
	b = strconv.AppendInt(b, int64(status), 10)
	b = append(b, `,"detail":"rate limit \"`...)
	b = appendJSONText(b, refusing.r.name)
	if status == http.StatusServiceUnavailable {
		b = append(b, `\" is temporarily unavailable; retry in `...)
	} else {
		b = append(b, `\" exceeded; retry in `...)
	}
	b = strconv.AppendInt(b, secs, 10)
	if secs == 1 {
		b = append(b, ` second"`...)
	} else {
		b = append(b, ` seconds"`...)
	}
	if status == http.StatusTooManyRequests {
		b = append(b, `,"violated-policies":[`...)
		n := 0
		for i := range hits {
			if hits[i].refused {
				if n > 0 {
					b = append(b, ',')
				}
				b = appendJSONString(b, hits[i].r.name)
				n++
			}
		}
		b = append(b, ']')
	}
	b = append(b, "}\n"...)

	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set(hdrRetryAfter, strconv.FormatInt(secs, 10))
	h.Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(status)
	_, _ = w.Write(b) // the client went away: nothing to do
}

// appendJSONString appends s as a JSON string.
func appendJSONString(dst []byte, s string) []byte {
	dst = append(dst, '"')
	dst = appendJSONText(dst, s)
	return append(dst, '"')
}

// appendJSONText appends s escaped for the inside of a JSON string. Rule
// names are printable ASCII (New checks), but the escaping is complete
// anyway.
func appendJSONText(dst []byte, s string) []byte {
	const hex = "0123456789abcdef"
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '"' || c == '\\':
			dst = append(dst, '\\', c)
		case c < 0x20:
			dst = append(dst, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
		case c > 0x7e:
			dst = append(dst, '?') // as in the headers: no broken UTF-8
		default:
			dst = append(dst, c)
		}
	}
	return dst
}
