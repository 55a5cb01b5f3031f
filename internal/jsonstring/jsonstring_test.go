package jsonstring_test

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/preforkd/preforkd/internal/jsonstring"
)

// Every byte value, under each choice: quotes and backslashes escaped,
// control bytes as \u00HH, printable ASCII as it is, a byte at 0x7f or
// above as the choice says; and the result parses as JSON.
func TestEveryByte(t *testing.T) {
	u00 := func(c byte) string { return fmt.Sprintf(`\u%04x`, c) }
	for _, tt := range []struct {
		n    jsonstring.NonASCII
		high func(c byte) string
	}{
		{jsonstring.Latin1, u00},
		{jsonstring.Replace, func(byte) string { return "?" }},
	} {
		for c := range 256 {
			b := byte(c)
			var want string
			switch {
			case b == '"' || b == '\\':
				want = `\` + string(b)
			case b < 0x20:
				want = u00(b)
			case b >= 0x7f:
				want = tt.high(b)
			default:
				want = string(b)
			}
			want = `"` + want + `"`
			got := string(jsonstring.Append(nil, string([]byte{b}), tt.n))
			if got != want {
				t.Errorf("Append(%#x, %d) = %s, want %s", b, tt.n, got, want)
			}
			if fromBytes := string(jsonstring.Append(nil, []byte{b}, tt.n)); fromBytes != got {
				t.Errorf("Append([]byte{%#x}, %d) = %s, the string's is %s", b, tt.n, fromBytes, got)
			}
			var s string
			if err := json.Unmarshal([]byte(got), &s); err != nil {
				t.Errorf("Append(%#x, %d) = %s: not JSON: %v", b, tt.n, got, err)
			}
		}
	}
}

// AppendText writes no quotes and appends to what dst holds.
func TestAppendText(t *testing.T) {
	got := string(jsonstring.AppendText([]byte(`{"a":"`), "x\"y\xc3\xa9", jsonstring.Latin1))
	if want := `{"a":"x\"y\u00c3\u00a9`; got != want {
		t.Errorf("AppendText = %s, want %s", got, want)
	}
}

func TestNoAllocation(t *testing.T) {
	buf := make([]byte, 0, 256)
	s, b := "a \"quoted\" \x01 \xe9 line", []byte("bytes \\ too \x7f")
	if n := testing.AllocsPerRun(100, func() {
		buf = jsonstring.Append(buf[:0], s, jsonstring.Latin1)
		buf = jsonstring.AppendText(buf, b, jsonstring.Replace)
	}); n != 0 {
		t.Errorf("%v allocations a run, want 0", n)
	}
}
