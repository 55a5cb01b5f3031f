package httpfield_test

import (
	"testing"

	"github.com/preforkd/preforkd/internal/httpfield"
)

func TestTrimOWS(t *testing.T) {
	for _, tt := range []struct{ in, want string }{
		{"", ""},
		{"a", "a"},
		{" \t a b \t ", "a b"},
		{"\t\t", ""},
		{"a\t", "a"},
		{" \ta", "a"},
		{"\r\na\r\n", "\r\na\r\n"}, // not OWS
		{"\va\f", "\va\f"},
		{"\u00a0a", "\u00a0a"}, // nor is a non-ASCII space
	} {
		if got := httpfield.TrimOWS(tt.in); got != tt.want {
			t.Errorf("TrimOWS(%q) = %q, want %q", tt.in, got, tt.want)
		}
		if got := httpfield.TrimOWS([]byte(tt.in)); string(got) != tt.want {
			t.Errorf("TrimOWS([]byte(%q)) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func TestHasToken(t *testing.T) {
	for _, tt := range []struct {
		lines []string
		token string
		want  bool
	}{
		{nil, "close", false},
		{[]string{"close"}, "close", true},
		{[]string{"keep-alive, Upgrade"}, "upgrade", true},
		{[]string{"keep-alive", " \tX-Foo\t "}, "x-foo", true},
		{[]string{"x-foo-bar"}, "x-foo", false},
		{[]string{",,"}, "", true}, // an empty item is a token of none but ""
		{[]string{"a b"}, "a", false},
	} {
		if got := httpfield.HasToken(tt.lines, tt.token); got != tt.want {
			t.Errorf("HasToken(%q, %q) = %v, want %v", tt.lines, tt.token, got, tt.want)
		}
	}
}
