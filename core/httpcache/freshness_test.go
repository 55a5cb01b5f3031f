package httpcache

import (
	"testing"
	"time"
)

func TestParseAge(t *testing.T) {
	for _, tt := range []struct {
		lines []string
		want  int64
		ok    bool
	}{
		{[]string{"60"}, 60, true},
		{[]string{"7200, 0"}, 7200, true},
		{[]string{"0, 7200"}, 0, true},
		{[]string{"7200", "0"}, 7200, true},
		{[]string{"2147483648"}, MaxDelta, true},
		{[]string{"abc"}, 0, false},
		{[]string{"-7200"}, 0, false},
		{[]string{"7200.0"}, 0, false},
		{[]string{""}, 0, false},
		{nil, 0, false},
	} {
		got, ok := ParseAge(tt.lines)
		if got != tt.want || ok != tt.ok {
			t.Errorf("%q: %d %v", tt.lines, got, ok)
		}
	}
}

// Judge, as a shared cache with a 24h cap, heuristics on and the target
// list [Preforkd-Cache-Control, Cdn-Cache-Control], at a fixed wall
// clock, for a response that took a second.
func TestJudge(t *testing.T) {
	wall := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	date := func(d time.Duration) string { return wall.Add(d).Format("Mon, 02 Jan 2006 15:04:05 GMT") }
	p := &Policy{TTL: 24 * time.Hour, Heuristic: true, Targets: []string{"Preforkd-Cache-Control", "Cdn-Cache-Control"}}
	type want struct {
		store, outdates bool
		fresh, swr, sie time.Duration
		age             time.Duration
		keep            bool
		target          string
	}
	for _, tt := range []struct {
		name   string
		status int
		h      []string // name, value, ...
		auth   bool
		want   want
	}{
		{"max-age", 200, []string{"Cache-Control", "max-age=60", "Date", date(0)}, false, want{store: true, fresh: time.Minute, age: time.Second}},
		{"s-maxage first", 200, []string{"Cache-Control", "max-age=60, s-maxage=10"}, false, want{store: true, fresh: 10 * time.Second, age: time.Second}},
		{"Expires", 200, []string{"Expires", date(time.Hour), "Date", date(0)}, false, want{store: true, fresh: time.Hour, age: time.Second}},
		{"Expires invalid: stale on arrival", 200, []string{"Expires", "Thu, 18 Aug 2050 2:01:18 GMT"}, false, want{outdates: true}},
		{"Expires twice", 200, []string{"Expires", date(time.Hour), "Expires", date(time.Hour)}, false, want{outdates: true}},
		{"Age by its first member", 200, []string{"Cache-Control", "max-age=3600", "Age", "7200, 0"}, false, want{outdates: true}},
		{"Age not a number", 200, []string{"Cache-Control", "max-age=3600", "Age", "abc"}, false, want{store: true, fresh: time.Hour, age: time.Second}},
		{"Date in the past counts", 200, []string{"Cache-Control", "max-age=3600", "Date", date(-time.Minute)}, false, want{store: true, fresh: time.Hour, age: time.Minute}},
		{"no-store", 200, []string{"Cache-Control", "max-age=60, no-store"}, false, want{outdates: true}},
		{"private", 200, []string{"Cache-Control", "max-age=60, private"}, false, want{outdates: true}},
		{"private run into max-age with ';'", 200, []string{"Cache-Control", "private; max-age=60", "Expires", date(time.Hour), "Date", date(0)}, false, want{outdates: true}},
		{"private run into max-age with a blank", 200, []string{"Cache-Control", "private max-age=60", "Expires", date(time.Hour), "Date", date(0)}, false, want{outdates: true}},
		{"no-store run into max-age with a blank", 200, []string{"Cache-Control", "no-store max-age=60", "Last-Modified", date(-time.Hour), "Date", date(0)}, false, want{outdates: true}},
		{"Set-Cookie", 200, []string{"Cache-Control", "max-age=60", "Set-Cookie", "a=b"}, false, want{outdates: true}},
		{"server-sent events: a stream", 200, []string{"Cache-Control", "max-age=60", "Content-Type", "Text/Event-Stream; charset=utf-8"}, false, want{outdates: true}},
		{"X-Accel-Buffering: no", 200, []string{"Cache-Control", "max-age=60", "X-Accel-Buffering", "No"}, false, want{outdates: true}},
		{"X-Accel-Buffering: yes", 200, []string{"Cache-Control", "max-age=60", "X-Accel-Buffering", "yes"}, false, want{store: true, fresh: time.Minute, age: time.Second}},
		{"Authorization", 200, []string{"Cache-Control", "max-age=60"}, true, want{}},
		{"Authorization, public", 200, []string{"Cache-Control", "max-age=60, public"}, true, want{store: true, fresh: time.Minute, age: time.Second}},
		{"Vary: *", 200, []string{"Cache-Control", "max-age=60", "Vary", "*"}, false, want{outdates: true}},
		{"no-cache with a validator: kept, always revalidated", 200, []string{"Cache-Control", "no-cache", "Etag", `"a"`}, false, want{store: true, keep: true, age: time.Second}},
		{"no-cache without one", 200, []string{"Cache-Control", "no-cache, max-age=60"}, false, want{outdates: true}},
		{"must-revalidate: no stale windows", 200, []string{"Cache-Control", "max-age=60, must-revalidate, stale-while-revalidate=30"}, false, want{store: true, fresh: time.Minute, age: time.Second}},
		{"s-maxage: the stale windows beside it hold", 200, []string{"Cache-Control", "s-maxage=60, stale-while-revalidate=30, stale-if-error=20"}, false, want{store: true, fresh: time.Minute, swr: 30 * time.Second, sie: 20 * time.Second, age: time.Second}},
		{"Authorization, s-maxage: never served stale", 200, []string{"Cache-Control", "s-maxage=60, stale-if-error=600"}, true, want{store: true, fresh: time.Minute, age: time.Second}},
		{"Authorization, targeted s-maxage: never served stale", 200, []string{"Cdn-Cache-Control", "s-maxage=60, stale-while-revalidate=30"}, true, want{store: true, fresh: time.Minute, age: time.Second, target: "Cdn-Cache-Control"}},
		{"Authorization, public: the stale windows hold", 200, []string{"Cache-Control", "public, max-age=60, stale-if-error=30"}, true, want{store: true, fresh: time.Minute, sie: 30 * time.Second, age: time.Second}},
		{"stale-if-error", 200, []string{"Cache-Control", "max-age=60, stale-if-error=30"}, false, want{store: true, fresh: time.Minute, sie: 30 * time.Second, age: time.Second}},
		{"stale-while-revalidate", 200, []string{"Cache-Control", "max-age=60, stale-while-revalidate=30"}, false, want{store: true, fresh: time.Minute, swr: 30 * time.Second, age: time.Second}},
		{"stale on arrival, with a validator: kept", 200, []string{"Cache-Control", "max-age=1", "Age", "60", "Last-Modified", date(-time.Hour)}, false, want{store: true, fresh: time.Second, age: 61 * time.Second, keep: true}},
		{"heuristic", 200, []string{"Last-Modified", date(-10 * time.Hour), "Date", date(0)}, false, want{store: true, fresh: time.Hour, age: time.Second, keep: true}},
		{"heuristic 501", 501, []string{"Last-Modified", date(-10 * time.Hour), "Date", date(0)}, false, want{store: true, fresh: time.Hour, age: time.Second, keep: true}},
		{"heuristic 599 only with public", 599, []string{"Last-Modified", date(-10 * time.Hour), "Date", date(0)}, false, want{}},
		{"heuristic 599, public", 599, []string{"Cache-Control", "public", "Last-Modified", date(-10 * time.Hour), "Date", date(0)}, false, want{store: true, fresh: time.Hour, age: time.Second, keep: true}},
		{"503 with max-age", 503, []string{"Cache-Control", "max-age=60"}, false, want{store: true, fresh: time.Minute, age: time.Second}},
		{"503 without freshness: the stored one stays", 503, nil, false, want{}},
		{"503 no-store: the stored one stays", 503, []string{"Cache-Control", "no-store, max-age=60"}, false, want{}},
		{"206", 206, []string{"Cache-Control", "max-age=60"}, false, want{}},
		{"304", 304, []string{"Cache-Control", "max-age=60"}, false, want{}},
		{"must-understand: a known status ignores no-store", 200, []string{"Cache-Control", "max-age=60, no-store, must-understand"}, false, want{store: true, fresh: time.Minute, age: time.Second}},
		{"must-understand: an unknown status is not stored", 299, []string{"Cache-Control", "max-age=60, no-store, must-understand"}, false, want{outdates: true}},
		{"targeted over Cache-Control", 200, []string{"Cache-Control", "no-store", "Cdn-Cache-Control", "max-age=60"}, false, want{store: true, fresh: time.Minute, age: time.Second, target: "Cdn-Cache-Control"}},
		{"targeted replaces Expires", 200, []string{"Expires", date(-time.Hour), "Cdn-Cache-Control", "max-age=60"}, false, want{store: true, fresh: time.Minute, age: time.Second, target: "Cdn-Cache-Control"}},
		{"targeted no-store", 200, []string{"Cache-Control", "max-age=60", "Cdn-Cache-Control", "no-store"}, false, want{outdates: true, target: "Cdn-Cache-Control"}},
		{"the own field first", 200, []string{"Cdn-Cache-Control", "max-age=60", "preforkd-cache-control", "max-age=10"}, false, want{store: true, fresh: 10 * time.Second, age: time.Second, target: "Preforkd-Cache-Control"}},
		{"an invalid targeted field does not count", 200, []string{"Cache-Control", "no-store", "Cdn-Cache-Control", `max-age="60"`}, false, want{outdates: true}},
		{"capped by TTL", 200, []string{"Cache-Control", "max-age=999999999"}, false, want{store: true, fresh: 24 * time.Hour, age: time.Second}},
	} {
		var h []Field
		for i := 0; i+1 < len(tt.h); i += 2 {
			h = append(h, Field{tt.h[i], []byte(tt.h[i+1])})
		}
		j := Judge(tt.status, h, p, tt.auth, wall, time.Second)
		got := want{store: j.Store, outdates: j.Outdates, fresh: j.Fresh, swr: j.SWR, sie: j.SIE, age: j.Age, keep: j.Keep > 0, target: j.Target}
		if !j.Store {
			got = want{outdates: j.Outdates, target: j.Target}
		}
		if got != tt.want {
			t.Errorf("%s: %+v, want %+v", tt.name, got, tt.want)
		}
	}
}
