package httpcache

import "time"

// ParseHTTPDate reads an HTTP-date (RFC 9110 §5.6.7) strictly: the
// IMF-fixdate ("Sun, 06 Nov 1994 08:49:37 GMT") or one of the two obsolete
// forms a recipient must still accept, rfc850-date ("Sunday, 06-Nov-94
// 08:49:37 GMT") and asctime-date ("Sun Nov  6 08:49:37 1994"). Anything
// else — two spaces where one goes, a one-digit hour, a zone other than
// GMT, a two-digit year in the IMF form — is no date: for Expires, a time
// in the past (RFC 9111 §5.3). Names of days, months and the zone are
// read without regard to case, as a lenient recipient would; the weekday
// is not checked against the date. A two-digit year more than 50 years
// ahead of now is in the past century (RFC 9110 §5.6.7).
func ParseHTTPDate(s string, now time.Time) (time.Time, bool) {
	switch {
	case len(s) == 29 && s[3] == ',':
		return imfFixdate(s)
	case len(s) == 24 && s[3] == ' ':
		return asctime(s)
	}
	return rfc850(s, now)
}

// imfFixdate reads "Sun, 06 Nov 1994 08:49:37 GMT" (29 bytes).
func imfFixdate(s string) (time.Time, bool) {
	if !dayName(s[:3]) || s[4] != ' ' || s[7] != ' ' || s[11] != ' ' || s[16] != ' ' || s[25] != ' ' || !gmt(s[26:]) {
		return time.Time{}, false
	}
	return date(s[5:7], s[8:11], s[12:16], s[17:25], time.Time{})
}

// asctime reads "Sun Nov  6 08:49:37 1994" (24 bytes): the day is two
// digits, or a space and one digit.
func asctime(s string) (time.Time, bool) {
	if !dayName(s[:3]) || s[7] != ' ' || s[10] != ' ' || s[19] != ' ' {
		return time.Time{}, false
	}
	d := s[8:10]
	if d[0] == ' ' {
		d = d[1:]
	}
	return date(d, s[4:7], s[20:24], s[11:19], time.Time{})
}

// rfc850 reads "Sunday, 06-Nov-94 08:49:37 GMT".
func rfc850(s string, now time.Time) (time.Time, bool) {
	comma := -1
	for i := 0; i < len(s) && i < 10; i++ {
		if s[i] == ',' {
			comma = i
			break
		}
	}
	if comma < 0 || !longDayName(s[:comma]) {
		return time.Time{}, false
	}
	s = s[comma+1:] // " 06-Nov-94 08:49:37 GMT"
	if len(s) != 23 || s[0] != ' ' || s[3] != '-' || s[7] != '-' || s[10] != ' ' || s[19] != ' ' || !gmt(s[20:]) {
		return time.Time{}, false
	}
	return date(s[1:3], s[4:7], s[8:10], s[11:19], now)
}

// date reads a date's day, month name, year and "08:49:37", and makes the
// instant. A two-digit year is the one nearest now, at most 50 years
// ahead of it.
func date(day, month, year, hms string, now time.Time) (time.Time, bool) {
	d, ok1 := digits(day)
	m, ok2 := monthName(month)
	y, ok3 := digits(year)
	if !ok1 || !ok2 || !ok3 {
		return time.Time{}, false
	}
	if len(year) == 2 {
		y += now.Year() - now.Year()%100
		if y > now.Year()+50 {
			y -= 100
		}
	}
	return clock(y, m, d, hms)
}

// clock reads "08:49:37" and makes the instant, refusing a day the month
// does not have.
func clock(year int, month time.Month, day int, hms string) (time.Time, bool) {
	if len(hms) != 8 || hms[2] != ':' || hms[5] != ':' {
		return time.Time{}, false
	}
	h, ok1 := digits(hms[:2])
	m, ok2 := digits(hms[3:5])
	sec, ok3 := digits(hms[6:])
	if !ok1 || !ok2 || !ok3 || h > 23 || m > 59 || sec > 60 || day < 1 || day > 31 {
		return time.Time{}, false
	}
	t := time.Date(year, month, day, h, m, min(sec, 59), 0, time.UTC)
	if t.Day() != day {
		return time.Time{}, false // 31 Feb
	}
	return t, true
}

// digits reads a fixed number of ASCII digits.
func digits(s string) (int, bool) {
	n := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int(c-'0')
	}
	return n, s != ""
}

var (
	dayNames     = [...]string{"mon", "tue", "wed", "thu", "fri", "sat", "sun"}
	longDayNames = [...]string{"monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday"}
	monthNames   = [...]string{"jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"}
)

func dayName(s string) bool {
	for _, d := range dayNames {
		if equalFold(s, d) {
			return true
		}
	}
	return false
}

func longDayName(s string) bool {
	for _, d := range longDayNames {
		if equalFold(s, d) {
			return true
		}
	}
	return false
}

func monthName(s string) (time.Month, bool) {
	for i, m := range monthNames {
		if equalFold(s, m) {
			return time.Month(i + 1), true
		}
	}
	return 0, false
}

func gmt(s string) bool { return equalFold(s, "gmt") }

// equalFold compares s with lower, which is lower-case ASCII, ignoring
// the case of s.
func equalFold(s, lower string) bool {
	if len(s) != len(lower) {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != lower[i] {
			return false
		}
	}
	return true
}
