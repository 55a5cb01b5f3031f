package core

import "github.com/preforkd/preforkd/internal/httpfield"

// MaxKeyLen is the longest idempotency key accepted, in bytes (after an
// sf-string's escapes are resolved).
const MaxKeyLen = 255

// keyProblem is what is wrong with an idempotency key header; keyOK is
// nothing.
type keyProblem uint8

const (
	keyOK        keyProblem = iota
	keyMissing              // no field line at all
	keyEmpty                // "" or a blank line
	keyTooLong              // more than MaxKeyLen bytes
	keyControl              // a control character (also HTAB) inside the key
	keyRepeated             // two field lines, or a list ("a", "b")
	keyMalformed            // neither an sf-string nor a bare token
)

// parseKey decodes the key header (its first field line, and how many
// lines there are) and
// appends the key to dst. The key is a structured-field String (RFC 9651
// §3.3.3): `"8e03978e"`, with `\"` and `\\` the only escapes, printable
// ASCII only; or, as many clients send it, a bare token: `8e03978e`, any
// printable ASCII except space, '"', '\\', ',' and ';'. Both spellings of
// one key are the same key. Leading and trailing spaces and tabs are
// optional whitespace and ignored.
//
// Anything else is refused, never guessed at: a second field line or a
// list (a ',' after the key) is keyRepeated, since two keys for one request
// cannot both be honoured; parameters (`"k";a=1`) and trailing text are
// keyMalformed. The key is 1..MaxKeyLen bytes. parseKey does not allocate
// when dst has room.
func parseKey(dst []byte, first string, lines int) ([]byte, keyProblem) {
	switch {
	case lines == 0:
		return dst, keyMissing
	case lines > 1:
		return dst, keyRepeated
	}
	v := httpfield.TrimOWS(first)
	if v == "" {
		return dst, keyEmpty
	}
	start := len(dst)
	if v[0] != '"' {
		for i := 0; i < len(v); i++ {
			switch c := v[i]; {
			case c < 0x20 || c == 0x7f:
				return dst[:start], keyControl
			case c == ',':
				return dst[:start], keyRepeated
			case c == ' ' || c == '"' || c == '\\' || c == ';' || c > 0x7e:
				return dst[:start], keyMalformed
			}
		}
		if len(v) > MaxKeyLen {
			return dst, keyTooLong
		}
		return append(dst, v...), keyOK
	}
	i := 1
	for {
		if i >= len(v) {
			return dst[:start], keyMalformed // unterminated
		}
		c := v[i]
		i++
		if c == '"' {
			break
		}
		switch {
		case c == '\\':
			if i >= len(v) || v[i] != '"' && v[i] != '\\' {
				return dst[:start], keyMalformed
			}
			c = v[i]
			i++
		case c < 0x20 || c == 0x7f:
			return dst[:start], keyControl
		case c > 0x7e:
			return dst[:start], keyMalformed
		}
		if len(dst)-start == MaxKeyLen {
			return dst[:start], keyTooLong
		}
		dst = append(dst, c)
	}
	if rest := httpfield.TrimOWS(v[i:]); rest != "" {
		if rest[0] == ',' {
			return dst[:start], keyRepeated
		}
		return dst[:start], keyMalformed
	}
	if len(dst) == start {
		return dst, keyEmpty
	}
	return dst, keyOK
}
