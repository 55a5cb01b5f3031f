package clientip

import (
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
func QueryValue(q, name string, scratch []byte) (value []byte, n int) {
	for q != "" {
		var pair string
		pair, q, _ = strings.Cut(q, "&")
		k, v, _ := strings.Cut(pair, "=")
		if !sameDecoded(k, name) {
			continue
		}
		n++
		if n == 1 {
			value = appendDecoded(scratch[:0], v)
		}
	}
	return value, n
}

// sameDecoded reports whether the query component s decodes to name.
func sameDecoded(s, name string) bool {
	if strings.IndexByte(s, '%') < 0 && strings.IndexByte(s, '+') < 0 {
		return s == name
	}
	var buf [64]byte
	d := appendDecoded(buf[:0], s)
	return string(d) == name
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
