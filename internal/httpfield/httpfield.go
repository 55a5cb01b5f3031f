package httpfield

import "strings"

// TrimOWS drops the optional whitespace (SP, HTAB) around a field value;
// other bytes, CR and LF among them, are kept. Unlike bytes.Trim, it makes
// no set of the cutset at each call.
func TrimOWS[T string | []byte](s T) T {
	for len(s) > 0 && (s[0] == ' ' || s[0] == '\t') {
		s = s[1:]
	}
	for len(s) > 0 && (s[len(s)-1] == ' ' || s[len(s)-1] == '\t') {
		s = s[:len(s)-1]
	}
	return s
}

// HasToken reports whether the comma-separated list of the field lines
// lines (Connection, Upgrade) has token, in any case.
func HasToken(lines []string, token string) bool {
	for _, line := range lines {
		for item := range strings.SplitSeq(line, ",") {
			if strings.EqualFold(TrimOWS(item), token) {
				return true
			}
		}
	}
	return false
}
