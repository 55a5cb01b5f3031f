package nethttp_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/preforkd/preforkd/bucket"
	"github.com/preforkd/preforkd/clientip"
	"github.com/preforkd/preforkd/core"
	"github.com/preforkd/preforkd/engine/nethttp"
	"github.com/preforkd/preforkd/internal/redistest"
	"github.com/preforkd/preforkd/redisstore"
	"github.com/preforkd/preforkd/route"
	"github.com/preforkd/preforkd/shm"
)

// redisRule is a rule on path for every client IP, in Redis when rr is
// set.
func redisRule(t testing.TB, name, path string, algo bucket.Algorithm, limit int64, window time.Duration, rr *core.RedisRule) core.RateLimit {
	t.Helper()
	rt, err := route.Compile(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	by, err := clientip.ParseBy("ip")
	if err != nil {
		t.Fatal(err)
	}
	return core.RateLimit{Rule: bucket.Rule{Name: name, Limit: limit, Window: window, Algorithm: algo}, Route: rt, By: by, Redis: rr}
}

// globalRule keys r by nothing: one count for every client.
func globalRule(t *testing.T, r core.RateLimit) core.RateLimit {
	by, err := clientip.ParseBy("global")
	if err != nil {
		t.Fatal(err)
	}
	r.By = by
	return r
}

// newRedisFixture is newCoreFixture with a Store (ro, at srv) over the
// fixture's region, so that rules with Redis set go to srv. It waits for
// the Store's warm-up: the first request must not dial under its timeout.
func newRedisFixture(t *testing.T, srv *redistest.Server, o core.Options, ro redisstore.Options) *fixture {
	t.Helper()
	f := &fixture{}
	geo := shm.Options{Counters: 1024}
	region := newRegion(t, geo)
	ro.URL = srv.URL()
	st, err := redisstore.New(region, ro)
	if err != nil {
		t.Fatal(err)
	}
	<-st.Warmed()
	o.Redis = core.RedisRules(st)
	f = newCoreFixtureOn(t, o, region)
	t.Cleanup(func() { f.mw.Core().Close() })
	return f
}

var exact = &core.RedisRule{}

// countingStore are the Store options of the tests that count decisions.
var countingStore = redisstore.Options{Timeout: redistest.CallTimeout}

// A Redis rule answers with the same headers and the same problem as the
// same rule on the host's table.
func TestRedisRuleAnswersAsLocal(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	for _, algo := range []bucket.Algorithm{bucket.GCRA, bucket.FixedWindow} {
		local := newCoreFixture(t, core.Options{RateLimits: []core.RateLimit{redisRule(t, "login", "/login", algo, 3, time.Minute, nil)}}, shm.Options{Counters: 64})
		remote := newRedisFixture(t, srv, core.Options{RateLimits: []core.RateLimit{redisRule(t, "login", "/login", algo, 3, time.Minute, exact)}}, countingStore)
		for i := range 5 {
			wl := local.get("/login", "192.0.2.1:1")
			wr := remote.get("/login", "192.0.2.1:1")
			bl, br := wl.Body.String(), wr.Body.String()
			if algo == bucket.FixedWindow {
				bl, br = digitless(bl), digitless(br)
			}
			if wl.Code != wr.Code || bl != br {
				t.Fatalf("%v request %d: local %d %s, redis %d %s", algo, i+1, wl.Code, wl.Body, wr.Code, wr.Body)
			}
			hl, hr := rateHeaders(wl.Header()), rateHeaders(wr.Header())
			for k, v := range hl {
				if algo == bucket.FixedWindow && (k == "RateLimit" || k == "X-RateLimit-Reset" || k == "Retry-After") {
					// Windows align to each clock's own zero: compare the
					// shape, not the seconds.
					if (hr[k] == "") != (v == "") {
						t.Errorf("%v request %d: %s local %q redis %q", algo, i+1, k, v, hr[k])
					}
					continue
				}
				if hr[k] != v {
					t.Errorf("%v request %d: %s local %q redis %q", algo, i+1, k, v, hr[k])
				}
			}
			if len(hl) != len(hr) {
				t.Errorf("%v request %d: headers local %v redis %v", algo, i+1, hl, hr)
			}
		}
	}
}

// Several Redis rules and a local one on one request: one round trip per
// request, and a refusal by any rule charges none.
func TestRedisSeveralRulesOneRoundTrip(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	f := newRedisFixture(t, srv, core.Options{RateLimits: []core.RateLimit{
		globalRule(t, redisRule(t, "wide", "/api/*", bucket.GCRA, 100, time.Minute, exact)),
		redisRule(t, "narrow", "/api/*", bucket.FixedWindow, 3, time.Minute, exact),
		redisRule(t, "hourly", "/api/*", bucket.GCRA, 50, time.Hour, exact),
		redisRule(t, "local", "/api/x", bucket.GCRA, 5, time.Minute, nil),
	}}, countingStore)
	before := srv.Calls("evalsha")
	for i := range 4 {
		w := f.get("/api/y", "192.0.2.9:1")
		if want := map[bool]int{true: 200, false: 429}[i < 3]; w.Code != want {
			t.Fatalf("request %d: %d, want %d", i+1, w.Code, want)
		}
	}
	if n := srv.Calls("evalsha") - before; n != 4 {
		t.Fatalf("%d EVALSHA for 4 requests of 3 Redis rules, want 4", n)
	}
	// narrow refused the 4th: wide (one key for every client) was not
	// charged for it. Another client's request shows what it holds.
	if got := f.get("/api/y", "192.0.2.99:1").Header().Get("RateLimit"); !strings.HasPrefix(got, `"wide";r=96;`) {
		t.Fatalf("another client after a refusal: RateLimit %q, want wide at 96 (3 served + this one)", got)
	}

	// The local rule refuses first: Redis is neither asked nor charged.
	g := newRedisFixture(t, srv, core.Options{RateLimits: []core.RateLimit{
		redisRule(t, "remote", "/b", bucket.GCRA, 100, time.Minute, exact),
		redisRule(t, "local", "/b", bucket.FixedWindow, 2, time.Minute, nil),
	}}, countingStore)
	for range 2 {
		if w := g.get("/b", "192.0.2.10:1"); w.Code != 200 {
			t.Fatalf("%d", w.Code)
		}
	}
	before = srv.Calls("evalsha")
	if w := g.get("/b", "192.0.2.10:1"); w.Code != 429 {
		t.Fatalf("third: %d", w.Code)
	}
	if n := srv.Calls("evalsha") - before; n != 0 {
		t.Fatalf("a request the local rule refused made %d calls", n)
	}
	// Redis refuses: the local charge is refunded.
	h := newRedisFixture(t, srv, core.Options{RateLimits: []core.RateLimit{
		redisRule(t, "remote", "/c", bucket.FixedWindow, 1, time.Minute, exact),
		redisRule(t, "local", "/c", bucket.FixedWindow, 10, time.Minute, nil),
	}}, countingStore)
	h.get("/c", "192.0.2.11:1")
	for range 3 {
		if w := h.get("/c", "192.0.2.11:1"); w.Code != 429 {
			t.Fatalf("%d", w.Code)
		}
	}
	if d := h.mw.Limiter("local").Peek("ip:192.0.2.11", h.clock.Now()); d.Remaining != 9 {
		t.Fatalf("local rule: %d remaining after 1 served and 3 refused by Redis, want 9", d.Remaining)
	}
}

// digitless is s with its numbers (and a unit of seconds after one)
// replaced by "N".
func digitless(s string) string {
	// "retry in 1 second" and "retry in 20 seconds" are one shape: a
	// window can end within a second on either clock.
	return regexp.MustCompile(`[0-9]+( seconds?)?`).ReplaceAllString(s, "N")
}

// A limited client flooding a host: the deny cache answers, Redis hears
// nothing until the retry time.
func TestRedisDenyCacheSparesRedis(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	f := newRedisFixture(t, srv, core.Options{RateLimits: []core.RateLimit{
		redisRule(t, "flood", "/", bucket.GCRA, 10, time.Minute, exact),
	}}, countingStore)
	for range 10 {
		f.get("/", "192.0.2.20:1")
	}
	before := srv.Calls("evalsha")
	for i := range 1000 {
		w := f.get("/", "192.0.2.20:1")
		if w.Code != 429 || w.Header().Get("Retry-After") == "" {
			t.Fatalf("request %d: %d", i+1, w.Code)
		}
	}
	if n := srv.Calls("evalsha") - before; n > 1 {
		t.Fatalf("1000 requests of a limited client made %d calls, want at most 1", n)
	}
	// The client's retry time passes (region time): Redis decides again.
	f.clock.Advance(7 * time.Second)
	f.get("/", "192.0.2.20:1")
	if n := srv.Calls("evalsha") - before; n != 2 {
		t.Fatalf("after the retry time: %d calls in all, want 2", n)
	}
}

// Redis down: each on_unavailable answers, and nobody waits longer than
// the timeout.
func TestRedisUnavailablePolicies(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	f := newRedisFixture(t, srv, core.Options{RateLimits: []core.RateLimit{
		redisRule(t, "open", "/open", bucket.GCRA, 10, time.Minute, &core.RedisRule{OnUnavailable: redisstore.FailOpen}),
		redisRule(t, "closed", "/closed", bucket.GCRA, 10, time.Minute, &core.RedisRule{OnUnavailable: redisstore.FailClosed}),
		redisRule(t, "local", "/local", bucket.GCRA, 10, time.Minute, &core.RedisRule{OnUnavailable: redisstore.FailLocal, LocalShare: 2}),
	}}, redisstore.Options{Breaker: redisstore.Breaker{Failures: 3, Backoff: time.Hour}})
	// One request answered by Redis (its RateLimit field says so): on a
	// loaded machine the first may time out and be served open, and a
	// success resets the breaker's count of failures.
	for i := 0; ; i++ {
		w := f.get("/open", "192.0.2.30:1")
		if w.Code != 200 {
			t.Fatal(w.Code)
		}
		if w.Header().Get("RateLimit") != "" {
			break
		}
		if i == 50 {
			t.Fatalf("Redis answered none of 50 requests: %+v", f.mw.Core().Redis().(*redisstore.Store).Stats(f.region.Now()))
		}
	}
	before, rulesBefore := f.mw.Core().Redis().(*redisstore.Store).Stats(f.region.Now()), f.mw.Stats()
	srv.Kill()
	for i := range 6 {
		start := time.Now()
		w := f.get("/open", "192.0.2.30:1")
		// A bound against hanging (envoy's ratelimit waits 10s), with room
		// for a loaded machine: not a measure of speed.
		if d := time.Since(start); d > 10*redisstore.DefaultTimeout {
			t.Errorf("open %d: %v", i, d)
		}
		if w.Code != 200 || w.Header().Get("RateLimit") != "" {
			t.Fatalf("open with Redis down: %d, RateLimit %q", w.Code, w.Header().Get("RateLimit"))
		}
	}
	w := f.get("/closed", "192.0.2.30:1")
	var p map[string]any
	json.Unmarshal(w.Body.Bytes(), &p)
	if w.Code != http.StatusServiceUnavailable || w.Header().Get("Retry-After") != "1" || p["type"] != nil && p["type"] != "about:blank" {
		t.Fatalf("closed with Redis down: %d %s", w.Code, w.Body)
	}
	served := 0
	for range 12 {
		w := f.get("/local", "192.0.2.30:1")
		if got := w.Header().Get("RateLimit-Policy"); got != `"local";q=5;w=60` {
			t.Fatalf("local share policy header %q", got)
		}
		switch {
		case w.Code == 200:
			served++
		case w.Code != http.StatusTooManyRequests || !strings.Contains(w.Body.String(), "quota-exceeded"):
			// The share refuses as any rule does: its quota is spent.
			t.Fatalf("local share refusal: %d %s, want a 429 quota-exceeded", w.Code, w.Body)
		}
	}
	if served != 5 {
		t.Fatalf("local share: %d of 12 served, want 10 ÷ 2 = 5", served)
	}
	st := f.mw.Core().Redis().(*redisstore.Store).Stats(f.region.Now())
	if st.Breaker.Phase != redisstore.Open || st.Calls-before.Calls != 3 || st.Errors+st.Timeouts-before.Errors-before.Timeouts != 3 {
		t.Fatalf("after Redis died: %+v, before %+v (3 failed calls, then the breaker open)", st, before)
	}
	for _, rs := range f.mw.Stats() {
		if rs.Unavailable == 0 {
			t.Errorf("rule %s counted no unavailable decision", rs.Name)
		}
	}
	// Each rule counted what on_unavailable answered: open served them
	// uncounted, closed refused one, local's share decided (5 served).
	if st := f.mw.Stats(); st[0].UnavailableOpen-rulesBefore[0].UnavailableOpen != 6 || st[1].UnavailableClosed != 1 || st[2].Allowed != 5 || st[2].Limited != 7 {
		t.Errorf("counts after Redis died: %+v", st)
	}
}

// Redis rules with the features of local ones: an override (its own
// limit and its own Redis keys), a cost, a 503 refusal status, exempt
// clients (never counted: Redis hears nothing) and shadow mode (never
// refuses, on Redis either).
func TestRedisRuleFeatures(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	rl := redisRule(t, "tiered", "/t", bucket.FixedWindow, 4, time.Minute, exact)
	rl.Rule.Cost = 2
	rl.Status = http.StatusServiceUnavailable
	rl.Overrides = []core.Override{{Clients: []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24")}, Limit: 10}}
	rl.Exempt = []netip.Prefix{netip.MustParsePrefix("203.0.113.0/24")}
	shadow := redisRule(t, "watch", "/w", bucket.GCRA, 1, time.Minute, exact)
	shadow.Shadow = true
	f := newRedisFixture(t, srv, core.Options{RateLimits: []core.RateLimit{rl, shadow}}, countingStore)

	// Cost 2 of 4: two requests, then the rule's own status.
	for i, want := range []int{200, 200, 503} {
		if w := f.get("/t", "192.0.2.40:1"); w.Code != want {
			t.Fatalf("request %d: %d, want %d", i+1, w.Code, want)
		}
	}
	// The override's clients: 10 ÷ 2 = 5 requests, in keys of their own
	// (the rule's client above did not spend them).
	served := 0
	for range 7 {
		w := f.get("/t", "198.51.100.7:1")
		if w.Code == 200 {
			served++
			if got := w.Header().Get("RateLimit-Policy"); got != `"tiered";q=10;w=60` {
				t.Fatalf("override policy %q", got)
			}
		}
	}
	if served != 5 {
		t.Fatalf("override: %d served, want 5", served)
	}
	// Exempt: no header, no call.
	before := srv.Calls("evalsha")
	for range 10 {
		if w := f.get("/t", "203.0.113.9:1"); w.Code != 200 || w.Header().Get("RateLimit") != "" {
			t.Fatalf("exempt: %d %q", w.Code, w.Header().Get("RateLimit"))
		}
	}
	if n := srv.Calls("evalsha") - before; n != 0 {
		t.Fatalf("an exempt client made %d calls", n)
	}
	// Shadow: never refuses, and no deny-cache entry holds its key back.
	for i := range 5 {
		if w := f.get("/w", "192.0.2.41:1"); w.Code != 200 {
			t.Fatalf("shadow request %d: %d", i+1, w.Code)
		}
	}
	for _, rs := range f.mw.Stats() {
		if rs.Name == "watch" && (rs.Allowed != 1 || rs.ShadowLimited != 4) {
			t.Fatalf("shadow stats %+v, want 1 counted and 4 served that it would have refused", rs)
		}
	}
}

// The application's reset header resets a Redis rule on the request's
// path, as a decision is made there: within redis.timeout, and not at all
// while the breaker is open. A hung Redis (stopped, accepting and never
// answering) opens the breaker at the first reset that meets it; no
// response with the header waits on it after that.
func TestResetHeaderKeepsToTheBreaker(t *testing.T) {
	srv := redistest.Start(t)
	rules := []core.RateLimit{redisRule(t, "login", "/login", bucket.GCRA, 10, time.Minute, &core.RedisRule{OnUnavailable: redisstore.FailLocal})}
	f := newRedisFixture(t, srv, core.Options{RateLimits: rules, ResetHeader: "Preforkd-Reset"},
		redisstore.Options{Breaker: redisstore.Breaker{Failures: 1, Backoff: time.Hour}})
	login := newHandler(f.mw.Core(), http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Preforkd-Reset", "login") // the login succeeded
		w.Write([]byte("welcome"))
	}), nethttp.Options{}, f.region, rules)
	srv.Freeze()
	for i := range 3 {
		start := time.Now()
		w := httptest.NewRecorder()
		login.ServeHTTP(w, request("GET", "/login", "192.0.2.40:1"))
		took := time.Since(start)
		if w.Code != 200 {
			t.Fatalf("login %d: %d", i, w.Code)
		}
		// The first meets the hung Redis twice (its decision, then its
		// reset unless the decision opened the breaker); each within
		// redis.timeout.
		if bound := 4 * redisstore.DefaultTimeout; i == 0 && took > bound+time.Second || i > 0 && took > bound {
			t.Errorf("login %d: the response waited %v on a hung Redis", i, took)
		}
	}
	if st := f.mw.Core().Redis().(*redisstore.Store).Stats(f.region.Now()); st.Breaker.Phase != redisstore.Open {
		t.Errorf("breaker %v after the hung resets, want open", st.Breaker.Phase)
	}
}

// A refusal from the deny cache reports the latest retry time of the
// rules that refuse: a local rule of the request that would refuse for
// longer is not only peeked for its header item. A client that obeys the
// Retry-After is not refused again by the other rule.
func TestDenyCacheRefusalTakesTheLatestRetry(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	f := newRedisFixture(t, srv, core.Options{RateLimits: []core.RateLimit{
		redisRule(t, "remote", "/r", bucket.GCRA, 1, time.Minute, exact),
		redisRule(t, "local", "/*", bucket.GCRA, 2, time.Hour, nil),
	}}, countingStore)
	const client = "192.0.2.30:1"
	for i, tc := range []struct {
		path string
		code int
	}{
		{"/r", 200},     // both charged
		{"/r", 429},     // Redis refuses: its key in the deny cache; local not charged
		{"/other", 200}, // local's last
	} {
		if w := f.get(tc.path, client); w.Code != tc.code {
			t.Fatalf("request %d (%s): %d, want %d", i+1, tc.path, w.Code, tc.code)
		}
	}
	w := f.get("/r", client)
	retry, _ := strconv.Atoi(w.Header().Get("Retry-After"))
	if w.Code != 429 || retry < 25*60 {
		t.Errorf("refused by the deny cache (remote: a minute) and local (half an hour): %d, Retry-After %d s; want 429, the local rule's half hour", w.Code, retry)
	}
}
