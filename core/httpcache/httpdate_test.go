package httpcache

import (
	"net/http"
	"strings"
	"testing"
	"time"
)

func TestParseHTTPDate(t *testing.T) {
	now := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	want := time.Date(2050, 8, 18, 2, 1, 18, 0, time.UTC)
	for _, tt := range []struct {
		s  string
		ok bool
	}{
		{"Thu, 18 Aug 2050 02:01:18 GMT", true},
		{"Thursday, 18-Aug-50 02:01:18 GMT", true}, // rfc850: within 50 years ahead
		{"Thu Aug 18 02:01:18 2050", true},         // asctime
		{"THU, 18 AUG 2050 02:01:18 gMT", true},    // names in any case
		{"Thu, 18 Aug 2050 02:01:18 UTC", false},
		{"Thu, 18 Aug 2050 02:01:18 AEST", false},
		{"Thu, 18 Aug 50 02:01:18 GMT", false},
		{"Thu 18 Aug 2050 02:01:18 GMT", false},
		{"Thu, 18  Aug  2050 02:01:18 GMT", false},
		{"Thu, 18-Aug-2050 02:01:18 GMT", false},
		{"Thu, 18 Aug 2050 02.01.18 GMT", false},
		{"Thu, 18 Aug 2050 2:01:18 GMT", false},
		{"Thu, 18 Aug 2050 02:01:18 GMT ", false},
		{"Thu, 31 Feb 2050 02:01:18 GMT", false},
		{"Thu, 18 Aug 2050 24:01:18 GMT", false},
		{"Xyz, 18 Aug 2050 02:01:18 GMT", false},
		{"0", false},
		{"", false},
	} {
		got, ok := ParseHTTPDate(tt.s, now)
		if ok != tt.ok || ok && !got.Equal(want) {
			t.Errorf("%q: %v %v", tt.s, got, ok)
		}
	}
	if got, ok := ParseHTTPDate("Thu Aug  8 02:01:18 2050", now); !ok || got.Day() != 8 {
		t.Errorf("asctime with a one-digit day: %v %v", got, ok)
	}
	// A two-digit year more than 50 years ahead is in the past century.
	if got, ok := ParseHTTPDate("Sunday, 06-Nov-94 08:49:37 GMT", now); !ok || got.Year() != 1994 {
		t.Errorf("rfc850 94: %v %v", got, ok)
	}
}

func FuzzParseHTTPDate(f *testing.F) {
	for _, s := range []string{"Sun, 06 Nov 1994 08:49:37 GMT", "Sunday, 06-Nov-94 08:49:37 GMT", "Sun Nov  6 08:49:37 1994"} {
		f.Add(s)
	}
	now := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, s string) {
		got, ok := ParseHTTPDate(s, now)
		// net/http reads the IMF-fixdate and asctime forms too, more
		// leniently (a one-digit hour, runs of spaces, fractional
		// seconds) but for case: what it reads that is written as it
		// writes those forms (but for the weekday, which neither checks,
		// and the case of names), this reads too, as the same instant.
		// (Its rfc850 form places a two-digit year otherwise.)
		if std, err := http.ParseTime(s); err == nil && len(s) > 4 {
			imf := std.Format(http.TimeFormat)
			asc := std.Format(time.ANSIC)
			asc0 := asc[:8] + strings.Replace(asc[8:9], " ", "0", 1) + asc[9:] // "Nov 06" for "Nov  6"
			if len(s) == len(imf) && strings.EqualFold(s[4:], imf[4:]) && s[3] == ',' ||
				len(s) == len(asc) && (strings.EqualFold(s[4:], asc[4:]) || strings.EqualFold(s[4:], asc0[4:])) && s[3] == ' ' {
				if !ok || !got.Equal(std) {
					t.Fatalf("%q: net/http reads %v, this %v %v", s, std, got, ok)
				}
			}
		}
		if !ok {
			return
		}
		// What parses is one of the three forms, and says the same
		// instant in the IMF form.
		back, ok := ParseHTTPDate(got.Format("Mon, 02 Jan 2006 15:04:05 GMT"), now)
		if !ok || !back.Equal(got) {
			t.Fatalf("%q parsed to %v, which does not read back (%v)", s, got, back)
		}
	})
}
