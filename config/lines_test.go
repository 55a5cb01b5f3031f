package config

import (
	"strings"
	"testing"

	"github.com/BurntSushi/toml"
)

// TestIndexLines checks the line of keys after the TOML constructs that
// could throw the scanner off.
func TestIndexLines(t *testing.T) {
	src := `# comment with "quote and [bracket
top = 1
"quoted key" = 'lit' # [not.a.table]
a.b . c = """
x = 1
[fake]
\""""  # ends with an escaped quote, then """ plus one more
after_ml = '''
'''''
[t1]
arr = [ 1,
  [2, 3], # nested
  "]",
]
inl = { x = 1, y = { z = "}" }, 
  w = 2 }
aot = [
  { k = 1 },
  { k = 2 },
]
dt = 1979-05-27 07:32:00Z
next = 3
[[r]]
n = 1
[[r]]
n = 2
[[r.sub]]
m = 1
[r.tbl]
o = 1
[[r]]
n = 3
[ "sp ace" . "x\u0079" ]
v = 1
`
	var m map[string]any
	if _, err := toml.Decode(src, &m); err != nil {
		t.Fatalf("test input is not TOML: %v", err)
	}
	ix := indexLines(src)
	for _, tc := range []struct {
		path []string
		line int
	}{
		{[]string{"top"}, 2},
		{[]string{"quoted key"}, 3},
		{[]string{"a"}, 4},
		{[]string{"a", "b", "c"}, 4},
		{[]string{"after_ml"}, 8},
		{[]string{"t1"}, 10},
		{[]string{"t1", "arr"}, 11},
		{[]string{"t1", "inl", "y", "z"}, 15},
		{[]string{"t1", "inl", "w"}, 16},
		{[]string{"t1", "aot", elem(1), "k"}, 19},
		{[]string{"t1", "dt"}, 21},
		{[]string{"t1", "next"}, 22},
		{[]string{"r", elem(0)}, 23},
		{[]string{"r", elem(1), "n"}, 26},
		{[]string{"r", elem(1), "sub", elem(0), "m"}, 28},
		{[]string{"r", elem(1), "tbl", "o"}, 30},
		{[]string{"r", elem(2), "n"}, 32},
		{[]string{"sp ace", "xy", "v"}, 34},
	} {
		if got := ix.line(tc.path...); got != tc.line {
			t.Errorf("line(%q) = %d, want %d", strings.Join(tc.path, "."), got, tc.line)
		}
	}
	if _, ok := ix[joinPath([]string{"fake"})]; ok {
		t.Errorf("a table header inside a multi-line string was indexed")
	}
	// A missing key falls back to its table.
	if got := ix.line("r", elem(2), "missing"); got != 31 {
		t.Errorf("fallback line = %d, want 31", got)
	}
	if got := ix.line("nowhere"); got != 0 {
		t.Errorf("unknown path: line %d, want 0", got)
	}
}

// TestIndexLinesStrings: a multi-line string may end in up to two quotes
// of its own before its closing three; no string ends a line early.
func TestIndexLinesStrings(t *testing.T) {
	for _, v := range []string{`"""a""""`, `"""a"""""`, `'''a''''`, `'''a'''''`, `"""\""""`, `"a # b"`, `'x"y'`, `"\"[z]"`} {
		src := "k = " + v + "\nnext = 1\n"
		var m map[string]any
		if _, err := toml.Decode(src, &m); err != nil {
			t.Fatalf("test input is not TOML: %v\n%s", err, src)
		}
		if got := indexLines(src).line("next"); got != 2 {
			t.Errorf("after k = %s: line(next) = %d, want 2", v, got)
		}
	}
}

// TestQuotedKeys: a quoted key is indexed under its value, escapes read as
// the decoder reads them. The scanner stops quietly at an escape the
// decoder refuses (it never sees one: such a file does not parse).
func TestQuotedKeys(t *testing.T) {
	for in, want := range map[string]string{
		`"plain"`:                "plain",
		`'lit\eral'`:             `lit\eral`,
		`"a\tb\\c\"d"`:           "a\tb\\c\"d",
		`"\u00e9\U0001F600\x41"`: "é😀A",
	} {
		if got := indexLines("x = 0\n" + in + " = 1\n").line(want); got != 2 {
			t.Errorf("key %s: line(%q) = %d, want 2", in, want, got)
		}
	}
	for _, in := range []string{`"\u00"`, `"\q"`, `"end\"`} {
		if ix := indexLines("x = 0\n" + in + " = 1\ny = 2\n"); ix.line("y") != 0 || ix.line("x") != 1 {
			t.Errorf("key %s: index %v, want x only", in, ix)
		}
	}
}
