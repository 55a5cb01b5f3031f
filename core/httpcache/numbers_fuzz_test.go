package httpcache

import (
	"math"
	"strconv"
	"strings"
	"testing"
)

// FuzzParseByteRange: a range accepted is one "bytes=" range of numbers
// strconv reads the same, first at or before last; anything refused
// comes with zeros.
func FuzzParseByteRange(f *testing.F) {
	for _, s := range []string{"bytes=0-99", "bytes=5-", "bytes=-7", "BYTES = 1 - 2", "bytes=2-1", "bytes=0-1,3-4", "items=0-1",
		"bytes=-", "bytes=999999999999999999-", "bytes=+1-2"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		first, last, suffix, ok := ParseByteRange(s)
		if !ok {
			if first != 0 || last != 0 || suffix {
				t.Fatalf("ParseByteRange(%q) refused with %d-%d %v", s, first, last, suffix)
			}
			return
		}
		v := strings.Trim(s, " \t")
		if !strings.EqualFold(v[:6], "bytes=") {
			t.Fatalf("ParseByteRange(%q): not a bytes range", s)
		}
		a, b, _ := strings.Cut(v[6:], "-")
		a, b = strings.Trim(a, " \t"), strings.Trim(b, " \t")
		num := func(x string) int64 {
			n, err := strconv.ParseInt(x, 10, 64)
			if err != nil || n < 0 || strings.Trim(x, "0123456789") != "" {
				t.Fatalf("ParseByteRange(%q) = %d-%d %v: %q is no number (%v)", s, first, last, suffix, x, err)
			}
			return n
		}
		switch {
		case suffix:
			if a != "" || first != 0 || last != num(b) {
				t.Fatalf("ParseByteRange(%q) = suffix %d", s, last)
			}
		case b == "":
			if first != num(a) || last != math.MaxInt64 {
				t.Fatalf("ParseByteRange(%q) = %d-%d", s, first, last)
			}
		default:
			if first != num(a) || last != num(b) || first > last {
				t.Fatalf("ParseByteRange(%q) = %d-%d", s, first, last)
			}
		}
	})
}

// FuzzParseDelta agrees with strconv on delta-seconds, capped at
// MaxDelta, quoted or not; ParseAge takes the first member of the list.
func FuzzParseDelta(f *testing.F) {
	for _, s := range []string{"0", "60", `"60"`, "-1", "1.5", "99999999999999999999", "", " 1", "7200, 0"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		v := s
		if len(v) >= 2 && v[0] == '"' && v[len(v)-1] == '"' {
			v = v[1 : len(v)-1]
		}
		n := ParseDelta(v)
		want, err := strconv.ParseUint(v, 10, 64)
		if v == "" || strings.Trim(v, "0123456789") != "" {
			want, err = 0, nil
		} else if err != nil || want > MaxDelta {
			want, err = MaxDelta, nil
		}
		if n != int64(want) {
			t.Fatalf("ParseDelta(%q) = %d, want %d", v, n, want)
		}
		age, ok := ParseAge([]string{s})
		first, _, _ := strings.Cut(s, ",")
		first = strings.Trim(first, " \t")
		if ok != (first != "" && strings.Trim(first, "0123456789") == "") || ok && age != ParseDelta(first) || !ok && age != 0 {
			t.Fatalf("ParseAge(%q) = %d, %v", s, age, ok)
		}
	})
}
