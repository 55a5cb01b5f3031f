package core_test

import (
	"bytes"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/preforkd/preforkd/core"
	"github.com/preforkd/preforkd/shm"
)

// An unsafe request invalidates its URL by the status the application
// answered, as soon as that head is known (before it is sent), even when
// its body then breaks off (the application did it);
// it asks the engine for the status and fields only (max 0), not to
// outlive its client.
func TestCacheInvalidationByStatus(t *testing.T) {
	c, reqs := cacheCore(t, 1)
	hit := func() bool {
		return serve(c, reqs[0], func(core.Forward) fakeResp { return fakeResp{status: 200} }).get("X-Cache") == "HIT"
	}
	if !hit() {
		t.Fatal("not cached")
	}
	for _, tt := range []struct {
		resp        fakeResp
		invalidates bool
	}{
		{fakeResp{status: 500}, false},
		{fakeResp{status: 404}, false},
		{fakeResp{status: 201, body: []byte("created"), cut: true}, true},
	} {
		post := *reqs[0]
		post.method = "POST"
		ex := c.Begin(&post)
		if ex.Decide() != core.Pass {
			t.Fatal("a POST was answered")
		}
		if ex.Keep() {
			t.Fatal("an unsafe request to a cached path must not outlive its client")
		}
		if r := ex.Head(tt.resp.status, nil); r != nil {
			t.Fatalf("Head replaced the answer: %+v", r)
		}
		// Invalid from the head on, before the engine sends it: a client
		// that saw the answer must not get the old one from another
		// worker.
		if hit() == tt.invalidates {
			t.Fatalf("once a POST answered %+v: hit %v", tt.resp, !tt.invalidates)
		}
		var err error
		if tt.resp.cut {
			err = errCut
		}
		ex.Finish(err)
	}
}

// storyClock is the region's and the wall clock of a story, moved by hand.
type storyClock struct{ at atomic.Int64 }

var storyWall = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)

func (c *storyClock) now() time.Duration      { return time.Hour + time.Duration(c.at.Load()) }
func (c *storyClock) wall() time.Time         { return storyWall.Add(time.Duration(c.at.Load())) }
func (c *storyClock) advance(d time.Duration) { c.at.Add(int64(d)) }
func (c *storyClock) date(d time.Duration) []byte {
	return []byte(c.wall().Add(d).Format(http.TimeFormat))
}

// storyCore is a core with one cache block over every path (targeted is
// its Targeted), on the story clock.
func storyCore(t *testing.T, targeted string) (*core.Core, *storyClock) {
	t.Helper()
	c, clk, _ := storyCoreRegion(t, targeted)
	return c, clk
}

// storyCoreRegion is storyCore, and its region.
func storyCoreRegion(t *testing.T, targeted string) (*core.Core, *storyClock, *shm.Region) {
	t.Helper()
	r := joinedRegion(t, shm.Options{Counters: 64, Responses: 64, ResponseBytes: 1 << 20})
	clk := &storyClock{}
	c, err := core.New(r, core.Options{
		Caches: core.CacheBlocks(core.Cache{Route: mustRoute(t, "/*", "GET", "HEAD"), TTL: 24 * time.Hour, MaxBody: 1 << 20, LockTimeout: time.Second, Targeted: targeted}),
		Now:    clk.now,
		Wall:   clk.wall,
	})
	if err != nil {
		t.Fatal(err)
	}
	return c, clk, r
}

// app is an application that answers with the next of its responses and
// keeps what each request it got was forwarded with.
type app struct {
	t     *testing.T
	resps []fakeResp
	got   []core.Forward
}

func (a *app) serve(f core.Forward) fakeResp {
	a.t.Helper()
	f.Add = slices.Clone(f.Add)
	for i := range f.Add {
		f.Add[i].Value = bytes.Clone(f.Add[i].Value)
	}
	a.got = append(a.got, f)
	if len(a.resps) == 0 {
		a.t.Fatal("the application was asked once more than expected")
	}
	r := a.resps[0]
	a.resps = a.resps[1:]
	return r
}

// added is the value of the field called name the n-th request was
// forwarded with, "" for none.
func (a *app) added(n int, name string) string {
	for _, f := range a.got[n].Add {
		if f.Name == name {
			return string(f.Value)
		}
	}
	return ""
}

func hdr(kv ...any) fakeHeader {
	var h fakeHeader
	for i := 0; i+1 < len(kv); i += 2 {
		v, ok := kv[i+1].([]byte)
		if !ok {
			v = []byte(kv[i+1].(string))
		}
		h = append(h, core.Field{Name: kv[i].(string), Value: v})
	}
	return h
}

func wantAnswer(t *testing.T, step string, a answer, status int, xcache, body string) {
	t.Helper()
	if a.status != status || a.get("X-Cache") != xcache || string(a.body) != body {
		t.Fatalf("%s: %d X-Cache %q body %q, want %d %q %q", step, a.status, a.get("X-Cache"), a.body, status, xcache, body)
	}
}

// A stale response with validators is revalidated with them in place of
// the client's own; a 304 refreshes its fields (RFC 9111 §4.3.4) and
// serves the stored body, fresh again, also as a 304 to a client whose
// condition it meets; another answer replaces it; a 304 for another tag
// serves it unchanged.
func TestCacheRevalidation(t *testing.T) {
	c, clk := storyCore(t, "")
	a := &app{t: t}
	get := func(kv ...string) answer {
		return serve(c, newReq("GET", "/r", "192.0.2.1", append([]string{"Host", "h"}, kv...)...), a.serve)
	}
	lm := "Sat, 01 Mar 2025 12:00:00 GMT"
	a.resps = []fakeResp{{status: 200, body: []byte("one"),
		header: hdr("Cache-Control", "max-age=2", "Etag", `"e1"`, "Last-Modified", lm, "Date", clk.date(0), "X-A", "1", "Content-Type", "text/plain")}}
	wantAnswer(t, "fill", get(), 200, "MISS", "one")
	wantAnswer(t, "hit", get(), 200, "HIT", "one")

	clk.advance(3 * time.Second)
	a.resps = []fakeResp{{status: 304, header: hdr("Date", clk.date(0), "X-A", "2", "Cache-Control", "max-age=60", "Etag", `"e1"`, "Content-Length", "99")}}
	r := get("If-None-Match", `"other"`)
	wantAnswer(t, "revalidated", r, 200, "REVALIDATED", "one")
	if a.added(1, "If-None-Match") != `"e1"` || a.added(1, "If-Modified-Since") != lm || !slices.Contains(a.got[1].Drop, "If-None-Match") {
		t.Fatalf("the revalidation was forwarded with %+v", a.got[1])
	}
	if r.get("X-A") != "2" || r.get("Content-Type") != "text/plain" || r.get("Cache-Control") != "max-age=60" || r.get("Date") != string(clk.date(0)) || r.get("Content-Length") != "3" {
		t.Fatalf("revalidated fields: %+v", r.header)
	}
	clk.advance(10 * time.Second)
	r = get()
	wantAnswer(t, "fresh again", r, 200, "HIT", "one")
	if r.get("X-A") != "2" || r.get("Age") != "10" {
		t.Fatalf("fields after the 304: %+v", r.header)
	}
	wantAnswer(t, "the client's own condition", get("If-None-Match", `W/"e1"`), 304, "HIT", "")

	// Stale again: the client's conditional request gets the cache's 304.
	clk.advance(time.Minute)
	a.resps = []fakeResp{{status: 304, header: hdr("Date", clk.date(0), "Cache-Control", "max-age=60")}}
	wantAnswer(t, "revalidated, to a conditional request", get("If-None-Match", `"e1"`), 304, "REVALIDATED", "")

	// A 304 with Set-Cookie (a session renewed): its cookie goes to this
	// client, and to nobody else, and like a 200 with one it outdates the
	// entry rather than refresh it.
	clk.advance(2 * time.Minute)
	a.resps = []fakeResp{{status: 304, header: hdr("Date", clk.date(0), "Cache-Control", "max-age=60", "Set-Cookie", "s=renewed")}}
	r = get()
	wantAnswer(t, "revalidated with a cookie", r, 200, "REVALIDATED", "one")
	if r.get("Set-Cookie") != "s=renewed" {
		t.Fatalf("the 304's Set-Cookie did not reach its client: %+v", r.header)
	}
	a.resps = []fakeResp{{status: 200, body: []byte("after"), header: hdr("Cache-Control", "max-age=60", "Date", clk.date(0))}}
	r = get()
	wantAnswer(t, "the entry the cookie outdated", r, 200, "MISS", "after")
	if r.get("Set-Cookie") != "" {
		t.Fatalf("another client got the cookie: %+v", r.header)
	}

	// A new response replaces the entry.
	clk.advance(2 * time.Minute)
	a.resps = []fakeResp{{status: 200, body: []byte("two"), header: hdr("Cache-Control", "max-age=60", "Etag", `"e2"`, "Date", clk.date(0))}}
	wantAnswer(t, "modified", get(), 200, "MISS", "two")
	wantAnswer(t, "the new one", get(), 200, "HIT", "two")

	// A 304 naming another entity-tag updates nothing (RFC 9111 §4.3.4),
	// but it says the tag sent matched: the entry is served as stored,
	// never a 304 to a client that asked no condition, and stays stale.
	clk.advance(2 * time.Minute)
	a.resps = []fakeResp{{status: 304, header: hdr("Etag", `"e9"`, "X-A", "9", "Date", clk.date(0))}}
	r = get()
	wantAnswer(t, "a 304 for another tag", r, 200, "REVALIDATED", "two")
	if r.get("Etag") != `"e2"` || r.get("X-A") != "" {
		t.Fatalf("a 304 for another tag updated the entry: %+v", r.header)
	}
	a.resps = []fakeResp{{status: 304, header: hdr("Etag", `"e2"`, "Date", clk.date(0))}}
	wantAnswer(t, "still stale after it", get(), 200, "REVALIDATED", "two")
	if len(a.resps) != 0 {
		t.Fatal("responses left")
	}
}

// no-cache and must-revalidate are revalidated on every use once stale
// (no-cache: always), never served stale; without a validator the
// response is fetched again in full, or not stored at all.
func TestCacheRevalidationDirectives(t *testing.T) {
	c, clk := storyCore(t, "")
	a := &app{t: t}
	get := func(path string) answer {
		return serve(c, newReq("GET", path, "192.0.2.1", "Host", "h"), a.serve)
	}
	a.resps = []fakeResp{
		{status: 200, body: []byte("nc"), header: hdr("Cache-Control", "no-cache", "Etag", `"n"`)},
		{status: 304, header: hdr("Etag", `"n"`)},
		{status: 304, header: hdr("Etag", `"n"`)},
	}
	wantAnswer(t, "no-cache fill", get("/nc"), 200, "MISS", "nc")
	wantAnswer(t, "no-cache use 1", get("/nc"), 200, "REVALIDATED", "nc")
	wantAnswer(t, "no-cache use 2", get("/nc"), 200, "REVALIDATED", "nc")
	if a.added(1, "If-None-Match") != `"n"` || a.added(2, "If-None-Match") != `"n"` {
		t.Fatalf("no-cache revalidations: %+v", a.got)
	}

	a.got = nil
	a.resps = []fakeResp{
		{status: 200, body: []byte("mr"), header: hdr("Cache-Control", "max-age=1, must-revalidate, stale-if-error=600", "Last-Modified", "Sat, 01 Mar 2025 12:00:00 GMT")},
		{status: 503},
		{status: 304},
	}
	wantAnswer(t, "must-revalidate fill", get("/mr"), 200, "MISS", "mr")
	clk.advance(2 * time.Second)
	wantAnswer(t, "must-revalidate, the application fails: no stale response", get("/mr"), 503, "MISS", "")
	wantAnswer(t, "must-revalidate revalidated", get("/mr"), 200, "REVALIDATED", "mr")
	if a.added(1, "If-Modified-Since") == "" || a.added(2, "If-Modified-Since") == "" || a.added(2, "If-None-Match") != "" {
		t.Fatalf("must-revalidate revalidations: %+v", a.got)
	}

	a.got = nil
	a.resps = []fakeResp{
		{status: 200, body: []byte("a"), header: hdr("Cache-Control", "max-age=1")},
		{status: 200, body: []byte("b"), header: hdr("Cache-Control", "max-age=1")},
		{status: 200, body: []byte("c"), header: hdr("Cache-Control", "no-cache")},
		{status: 200, body: []byte("d"), header: hdr("Cache-Control", "no-cache")},
	}
	wantAnswer(t, "no validator", get("/nv"), 200, "MISS", "a")
	clk.advance(2 * time.Second)
	wantAnswer(t, "no validator, stale", get("/nv"), 200, "MISS", "b")
	if len(a.got[1].Add) != 0 {
		t.Fatalf("a request without a validator to send: %+v", a.got[1])
	}
	wantAnswer(t, "no-cache without a validator", get("/nv2"), 200, "MISS", "c")
	wantAnswer(t, "is not stored", get("/nv2"), 200, "MISS", "d")
}

// A targeted field decides before Cache-Control (CDN-Cache-Control, and
// the block's own before it); the block's own never reaches a client,
// on a miss or a hit; CDN-Cache-Control does.
func TestCacheTargeted(t *testing.T) {
	for _, own := range []string{"", "Edge-Control"} {
		c, _ := storyCore(t, own)
		name := own
		if name == "" {
			name = core.DefaultTargeted
		}
		a := &app{t: t}
		get := func(path string) answer {
			return serve(c, newReq("GET", path, "192.0.2.1", "Host", "h"), a.serve)
		}
		a.resps = []fakeResp{
			{status: 200, body: []byte("cdn"), header: hdr("Cache-Control", "no-store", "Cdn-Cache-Control", "max-age=60")},
			{status: 200, body: []byte("own"), header: hdr("Cache-Control", "max-age=60", "Cdn-Cache-Control", "no-store", name, "max-age=60")},
			{status: 200, body: []byte("nostore"), header: hdr("Cache-Control", "max-age=60", name, "no-store")},
			{status: 200, body: []byte("nostore2"), header: hdr("Cache-Control", "max-age=60", name, "no-store")},
		}
		wantAnswer(t, own+" cdn fill", get("/cdn"), 200, "MISS", "cdn")
		r := get("/cdn")
		wantAnswer(t, own+" cdn hit", r, 200, "HIT", "cdn")
		if r.get("Cdn-Cache-Control") != "max-age=60" || r.get("Cache-Control") != "no-store" {
			t.Fatalf("CDN-Cache-Control and Cache-Control go to clients: %+v", r.header)
		}
		r = get("/own")
		wantAnswer(t, own+" own fill", r, 200, "MISS", "own")
		if r.get(name) != "" {
			t.Fatalf("%s sent on a miss: %+v", name, r.header)
		}
		r = get("/own")
		wantAnswer(t, own+" own hit", r, 200, "HIT", "own")
		if r.get(name) != "" {
			t.Fatalf("%s sent on a hit: %+v", name, r.header)
		}
		wantAnswer(t, own+" own no-store", get("/ns"), 200, "MISS", "nostore")
		wantAnswer(t, own+" own no-store again", get("/ns"), 200, "MISS", "nostore2")
	}
}

// The cache stores what it may by RFC 9111 read strictly: an Expires
// that is not an HTTP-date is in the past, Age counts by its first
// member; the stored Date is served on a hit (one is added when the
// response had none); an error status with explicit freshness is stored.
func TestCacheStrictParsing(t *testing.T) {
	c, clk := storyCore(t, "")
	a := &app{t: t}
	get := func(path string) answer {
		return serve(c, newReq("GET", path, "192.0.2.1", "Host", "h"), a.serve)
	}
	twice := func(path string, h fakeHeader, status int, x string) {
		t.Helper()
		a.resps = append(a.resps, fakeResp{status: status, body: []byte("1"), header: h}, fakeResp{status: status, body: []byte("2"), header: h})
		wantAnswer(t, path+" first", get(path), status, "MISS", "1")
		body := "2"
		if x == "HIT" {
			body = "1"
		}
		wantAnswer(t, path+" second", get(path), status, x, body)
		a.resps = nil
	}
	future := clk.date(time.Hour)
	twice("/expires", hdr("Expires", future), 200, "HIT")
	twice("/expires-spaces", hdr("Expires", strings.Replace(string(future), " ", "  ", 2)), 200, "MISS")
	twice("/expires-hour", hdr("Expires", "Thu, 18 Aug 2050 2:01:18 GMT"), 200, "MISS")
	twice("/expires-twice", hdr("Expires", future, "Expires", future), 200, "MISS")
	twice("/age", hdr("Cache-Control", "max-age=3600", "Age", "7200, 0"), 200, "MISS")
	twice("/age-prefix", hdr("Cache-Control", "max-age=3600", "Age", "0, 7200"), 200, "HIT")
	twice("/503", hdr("Cache-Control", "max-age=60"), 503, "HIT")
	twice("/503-plain", nil, 503, "MISS")

	a.resps = []fakeResp{{status: 200, body: []byte("d"), header: hdr("Cache-Control", "max-age=60", "Date", clk.date(-time.Second))}}
	get("/date")
	clk.advance(5 * time.Second)
	if r := get("/date"); r.get("Date") != string(clk.date(-6*time.Second)) || r.get("Age") != "6" {
		t.Fatalf("the stored Date is not served: %+v", r.header)
	}
	a.resps = []fakeResp{{status: 200, body: []byte("n"), header: hdr("Cache-Control", "max-age=60")}}
	stored := string(clk.date(0))
	get("/nodate")
	clk.advance(5 * time.Second)
	if r := get("/nodate"); r.get("Date") != stored {
		t.Fatalf("a response without Date is stored with the time it arrived (%s): %+v", stored, r.header)
	}
}

// A byte range of a stored 200 is served from it: 206 with Content-Range,
// 416 past its end; several ranges, another unit or an If-Range that
// does not match get the whole response.
func TestCacheRanges(t *testing.T) {
	c, _ := storyCore(t, "")
	lm := "Sat, 01 Mar 2025 12:00:00 GMT"
	a := &app{t: t, resps: []fakeResp{{status: 200, body: []byte("0123456789A"), header: hdr("Cache-Control", "max-age=60", "Etag", `"s"`, "Last-Modified", lm)}}}
	get := func(method string, kv ...string) answer {
		return serve(c, newReq(method, "/r", "192.0.2.1", append([]string{"Host", "h"}, kv...)...), a.serve)
	}
	wantAnswer(t, "fill, a range asked", get("GET", "Range", "bytes=0-1"), 200, "MISS", "0123456789A")
	for _, tt := range []struct {
		kv           []string
		status       int
		body, crange string
	}{
		{[]string{"Range", "bytes=0-1"}, 206, "01", "bytes 0-1/11"},
		{[]string{"Range", "bytes=1-"}, 206, "123456789A", "bytes 1-10/11"},
		{[]string{"Range", "bytes=-1"}, 206, "A", "bytes 10-10/11"},
		{[]string{"Range", "bytes=-20"}, 206, "0123456789A", "bytes 0-10/11"},
		{[]string{"Range", "bytes=5-99"}, 206, "56789A", "bytes 5-10/11"},
		{[]string{"Range", "bytes=11-"}, 416, "", "bytes */11"},
		{[]string{"Range", "bytes=-0"}, 416, "", "bytes */11"},
		{[]string{"Range", "bytes=0-1,3-4"}, 200, "0123456789A", ""},
		{[]string{"Range", "items=0-1"}, 200, "0123456789A", ""},
		{[]string{"Range", "bytes=3-1"}, 200, "0123456789A", ""},
		{[]string{"Range", "bytes=0-1", "If-Range", `"s"`}, 206, "01", "bytes 0-1/11"},
		{[]string{"Range", "bytes=0-1", "If-Range", lm}, 206, "01", "bytes 0-1/11"},
		{[]string{"Range", "bytes=0-1", "If-Range", `"x"`}, 200, "0123456789A", ""},
		{[]string{"Range", "bytes=0-1", "If-Range", `W/"s"`}, 200, "0123456789A", ""},
	} {
		r := get("GET", tt.kv...)
		if r.status != tt.status || string(r.body) != tt.body || r.get("Content-Range") != tt.crange || r.get("X-Cache") != "HIT" ||
			r.get("Content-Length") != map[bool]string{true: strconv.Itoa(len(tt.body)), false: ""}[tt.status != 416] {
			t.Errorf("%q: %d %q Content-Range %q, header %+v; want %d %q %q", tt.kv, r.status, r.body, r.get("Content-Range"), r.header, tt.status, tt.body, tt.crange)
		}
	}
	if r := get("HEAD", "Range", "bytes=0-1"); r.status != 200 || r.get("Content-Length") != "11" || len(r.body) != 0 {
		t.Errorf("HEAD with a Range: %d %+v", r.status, r.header)
	}
}

// A background refresh (stale-while-revalidate) of a response with a
// validator is conditional too: its 304 refreshes the stored fields.
func TestCacheRefreshRevalidates(t *testing.T) {
	c, clk := storyCore(t, "")
	a := &app{t: t}
	get := func() answer { return serve(c, newReq("GET", "/swr", "192.0.2.1", "Host", "h"), a.serve) }
	a.resps = []fakeResp{
		{status: 200, body: []byte("s"), header: hdr("Cache-Control", "max-age=1, stale-while-revalidate=60", "Etag", `"w"`, "X-A", "1")},
		{status: 304, header: hdr("Cache-Control", "max-age=60", "Etag", `"w"`, "X-A", "2")},
	}
	wantAnswer(t, "fill", get(), 200, "MISS", "s")
	clk.advance(2 * time.Second)
	wantAnswer(t, "stale, refreshed in the background", get(), 200, "STALE", "s")
	if a.added(1, "If-None-Match") != `"w"` {
		t.Fatalf("the refresh was forwarded with %+v", a.got[1])
	}
	r := get()
	wantAnswer(t, "refreshed", r, 200, "HIT", "s")
	if r.get("X-A") != "2" || r.get("Cache-Control") != "max-age=60" {
		t.Fatalf("the refresh's 304 did not refresh the fields: %+v", r.header)
	}

	// A refresh's new response is stored with every field it has, those
	// the stale one had too.
	get2 := func() answer { return serve(c, newReq("GET", "/swr2", "192.0.2.1", "Host", "h"), a.serve) }
	a.resps = []fakeResp{
		{status: 200, body: []byte("1"), header: hdr("Cache-Control", "max-age=1, stale-while-revalidate=60", "X-A", "1", "Content-Type", "text/plain")},
		{status: 200, body: []byte("2"), header: hdr("Cache-Control", "max-age=60", "X-A", "2", "Content-Type", "text/html")},
	}
	wantAnswer(t, "fill 2", get2(), 200, "MISS", "1")
	clk.advance(2 * time.Second)
	wantAnswer(t, "stale 2", get2(), 200, "STALE", "1")
	r = get2()
	wantAnswer(t, "refreshed 2", r, 200, "HIT", "2")
	if r.get("X-A") != "2" || r.get("Content-Type") != "text/html" || r.get("Cache-Control") != "max-age=60" {
		t.Fatalf("the refreshed response lost fields: %+v", r.header)
	}
}

// A purge, by URL or by tag, while one request fetches a response and
// another waits for that fetch: what the first fetched is not stored (it
// may be what was purged), but the waiter's own fetch, which begins after
// the purge, is, and the next request is a hit.
func TestCachePurgeDuringAFill(t *testing.T) {
	for _, by := range []string{"url", "tag"} {
		t.Run(by, func(t *testing.T) {
			c, _, r := storyCoreRegion(t, "")
			resp := fakeResp{status: 200, body: []byte("x"), header: hdr("Cache-Control", "max-age=60", "Cache-Tag", "t")}
			a := &app{t: t, resps: []fakeResp{resp, resp}}
			req := func() *fakeReq { return newReq("GET", "/p", "192.0.2.1", "Host", "h") }
			fetching := c.Begin(req())
			fetching.NoWait(true)
			if v := fetching.Decide(); v != core.Pass {
				t.Fatalf("the first request: %v, want it to fetch", v)
			}
			waiting := c.Begin(req())
			waiting.NoWait(true)
			if v := waiting.Decide(); v != core.Wait {
				t.Fatalf("the second request: %v, want it to wait for the fetch", v)
			}
			if by == "url" {
				if _, err := core.PurgeURL(r, "/p"); err != nil {
					t.Fatal(err)
				}
			} else {
				core.PurgeTag(r, "t")
			}
			forward(fetching, a.serve)
			fetching.Finish(nil)
			if v := waiting.Decide(); v != core.Pass {
				t.Fatalf("the waiter after the fetch: %v, want it to fetch itself", v)
			}
			forward(waiting, a.serve)
			waiting.Finish(nil)
			wantAnswer(t, "after the purge and the waiter's fetch", serve(c, req(), a.serve), 200, "HIT", "x")
		})
	}
}

// If-None-Match: * is false for any current representation (RFC 9110
// §13.1.2): a hit without an ETag is answered 304 too.
func TestCacheIfNoneMatchStar(t *testing.T) {
	c, _ := storyCore(t, "")
	a := &app{t: t, resps: []fakeResp{{status: 200, body: []byte("x"), header: hdr("Cache-Control", "max-age=60")}}}
	wantAnswer(t, "fill", serve(c, newReq("GET", "/n", "192.0.2.1", "Host", "h"), a.serve), 200, "MISS", "x")
	wantAnswer(t, "If-None-Match: *", serve(c, newReq("GET", "/n", "192.0.2.1", "Host", "h", "If-None-Match", "*"), a.serve), 304, "HIT", "")
}

// A 304 that has been in a cache on its way (Age) refreshes the entry
// with that age (RFC 9111 §4.2.3), as a 200 with it would be stored: the
// entry is fresh for what remains of its lifetime, not for all of it.
func TestCacheRevalidationKeepsThe304sAge(t *testing.T) {
	c, clk := storyCore(t, "")
	a := &app{t: t}
	get := func() answer {
		return serve(c, newReq("GET", "/r", "192.0.2.1", "Host", "h"), a.serve)
	}
	a.resps = []fakeResp{{status: 200, body: []byte("one"),
		header: hdr("Cache-Control", "max-age=2", "Etag", `"e1"`, "Date", clk.date(0))}}
	wantAnswer(t, "fill", get(), 200, "MISS", "one")
	clk.advance(3 * time.Second)
	a.resps = []fakeResp{{status: 304, header: hdr("Date", clk.date(0), "Cache-Control", "max-age=60", "Etag", `"e1"`, "Age", "50")}}
	if r := get(); r.get("Age") != "50" {
		t.Fatalf("revalidated: Age %q, want 50: %+v", r.get("Age"), r.header)
	}
	clk.advance(5 * time.Second)
	if r := get(); r.get("X-Cache") != "HIT" || r.get("Age") != "55" {
		t.Fatalf("5s later: X-Cache %q Age %q, want HIT 55", r.get("X-Cache"), r.get("Age"))
	}
	// 50 + 5 + 6 = 61 > 60: stale, revalidated again.
	clk.advance(6 * time.Second)
	a.resps = []fakeResp{{status: 304, header: hdr("Date", clk.date(0), "Cache-Control", "max-age=60", "Etag", `"e1"`)}}
	if r := get(); r.get("X-Cache") != "REVALIDATED" {
		t.Fatalf("past its lifetime: X-Cache %q, want REVALIDATED", r.get("X-Cache"))
	}
	if len(a.resps) != 0 {
		t.Fatal("the stale entry was not revalidated")
	}
}

// A reload that lowers a cache block's ttl caps the entries stored under
// the higher one too: the ttl is the longest a response is fresh, and
// the workers of the new configuration serve none fresher.
func TestCacheTTLLoweredByReload(t *testing.T) {
	r := joinedRegion(t, shm.Options{Counters: 64, Responses: 64, ResponseBytes: 1 << 20})
	clk := &storyClock{}
	coreWith := func(ttl time.Duration) *core.Core {
		c, err := core.New(r, core.Options{
			Caches: core.CacheBlocks(core.Cache{Route: mustRoute(t, "/*", "GET", "HEAD"), TTL: ttl, MaxBody: 1 << 20, LockTimeout: time.Second}),
			Now:    clk.now,
			Wall:   clk.wall,
		})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	before, after := coreWith(time.Hour), coreWith(10*time.Second)
	a := &app{t: t}
	get := func(c *core.Core) answer {
		return serve(c, newReq("GET", "/r", "192.0.2.1", "Host", "h"), a.serve)
	}
	a.resps = []fakeResp{{status: 200, body: []byte("old"), header: hdr("Cache-Control", "max-age=3600", "Date", clk.date(0))}}
	wantAnswer(t, "fill", get(before), 200, "MISS", "old")
	clk.advance(20 * time.Second)
	wantAnswer(t, "the old configuration", get(before), 200, "HIT", "old")
	a.resps = []fakeResp{{status: 200, body: []byte("new"), header: hdr("Cache-Control", "max-age=3600", "Date", clk.date(0))}}
	wantAnswer(t, "the new configuration", get(after), 200, "MISS", "new")
	wantAnswer(t, "then", get(after), 200, "HIT", "new")
}

// A cache block that a reload removed and a later one adds back serves
// none of the responses stored before it came back: while it was gone,
// unsafe requests to its URLs invalidated nothing (no block matched
// them), so what was stored may be what they changed.
func TestCacheBlockAddedBackByReload(t *testing.T) {
	r := joinedRegion(t, shm.Options{Counters: 64, Responses: 64, ResponseBytes: 1 << 20})
	clk := &storyClock{}
	coreWith := func(blocks ...core.Cache) *core.Core {
		o := core.Options{Now: clk.now, Wall: clk.wall}
		if blocks != nil {
			o.Caches = core.CacheBlocks(blocks...)
		}
		c, err := core.New(r, o)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	block := core.Cache{Route: mustRoute(t, "/*", "GET", "HEAD"), TTL: time.Hour, MaxBody: 1 << 20, LockTimeout: time.Second}
	before := coreWith(block)
	a := &app{t: t}
	get := func(c *core.Core) answer {
		return serve(c, newReq("GET", "/r", "192.0.2.1", "Host", "h"), a.serve)
	}
	a.resps = []fakeResp{{status: 200, body: []byte("old"), header: hdr("Cache-Control", "max-age=3600", "Date", clk.date(0))}}
	wantAnswer(t, "fill", get(before), 200, "MISS", "old")

	clk.advance(time.Minute)
	without := coreWith() // the block removed
	a.resps = []fakeResp{{status: 201}}
	if got := serve(without, newReq("POST", "/r", "192.0.2.1", "Host", "h"), a.serve); got.status != 201 {
		t.Fatalf("POST without the block: %d", got.status)
	}

	clk.advance(time.Minute)
	back := block
	back.Since = clk.now() // as the reload that adds it back sets it
	again := coreWith(back)
	a.resps = []fakeResp{{status: 200, body: []byte("new"), header: hdr("Cache-Control", "max-age=3600", "Date", clk.date(0))}}
	wantAnswer(t, "added back", get(again), 200, "MISS", "new")
	wantAnswer(t, "then", get(again), 200, "HIT", "new")
	// The block as it ran before (no Since) is unchanged: the entry the
	// new one stored is served.
	wantAnswer(t, "the block as configured at start", get(coreWith(block)), 200, "HIT", "new")
}

// A hit has the fields a miss gives the client, and no more: every
// Proxy-* field is hop-by-hop to the engines (never passed on), so it is
// not stored either, from a 200 or from a 304 that refreshes it; the
// fields the Connection field names are not stored.
func TestCacheStoresNoHopByHopField(t *testing.T) {
	c, clk := storyCore(t, "")
	a := &app{t: t}
	get := func() answer {
		return serve(c, newReq("GET", "/p", "192.0.2.1", "Host", "h"), a.serve)
	}
	a.resps = []fakeResp{{status: 200, body: []byte("x"), header: hdr("Cache-Control", "max-age=2", "Etag", `"e"`,
		"Proxy-Status", "edge; error=http_request_error", "Proxy-Authentication-Info", `nextnonce="n1"`,
		"Connection", "x-secret", "X-Secret", "s", "X-Kept", "k")}}
	wantAnswer(t, "fill", get(), 200, "MISS", "x")
	clk.advance(3 * time.Second)
	a.resps = []fakeResp{{status: 304, header: hdr("Etag", `"e"`, "Cache-Control", "max-age=60", "Proxy-Authentication-Info", `nextnonce="n2"`)}}
	for _, step := range []string{"revalidated", "hit"} {
		r := get()
		for _, name := range []string{"Proxy-Status", "Proxy-Authentication-Info", "X-Secret", "Connection"} {
			if v := r.get(name); v != "" {
				t.Fatalf("%s: %s: %q was stored: %+v", step, name, v, r.header)
			}
		}
		if r.get("X-Kept") != "k" {
			t.Fatalf("%s: an end-to-end field was not stored: %+v", step, r.header)
		}
	}
}
