package httpfield

// TrimOWS drops the optional whitespace (SP, HTAB) around a field value;
// other bytes, CR and LF among them, are kept.
func TrimOWS(s string) string {
	for len(s) > 0 && (s[0] == ' ' || s[0] == '\t') {
		s = s[1:]
	}
	for len(s) > 0 && (s[len(s)-1] == ' ' || s[len(s)-1] == '\t') {
		s = s[:len(s)-1]
	}
	return s
}
