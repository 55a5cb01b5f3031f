package core

import (
	"net/textproto"
	"slices"
	"strings"
)

// The parsers of the response cache: Cache-Control (RFC 9111 §5.2), Vary
// (RFC 9110 §12.5.5), cache tags (Cache-Tag, Surrogate-Key) and entity
// tags (RFC 9110 §8.8.3). Each reads field values as sent and never
// fails: what it cannot read is what a cache must assume of it.

// maxDelta is what a delta-seconds value too large to represent counts
// as (RFC 9111 §1.2.2).
const maxDelta = 1 << 31

// cacheControl is what a response's Cache-Control says to a shared cache.
// Durations are in seconds; -1 means absent.
type cacheControl struct {
	noStore, noCache, private, public bool
	mustRevalidate, proxyRevalidate   bool
	maxAge, sMaxAge                   int64
	swr, sie                          int64 // stale-while-revalidate, stale-if-error
}

// parseCacheControl reads the Cache-Control field lines. Directive names
// are case-insensitive; a directive given twice counts once, with its
// first value (RFC 9111 §4.2.1 allows either that or treating the
// response as stale). A freshness value that is not a delta-seconds
// (max-age=soon, max-age="") counts as 0, so the response is stale: a
// cache must not guess at a lifetime. no-cache and private with field
// names ("no-cache=Set-Cookie") are taken as the unqualified directives:
// stricter than the field-by-field reading, never looser.
func parseCacheControl(lines []string) cacheControl {
	cc := cacheControl{maxAge: -1, sMaxAge: -1, swr: -1, sie: -1}
	for _, line := range lines {
		for rest := line; rest != ""; {
			var name, value string
			name, value, rest = nextDirective(rest)
			delta := func(p *int64) {
				if *p < 0 {
					*p = parseDelta(value)
				}
			}
			switch strings.ToLower(name) {
			case "no-store":
				cc.noStore = true
			case "no-cache":
				cc.noCache = true
			case "private":
				cc.private = true
			case "public":
				cc.public = true
			case "must-revalidate":
				cc.mustRevalidate = true
			case "proxy-revalidate":
				cc.proxyRevalidate = true
			case "max-age":
				delta(&cc.maxAge)
			case "s-maxage":
				delta(&cc.sMaxAge)
			case "stale-while-revalidate":
				delta(&cc.swr)
			case "stale-if-error":
				delta(&cc.sie)
			}
		}
	}
	return cc
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

// parseDelta reads delta-seconds (1*DIGIT), quoted or not: senders write
// max-age="60", which RFC 9111 §5.2 asks recipients to accept. Anything
// else is 0; too large a value is maxDelta.
func parseDelta(v string) int64 {
	if v == "" {
		return 0
	}
	var n int64
	for i := 0; i < len(v); i++ {
		c := v[i]
		if c < '0' || c > '9' {
			return 0
		}
		if n < maxDelta {
			n = n*10 + int64(c-'0')
		}
	}
	return min(n, maxDelta)
}

// parseVary reads the Vary field lines: the request field names a
// response varies on, canonical ("Accept-Encoding"), sorted, each once;
// star reports a "*" (the response varies on something no request field
// shows, so a stored copy never matches). Names that are not tokens are
// kept as sent: a request never has such a field, so its value is empty.
func parseVary(lines []string) (names []string, star bool) {
	for _, line := range lines {
		for f := range strings.SplitSeq(line, ",") {
			f = trimOWS(f)
			switch {
			case f == "":
			case f == "*":
				star = true
			default:
				names = append(names, textproto.CanonicalMIMEHeaderKey(f))
			}
		}
	}
	slices.Sort(names)
	return slices.Compact(names), star
}

// maxTags bounds the tags one entry keeps a generation of. A response
// with more is not stored: a purge of a tag it could not keep would miss
// it, and a purge that misses is the one thing a tag must never do.
const maxTags = 32

// maxTagLen bounds one tag; a response with a longer one is not stored,
// for the same reason.
const maxTagLen = 1024

// appendTags appends the tags of the tag field lines to dst: values
// separated by commas (Cache-Tag) or blanks (Surrogate-Key), either in
// either field, each as sent (never decoded: a purge names the same
// bytes), each once. ok is false when there are more than maxTags or one
// is longer than maxTagLen.
func appendTags(dst []string, lines []string) (_ []string, ok bool) {
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
			case len(tag) > maxTagLen || len(dst) == maxTags:
				return dst, false
			default:
				dst = append(dst, tag)
			}
		}
	}
	return dst, true
}

// etagMatch reports whether the If-None-Match field lines list etag (or
// "*"), by the weak comparison (RFC 9110 §8.8.3.2: W/ is ignored on both
// sides). An entity-tag is W/? and a quoted opaque-tag, which may hold
// commas; list elements that are not entity-tags are skipped.
func etagMatch(lines []string, etag string) bool {
	want, ok := opaqueTag(trimOWS(etag))
	if !ok {
		return false
	}
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
			if s[1:1+end] == want {
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
