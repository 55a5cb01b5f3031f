package config

import (
	"testing"
)

// FuzzSize: a size read from a file writes back (String, MarshalText) as
// a text that reads to the same size; a text refused leaves the value as
// it was. IdemWait likewise.
func FuzzSize(f *testing.F) {
	for _, s := range []string{"512", "64KiB", "1MB", " 2 GiB ", "-1", "1.5MB", "9223372036854775807", "8388608TiB", "KiB", "", "0", "1 B"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		v := Size(7)
		if err := v.UnmarshalText([]byte(s)); err != nil {
			if v != 7 {
				t.Fatalf("Size(%q) refused (%v), and the value became %d", s, err, v)
			}
		} else {
			var again Size
			if v < 0 || again.UnmarshalText([]byte(v.String())) != nil || again != v {
				t.Fatalf("Size(%q) = %d, written %q, reads back %d", s, v, v.String(), again)
			}
			var lim SizeLimit
			if err := lim.UnmarshalText([]byte(SizeLimit(v).String())); err != nil || lim != SizeLimit(v) {
				t.Fatalf("SizeLimit %d written %q reads back %d, %v", v, SizeLimit(v).String(), lim, err)
			}
		}
		w := IdemWait(7)
		if err := w.UnmarshalText([]byte(s)); err != nil {
			if w != 7 {
				t.Fatalf("IdemWait(%q) refused (%v), and the value became %d", s, err, w)
			}
			return
		}
		var again IdemWait
		if w < UntilDone || again.UnmarshalText([]byte(w.String())) != nil || again != w {
			t.Fatalf("IdemWait(%q) = %d, written %q, reads back %d", s, w, w.String(), again)
		}
	})
}
