package jsonstring

// NonASCII says what a byte at 0x7f or above becomes.
type NonASCII uint8

const (
	// Latin1 writes the byte as \u00HH, its Latin-1 reading: nothing a
	// client sent is lost (the access log).
	Latin1 NonASCII = iota
	// Replace writes '?': for text that should be ASCII, where a broken
	// UTF-8 sequence must never reach a client's parser (a problem's
	// members).
	Replace
)

// Append appends s as a JSON string: quoted, then escaped as by
// [AppendText].
func Append[S string | []byte](dst []byte, s S, n NonASCII) []byte {
	dst = append(dst, '"')
	dst = AppendText(dst, s, n)
	return append(dst, '"')
}

// AppendText appends s escaped for the inside of a JSON string: '"' and
// '\' after a backslash, control bytes as \u00HH, a byte at 0x7f or above
// as n says.
func AppendText[S string | []byte](dst []byte, s S, n NonASCII) []byte {
	const hex = "0123456789abcdef"
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '"' || c == '\\':
			dst = append(dst, '\\', c)
		case c < 0x20 || c >= 0x7f && n == Latin1:
			dst = append(dst, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
		case c >= 0x7f:
			dst = append(dst, '?')
		default:
			dst = append(dst, c)
		}
	}
	return dst
}
