package core

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/preforkd/preforkd/bucket"
	"github.com/preforkd/preforkd/internal/ratelimittest"
)

func testHit(name string, limit int64, window time.Duration, d bucket.Decision) hit {
	ru := &rule{name: name, status: 429}
	ru.base.hdr = newRuleHeaders(name, limit, window)
	return hit{r: ru, v: &ru.base, d: d, decided: true}
}

// refusedHit marks h as an enforcing rule's refusal.
func refusedHit(h hit) hit {
	h.refused = true
	return h
}

// setRateLimitHeaders sets on h the fields an exchange with hits sends
// under mode, at wall.
func setRateLimitHeaders(h http.Header, mode HeaderMode, hits []hit, wall time.Time) {
	ex := &Exchange{c: &Core{headers: mode, wall: func() time.Time { return wall }}}
	ex.fields, ex.buf = ex.fieldBuf[:0], ex.bufArr[:0]
	ex.rl.hits = hits
	ex.rateLimitFields()
	for _, f := range ex.fields {
		h.Add(f.Name, string(f.Value))
	}
}

// writeProblem writes the refusal of refusing, one of hits, as an engine
// would.
func writeProblem(w http.ResponseWriter, refusing *hit, hits []hit) {
	p, _ := refusalProblem(refusing, hits, nil)
	body := p.AppendJSON(nil)
	fields, _ := ProblemFields(nil, nil, p.RetryAfter, len(body))
	for _, f := range fields {
		w.Header().Set(f.Name, string(f.Value))
	}
	w.WriteHeader(p.Status)
	w.Write(body)
}

func TestSetRateLimitHeaders(t *testing.T) {
	wall := time.Unix(1_767_225_600, 250_000_000) // a quarter second past
	allowed := func(rem int64, reset time.Duration) bucket.Decision {
		return bucket.Decision{Allowed: true, Remaining: rem, ResetAfter: reset}
	}
	refused := func(retry, reset time.Duration) bucket.Decision {
		return bucket.Decision{RetryAfter: retry, ResetAfter: reset}
	}
	for _, tt := range []struct {
		name string
		hits []hit
		want map[string]string
	}{
		{"one rule", []hit{testHit("login", 5, 5*time.Minute, allowed(2, 40500*time.Millisecond))}, map[string]string{
			"RateLimit-Policy":      `"login";q=5;w=300`,
			"RateLimit":             `"login";r=2;t=41`, // 40.5s rounded up
			"X-RateLimit-Limit":     "5",
			"X-RateLimit-Remaining": "2",
			"X-RateLimit-Reset":     "1767225641", // 600.25 + 40.5 = 640.75, up
		}},
		{"sub-second window", []hit{testHit("burst", 10, 100*time.Millisecond, allowed(9, 10*time.Millisecond))}, map[string]string{
			"RateLimit-Policy":      `"burst";q=10;w=1`,
			"RateLimit":             `"burst";r=9;t=1`,
			"X-RateLimit-Limit":     "10",
			"X-RateLimit-Remaining": "9",
			"X-RateLimit-Reset":     "1767225601",
		}},
		{"fewest remaining wins", []hit{
			testHit("a", 100, time.Hour, allowed(50, time.Minute)),
			testHit("b", 10, time.Minute, allowed(3, 30*time.Second)),
			testHit("c", 20, time.Minute, allowed(7, 10*time.Second)),
		}, map[string]string{
			"RateLimit-Policy":      `"a";q=100;w=3600, "b";q=10;w=60, "c";q=20;w=60`,
			"RateLimit":             `"a";r=50;t=60, "b";r=3;t=30, "c";r=7;t=10`,
			"X-RateLimit-Limit":     "10",
			"X-RateLimit-Remaining": "3",
			"X-RateLimit-Reset":     "1767225631",
		}},
		{"ties: soonest reset", []hit{
			testHit("a", 100, time.Hour, allowed(3, time.Minute)),
			testHit("b", 10, time.Minute, allowed(3, 30*time.Second)),
			testHit("c", 20, time.Minute, allowed(3, 45*time.Second)),
		}, map[string]string{
			"RateLimit-Policy":      `"a";q=100;w=3600, "b";q=10;w=60, "c";q=20;w=60`,
			"RateLimit":             `"a";r=3;t=60, "b";r=3;t=30, "c";r=3;t=45`,
			"X-RateLimit-Limit":     "10",
			"X-RateLimit-Remaining": "3",
			"X-RateLimit-Reset":     "1767225631",
		}},
		{"refused: t is the retry", []hit{
			testHit("a", 100, time.Hour, allowed(40, time.Minute)),
			testHit("b", 3, time.Minute, refused(20*time.Second, time.Minute)),
		}, map[string]string{
			"RateLimit-Policy":      `"a";q=100;w=3600, "b";q=3;w=60`,
			"RateLimit":             `"a";r=40;t=60, "b";r=0;t=20`,
			"X-RateLimit-Limit":     "3",
			"X-RateLimit-Remaining": "0",
			"X-RateLimit-Reset":     "1767225621",
		}},
		// Two rules refuse: the X family is the one whose retry the
		// refusal's Retry-After is (the latest), not the one that frees
		// sooner; and a shadow rule that would refuse (not refused) never
		// speaks for it.
		{"refused by two: the latest retry", []hit{
			refusedHit(testHit("slow", 3, time.Minute, refused(20*time.Second, time.Minute))),
			refusedHit(testHit("fast", 2, 5*time.Second, refused(2500*time.Millisecond, 5*time.Second))),
		}, map[string]string{
			"RateLimit-Policy":      `"slow";q=3;w=60, "fast";q=2;w=5`,
			"RateLimit":             `"slow";r=0;t=20, "fast";r=0;t=3`,
			"X-RateLimit-Limit":     "3",
			"X-RateLimit-Remaining": "0",
			"X-RateLimit-Reset":     "1767225621",
		}},
		{"refused beside a shadow rule", []hit{
			refusedHit(testHit("login", 1, time.Minute, refused(time.Minute, time.Minute))),
			testHit("watch", 50, time.Second, refused(500*time.Millisecond, time.Second)),
		}, map[string]string{
			"RateLimit-Policy":      `"login";q=1;w=60, "watch";q=50;w=1`,
			"RateLimit":             `"login";r=0;t=60, "watch";r=0;t=1`,
			"X-RateLimit-Limit":     "1",
			"X-RateLimit-Remaining": "0",
			"X-RateLimit-Reset":     "1767225661",
		}},
		{"escaped name", []hit{testHit(`a"b\c`, 1, time.Second, allowed(0, time.Second))}, map[string]string{
			"RateLimit-Policy":      `"a\"b\\c";q=1;w=1`,
			"RateLimit":             `"a\"b\\c";r=0;t=1`,
			"X-RateLimit-Limit":     "1",
			"X-RateLimit-Remaining": "0",
			"X-RateLimit-Reset":     "1767225602",
		}},
	} {
		h := http.Header{}
		setRateLimitHeaders(h, HeadersBoth, tt.hits, wall)
		got := ratelimittest.Fields(h)
		for k, v := range tt.want {
			if got[k] != v {
				t.Errorf("%s: %s = %q, want %q", tt.name, k, got[k], v)
			}
		}
		if len(got) != len(tt.want) {
			t.Errorf("%s: got %v", tt.name, got)
		}
	}
}

func TestHeaderModeNoneSetsNothing(t *testing.T) {
	h := http.Header{}
	setRateLimitHeaders(h, HeadersNone, []hit{testHit("a", 1, time.Second, bucket.Decision{Allowed: true})}, time.Time{})
	if len(h) != 0 {
		t.Errorf("mode none set %v", h)
	}
}

// Each mode's name reads back as the mode; any other name is an error.
func TestParseHeaderMode(t *testing.T) {
	for name, want := range map[string]HeaderMode{"both": HeadersBoth, "ietf": HeadersIETF, "x": HeadersX, "none": HeadersNone} {
		if m, err := ParseHeaderMode(name); err != nil || m != want {
			t.Errorf("ParseHeaderMode(%q) = %v, %v; want %v", name, m, err, want)
		}
		if got := want.String(); got != name {
			t.Errorf("%d.String() = %q, want %q", want, got, name)
		}
	}
	for _, bad := range []string{"", "all", "IETF", "HeaderMode(4)"} {
		if m, err := ParseHeaderMode(bad); err == nil {
			t.Errorf("ParseHeaderMode(%q) = %v, want an error", bad, m)
		}
	}
}

// sfItem is a parsed structured-field list member: a String with Integer
// parameters (all this package sends).
type sfItem struct {
	name   string
	params map[string]int64
}

// parseSFList parses a List of Items (RFC 9651 §4.2.1), accepting only
// String bare items and Integer parameters.
func parseSFList(s string) ([]sfItem, error) {
	var out []sfItem
	i := 0
	for i < len(s) && s[i] == ' ' {
		i++
	}
	if i == len(s) {
		return nil, errors.New("empty list")
	}
	for {
		var it sfItem
		var err error
		if it.name, i, err = parseSFString(s, i); err != nil {
			return nil, err
		}
		it.params = map[string]int64{}
		for i < len(s) && s[i] == ';' {
			i++
			for i < len(s) && s[i] == ' ' {
				i++
			}
			j := i
			if j == len(s) || !(s[j] >= 'a' && s[j] <= 'z' || s[j] == '*') {
				return nil, fmt.Errorf("bad key at %d", j)
			}
			for j < len(s) && (s[j] >= 'a' && s[j] <= 'z' || s[j] >= '0' && s[j] <= '9' || strings.IndexByte("_-.*", s[j]) >= 0) {
				j++
			}
			key := s[i:j]
			if j == len(s) || s[j] != '=' {
				return nil, fmt.Errorf("parameter %q without an Integer", key)
			}
			j++
			k := j
			for k < len(s) && s[k] >= '0' && s[k] <= '9' {
				k++
			}
			if k == j || k-j > 15 {
				return nil, fmt.Errorf("parameter %q: bad Integer %q", key, s[j:k])
			}
			v, _ := strconv.ParseInt(s[j:k], 10, 64)
			if _, dup := it.params[key]; dup {
				return nil, fmt.Errorf("parameter %q twice", key)
			}
			it.params[key] = v
			i = k
		}
		out = append(out, it)
		for i < len(s) && (s[i] == ' ' || s[i] == '\t') {
			i++
		}
		if i == len(s) {
			return out, nil
		}
		if s[i] != ',' {
			return nil, fmt.Errorf("want ',' at %d in %q", i, s)
		}
		i++
		for i < len(s) && (s[i] == ' ' || s[i] == '\t') {
			i++
		}
		if i == len(s) {
			return nil, errors.New("trailing comma")
		}
	}
}

func parseSFString(s string, i int) (string, int, error) {
	if i >= len(s) || s[i] != '"' {
		return "", i, fmt.Errorf("want a String at %d in %q", i, s)
	}
	var b strings.Builder
	for i++; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '\\':
			i++
			if i == len(s) || s[i] != '"' && s[i] != '\\' {
				return "", i, errors.New("bad escape")
			}
			b.WriteByte(s[i])
		case c == '"':
			return b.String(), i + 1, nil
		case c < 0x20 || c > 0x7e:
			return "", i, fmt.Errorf("byte %#x in a String", c)
		default:
			b.WriteByte(c)
		}
	}
	return "", i, errors.New("unterminated String")
}

func sanitized(name string) string {
	b := []byte(name)
	for i, c := range b {
		if c < 0x20 || c > 0x7e {
			b[i] = '?'
		}
	}
	return string(b)
}

func FuzzHeaders(f *testing.F) {
	f.Add("login", "api", int64(5), int64(5*time.Minute), int64(2), int64(41*time.Second), int64(0), true, false, int64(1_767_225_600))
	f.Add(`a"b\c`, "é\r\nx", int64(0), int64(-1), int64(-5), int64(-1), int64(1<<62), false, true, int64(-1))
	f.Add("", "\x00", int64(1<<62), int64(1<<62), int64(1<<62), int64(1<<62), int64(-1<<62), false, false, int64(1<<40))
	f.Fuzz(func(t *testing.T, name1, name2 string, limit, window, remaining, reset, retry int64, allowed, full bool, wallSec int64) {
		d := bucket.Decision{Allowed: allowed, Full: full, Limit: limit, Remaining: remaining,
			ResetAfter: time.Duration(reset), RetryAfter: time.Duration(retry)}
		hits := []hit{
			testHit(name1, limit, time.Duration(window), d),
			testHit(name2, limit/2, time.Duration(window)*2, bucket.Decision{Allowed: !allowed, Remaining: remaining / 3, ResetAfter: time.Duration(retry)}),
		}
		wall := time.Unix(wallSec%(1<<40), 0)
		for n := 1; n <= 2; n++ {
			h := http.Header{}
			setRateLimitHeaders(h, HeadersBoth, hits[:n], wall)
			for k, vs := range h {
				if len(vs) != 1 {
					t.Fatalf("%s: %d values", k, len(vs))
				}
				for i := 0; i < len(vs[0]); i++ {
					if c := vs[0][i]; c < 0x20 || c > 0x7e {
						t.Fatalf("%s: byte %#x in %q", k, c, vs[0])
					}
				}
			}
			// A hit let through by on_full "open" knows nothing of the
			// client and sends no item.
			var known []hit
			for i := range hits[:n] {
				if !blind(&hits[i]) {
					known = append(known, hits[i])
				}
			}
			if len(known) == 0 {
				if len(h) != 0 {
					t.Fatalf("only blind hits, yet fields %v", h)
				}
				continue
			}
			policy, err := parseSFList(h.Get("RateLimit-Policy"))
			if err != nil {
				t.Fatalf("RateLimit-Policy %q: %v", h.Get("RateLimit-Policy"), err)
			}
			limits, err := parseSFList(h.Get("RateLimit"))
			if err != nil {
				t.Fatalf("RateLimit %q: %v", h.Get("RateLimit"), err)
			}
			if len(policy) != len(known) || len(limits) != len(known) {
				t.Fatalf("%d rules (%d knowing): %d policy items, %d limit items", n, len(known), len(policy), len(limits))
			}
			for i := range known {
				want := sanitized(known[i].r.name)
				if policy[i].name != want || limits[i].name != want {
					t.Fatalf("item %d names %q, %q; want %q", i, policy[i].name, limits[i].name, want)
				}
				p, l := policy[i].params, limits[i].params
				if len(p) != 2 || p["w"] < 1 || len(l) != 2 {
					t.Fatalf("item %d params %v, %v", i, p, l)
				}
				if _, ok := p["q"]; !ok {
					t.Fatalf("item %d: no q in %v", i, p)
				}
				if _, ok := l["t"]; !ok {
					t.Fatalf("item %d: no t in %v", i, l)
				}
				if !known[i].d.Allowed && l["r"] != 0 {
					t.Fatalf("item %d refuses with r=%d", i, l["r"])
				}
			}
			for _, k := range []string{"X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset"} {
				if _, err := strconv.ParseUint(h.Get(k), 10, 64); err != nil && !(k == "X-RateLimit-Reset" && wallSec < 0) {
					t.Fatalf("%s = %q: %v", k, h.Get(k), err)
				}
			}
		}

		// The problem body is JSON, names the rule and gives a wait of at
		// least one second.
		for _, status := range []int{429, 503} {
			hits[0].refused = true
			w := httptest.NewRecorder()
			hits[0].d.Full = status == 503
			writeProblem(w, &hits[0], hits)
			var body struct {
				Type, Title, Detail string
				Status              int
				Violated            []string `json:"violated-policies"`
			}
			if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil {
				t.Fatalf("body %q: %v", w.Body, err)
			}
			secs, err := strconv.ParseInt(w.Header().Get("Retry-After"), 10, 64)
			if err != nil || secs < 1 {
				t.Fatalf("Retry-After %q", w.Header().Get("Retry-After"))
			}
			if body.Status != status || w.Code != status {
				t.Fatalf("status %d / %d, want %d", body.Status, w.Code, status)
			}
			if printableASCII(name1) && !strings.Contains(body.Detail, `"`+name1+`"`) {
				t.Fatalf("detail %q does not name %q", body.Detail, name1)
			}
			if status == 429 && (len(body.Violated) != 1 || printableASCII(name1) && body.Violated[0] != name1) {
				t.Fatalf("violated-policies %q", body.Violated)
			}
		}
	})
}

// Whole seconds are rounded up, and the largest durations do not wrap
// around to a small count.
func TestCeilSeconds(t *testing.T) {
	for _, c := range []struct {
		d    time.Duration
		want int64
	}{
		{-time.Second, 0}, {0, 0}, {1, 1}, {time.Second, 1}, {time.Second + 1, 2},
		{math.MaxInt64, 9_223_372_037},
		{math.MaxInt64 - time.Second + 2, 9_223_372_036},
	} {
		if got := ceilSeconds(c.d); got != c.want {
			t.Errorf("ceilSeconds(%d) = %d, want %d", c.d, got, c.want)
		}
	}
}
