package core_test

import (
	"bytes"
	"testing"
	"time"

	"github.com/preforkd/preforkd/bucket"
	"github.com/preforkd/preforkd/clientip"
	"github.com/preforkd/preforkd/core"
	"github.com/preforkd/preforkd/shm"
)

// The reset header of a 304 that revalidates a cached response is the
// core's alone, as a 200's is: the entry it refreshes never keeps it, so
// neither the revalidated answer nor a later hit carries it, and a hit
// resets nothing.
func TestCacheRevalidationKeepsNoResetHeader(t *testing.T) {
	r := joinedRegion(t, shm.Options{Counters: 64, Responses: 64, ResponseBytes: 1 << 20})
	clk := &storyClock{}
	c, err := core.New(r, core.Options{
		RateLimits: []core.RateLimit{{Rule: bucket.Rule{Name: "login", Limit: 2, Window: time.Hour},
			Route: mustRoute(t, "/*"), By: clientip.MustParseBy("ip")}},
		Caches:      core.CacheBlocks(core.Cache{Route: mustRoute(t, "/*", "GET", "HEAD"), TTL: 24 * time.Hour, MaxBody: 1 << 20, LockTimeout: time.Second}),
		ResetHeader: "Preforkd-Reset",
		Now:         clk.now,
		Wall:        clk.wall,
	})
	if err != nil {
		t.Fatal(err)
	}
	a := &app{t: t}
	get := func() answer {
		return serve(c, newReq("GET", "/r", "192.0.2.1", "Host", "h"), a.serve)
	}
	for _, bg := range []bool{false, true} {
		cc := "max-age=2"
		if bg {
			cc = "max-age=2, stale-while-revalidate=30"
		}
		clk.advance(time.Hour)
		a.resps = []fakeResp{{status: 200, body: []byte("one"), header: hdr("Cache-Control", cc, "Etag", `"e1"`, "Date", clk.date(0))}}
		get()
		clk.advance(3 * time.Second)
		a.resps = []fakeResp{{status: 304, header: hdr("Date", clk.date(0), "Cache-Control", "max-age=60", "Preforkd-Reset", "login")}}
		ans := get()
		if v := ans.get("Preforkd-Reset"); v != "" {
			t.Fatalf("background %v: the revalidated answer carries the reset header: %+v", bg, ans.header)
		}
		// A hit is the cache's answer: no reset header, and no reset.
		for i := range 3 {
			ans = get()
			if v := ans.get("Preforkd-Reset"); v != "" {
				t.Fatalf("background %v: hit %d carries the reset header: %+v", bg, i, ans.header)
			}
		}
		if ans.status != 429 {
			t.Fatalf("background %v: the hits were not limited (%d): a stored reset header reset the rule", bg, ans.status)
		}
	}
}

// An entry stored before the reset header was configured (by a reload,
// or restored from a dump) keeps the field as the application sent it:
// a hit never sends it.
func TestCacheHitOfAnEntryStoredBeforeTheResetHeader(t *testing.T) {
	r := joinedRegion(t, shm.Options{Counters: 64, Responses: 64, ResponseBytes: 1 << 20})
	clk := &storyClock{}
	coreWith := func(reset string) *core.Core {
		c, err := core.New(r, core.Options{
			Caches:      core.CacheBlocks(core.Cache{Route: mustRoute(t, "/*", "GET", "HEAD"), TTL: time.Hour, MaxBody: 1 << 20, LockTimeout: time.Second}),
			ResetHeader: reset,
			Now:         clk.now,
			Wall:        clk.wall,
		})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	before, after := coreWith(""), coreWith("Preforkd-Reset")
	a := &app{t: t}
	get := func(c *core.Core) answer {
		return serve(c, newReq("GET", "/r", "192.0.2.1", "Host", "h"), a.serve)
	}
	a.resps = []fakeResp{{status: 200, body: []byte("one"), header: hdr("Cache-Control", "max-age=600", "Date", clk.date(0), "Preforkd-Reset", "login")}}
	wantAnswer(t, "fill", get(before), 200, "MISS", "one")
	ans := get(after)
	wantAnswer(t, "hit", ans, 200, "HIT", "one")
	if v := ans.get("Preforkd-Reset"); v != "" {
		t.Fatalf("a hit carries the reset header: %+v", ans.header)
	}
}

// The response to a background refresh is stored without the request id
// field, as a fill's is, though the application echoes the id the refresh
// was forwarded with: a later hit carries its own id, once.
func TestCacheRefreshStoresNoRequestID(t *testing.T) {
	r := joinedRegion(t, shm.Options{Counters: 64, Responses: 64, ResponseBytes: 1 << 20})
	clk := &storyClock{}
	c, err := core.New(r, core.Options{
		Caches:    core.CacheBlocks(core.Cache{Route: mustRoute(t, "/*", "GET", "HEAD"), TTL: time.Hour, MaxBody: 1 << 20, LockTimeout: time.Second}),
		RequestID: "X-Request-Id",
		Now:       clk.now,
		Wall:      clk.wall,
	})
	if err != nil {
		t.Fatal(err)
	}
	body := "one"
	echo := func(f core.Forward) fakeResp {
		h := hdr("Cache-Control", "max-age=2, stale-while-revalidate=60", "Date", clk.date(0))
		for _, a := range f.Add {
			if a.Name == "X-Request-Id" {
				h = append(h, core.Field{Name: a.Name, Value: bytes.Clone(a.Value)})
			}
		}
		return fakeResp{status: 200, body: []byte(body), header: h}
	}
	get := func() answer { return serve(c, newReq("GET", "/r", "192.0.2.1", "Host", "h"), echo) }
	ids := func(a answer) (n int) {
		for _, f := range a.header {
			if f.Name == "X-Request-Id" {
				n++
			}
		}
		return n
	}
	wantAnswer(t, "fill", get(), 200, "MISS", "one")
	if a := get(); ids(a) != 1 {
		t.Fatalf("hit: %d request ids: %+v", ids(a), a.header)
	}
	clk.advance(3 * time.Second)
	body = "two"
	wantAnswer(t, "stale", get(), 200, "STALE", "one")
	a := get()
	wantAnswer(t, "refreshed", a, 200, "HIT", "two")
	if ids(a) != 1 {
		t.Fatalf("a hit of the refreshed response: %d request ids: %+v", ids(a), a.header)
	}
}
