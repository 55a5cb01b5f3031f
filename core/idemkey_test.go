package core

import (
	"bytes"
	"strings"
	"testing"
)

func TestParseKey(t *testing.T) {
	long := strings.Repeat("k", MaxKeyLen)
	tests := []struct {
		name string
		vs   []string
		want string
		p    keyProblem
	}{
		{"sf-string", []string{`"8e03978e"`}, "8e03978e", keyOK},
		{"bare token", []string{`8e03978e`}, "8e03978e", keyOK},
		{"ows around", []string{" \t\"8e03978e\" \t"}, "8e03978e", keyOK},
		{"escapes", []string{`"a\"b\\c"`}, `a"b\c`, keyOK},
		{"space inside a string", []string{`"a b"`}, "a b", keyOK},
		{"uuid", []string{"f81d4fae-7dec-11d0-a765-00a0c91e6bf6"}, "f81d4fae-7dec-11d0-a765-00a0c91e6bf6", keyOK},
		{"base64", []string{"q83vEjRWeJA+/w=="}, "q83vEjRWeJA+/w==", keyOK},
		{"255 bytes bare", []string{long}, long, keyOK},
		{"255 bytes string", []string{`"` + long + `"`}, long, keyOK},
		{"255 bytes with escapes", []string{`"` + strings.Repeat(`\"`, MaxKeyLen) + `"`}, strings.Repeat(`"`, MaxKeyLen), keyOK},

		{"missing", nil, "", keyMissing},
		{"empty line", []string{""}, "", keyEmpty},
		{"blank line", []string{"  \t "}, "", keyEmpty},
		{"empty string", []string{`""`}, "", keyEmpty},
		{"256 bytes bare", []string{long + "k"}, "", keyTooLong},
		{"256 bytes string", []string{`"` + long + `k"`}, "", keyTooLong},
		{"NUL", []string{"a\x00b"}, "", keyControl},
		{"tab inside", []string{"a\tb"}, "", keyControl},
		{"DEL in string", []string{"\"a\x7fb\""}, "", keyControl},
		{"newline in string", []string{"\"a\nb\""}, "", keyControl},
		{"two lines", []string{`"a"`, `"a"`}, "", keyRepeated},
		{"two lines, one empty", []string{`"a"`, ``}, "", keyRepeated},
		{"list of strings", []string{`"a", "b"`}, "", keyRepeated},
		{"list of tokens", []string{`a,b`}, "", keyRepeated},
		{"trailing comma", []string{`"a",`}, "", keyRepeated},
		{"unterminated", []string{`"abc`}, "", keyMalformed},
		{"bad escape", []string{`"a\nb"`}, "", keyMalformed},
		{"escape at end", []string{`"a\`}, "", keyMalformed},
		{"parameters", []string{`"a";x=1`}, "", keyMalformed},
		{"trailing text", []string{`"a" b`}, "", keyMalformed},
		{"space in token", []string{`a b`}, "", keyMalformed},
		{"quote in token", []string{`a"b`}, "", keyMalformed},
		{"semicolon in token", []string{`a;b`}, "", keyMalformed},
		{"non-ASCII token", []string{"caf\xc3\xa9"}, "", keyMalformed},
		{"non-ASCII string", []string{"\"caf\xc3\xa9\""}, "", keyMalformed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, p := parseKey([]byte("prefix"), first(tt.vs), len(tt.vs))
			if p != tt.p {
				t.Fatalf("problem %d, want %d", p, tt.p)
			}
			if !bytes.HasPrefix(got, []byte("prefix")) {
				t.Fatalf("dst's contents lost: %q", got)
			}
			if p == keyOK && string(got[len("prefix"):]) != tt.want {
				t.Fatalf("key %q, want %q", got[len("prefix"):], tt.want)
			}
			if p != keyOK && len(got) != len("prefix") {
				t.Fatalf("refused key left bytes in dst: %q", got)
			}
		})
	}
}

func TestParseKeyDoesNotAllocate(t *testing.T) {
	buf := make([]byte, 0, 512)
	vs := []string{`"f81d4fae-7dec-11d0-a765-00a0c91e6bf6"`}
	if n := testing.AllocsPerRun(100, func() { parseKey(buf[:0], first(vs), len(vs)) }); n != 0 {
		t.Fatalf("%v allocations", n)
	}
}

// appendSFKey appends key as a structured-field String.
func appendSFKey(dst []byte, key []byte) []byte {
	dst = append(dst, '"')
	for _, c := range key {
		if c == '"' || c == '\\' {
			dst = append(dst, '\\')
		}
		dst = append(dst, c)
	}
	return append(dst, '"')
}

func FuzzKey(f *testing.F) {
	for _, s := range []string{`"8e03978e"`, `8e03978e`, `"a\"b\\c"`, `"a", "b"`, `""`, "a\x00", `"` + strings.Repeat("x", 300) + `"`, ` "x" `, `"x";y`} {
		f.Add(s, "")
	}
	f.Add(`"a"`, `"a"`)
	f.Fuzz(func(t *testing.T, v1, v2 string) {
		vs := []string{v1}
		if v2 != "" {
			vs = append(vs, v2)
		}
		key, p := parseKey(nil, first(vs), len(vs))
		if p != keyOK {
			if len(key) != 0 {
				t.Fatalf("refused (%d) but returned %q", p, key)
			}
			return
		}
		if len(vs) != 1 {
			t.Fatalf("two field lines accepted: %q", vs)
		}
		if len(key) < 1 || len(key) > MaxKeyLen {
			t.Fatalf("accepted a key of %d bytes", len(key))
		}
		for _, c := range key {
			if c < 0x20 || c > 0x7e {
				t.Fatalf("accepted key %q with byte %#x", key, c)
			}
		}
		if strings.ContainsAny(v1, "\x00\r\n\x7f") {
			t.Fatalf("accepted a value with control characters: %q", v1)
		}
		// The key as an sf-string parses back to itself.
		sf := appendSFKey(nil, key)
		again, p := parseKey(nil, string(sf), 1)
		if p != keyOK || !bytes.Equal(again, key) {
			t.Fatalf("round trip of %q through %s: %q, %d", key, sf, again, p)
		}
	})
}

func first(vs []string) string {
	if len(vs) == 0 {
		return ""
	}
	return vs[0]
}
