package httpcache

import (
	"math"
	"net/textproto"
	"slices"
	"strings"

	"github.com/preforkd/preforkd/internal/httpfield"
	"github.com/preforkd/preforkd/route"
)

// The parsers of the response cache: Cache-Control (RFC 9111 §5.2), Vary
// (RFC 9110 §12.5.5), cache tags (Cache-Tag, Surrogate-Key) and entity
// tags (RFC 9110 §8.8.3). Each reads field values as sent and never
// fails: what it cannot read is what a cache must assume of it.

// MaxDelta is what a delta-seconds value too large to represent counts
// as (RFC 9111 §1.2.2).
const MaxDelta = 1 << 31

// Directives is what a response's Cache-Control says to a shared cache.
// Durations are in seconds; -1 means absent.
type Directives struct {
	NoStore, NoCache, Private, Public bool
	MustRevalidate, ProxyRevalidate   bool
	MustUnderstand                    bool
	MaxAge, SMaxAge                   int64
	SWR, SIE                          int64 // stale-while-revalidate, stale-if-error
}

// ParseCacheControl reads the Cache-Control field lines. Directive names
// are case-insensitive; a directive given twice counts once, with its
// first value (RFC 9111 §4.2.1 allows either that or treating the
// response as stale). A freshness value that is not a delta-seconds
// (max-age=soon, max-age="") counts as 0, so the response is stale: a
// cache must not guess at a lifetime. no-cache and private with field
// names ("no-cache=Set-Cookie") are taken as the unqualified directives:
// stricter than the field-by-field reading, never looser; so are the
// restrictions in directives run together with ';' or blanks (restrict).
func ParseCacheControl(lines []string) Directives {
	cc := Directives{MaxAge: -1, SMaxAge: -1, SWR: -1, SIE: -1}
	for _, line := range lines {
		for rest := line; rest != ""; {
			var name, value string
			name, value, rest = nextDirective(rest)
			flag, delta := cc.directive(strings.ToLower(name))
			switch {
			case flag != nil:
				*flag = true
			case delta != nil && *delta < 0:
				*delta = ParseDelta(value)
			}
			if strings.ContainsAny(name, runTogether) || strings.ContainsAny(value, runTogether) {
				cc.restrict(name + ";" + value)
			}
		}
	}
	return cc
}

// runTogether are what separate directives written without their
// commas: ';', and blanks.
const runTogether = "; \t"

// restrict sets the directives that restrict a cache (never one that
// loosens: a freshness, public, must-understand) named in the parts,
// separated by ';' or blanks, of a directive that is not one: "private;
// max-age=600" and "private max-age=600" are what an application that
// means private writes by mistake, and nginx and Varnish's built-in
// rules honour it anywhere in the field. Read as an unknown directive,
// it would let the response be stored and served to everyone by
// Expires or a heuristic.
func (d *Directives) restrict(s string) {
	for part := range strings.FieldsFuncSeq(s, func(r rune) bool { return strings.ContainsRune(runTogether, r) }) {
		name, _, _ := strings.Cut(part, "=")
		switch name = strings.ToLower(name); name {
		case "no-store", "no-cache", "private", "must-revalidate", "proxy-revalidate":
			flag, _ := d.directive(name)
			*flag = true
		}
	}
}

// directive is where d keeps the directive of a lower-case name: flag
// for one that is present or not, delta for one with delta-seconds; both
// nil for an extension. Cache-Control and the targeted fields share it,
// so that a directive this cache learns is learnt by both.
func (d *Directives) directive(name string) (flag *bool, delta *int64) {
	switch name {
	case "no-store":
		return &d.NoStore, nil
	case "no-cache":
		return &d.NoCache, nil
	case "private":
		return &d.Private, nil
	case "public":
		return &d.Public, nil
	case "must-revalidate":
		return &d.MustRevalidate, nil
	case "proxy-revalidate":
		return &d.ProxyRevalidate, nil
	case "must-understand":
		return &d.MustUnderstand, nil
	case "max-age":
		return nil, &d.MaxAge
	case "s-maxage":
		return nil, &d.SMaxAge
	case "stale-while-revalidate":
		return nil, &d.SWR
	case "stale-if-error":
		return nil, &d.SIE
	}
	return nil, nil
}

// nextDirective splits the first directive off a Cache-Control value:
// token [ "=" ( token / quoted-string ) ], then a comma. Blanks around
// names, values and commas are skipped; a quoted value keeps its escapes
// resolved.
func nextDirective(s string) (name, value, rest string) {
	s = strings.TrimLeft(s, " \t,")
	i := 0
	for i < len(s) && s[i] != '=' && s[i] != ',' {
		i++
	}
	name = strings.TrimRight(s[:i], " \t")
	if i == len(s) || s[i] == ',' {
		return name, "", s[i:]
	}
	s = strings.TrimLeft(s[i+1:], " \t")
	if s != "" && s[0] == '"' {
		var b strings.Builder
		j := 1
		for ; j < len(s) && s[j] != '"'; j++ {
			if s[j] == '\\' && j+1 < len(s) {
				j++
			}
			b.WriteByte(s[j])
		}
		if j < len(s) {
			j++ // the closing quote
		}
		rest = s[j:]
		if k := strings.IndexByte(rest, ','); k >= 0 {
			rest = rest[k:]
		} else {
			rest = ""
		}
		return name, b.String(), rest
	}
	j := 0
	for j < len(s) && s[j] != ',' {
		j++
	}
	return name, strings.TrimRight(s[:j], " \t"), s[j:]
}

// ParseDelta reads delta-seconds (1*DIGIT), quoted or not: senders write
// max-age="60", which RFC 9111 §5.2 asks recipients to accept. Anything
// else is 0; too large a value is MaxDelta.
func ParseDelta(v string) int64 {
	if v == "" {
		return 0
	}
	var n int64
	for i := 0; i < len(v); i++ {
		c := v[i]
		if c < '0' || c > '9' {
			return 0
		}
		if n < MaxDelta {
			n = n*10 + int64(c-'0')
		}
	}
	return min(n, MaxDelta)
}

// ParseAge reads the Age field lines (RFC 9111 §5.1) as a recipient of
// a list would: the lines make one list, and its first member counts
// ("Age: 7200, 0" is 7200 seconds old). A first member that is not
// delta-seconds (a negative number, a fraction, a word) makes the field
// count as absent: ok is false.
func ParseAge(lines []string) (seconds int64, ok bool) {
	if len(lines) == 0 {
		return 0, false
	}
	first, _, _ := strings.Cut(lines[0], ",")
	first = httpfield.TrimOWS(first)
	if first == "" {
		return 0, false
	}
	for i := 0; i < len(first); i++ {
		if first[i] < '0' || first[i] > '9' {
			return 0, false
		}
	}
	return ParseDelta(first), true
}

// ParseVary reads the Vary field lines: the request field names a
// response varies on, canonical ("Accept-Encoding"), sorted, each once;
// star reports a "*" (the response varies on something no request field
// shows, so a stored copy never matches). Names are separated by commas
// or blanks: "Accept-Encoding Cookie" is two, as nginx and Varnish read
// it, not one name no request has, which every request would match. A
// member that is not a field name ("Cookie;") counts as "*": what the
// response varies on is not known.
func ParseVary(lines []string) (names []string, star bool) {
	for _, line := range lines {
		for f := range strings.FieldsFuncSeq(line, func(r rune) bool { return r == ',' || r == ' ' || r == '\t' }) {
			switch {
			case f == "*", !route.IsToken(f):
				star = true
			default:
				names = append(names, textproto.CanonicalMIMEHeaderKey(f))
			}
		}
	}
	slices.Sort(names)
	return slices.Compact(names), star
}

// MaxTags bounds the tags one entry keeps a generation of. A response
// with more is not stored: a purge of a tag it could not keep would miss
// it, and a purge that misses is the one thing a tag must never do.
const MaxTags = 32

// MaxTagLen bounds one tag; a response with a longer one is not stored,
// for the same reason.
const MaxTagLen = 1024

// AppendTags appends the tags of the tag field lines to dst: values
// separated by commas (Cache-Tag) or blanks (Surrogate-Key), either in
// either field, each as sent (never decoded: a purge names the same
// bytes), each once. ok is false when there are more than MaxTags or one
// is longer than MaxTagLen.
func AppendTags(dst []string, lines []string) (_ []string, ok bool) {
	for _, line := range lines {
		for rest := line; rest != ""; {
			i := strings.IndexAny(rest, ", \t")
			tag := rest
			if i >= 0 {
				tag, rest = rest[:i], rest[i+1:]
			} else {
				rest = ""
			}
			switch {
			case tag == "" || slices.Contains(dst, tag):
			case len(tag) > MaxTagLen || len(dst) == MaxTags:
				return dst, false
			default:
				dst = append(dst, tag)
			}
		}
	}
	return dst, true
}

// ETagMatch reports whether the If-None-Match field lines list etag, by
// the weak comparison (RFC 9110 §8.8.3.2: W/ is ignored on both sides), or
// are "*", which any representation matches, one without an ETag (etag
// "", or not an entity-tag) too (RFC 9110 §13.1.2). An entity-tag is W/?
// and a quoted opaque-tag, which may hold commas; list elements that are
// not entity-tags are skipped.
func ETagMatch(lines []string, etag string) bool {
	want, ok := opaqueTag(httpfield.TrimOWS(etag))
	for _, line := range lines {
		s := line
		for {
			s = strings.TrimLeft(s, " \t,")
			if s == "" {
				break
			}
			if s[0] == '*' {
				return true
			}
			s = strings.TrimPrefix(s, "W/")
			if s == "" || s[0] != '"' {
				// Not an entity-tag: skip to the next element.
				if i := strings.IndexByte(s, ','); i >= 0 {
					s = s[i:]
					continue
				}
				break
			}
			end := strings.IndexByte(s[1:], '"')
			if end < 0 {
				break
			}
			if ok && s[1:1+end] == want {
				return true
			}
			s = s[end+2:]
		}
	}
	return false
}

// opaqueTag is the opaque-tag of an entity-tag without its quotes (and
// without W/).
func opaqueTag(etag string) (string, bool) {
	etag = strings.TrimPrefix(etag, "W/")
	if len(etag) < 2 || etag[0] != '"' || etag[len(etag)-1] != '"' || strings.IndexByte(etag[1:len(etag)-1], '"') >= 0 {
		return "", false
	}
	return etag[1 : len(etag)-1], true
}

// SameTag reports whether two entity-tags have the same opaque-tag,
// whether either is weak: a 304 that names another tag than the stored
// response's does not validate it (RFC 9111 §4.3.4).
func SameTag(a, b string) bool {
	ta, ok1 := opaqueTag(httpfield.TrimOWS(a))
	tb, ok2 := opaqueTag(httpfield.TrimOWS(b))
	return ok1 && ok2 && ta == tb
}

// ParseByteRange reads a Range field value of one byte range (RFC 9110
// §14.1.2): "bytes=first-last", "bytes=first-" (last is then MaxInt64)
// or "bytes=-suffix" (suffix reports it; last is its length). ok is
// false for anything else: another unit, several ranges, first after
// last, a number that is not one.
func ParseByteRange(v string) (first, last int64, suffix, ok bool) {
	v = httpfield.TrimOWS(v)
	if len(v) < 6 || !equalFold(v[:6], "bytes=") {
		return 0, 0, false, false
	}
	v = httpfield.TrimOWS(v[6:])
	a, b, found := strings.Cut(v, "-")
	if !found || strings.IndexByte(b, ',') >= 0 {
		return 0, 0, false, false
	}
	a, b = httpfield.TrimOWS(a), httpfield.TrimOWS(b)
	num := func(s string) (int64, bool) {
		if s == "" || len(s) > 18 {
			return 0, false
		}
		var n int64
		for i := 0; i < len(s); i++ {
			if s[i] < '0' || s[i] > '9' {
				return 0, false
			}
			n = n*10 + int64(s[i]-'0')
		}
		return n, true
	}
	if a == "" {
		if n, ok := num(b); ok {
			return 0, n, true, true
		}
		return 0, 0, false, false
	}
	first, ok = num(a)
	if !ok {
		return 0, 0, false, false
	}
	if b == "" {
		return first, math.MaxInt64, false, true
	}
	last, ok = num(b)
	if !ok || last < first {
		return 0, 0, false, false
	}
	return first, last, false, true
}
