package textvalue

import (
	"strings"
	"testing"
)

// FuzzEnum: a name Parse accepts is the name of the value it returns, and
// Marshal writes it back; a text it refuses gives the zero value and an
// error that starts with the package, and Unmarshal leaves the value it
// was given as it was.
func FuzzEnum(f *testing.F) {
	names := Enum[uint8]{"combined", "json", "", "fixed-window"}
	for _, s := range []string{"combined", "json", "", "Combined", "json ", "fixed-window", "x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		v, err := names.Parse("pkg", s)
		if err != nil {
			if v != 0 || !strings.HasPrefix(err.Error(), "pkg: ") {
				t.Fatalf("Parse(%q) = %d, %v", s, v, err)
			}
			kept := uint8(3)
			if uerr := names.Unmarshal("pkg", []byte(s), &kept); uerr == nil || kept != 3 {
				t.Fatalf("Unmarshal(%q) = %v, and the value became %d", s, uerr, kept)
			}
			return
		}
		if name, ok := names.Name(v); !ok || name != s || names.String(v, "T") != s {
			t.Fatalf("Parse(%q) = %d, named %q %v", s, v, name, ok)
		}
		if b, err := names.Marshal("pkg", v); err != nil || string(b) != s {
			t.Fatalf("Marshal(Parse(%q)) = %q, %v", s, b, err)
		}
	})
}
