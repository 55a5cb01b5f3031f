package nethttp_test

// The response cache, through the net/http adapter, on a clock
// the tests move.

import (
	"bytes"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/preforkd/preforkd/config"
	"github.com/preforkd/preforkd/core"
	"github.com/preforkd/preforkd/metrics"
	"github.com/preforkd/preforkd/shm"
)

// origin is the application behind the cache: it counts its calls per
// URL and answers with respond.
type origin struct {
	mu      sync.Mutex
	calls   map[string]int
	seen    []http.Header // request fields, in call order
	respond func(n int, w http.ResponseWriter, r *http.Request)
}

func (o *origin) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	o.mu.Lock()
	o.calls[r.URL.RequestURI()]++
	n := o.calls[r.URL.RequestURI()]
	o.seen = append(o.seen, r.Header.Clone())
	o.mu.Unlock()
	o.respond(n, w, r)
}

func (o *origin) count(uri string) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.calls[uri]
}

func (o *origin) total() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	n := 0
	for _, c := range o.calls {
		n += c
	}
	return n
}

// cacheFixture is the adapter with cache blocks over a private region, an
// origin, and a clock that moves only when the test says.
type cacheFixture struct {
	t      *testing.T
	h      *handler
	region *shm.Region
	o      *origin
	clock  atomic.Int64 // ns since the start
}

var wallStart = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

func newCacheFixture(t *testing.T, cfg config.Config, respond func(n int, w http.ResponseWriter, r *http.Request)) *cacheFixture {
	t.Helper()
	// 2^20 tag generations (8 MiB, touched only where used) make it one in
	// a quarter of a million that a purge here also purges, by sharing its
	// slot, an entry a test expects kept (at the default 65536 slots, one
	// in 16,000 for TestCachePurge's four).
	r := newRegion(t, shm.Options{Counters: 64, Responses: 256, ResponseBytes: 1 << 20, BlockSize: 256, Tags: 1 << 20})
	f := &cacheFixture{t: t, region: r, o: &origin{calls: map[string]int{}, respond: respond}}
	for i := range cfg.Caches {
		if cfg.Caches[i].LockTimeout == 0 {
			cfg.Caches[i].LockTimeout = 5 * time.Second
		}
	}
	var err error
	f.h, err = New(cfg, r, f.o, Options{
		Now:  func() time.Duration { return time.Hour + time.Duration(f.clock.Load()) },
		Wall: f.wall,
	})
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// cacheCounts is what the cache stage counted in the region.
type cacheCounts struct {
	Hits, Stale, Misses, Bypass, NotModified, Bytes   uint64
	Stored, NotStored, Waits, LockTimeouts, Refreshes uint64
	Invalidations, Purged                             uint64
}

func (f *cacheFixture) stats() cacheCounts {
	var s metrics.Snapshot
	metrics.Read(f.region, &s)
	v := func(fam metrics.Family, i int) uint64 { return s.Value(fam, i) }
	return cacheCounts{
		Hits: v(metrics.CacheRequests, metrics.CacheHit), Stale: v(metrics.CacheRequests, metrics.CacheStale),
		Misses: v(metrics.CacheRequests, metrics.CacheMiss), Bypass: v(metrics.CacheRequests, metrics.CacheBypass),
		NotModified: v(metrics.CacheNotModified, 0), Bytes: v(metrics.CacheSentBytes, 0),
		Stored: v(metrics.CacheFills, metrics.CacheStored), NotStored: v(metrics.CacheFills, metrics.CacheNotStored),
		Waits: v(metrics.CacheWaits, metrics.CacheWaited), LockTimeouts: v(metrics.CacheWaits, metrics.CacheLockTimeout),
		Refreshes: v(metrics.CacheRefreshes, 0), Invalidations: v(metrics.CacheInvalidations, 0), Purged: v(metrics.CachePurged, 0),
	}
}

func (f *cacheFixture) wall() time.Time         { return wallStart.Add(time.Duration(f.clock.Load())) }
func (f *cacheFixture) advance(d time.Duration) { f.clock.Add(int64(d)) }

// do sends a request with header fields given as name, value pairs.
func (f *cacheFixture) do(method, target string, hdr ...string) *httptest.ResponseRecorder {
	f.t.Helper()
	req := httptest.NewRequest(method, target, nil)
	req.Host = "example.com"
	req.RemoteAddr = "192.0.2.1:1234"
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Add(hdr[i], hdr[i+1])
	}
	w := httptest.NewRecorder()
	f.h.ServeHTTP(w, req)
	return w
}

func (f *cacheFixture) get(target string, hdr ...string) *httptest.ResponseRecorder {
	f.t.Helper()
	return f.do(http.MethodGet, target, hdr...)
}

// want checks a response's status, X-Cache and body.
func (f *cacheFixture) want(w *httptest.ResponseRecorder, status int, xcache, body string) {
	f.t.Helper()
	if w.Code != status || w.Header().Get("X-Cache") != xcache || w.Body.String() != body {
		f.t.Fatalf("got %d X-Cache %q body %q, want %d %q %q; fields %v", w.Code, w.Header().Get("X-Cache"), w.Body.String(), status, xcache, body, w.Header())
	}
}

// cacheAll is one block over every path.
func cacheAll() config.Config {
	return config.Config{Caches: []config.Cache{{Path: "/*"}}}
}

// cacheable answers with the given Cache-Control, a body naming the call,
// and the fields extra gives (name, value pairs).
func cacheable(cc string, extra ...string) func(int, http.ResponseWriter, *http.Request) {
	return func(n int, w http.ResponseWriter, r *http.Request) {
		if cc != "" {
			w.Header().Set("Cache-Control", cc)
		}
		for i := 0; i+1 < len(extra); i += 2 {
			w.Header().Add(extra[i], extra[i+1])
		}
		w.Header().Set("Content-Type", "text/plain")
		fmt.Fprintf(w, "%s #%d", r.URL.RequestURI(), n)
	}
}

// A fresh response is stored once and served from the cache with its
// fields (repeated ones too), a rising Age and X-Cache: HIT; the fields
// that are the cache's own or hop-by-hop are not stored.
func TestCacheHit(t *testing.T) {
	f := newCacheFixture(t, cacheAll(), cacheable("max-age=60", "Link", "</a>; rel=preload", "Link", "</b>; rel=preload", "Keep-Alive", "timeout=5", "Connection", "X-Private", "X-Private", "secret", "Etag", `"v1"`))
	first := f.get("/page?x=1")
	f.want(first, 200, "MISS", "/page?x=1 #1")
	for i, age := range []string{"0", "5", "59"} {
		if i > 0 {
			f.advance(map[int]time.Duration{1: 5 * time.Second, 2: 54 * time.Second}[i])
		}
		w := f.get("/page?x=1")
		f.want(w, 200, "HIT", "/page?x=1 #1")
		if got := w.Header().Get("Age"); got != age {
			t.Fatalf("Age %q, want %s", got, age)
		}
		if links := w.Header().Values("Link"); len(links) != 2 || links[1] != "</b>; rel=preload" {
			t.Fatalf("Link lines: %q", links)
		}
		if w.Header().Get("Keep-Alive") != "" || w.Header().Get("X-Private") != "" || w.Header().Get("Connection") != "" {
			t.Fatalf("hop-by-hop fields stored: %v", w.Header())
		}
		if w.Header().Get("Content-Type") != "text/plain" || w.Header().Get("Content-Length") != strconv.Itoa(len("/page?x=1 #1")) {
			t.Fatalf("fields of a hit: %v", w.Header())
		}
	}
	f.advance(time.Second) // age 60: stale
	f.want(f.get("/page?x=1"), 200, "MISS", "/page?x=1 #2")
	if n := f.o.count("/page?x=1"); n != 2 {
		t.Fatalf("%d fetches, want 2", n)
	}
	// Another query is another URL; HEAD is answered from GET's entry.
	f.want(f.get("/page?x=2"), 200, "MISS", "/page?x=2 #1")
	head := f.do(http.MethodHead, "/page?x=2")
	f.want(head, 200, "HIT", "")
	if head.Header().Get("Content-Length") != strconv.Itoa(len("/page?x=2 #1")) {
		t.Fatalf("HEAD hit fields: %v", head.Header())
	}
	st := f.stats()
	if st.Hits != 4 || st.Misses != 3 || st.Stored != 3 || st.Bytes != 3*uint64(len("/page?x=1 #1")) {
		t.Fatalf("stats: %+v", st)
	}
}

// An http.Handler behind the adapter is the application with no proxy in
// between: it gets X-Forwarded-Host and X-Forwarded-Proto as the client
// sent them, and frameworks build redirects and absolute links from them.
// A client's values that are not the request's own Host and scheme key
// the response apart: one client never stores a redirect to its host,
// or to http, for the others. The same values as the request's share
// the entry.
func TestCacheKeysForwardedHostAndProtoOfAHandler(t *testing.T) {
	f := newCacheFixture(t, cacheAll(), func(n int, w http.ResponseWriter, r *http.Request) {
		host, scheme := r.Host, "http"
		if h := r.Header.Get("X-Forwarded-Host"); h != "" {
			host = h
		}
		if p := r.Header.Get("X-Forwarded-Proto"); p != "" {
			scheme = p
		}
		w.Header().Set("Cache-Control", "max-age=60")
		fmt.Fprintf(w, "%s://%s/login #%d", scheme, host, n)
	})
	f.want(f.get("/r", "X-Forwarded-Host", "evil.example"), 200, "MISS", "http://evil.example/login #1")
	f.want(f.get("/r", "X-Forwarded-Proto", "https"), 200, "MISS", "https://example.com/login #2")
	f.want(f.get("/r"), 200, "MISS", "http://example.com/login #3")
	f.want(f.get("/r", "X-Forwarded-Host", "example.com", "X-Forwarded-Proto", "http"), 200, "HIT", "http://example.com/login #3")
	f.want(f.get("/r", "X-Forwarded-Host", "evil.example"), 200, "HIT", "http://evil.example/login #1")
}

// What a shared cache must not store is fetched every time.
func TestCacheNotStored(t *testing.T) {
	for _, tt := range []struct {
		name    string
		respond func(int, http.ResponseWriter, *http.Request)
		hdr     []string
	}{
		{"no-store", cacheable("max-age=60, no-store"), nil},
		{"private", cacheable("private, max-age=60"), nil},
		{"private with fields", cacheable(`max-age=60, private="X-User"`), nil},
		{"no-cache", cacheable("no-cache, max-age=60"), nil},
		{"Set-Cookie", cacheable("max-age=60", "Set-Cookie", "session=1"), nil},
		{"Authorization", cacheable("max-age=60"), []string{"Authorization", "Bearer t"}},
		{"no freshness", cacheable(""), nil},
		{"Last-Modified without heuristic", cacheable("", "Last-Modified", "Sat, 01 Mar 2025 12:00:00 GMT"), nil},
		{"Expires in the past", cacheable("", "Expires", "Sat, 01 Mar 2025 12:00:00 GMT"), nil},
		{"invalid Expires", cacheable("", "Expires", "0"), nil},
		{"invalid max-age", cacheable("max-age=soon"), nil},
		{"Vary: *", cacheable("max-age=60", "Vary", "*"), nil},
		{"Vary with a star", cacheable("max-age=60", "Vary", "Accept, *"), nil},
		// An error status is stored only with explicit freshness.
		{"5xx without freshness", func(n int, w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Last-Modified", "Sat, 01 Mar 2025 12:00:00 GMT")
			w.WriteHeader(503)
			fmt.Fprintf(w, "#%d", n)
		}, nil},
		{"5xx with no-store", func(n int, w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Cache-Control", "max-age=60, no-store")
			w.WriteHeader(500)
			fmt.Fprintf(w, "#%d", n)
		}, nil},
		{"206", func(n int, w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Cache-Control", "max-age=60")
			w.WriteHeader(206)
		}, nil},
		{"over max_body", func(n int, w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Cache-Control", "max-age=60")
			w.Write(bytes.Repeat([]byte{'x'}, 2048))
		}, nil},
		{"too many tags", cacheable("max-age=60", "Cache-Tag", manyTags(33)), nil},
		{"a tag too long", cacheable("max-age=60", "Surrogate-Key", "a "+strings.Repeat("t", 1025)), nil},
		{"stale on arrival", cacheable("max-age=60", "Age", "120"), nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg := config.Config{Caches: []config.Cache{{Path: "/*", MaxBody: 1024}}}
			f := newCacheFixture(t, cfg, tt.respond)
			for range 3 {
				if x := f.get("/p", tt.hdr...).Header().Get("X-Cache"); x != "MISS" {
					t.Fatalf("X-Cache %q, want MISS", x)
				}
			}
			if n := f.o.count("/p"); n != 3 {
				t.Fatalf("%d fetches, want 3", n)
			}
		})
	}
}

func manyTags(n int) string {
	var tags []string
	for i := range n {
		tags = append(tags, "tag-"+strconv.Itoa(i))
	}
	return strings.Join(tags, ", ")
}

// Up to 32 tags are kept.
func TestCacheTagsKept(t *testing.T) {
	f := newCacheFixture(t, cacheAll(), cacheable("max-age=60", "Cache-Tag", manyTags(20), "Surrogate-Key", "s-1 s-2\ttag-3"))
	f.get("/p")
	f.want(f.get("/p"), 200, "HIT", "/p #1")
	core.PurgeTag(f.region, "tag-19")
	f.want(f.get("/p"), 200, "MISS", "/p #2")
	core.PurgeTag(f.region, "s-2")
	f.want(f.get("/p"), 200, "MISS", "/p #3")
}

// A request with Authorization may store a response that says a shared
// cache may: public, s-maxage or must-revalidate.
func TestCacheAuthorizationAllowed(t *testing.T) {
	for _, cc := range []string{"public, max-age=60", "s-maxage=60", "must-revalidate, max-age=60"} {
		f := newCacheFixture(t, cacheAll(), cacheable(cc))
		f.want(f.get("/p", "Authorization", "Bearer t"), 200, "MISS", "/p #1")
		f.want(f.get("/p"), 200, "HIT", "/p #1")
	}
}

// Freshness: s-maxage before max-age before Expires - Date; the block's
// ttl caps it; heuristic freshness only when the block allows it.
func TestCacheFreshness(t *testing.T) {
	for _, tt := range []struct {
		name  string
		cfg   config.Cache
		cc    string
		extra func(f *cacheFixture) []string
		fresh time.Duration
	}{
		{"s-maxage first", config.Cache{}, "s-maxage=10, max-age=100", nil, 10 * time.Second},
		{"max-age over Expires", config.Cache{}, "max-age=20", func(f *cacheFixture) []string {
			return []string{"Expires", f.wall().Add(time.Hour).Format(http.TimeFormat)}
		}, 20 * time.Second},
		{"Expires - Date", config.Cache{}, "", func(f *cacheFixture) []string {
			return []string{"Date", f.wall().Format(http.TimeFormat), "Expires", f.wall().Add(30 * time.Second).Format(http.TimeFormat)}
		}, 30 * time.Second},
		{"ttl cap", config.Cache{TTL: 15 * time.Second}, "max-age=3600", nil, 15 * time.Second},
		{"heuristic", config.Cache{Heuristic: true}, "", func(f *cacheFixture) []string {
			return []string{"Date", f.wall().Format(http.TimeFormat), "Last-Modified", f.wall().Add(-100 * time.Second).Format(http.TimeFormat)}
		}, 10 * time.Second},
		{"Age counts", config.Cache{}, "max-age=60", func(f *cacheFixture) []string { return []string{"Age", "40"} }, 20 * time.Second},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg := tt.cfg
			cfg.Path = "/*"
			var f *cacheFixture
			f = newCacheFixture(t, config.Config{Caches: []config.Cache{cfg}}, func(n int, w http.ResponseWriter, r *http.Request) {
				var extra []string
				if tt.extra != nil {
					extra = tt.extra(f)
				}
				cacheable(tt.cc, extra...)(n, w, r)
			})
			f.want(f.get("/p"), 200, "MISS", "/p #1")
			f.advance(tt.fresh - time.Second)
			f.want(f.get("/p"), 200, "HIT", "/p #1")
			f.advance(time.Second)
			f.want(f.get("/p"), 200, "MISS", "/p #2")
		})
	}
}

// Vary keeps variants apart: two values of Accept-Encoding are two
// entries, each served to its own; the request's fields decide.
func TestCacheVary(t *testing.T) {
	f := newCacheFixture(t, cacheAll(), func(n int, w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "max-age=60")
		w.Header().Set("Vary", "Accept-Encoding")
		fmt.Fprintf(w, "enc=%s #%d", r.Header.Get("Accept-Encoding"), n)
	})
	f.want(f.get("/v", "Accept-Encoding", "gzip"), 200, "MISS", "enc=gzip #1")
	f.want(f.get("/v", "Accept-Encoding", "br"), 200, "MISS", "enc=br #2")
	f.want(f.get("/v"), 200, "MISS", "enc= #3")
	for range 2 {
		f.want(f.get("/v", "Accept-Encoding", "gzip"), 200, "HIT", "enc=gzip #1")
		f.want(f.get("/v", "Accept-Encoding", "br"), 200, "HIT", "enc=br #2")
		f.want(f.get("/v"), 200, "HIT", "enc= #3")
	}
	if w := f.get("/v", "Accept-Encoding", "gzip"); w.Header().Get("Vary") != "Accept-Encoding" {
		t.Fatalf("Vary not sent with a hit: %v", w.Header())
	}
	// The origin stops varying: its response replaces the stub.
	f.o.respond = cacheable("max-age=60")
	f.advance(61 * time.Second)
	f.want(f.get("/v", "Accept-Encoding", "gzip"), 200, "MISS", "/v #4")
	f.want(f.get("/v", "Accept-Encoding", "br"), 200, "HIT", "/v #4")
}

// A field sent empty is not a field absent (RFC 9111 §4.1: an absent
// field matches only its absence): the two are two variants, in either
// order, as the application tells them apart.
func TestCacheVaryEmptyIsNotAbsent(t *testing.T) {
	f := newCacheFixture(t, cacheAll(), func(n int, w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "max-age=60")
		w.Header().Set("Vary", "X-V")
		_, present := r.Header["X-V"]
		fmt.Fprintf(w, "present=%v #%d", present, n)
	})
	f.want(f.get("/a", "X-V", ""), 200, "MISS", "present=true #1")
	f.want(f.get("/a"), 200, "MISS", "present=false #2")
	f.want(f.get("/b"), 200, "MISS", "present=false #1")
	f.want(f.get("/b", "X-V", ""), 200, "MISS", "present=true #2")
	f.want(f.get("/a", "X-V", ""), 200, "HIT", "present=true #1")
	f.want(f.get("/a"), 200, "HIT", "present=false #2")
}

// Conditional requests are answered 304 from the cache, without a body
// and without asking the application; a miss forwards no conditional
// field, so that what it stores is whole.
func TestCacheConditional(t *testing.T) {
	lm := "Sat, 01 Mar 2025 12:00:00 GMT"
	f := newCacheFixture(t, cacheAll(), cacheable("max-age=60", "Etag", `"abc"`, "Last-Modified", lm, "Content-Language", "en"))
	f.want(f.get("/c", "If-None-Match", `"abc"`), 200, "MISS", "/c #1")
	if f.o.seen[0].Get("If-None-Match") != "" {
		t.Fatalf("the fill forwarded If-None-Match: %v", f.o.seen[0])
	}
	for _, hdr := range [][]string{
		{"If-None-Match", `"abc"`},
		{"If-None-Match", `"x", W/"abc"`},
		{"If-None-Match", `*`},
		{"If-Modified-Since", lm},
		{"If-Modified-Since", "Sun, 02 Mar 2025 12:00:00 GMT"},
	} {
		w := f.get("/c", hdr...)
		f.want(w, 304, "HIT", "")
		if w.Header().Get("Etag") != `"abc"` || w.Header().Get("Cache-Control") != "max-age=60" || w.Header().Get("Content-Language") != "" || w.Header().Get("Content-Length") != "" {
			t.Fatalf("304 fields for %v: %v", hdr, w.Header())
		}
	}
	for _, hdr := range [][]string{
		{"If-None-Match", `"abd"`},
		{"If-None-Match", `"abd"`, "If-Modified-Since", lm}, // If-None-Match decides
		{"If-Modified-Since", "Fri, 28 Feb 2025 12:00:00 GMT"},
		{"If-Modified-Since", "not a date"},
	} {
		f.want(f.get("/c", hdr...), 200, "HIT", "/c #1")
	}
	// Preconditions only the application judges go to it.
	f.want(f.get("/c", "If-Match", `"abc"`), 200, "BYPASS", "/c #2")
	if n := f.o.count("/c"); n != 2 {
		t.Fatalf("%d fetches, want 2", n)
	}
	if st := f.stats(); st.NotModified != 5 || st.Bypass != 1 {
		t.Fatalf("stats: %+v", st)
	}
}

// A successful unsafe request invalidates the URL (every variant) and
// the same-host URL its Location names; a failed one does not.
func TestCacheInvalidation(t *testing.T) {
	f := newCacheFixture(t, cacheAll(), func(n int, w http.ResponseWriter, r *http.Request) {
		switch {
		case r.Method == http.MethodPost && r.URL.Path == "/fail":
			w.WriteHeader(500)
		case r.Method == http.MethodPost:
			w.Header().Set("Location", "http://example.com/other?q=1")
			w.WriteHeader(201)
		default:
			w.Header().Set("Cache-Control", "max-age=60")
			w.Header().Set("Vary", "Accept")
			fmt.Fprintf(w, "%s #%d", r.URL.RequestURI(), n)
		}
	})
	for _, u := range []string{"/items", "/other?q=1", "/fail"} {
		f.want(f.get(u), 200, "MISS", u+" #1")
		f.want(f.get(u, "Accept", "text/html"), 200, "MISS", u+" #2")
	}
	if w := f.do(http.MethodPost, "/items"); w.Code != 201 || w.Header().Get("X-Cache") != "BYPASS" {
		t.Fatalf("POST: %d %v", w.Code, w.Header())
	}
	// (The POST was the origin's call #3 for /items.)
	f.want(f.get("/items"), 200, "MISS", "/items #4")
	f.want(f.get("/items", "Accept", "text/html"), 200, "MISS", "/items #5")
	f.want(f.get("/other?q=1"), 200, "MISS", "/other?q=1 #3")
	f.do(http.MethodPost, "/fail")
	f.want(f.get("/fail"), 200, "HIT", "/fail #1")
	// Another host's Location does not invalidate ours.
	f.o.respond = func(n int, w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodDelete {
			w.Header().Set("Location", "http://elsewhere.example/fail")
			w.WriteHeader(204)
			return
		}
		cacheable("max-age=60")(n, w, r)
	}
	f.do(http.MethodDelete, "/items")
	f.want(f.get("/fail"), 200, "HIT", "/fail #1")
	if st := f.stats(); st.Invalidations != 2 {
		t.Fatalf("invalidations %d, want 2", st.Invalidations)
	}
}

// A URL is one URL however it is percent-encoded: an unsafe request, a
// Location and a purge each reach what another spelling stored.
func TestCacheInvalidationSpellings(t *testing.T) {
	f := newCacheFixture(t, cacheAll(), func(n int, w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			w.Header().Set("Location", "/b%7e?x=%c3%a9")
			w.WriteHeader(201)
			return
		}
		cacheable("max-age=60")(n, w, r)
	})
	fill := func(u string) {
		t.Helper()
		f.get(u)
		if w := f.get(u); w.Header().Get("X-Cache") != "HIT" {
			t.Fatalf("%s: not cached (%d %v)", u, w.Code, w.Header())
		}
	}
	miss := func(u string) {
		t.Helper()
		if w := f.get(u); w.Header().Get("X-Cache") != "MISS" {
			t.Fatalf("%s: X-Cache %q, want MISS", u, w.Header().Get("X-Cache"))
		}
	}
	fill("/caf%c3%a9?q=%7e")
	fill("/b~?x=%C3%A9")
	fill("/p%41th")
	f.do(http.MethodPost, "/caf%C3%A9?q=~") // and its Location, /b~?x=é
	miss("/caf%c3%a9?q=%7e")
	miss("/b~?x=%C3%A9")
	if ok, err := core.PurgeURL(f.region, "/pAth"); !ok || err != nil {
		t.Fatalf("PurgeURL: %v %v", ok, err)
	}
	miss("/p%41th")
}

// Purges by tag and by URL are misses at the next request; tags are
// matched as sent (never decoded), so a tag with '%' or '/' is purged by
// its own bytes.
func TestCachePurge(t *testing.T) {
	f := newCacheFixture(t, cacheAll(), func(n int, w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "max-age=60")
		w.Header().Set("Cache-Tag", "product-1, a/b%20c")
		w.Header().Set("Surrogate-Key", "section-"+r.URL.Query().Get("s"))
		fmt.Fprintf(w, "%s #%d", r.URL.RequestURI(), n)
	})
	fill := func(u string) { f.get(u); f.want(f.get(u), 200, "HIT", u+" #"+strconv.Itoa(f.o.count(u))) }
	fill("/p?s=1")
	fill("/q?s=2")
	if !core.PurgeTag(f.region, "section-1") {
		t.Fatal("PurgeTag: false")
	}
	f.want(f.get("/p?s=1"), 200, "MISS", "/p?s=1 #2")
	f.want(f.get("/q?s=2"), 200, "HIT", "/q?s=2 #1")
	core.PurgeTag(f.region, "a/b c") // decoded: not the tag
	f.want(f.get("/q?s=2"), 200, "HIT", "/q?s=2 #1")
	core.PurgeTag(f.region, "a/b%20c")
	f.want(f.get("/q?s=2"), 200, "MISS", "/q?s=2 #2")
	f.want(f.get("/p?s=1"), 200, "MISS", "/p?s=1 #3")

	if ok, err := core.PurgeURL(f.region, "http://any.host/./q?s=2"); !ok || err != nil {
		t.Fatalf("PurgeURL: %v %v", ok, err)
	}
	f.want(f.get("/q?s=2"), 200, "MISS", "/q?s=2 #3")
	f.want(f.get("/p?s=1"), 200, "HIT", "/p?s=1 #3")
	for _, bad := range []string{"", "q", "ftp://h/q", "/a%2Fb"} {
		if _, err := core.PurgeURL(f.region, bad); err == nil {
			t.Errorf("PurgeURL(%q) accepted", bad)
		}
	}
	if st := f.stats(); st.Purged != 4 {
		t.Fatalf("purged %d, want 4", st.Purged)
	}
}

// A purge while a response is being fetched keeps it out of the cache:
// it may predate the purge.
func TestCachePurgeDuringFill(t *testing.T) {
	var f *cacheFixture
	f = newCacheFixture(t, cacheAll(), func(n int, w http.ResponseWriter, r *http.Request) {
		if n == 1 {
			core.PurgeTag(f.region, "unrelated") // any tag purge: the response's tags are unknown before it
		}
		cacheable("max-age=60", "Cache-Tag", "t")(n, w, r)
	})
	f.want(f.get("/p"), 200, "MISS", "/p #1")
	f.want(f.get("/p"), 200, "MISS", "/p #2")
	f.want(f.get("/p"), 200, "HIT", "/p #2")
	// An invalidation of the URL during the fetch too.
	f.o.respond = func(n int, w http.ResponseWriter, r *http.Request) {
		if n == 3 {
			core.PurgeURL(f.region, "/p")
		}
		cacheable("max-age=60")(n, w, r)
	}
	f.advance(time.Minute)
	f.want(f.get("/p"), 200, "MISS", "/p #3")
	f.want(f.get("/p"), 200, "MISS", "/p #4")
	f.want(f.get("/p"), 200, "HIT", "/p #4")
	if st := f.stats(); st.Stored != 2 || st.NotStored != 2 {
		t.Fatalf("stored %d, not stored %d; want 2 and 2", st.Stored, st.NotStored)
	}
}

// Within stale-while-revalidate a stale response is served at once and
// refreshed once, in the background; must-revalidate forbids it.
func TestCacheStaleWhileRevalidate(t *testing.T) {
	f := newCacheFixture(t, cacheAll(), cacheable("max-age=10, stale-while-revalidate=30"))
	f.want(f.get("/s"), 200, "MISS", "/s #1")
	f.advance(15 * time.Second)
	w := f.get("/s")
	f.want(w, 200, "STALE", "/s #1")
	if w.Header().Get("Age") != "15" {
		t.Fatalf("Age %q", w.Header().Get("Age"))
	}
	f.h.Wait()
	if n := f.o.count("/s"); n != 2 {
		t.Fatalf("%d fetches after one stale hit, want 2", n)
	}
	if f.o.seen[1].Get("X-Cache") != "" {
		t.Fatal("the refresh carried X-Cache")
	}
	f.want(f.get("/s"), 200, "HIT", "/s #2")
	// Beyond the window: a miss.
	f.advance(41 * time.Second)
	f.want(f.get("/s"), 200, "MISS", "/s #3")
	// A stale HEAD is answered but refreshes nothing: its copy would
	// store no body.
	f.advance(15 * time.Second)
	f.want(f.do(http.MethodHead, "/s"), 200, "STALE", "")
	f.h.Wait()
	if n := f.o.count("/s"); n != 3 {
		t.Fatalf("%d fetches after a stale HEAD, want 3", n)
	}
	f.want(f.get("/s"), 200, "STALE", "/s #3")
	f.h.Wait()
	f.want(f.get("/s"), 200, "HIT", "/s #4")
	if st := f.stats(); st.Refreshes != 2 || st.Stale != 3 {
		t.Fatalf("stats: %+v", st)
	}

	g := newCacheFixture(t, cacheAll(), cacheable("max-age=10, stale-while-revalidate=30, must-revalidate"))
	g.get("/s")
	g.advance(15 * time.Second)
	g.want(g.get("/s"), 200, "MISS", "/s #2")
}

// A refresh's application may change its request (a router setting
// path values): the client's request, which the handlers around this one
// still read, keeps its own. The refresh still sees the path values the
// outer mux matched.
func TestCacheRefreshRequestIsItsOwn(t *testing.T) {
	var seen []string
	f := newCacheFixture(t, cacheAll(), func(n int, w http.ResponseWriter, r *http.Request) {
		seen = append(seen, r.PathValue("id")+" "+r.Pattern)
		r.SetPathValue("id", "changed")
		cacheable("max-age=10, stale-while-revalidate=30")(n, w, r)
	})
	mux := http.NewServeMux()
	mux.Handle("GET /items/{id}", f.h)
	get := func() (*http.Request, *httptest.ResponseRecorder) {
		req := httptest.NewRequest(http.MethodGet, "/items/7", nil)
		req.Host = "example.com"
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, req)
		return req, w
	}
	get()
	f.advance(15 * time.Second)
	req, w := get()
	f.want(w, 200, "STALE", "/items/7 #1")
	f.h.Wait()
	if got := req.PathValue("id"); got != "7" {
		t.Errorf("the client's request has path value %q after the refresh, want 7", got)
	}
	if len(seen) != 2 || seen[1] != "7 GET /items/{id}" {
		t.Errorf("the application saw %q, want the refresh to see 7 and the pattern", seen)
	}
}

// Many stale hits while a refresh runs make one refresh.
func TestCacheOneRefresh(t *testing.T) {
	release := make(chan struct{})
	f := newCacheFixture(t, cacheAll(), func(n int, w http.ResponseWriter, r *http.Request) {
		if n == 2 {
			<-release
		}
		cacheable("max-age=10, stale-while-revalidate=30")(n, w, r)
	})
	f.get("/s")
	f.advance(15 * time.Second)
	for range 20 {
		f.want(f.get("/s"), 200, "STALE", "/s #1")
	}
	close(release)
	f.h.Wait()
	if n := f.o.count("/s"); n != 2 {
		t.Fatalf("%d fetches, want 2", n)
	}
	f.want(f.get("/s"), 200, "HIT", "/s #2")
}

// With stale-if-error, a failing application (5xx) gets the stale
// response sent instead; without it, or past its window, the error
// passes.
func TestCacheStaleIfError(t *testing.T) {
	fail := false
	var mu sync.Mutex
	f := newCacheFixture(t, cacheAll(), func(n int, w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		if fail {
			w.Header().Set("Content-Type", "text/html")
			w.Header().Set("X-Error", "yes")
			w.WriteHeader(502)
			fmt.Fprint(w, "bad gateway")
			return
		}
		cc := "max-age=10, stale-if-error=60"
		if r.URL.Path == "/plain" {
			cc = "max-age=10"
		}
		cacheable(cc)(n, w, r)
	})
	f.want(f.get("/e"), 200, "MISS", "/e #1")
	f.want(f.get("/plain"), 200, "MISS", "/plain #1")
	mu.Lock()
	fail = true
	mu.Unlock()
	f.advance(20 * time.Second)
	w := f.get("/e")
	f.want(w, 200, "STALE", "/e #1")
	if w.Header().Get("X-Error") != "" || w.Header().Get("Content-Type") != "text/plain" || w.Header().Get("Age") != "20" {
		t.Fatalf("the stale answer has the failed one's fields: %v", w.Header())
	}
	f.want(f.get("/plain"), 502, "MISS", "bad gateway")
	f.advance(60 * time.Second)
	f.want(f.get("/e"), 502, "MISS", "bad gateway")
	if n := f.o.count("/e"); n != 3 {
		t.Fatalf("%d fetches, want 3", n)
	}
}

// Concurrent misses for one URL make one fetch; the others wait for it
// and are hits. After the lock timeout, waiters fetch themselves.
func TestCacheOneFetchPerMiss(t *testing.T) {
	release := make(chan struct{})
	f := newCacheFixture(t, cacheAll(), func(n int, w http.ResponseWriter, r *http.Request) {
		<-release
		cacheable("max-age=60")(n, w, r)
	})
	var wg sync.WaitGroup
	results := make([]*httptest.ResponseRecorder, 50)
	for i := range results {
		wg.Go(func() { results[i] = f.get("/hot") })
	}
	for f.stats().Waits < 49 {
		time.Sleep(time.Millisecond)
	}
	close(release)
	wg.Wait()
	xc := map[string]int{}
	for _, w := range results {
		xc[w.Header().Get("X-Cache")]++
		if w.Body.String() != "/hot #1" {
			t.Fatalf("body %q", w.Body.String())
		}
	}
	if f.o.count("/hot") != 1 || xc["MISS"] != 1 || xc["HIT"] != 49 {
		t.Fatalf("%d fetches, X-Cache %v", f.o.count("/hot"), xc)
	}

	// A fetch that outlasts the lock timeout: the waiter fetches itself,
	// and does not store.
	slow := make(chan struct{})
	cfg := config.Config{Caches: []config.Cache{{Path: "/*", LockTimeout: 50 * time.Millisecond}}}
	g := newCacheFixture(t, cfg, func(n int, w http.ResponseWriter, r *http.Request) {
		if n == 1 {
			<-slow
		}
		cacheable("max-age=60")(n, w, r)
	})
	done := make(chan *httptest.ResponseRecorder)
	go func() { done <- g.get("/slow") }()
	for g.o.count("/slow") == 0 {
		time.Sleep(time.Millisecond)
	}
	g.want(g.get("/slow"), 200, "MISS", "/slow #2")
	close(slow)
	g.want(<-done, 200, "MISS", "/slow #1")
	g.want(g.get("/slow"), 200, "HIT", "/slow #1")
	if st := g.stats(); st.LockTimeouts != 1 || st.Stored != 1 {
		t.Fatalf("stats: %+v", st)
	}
}

// Misses that waited for a fetch whose response could not be stored
// (private here) go to the application together, not in turn behind one
// fetch after another: every request for a private page would queue.
func TestCacheUnstorableFetchesAreNotQueued(t *testing.T) {
	release := make(chan struct{})
	var inFlight, most atomic.Int32
	f := newCacheFixture(t, cacheAll(), func(n int, w http.ResponseWriter, r *http.Request) {
		if n == 1 {
			<-release
		} else {
			// Wait a moment for another fetch beside this one.
			now := inFlight.Add(1)
			defer inFlight.Add(-1)
			for end := time.Now().Add(300 * time.Millisecond); now < 2 && time.Now().Before(end); now = inFlight.Load() {
				time.Sleep(time.Millisecond)
			}
			for m := most.Load(); now > m && !most.CompareAndSwap(m, now); m = most.Load() {
			}
		}
		cacheable("private, max-age=60")(n, w, r)
	})
	var wg sync.WaitGroup
	results := make([]*httptest.ResponseRecorder, 6)
	for i := range results {
		wg.Go(func() { results[i] = f.get("/account") })
	}
	for f.stats().Waits < 5 {
		time.Sleep(time.Millisecond)
	}
	close(release)
	wg.Wait()
	for _, w := range results {
		if w.Code != 200 || w.Header().Get("X-Cache") != "MISS" {
			t.Fatalf("%d X-Cache %q", w.Code, w.Header().Get("X-Cache"))
		}
	}
	if n := f.o.count("/account"); n != 6 || most.Load() < 2 {
		t.Fatalf("%d fetches, at most %d at once after the first; want 6, several at once", n, most.Load())
	}
}

// The cache comes after rate limiting: a refused request never fills it,
// and a hit is counted by the rule.
func TestCacheAfterRateLimit(t *testing.T) {
	cfg := cacheAll()
	cfg.RateLimits = []config.RateLimit{{Name: "r", Path: "/*", Limit: 3, Window: time.Hour}}
	f := newCacheFixture(t, cfg, cacheable("max-age=60"))
	f.want(f.get("/a"), 200, "MISS", "/a #1")
	f.want(f.get("/a"), 200, "HIT", "/a #1")
	w := f.get("/a")
	f.want(w, 200, "HIT", "/a #1")
	if w.Header().Get("X-Ratelimit-Remaining") != "0" {
		t.Fatalf("a hit without its rate-limit fields: %v", w.Header())
	}
	if w := f.get("/b"); w.Code != 429 || w.Header().Get("X-Cache") != "" {
		t.Fatalf("refused: %d %v", w.Code, w.Header())
	}
	if f.o.total() != 1 {
		t.Fatalf("%d fetches", f.o.total())
	}
	if st := f.region.Responses().Stats(); st.Cached != 1 || st.Filling != 0 {
		t.Fatalf("table: %+v", st)
	}
}
