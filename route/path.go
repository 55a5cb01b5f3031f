package route

import (
	"errors"
	"path"
	"strings"
)

// ErrBadPath is wrapped by every error of [Normalize]: the path is one that
// applications disagree about, so preforkd refuses it (400) rather than
// guess which of them it is talking to.
var ErrBadPath = errors.New("route: bad request path")

// badPath is the reason for one refusal. Refusals are constants, so a
// flood of bad paths costs no allocation.
type badPath string

func (e badPath) Error() string { return "route: bad request path: " + string(e) }
func (e badPath) Unwrap() error { return ErrBadPath }

// PathReason is why [Normalize] refused a path, as said to the client
// ("encoded slash (%2F)"); "" for an error that is not one of its.
func PathReason(err error) string {
	if b, ok := errors.AsType[badPath](err); ok {
		return string(b)
	}
	return ""
}

const (
	errNotAbsolute      badPath = "does not start with /"
	errBackslash        badPath = "backslash"
	errEncodedSlash     badPath = "encoded slash (%2F)"
	errEncodedBackslash badPath = "encoded backslash (%5C)"
	errNUL              badPath = "encoded NUL (%00)"
	errEncodedControl   badPath = "encoded control byte"
	errControl          badPath = "control byte"
	errPercent          badPath = "bad percent-encoding"
	errQuery            badPath = "'?' in path (split off the query first)"
	errFragment         badPath = "'#' in path"
	errDotParams        badPath = "a dot segment with ';' parameters (\"..;\")"
)

// Normalize reads raw, a request path as sent on the wire (percent-encoded,
// the query already split off at the first '?'), and returns the path that
// routes match against and the path to forward upstream.
//
// The match path is the forward path with percent-encodings of unreserved
// characters (A-Z a-z 0-9 - . _ ~) decoded, other encodings upper-cased,
// other bytes percent-encoded, each segment's ';' parameters and trailing
// dots dropped, dot segments removed, and no empty segment and no trailing
// '/' (the root is "/"). It keeps its case: [Route.Match] folds it.
//
// The forward path is raw with its dot segments ("." and "..", also spelt
// "%2e") removed and repeated slashes merged, as Envoy's normalize_path and
// merge_slashes do; everything else (parameters, encodings, case, trailing
// dots, a trailing '/') is as sent. The match path is computed from the
// forward path, so the application can only receive what was matched.
//
// The error wraps [ErrBadPath] when raw does not start with '/', or holds a
// backslash, a control byte, '?', '#', a bad percent-encoding, or an
// encoded '/', '\', NUL or other control byte. An empty raw is "/".
//
// Normalize does not allocate when raw is its own match path, nor when the
// match path is a prefix of the forward path and raw is short (a trailing
// '/', a final ";jsessionid=…").
func Normalize(raw string) (match, forward string, err error) {
	if raw == "" {
		return "/", "/", nil // RFC 9110 §4.2.3: an empty path is "/"
	}
	if raw[0] != '/' {
		return "", "", errNotAbsolute
	}
	normal := true  // raw is its own match path and forward path
	dotted := false // a segment of raw is empty or starts with a dot: the forward path may differ
	prev := byte('/')
	seg := 1 // where the current segment starts
	for i := 1; i < len(raw); i++ {
		c := raw[i]
		switch {
		case c == ';':
			// "..;" is ".." to Tomcat, Jetty and Spring, which drop the
			// parameters, and a name to net/http, nginx and Express: a
			// rule on /admin/* would not count /admin/..;/login, which
			// they route under /admin/.
			if dots(raw[seg:i]) > 0 {
				return "", "", errDotParams
			}
			normal = false
		case c == '.':
			dotted = dotted || prev == '/'
		case isUnreserved(c):
		case c == '/':
			if prev == '/' || prev == '.' {
				normal = false // empty segment, or one ending in '.'
				dotted = dotted || prev == '/'
			}
			seg = i + 1
		case c == '%':
			if i+2 >= len(raw) {
				return "", "", errPercent
			}
			v, ok := unhex2(raw[i+1], raw[i+2])
			switch {
			case !ok:
				return "", "", errPercent
			case v == 0:
				return "", "", errNUL
			case v == '/':
				return "", "", errEncodedSlash
			case v == '\\':
				return "", "", errEncodedBackslash
			case v < 0x20 || v == 0x7f:
				return "", "", errEncodedControl
			}
			normal = false
			dotted = dotted || prev == '/' && v == '.'
			i += 2
		case c < 0x20 || c == 0x7f:
			return "", "", errControl
		case c == '\\':
			return "", "", errBackslash
		case c == '?':
			return "", "", errQuery
		case c == '#':
			return "", "", errFragment
		default:
			normal = false
		}
		prev = c
	}
	if normal && prev != '.' && (prev != '/' || len(raw) == 1) {
		return raw, raw, nil
	}

	// Build both into stack buffers; only a result that is not a prefix
	// of what we already hold is copied to the heap.
	forward = raw
	if dotted {
		var fbuf [256]byte
		if f := appendForward(fbuf[:0], raw); string(f) != raw {
			forward = string(f)
		}
	}
	var mbuf [256]byte
	m := appendMatch(mbuf[:0], forward)
	if len(m) <= len(forward) && string(m) == forward[:len(m)] {
		return forward[:len(m)], forward, nil
	}
	return string(m), forward, nil
}

// appendForward appends p with dot segments removed and repeated slashes
// merged (RFC 3986 §5.2.4 remove_dot_segments, after Envoy). A final "/",
// "." or ".." leaves a trailing '/', as in RFC 3986. It requires p to start
// with '/' and to have passed Normalize's checks.
func appendForward(dst []byte, p string) []byte {
	base := len(dst)
	dst = append(dst, '/') // dst is "/" and "segment/" for each kept segment
	trailing := false
	for i := 1; ; {
		j := segmentEnd(p, i)
		seg := p[i:j]
		trailing = true
		switch dots(seg) {
		case 1:
		case 2:
			dst = popSegment(dst, base)
		default:
			if seg != "" {
				dst = append(dst, seg...)
				dst = append(dst, '/')
				trailing = false
			}
		}
		if j == len(p) {
			break
		}
		i = j + 1
	}
	if !trailing {
		dst = dst[:len(dst)-1]
	}
	return dst
}

// appendMatch appends the match path of p (see Normalize). It requires p to
// start with '/' and to have passed Normalize's checks.
func appendMatch(dst []byte, p string) []byte {
	base := len(dst)
	dst = append(dst, '/')
	for i := 1; ; {
		j := segmentEnd(p, i)
		seg := p[i:j]
		if k := strings.IndexByte(seg, ';'); k >= 0 {
			seg = seg[:k] // Tomcat, Jetty and Spring ignore ";params"
		}
		start := len(dst)
		// Unreserved characters decoded, every other byte percent-encoded
		// with upper-case hex digits: encoding the bytes a client may send
		// raw (":", "@", UTF-8) lets "/@me" and "/%40me" match one route,
		// as they reach one handler in applications that decode the path
		// before routing. (seg holds no '/': an encoded one was refused.)
		dst = AppendSpelling(dst, seg)
		switch string(dst[start:]) {
		case ".":
			dst = dst[:start]
		case "..":
			dst = popSegment(dst[:start], base)
		default:
			// IIS (the Windows file system) ignores trailing dots.
			for len(dst) > start && dst[len(dst)-1] == '.' {
				dst = dst[:len(dst)-1]
			}
			if len(dst) > start {
				dst = append(dst, '/')
			}
		}
		if j == len(p) {
			break
		}
		i = j + 1
	}
	if len(dst)-base > 1 {
		dst = dst[:len(dst)-1]
	}
	return dst
}

// AppendSpelling appends the one spelling of s, a path or a query as sent,
// that every spelling RFC 3986 §6.2.2 holds equivalent shares, and some it
// does not: each valid percent-encoding is decoded, and then every byte
// other than an unreserved character or '/' is percent-encoded with
// upper-case digits. So "/caf%c3%a9?%7Ea" and "/caf%C3%A9?~a" have one
// spelling, and so do "a=b" and "a%3Db", which an application may read
// apart: use it where taking two URLs for one errs safely (an
// invalidation that reaches too far is only an extra miss).
func AppendSpelling(dst []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		j := i
		for j < len(s) && (isUnreserved(s[j]) || s[j] == '/') {
			j++
		}
		if j > i {
			dst = append(dst, s[i:j]...)
			if i = j; i == len(s) {
				break
			}
		}
		c := s[i]
		if c == '%' && i+2 < len(s) {
			if v, ok := unhex2(s[i+1], s[i+2]); ok {
				c = v
				i += 2
			}
		}
		if isUnreserved(c) || c == '/' {
			dst = append(dst, c)
		} else {
			dst = append(dst, '%', upperHex[c>>4], upperHex[c&15])
		}
	}
	return dst
}

// popSegment removes the last segment of dst[base:], which is "/" followed
// by "segment/" for each segment. The root stays: "/.." is "/".
func popSegment(dst []byte, base int) []byte {
	if len(dst)-base <= 1 {
		return dst
	}
	i := len(dst) - 2
	for dst[i] != '/' {
		i--
	}
	return dst[:i+1]
}

// dots reports whether seg is a dot segment: 1 for ".", 2 for "..", where
// each dot may be spelt "%2e" or "%2E" (as Chromium's canonicalizer, and so
// Envoy, reads them); 0 otherwise.
func dots(seg string) int {
	n := 0
	for i := 0; i < len(seg); n++ {
		switch {
		case n == 2:
			return 0
		case seg[i] == '.':
			i++
		case strings.HasPrefix(seg[i:], "%2e") || strings.HasPrefix(seg[i:], "%2E"):
			i += 3
		default:
			return 0
		}
	}
	return n
}

// segmentEnd returns the index of the first '/' in p at or after i, or len(p).
func segmentEnd(p string, i int) int {
	if k := strings.IndexByte(p[i:], '/'); k >= 0 {
		return i + k
	}
	return len(p)
}

// isUnreserved reports whether c is an RFC 3986 unreserved character.
func isUnreserved(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' ||
		c == '-' || c == '.' || c == '_' || c == '~'
}

const upperHex = "0123456789ABCDEF"

// unhex2 decodes two hex digits.
func unhex2(hi, lo byte) (byte, bool) {
	h, ok1 := unhex(hi)
	l, ok2 := unhex(lo)
	return h<<4 | l, ok1 && ok2
}

func unhex(c byte) (byte, bool) {
	switch {
	case '0' <= c && c <= '9':
		return c - '0', true
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10, true
	case 'A' <= c && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}

// Clean returns p, an already-decoded path (r.URL.Path), with "." and ".."
// elements resolved, repeated slashes collapsed and a trailing slash dropped
// (path.Clean). An empty path is "/". It allocates only when the path is not
// already clean.
//
// Deprecated: use [Normalize] on the path as sent. A decoded path has
// already turned "%2F" into '/', so Clean cannot refuse what Normalize
// refuses, and it neither drops ";" parameters and trailing dots nor spells
// characters outside A-Z a-z 0-9 - . _ ~ / the way compiled routes do.
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
