package httpcache

import (
	"testing"
)

func TestParseTargeted(t *testing.T) {
	absent := Directives{MaxAge: -1, SMaxAge: -1, SWR: -1, SIE: -1}
	with := func(f func(*Directives)) Directives {
		d := absent
		f(&d)
		return d
	}
	for _, tt := range []struct {
		lines []string
		want  Directives
		ok    bool
	}{
		{[]string{"max-age=60"}, with(func(d *Directives) { d.MaxAge = 60 }), true},
		{[]string{"  max-age=60 ,  s-maxage=30  "}, with(func(d *Directives) { d.MaxAge, d.SMaxAge = 60, 30 }), true},
		{[]string{"max-age=2147483648"}, with(func(d *Directives) { d.MaxAge = MaxDelta }), true},
		{[]string{"max-age=99999999999"}, with(func(d *Directives) { d.MaxAge = MaxDelta }), true},
		{[]string{"no-store, private"}, with(func(d *Directives) { d.NoStore, d.Private = true, true }), true},
		{[]string{`no-cache="Set-Cookie"`}, with(func(d *Directives) { d.NoCache = true }), true},
		{[]string{`private="Authorization", public`}, with(func(d *Directives) { d.Private, d.Public = true, true }), true},
		{[]string{"proxy-revalidate, must-understand, stale-while-revalidate=7, stale-if-error=9"},
			with(func(d *Directives) { d.ProxyRevalidate, d.MustUnderstand, d.SWR, d.SIE = true, true, 7, 9 }), true},
		{[]string{"no-store=?0, max-age=5"}, with(func(d *Directives) { d.MaxAge = 5 }), true},
		{[]string{"max-age=10;a=1, foo=bar, baz=(1 2)"}, with(func(d *Directives) { d.MaxAge = 10 }), true},
		{[]string{"max-age=10", "must-revalidate"}, with(func(d *Directives) { d.MaxAge, d.MustRevalidate = 10, true }), true},
		{[]string{"max-age=10, max-age=20"}, with(func(d *Directives) { d.MaxAge = 20 }), true}, // a Dictionary: the last
		{[]string{"none"}, absent, true},
		// Invalid: the field does not count.
		{nil, absent, false},
		{[]string{""}, absent, false},
		{[]string{"max-age=10000, &&&&&"}, with(func(d *Directives) { d.MaxAge = 10000 }), false},
		{[]string{`max-age="10000"`}, absent, false},
		{[]string{"max-age=-1"}, absent, false},
		{[]string{"max-age=1.5"}, absent, false},
		{[]string{"no-store=1"}, absent, false},
		{[]string{`public="x"`}, absent, false}, // only no-cache and private list names
		{[]string{"MaX-aGe=10"}, absent, false},
		{[]string{"max-age =10"}, absent, false},
		{[]string{"max-age= 10"}, absent, false},
		{[]string{"max-age=10,"}, with(func(d *Directives) { d.MaxAge = 10 }), false},
		{[]string{"max-age=1234567890123456"}, absent, false},
	} {
		got, ok := ParseTargeted(tt.lines)
		if ok != tt.ok || ok && got != tt.want {
			t.Errorf("%q: %+v %v, want %+v %v", tt.lines, got, ok, tt.want, tt.ok)
		}
	}
}

func FuzzParseTargeted(f *testing.F) {
	for _, s := range []string{"max-age=60, no-store", `a=("x" 1;b=?0), b=:aGVsbG8=:, c=@12, d=%"x", e=1.5`, "max-age=10000, &&&&&"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		d, ok := ParseTargeted([]string{s})
		if !ok {
			return
		}
		for _, v := range []int64{d.MaxAge, d.SMaxAge, d.SWR, d.SIE} {
			if v < -1 || v > MaxDelta {
				t.Fatalf("%q: %+v", s, d)
			}
		}
	})
}
