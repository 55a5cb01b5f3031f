package engine

import (
	"bytes"
	"testing"
)

// TestTrimOWS checks trimOWS against bytes.Trim with its cutset.
func TestTrimOWS(t *testing.T) {
	for _, s := range []string{"", " ", "\t \t", "a", " a", "a\t", " \ta b\t ", "\v a \r", "keep-alive", " chunked"} {
		if got, want := trimOWS([]byte(s)), bytes.Trim([]byte(s), " \t"); !bytes.Equal(got, want) {
			t.Errorf("trimOWS(%q) = %q, want %q", s, got, want)
		}
	}
}
