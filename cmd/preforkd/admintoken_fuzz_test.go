package main

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/net/http/httpguts"
)

// FuzzReadToken: a token the file gives is one a client can send: a
// field value net/http passes on, that bearer reads back whole. A token
// no request can carry would leave the actions locked with the start
// reporting nothing wrong.
func FuzzReadToken(f *testing.F) {
	for _, s := range []string{"0123456789abcdef0123\n", "  0123456789abcdef0123  \r\n", "short\n", "0123456789 abcdef0123", "0123456789abcdef\x00123",
		"0123456789abcdef\x0b0123", "0123456789abcdef\u00e90123", "\x0c0123456789abcdef0123\x0c"} {
		f.Add(s)
	}
	path := filepath.Join(f.TempDir(), "token")
	f.Fuzz(func(t *testing.T, content string) {
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		tok, err := readToken(path)
		if err != nil {
			return
		}
		v := "Bearer " + string(tok)
		if !httpguts.ValidHeaderFieldValue(v) {
			t.Fatalf("token %q accepted: no request carries it", tok)
		}
		if got, ok := bearer(v); !ok || got != string(tok) {
			t.Fatalf("token %q accepted, but a request carrying it gives %q", tok, got)
		}
	})
}
