package clientip

import (
	"bytes"
	"strings"

	"github.com/preforkd/preforkd/internal/httpfield"
)

// CookieValue returns the value of the first cookie called name in the
// Cookie header lines (RFC 6265 §4.2: "a=1; b=2"), with the double quotes
// of a quoted value removed, and whether there is one. Malformed pairs are
// skipped. It does not allocate.
func CookieValue(lines []string, name string) (string, bool) {
	for _, line := range lines {
		for line != "" {
			var pair string
			pair, line, _ = strings.Cut(line, ";")
			k, v, ok := strings.Cut(pair, "=")
			if !ok || httpfield.TrimOWS(k) != name {
				continue
			}
			v = httpfield.TrimOWS(v)
			if len(v) >= 2 && v[0] == '"' && v[len(v)-1] == '"' {
				v = v[1 : len(v)-1]
			}
			return v, true
		}
	}
	return "", false
}

// QueryValue returns the value of the query parameter called name in the
// raw query q ("a=1&b=2", no '?'), percent-decoded with '+' as a space
// (as HTML forms encode it), and how many times q has the parameter. Names
// are compared decoded too, so that "%61pi_key" is "api_key". A decoded
// value is appended to scratch (which the result may alias); an invalid
// escape is kept as it is. It does not allocate when scratch has room.
//
// n counts every copy that an application's parser may read as the
// parameter, so that n > 1 whenever the application may read another
// value than this one:
//   - a parameter whose name PHP reads as name (see phpName):
//     "api.key", "api+key", "api[key" are all PHP's api_key, and PHP
//     keeps the last;
//   - in a pair with a ';' ("x=1;api_key=k", "api_key=k;x"), a parameter
//     called name before or after that ';' counts twice: Rack before 3
//     and Python before 3.9.2 split pairs at ';' as well as '&', so that
//     they read "k" where the others read nothing, or "k;x".
//
// The value is the first copy's as a pair between '&'s, with its exact
// name: what most parsers read when there is one copy.
func QueryValue(q, name string, scratch []byte) (value []byte, n int) {
	found := false
	for q != "" {
		var pair string
		pair, q, _ = strings.Cut(q, "&")
		k, v, _ := strings.Cut(pair, "=")
		if sameDecoded(k, name) {
			n++
			if !found {
				value, found = appendDecoded(scratch[:0], v), true
			}
		} else if phpName(k, name) {
			n++
		}
		if strings.IndexByte(pair, ';') >= 0 {
			for part := range strings.SplitSeq(pair, ";") {
				if k, _, _ := strings.Cut(part, "="); sameDecoded(k, name) {
					n += 2
				}
			}
		}
	}
	return value, n
}

// sameDecoded reports whether the query component s decodes to name.
func sameDecoded(s, name string) bool {
	if len(s) < len(name) { // decoding only shortens
		return false
	}
	if strings.IndexByte(s, '%') < 0 && strings.IndexByte(s, '+') < 0 {
		return s == name
	}
	var buf [64]byte
	d := appendDecoded(buf[:0], s)
	return string(d) == name
}

// phpName reports whether PHP reads the query component s as the
// parameter name (whose '.'s PHP reads as '_' too), as PHP 8 does (PHP 7
// reads fewer names so; it leaves the ' ', '.' and '[' after a first '['
// as they are, and name has none to match them): decoded, cut at a NUL,
// without leading spaces, and with each ' ', '.' and '[' read as '_',
// unless a ']' follows the first '[' (then it is an array).
func phpName(s, name string) bool {
	if len(s) < len(name) || !strings.ContainsAny(s, "%+. [") && strings.IndexByte(name, '.') < 0 {
		return false // the common case: s reads as itself, not name
	}
	var buf [64]byte
	d := appendDecoded(buf[:0], s)
	if i := bytes.IndexByte(d, 0); i >= 0 {
		d = d[:i]
	}
	for len(d) > 0 && d[0] == ' ' {
		d = d[1:]
	}
	if len(d) != len(name) {
		return false
	}
	if i := bytes.IndexByte(d, '['); i >= 0 && bytes.IndexByte(d[i+1:], ']') >= 0 {
		return false
	}
	for i, c := range d {
		if c == ' ' || c == '.' || c == '[' {
			c = '_'
		}
		want := name[i]
		if want == '.' {
			want = '_'
		}
		if c != want {
			return false
		}
	}
	return true
}

// appendDecoded appends s with %XX escapes and '+' decoded.
func appendDecoded(dst []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '+':
			dst = append(dst, ' ')
		case c == '%' && i+2 < len(s) && isHex(s[i+1]) && isHex(s[i+2]):
			dst = append(dst, unhex(s[i+1])<<4|unhex(s[i+2]))
			i += 2
		default:
			dst = append(dst, c)
		}
	}
	return dst
}

func isHex(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
}

func unhex(c byte) byte {
	switch {
	case c >= 'a':
		return c - 'a' + 10
	case c >= 'A':
		return c - 'A' + 10
	}
	return c - '0'
}
