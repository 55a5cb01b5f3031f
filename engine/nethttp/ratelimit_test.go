package nethttp_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/preforkd/preforkd/bucket"
	"github.com/preforkd/preforkd/config"
	"github.com/preforkd/preforkd/core"
	"github.com/preforkd/preforkd/engine/nethttp"
	"github.com/preforkd/preforkd/internal/logtest"
	"github.com/preforkd/preforkd/internal/ratelimittest"
	"github.com/preforkd/preforkd/internal/shmtest"
	"github.com/preforkd/preforkd/shm"
)

// t0 is the region time tests start at; wall0 is the wall clock then
// (2026-01-01T00:00:00Z).
const t0 = 1000 * time.Second

var wall0 = time.Unix(1_767_225_600, 0)

// clock is a test clock for Options.Now and Options.Wall: frozen until
// advanced, both readings moving together.
type clock struct{ d atomic.Int64 }

func newClock() *clock {
	c := &clock{}
	c.d.Store(int64(t0))
	return c
}
func (c *clock) Now() time.Duration       { return time.Duration(c.d.Load()) }
func (c *clock) Wall() time.Time          { return wall0.Add(c.Now() - t0) }
func (c *clock) Advance(by time.Duration) { c.d.Add(int64(by)) }

// newRegion is a private region with room for the statistics, joined as
// worker 0.
func newRegion(t testing.TB, opts shm.Options) *shm.Region {
	t.Helper()
	return shmtest.Private(t, statRegion(opts))
}

// app is the next handler: 200 "ok", and it records that it ran.
type app struct{ calls atomic.Int64 }

func (a *app) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	a.calls.Add(1)
	io.WriteString(w, "ok")
}

type fixture struct {
	mw     *handler
	app    *app
	clock  *clock
	region *shm.Region
	logs   *logtest.Buffer
}

func newFixture(t testing.TB, cfg config.Config, geo shm.Options) *fixture {
	t.Helper()
	o, err := cfg.CoreOptions()
	if err != nil {
		t.Fatal(err)
	}
	return newCoreFixture(t, o, geo)
}

// newCoreFixture is newFixture for core options built in Go (what the
// configuration cannot express yet, or tests that want the core alone).
func newCoreFixture(t testing.TB, o core.Options, geo shm.Options) *fixture {
	t.Helper()
	return newCoreFixtureOn(t, o, newRegion(t, geo))
}

// newCoreFixtureOn is newCoreFixture over a region of the test's.
func newCoreFixtureOn(t testing.TB, o core.Options, region *shm.Region) *fixture {
	t.Helper()
	f := &fixture{app: &app{}, clock: newClock(), region: region, logs: &logtest.Buffer{}}
	o.Logger = slog.New(slog.NewTextHandler(f.logs, &slog.HandlerOptions{
		ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey {
				return slog.Attr{}
			}
			return a
		},
	}))
	o.Now, o.Wall = f.clock.Now, f.clock.Wall
	c, err := core.New(f.region, o)
	if err != nil {
		t.Fatal(err)
	}
	f.mw = newHandler(c, f.app, nethttp.Options{}, f.region, o.RateLimits)
	return f
}

func request(method, target, remote string, hdr ...string) *http.Request {
	r := httptest.NewRequest(method, target, nil)
	r.RemoteAddr = remote
	for i := 0; i+1 < len(hdr); i += 2 {
		r.Header.Add(hdr[i], hdr[i+1])
	}
	return r
}

func (f *fixture) do(r *http.Request) *httptest.ResponseRecorder {
	w := httptest.NewRecorder()
	f.mw.ServeHTTP(w, r)
	return w
}

func (f *fixture) get(target, remote string, hdr ...string) *httptest.ResponseRecorder {
	return f.do(request("GET", target, remote, hdr...))
}

func cfgWith(rules ...config.RateLimit) config.Config {
	c := config.Default()
	c.RateLimits = rules
	// The answers are compared byte for byte (and their allocations
	// counted): without the random request id, tested on its own (core,
	// and the daemon's end-to-end tests).
	c.Server.RequestID = ""
	return c
}

// rateHeaders picks the rate-limit and refusal fields out of a response.
func rateHeaders(h http.Header) map[string]string { return ratelimittest.Fields(h) }

func checkHeaders(t *testing.T, what string, h http.Header, want map[string]string) {
	t.Helper()
	got := rateHeaders(h)
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: %s = %q, want %q", what, k, got[k], v)
		}
	}
	for k, v := range got {
		if _, ok := want[k]; !ok {
			t.Errorf("%s: unexpected %s: %q", what, k, v)
		}
	}
}

// The story of one client against "3 per minute": three served, the fourth
// refused, with every header exact.
func TestLimitOneClient(t *testing.T) {
	f := newFixture(t, cfgWith(config.RateLimit{Name: "login", Path: "/login", Limit: 3, Window: time.Minute}), shm.Options{Counters: 64})
	const wall = 1_767_225_600
	for i, want := range []map[string]string{
		{"RateLimit": `"login";r=2;t=20`, "X-RateLimit-Remaining": "2", "X-RateLimit-Reset": fmt.Sprint(wall + 20)},
		{"RateLimit": `"login";r=1;t=40`, "X-RateLimit-Remaining": "1", "X-RateLimit-Reset": fmt.Sprint(wall + 40)},
		{"RateLimit": `"login";r=0;t=60`, "X-RateLimit-Remaining": "0", "X-RateLimit-Reset": fmt.Sprint(wall + 60)},
	} {
		w := f.do(request("POST", "/login", "192.0.2.1:5000"))
		if w.Code != 200 || w.Body.String() != "ok" {
			t.Fatalf("request %d: %d %q, want 200 ok", i+1, w.Code, w.Body)
		}
		want["RateLimit-Policy"] = `"login";q=3;w=60`
		want["X-RateLimit-Limit"] = "3"
		checkHeaders(t, fmt.Sprintf("request %d", i+1), w.Header(), want)
	}

	w := f.do(request("POST", "/login", "192.0.2.1:5001")) // another port, same client
	if w.Code != http.StatusTooManyRequests {
		t.Fatalf("request 4: %d, want 429", w.Code)
	}
	// GCRA: one request per 20s; the fourth may pass 20s from now.
	checkHeaders(t, "request 4", w.Header(), map[string]string{
		"RateLimit-Policy":      `"login";q=3;w=60`,
		"RateLimit":             `"login";r=0;t=20`,
		"X-RateLimit-Limit":     "3",
		"X-RateLimit-Remaining": "0",
		"X-RateLimit-Reset":     fmt.Sprint(wall + 20),
		"Retry-After":           "20",
	})
	if got := w.Header().Get("Content-Type"); got != "application/problem+json" {
		t.Errorf("Content-Type = %q", got)
	}
	if got := w.Header().Get("Cache-Control"); got != "no-store" {
		t.Errorf("Cache-Control = %q", got)
	}
	wantBody := `{"type":"https://iana.org/assignments/http-problem-types#quota-exceeded","title":"Too Many Requests","status":429,"detail":"rate limit \"login\" exceeded; retry in 20 seconds","violated-policies":["login"]}` + "\n"
	if w.Body.String() != wantBody {
		t.Errorf("body\n got %s\nwant %s", w.Body, wantBody)
	}
	if !json.Valid(w.Body.Bytes()) {
		t.Errorf("body is not JSON")
	}
	if got := w.Header().Get("Content-Length"); got != fmt.Sprint(len(wantBody)) {
		t.Errorf("Content-Length = %s, want %d", got, len(wantBody))
	}
	if n := f.app.calls.Load(); n != 3 {
		t.Errorf("the application ran %d times, want 3", n)
	}

	// Retry-After is never early: rounded up, still refused 19.5s later,
	// served at 20s.
	f.clock.Advance(18500 * time.Millisecond)
	if w := f.get("/login", "192.0.2.1:1"); w.Code != 429 || w.Header().Get("Retry-After") != "2" {
		t.Errorf("at +18.5s: %d, Retry-After %q; want 429, 2 (1.5s rounded up)", w.Code, w.Header().Get("Retry-After"))
	}
	f.clock.Advance(time.Second)
	if w := f.get("/login", "192.0.2.1:1"); w.Code != 429 || w.Header().Get("Retry-After") != "1" {
		t.Errorf("at +19.5s: %d, Retry-After %q; want 429, 1 (0.5s rounded up)", w.Code, w.Header().Get("Retry-After"))
	}
	f.clock.Advance(500 * time.Millisecond)
	if w := f.get("/login", "192.0.2.1:1"); w.Code != 200 {
		t.Errorf("at +20s: %d, want 200", w.Code)
	}
	// Another client has its own budget; another path is not limited.
	if w := f.get("/login", "192.0.2.2:1"); w.Code != 200 {
		t.Errorf("other client: %d, want 200", w.Code)
	}
	w = f.get("/other", "192.0.2.1:1")
	if w.Code != 200 || len(rateHeaders(w.Header())) != 0 {
		t.Errorf("unmatched path: %d %v, want 200 without rate-limit headers", w.Code, rateHeaders(w.Header()))
	}
	st := f.mw.Stats()
	if want := []ruleCounts{{Name: "login", Allowed: 5, Limited: 3}}; fmt.Sprint(st) != fmt.Sprint(want) {
		t.Errorf("Stats = %+v, want %+v", st, want)
	}
}

// A fixed window reports the end of the window as t, refused or not.
func TestFixedWindowHeaders(t *testing.T) {
	f := newFixture(t, cfgWith(config.RateLimit{Name: "fw", Path: "/x", Limit: 2, Window: 10 * time.Second, Algorithm: bucket.FixedWindow}), shm.Options{Counters: 64})
	f.clock.Advance(3 * time.Second) // t0 is window-aligned; 7s remain in this one
	for i, want := range []string{`"fw";r=1;t=7`, `"fw";r=0;t=7`, `"fw";r=0;t=7`} {
		w := f.get("/x", "192.0.2.1:1")
		if got := w.Header().Get("RateLimit"); got != want {
			t.Errorf("request %d: RateLimit = %q, want %q", i+1, got, want)
		}
		if i == 2 && (w.Code != 429 || w.Header().Get("Retry-After") != "7") {
			t.Errorf("request 3: %d, Retry-After %q; want 429, 7", w.Code, w.Header().Get("Retry-After"))
		}
	}
}

// Two rules on one path: B refuses the third request, and A is not charged
// for it.
func TestRefusalChargesNoRule(t *testing.T) {
	f := newFixture(t, cfgWith(
		config.RateLimit{Name: "A", Path: "/api/*", Limit: 10, Window: time.Minute},
		config.RateLimit{Name: "B", Path: "/api/*", Limit: 2, Window: time.Minute},
	), shm.Options{Counters: 64})
	req := func() *http.Request { return request("GET", "/api/items", "192.0.2.1:1") }
	remainingA := func() int64 {
		return f.mw.Limiter("A").Peek(string(f.mw.KeyOf("A", req())), f.clock.Now()).Remaining
	}
	for i := 0; i < 2; i++ {
		if w := f.do(req()); w.Code != 200 {
			t.Fatalf("request %d: %d", i+1, w.Code)
		}
	}
	if got := remainingA(); got != 8 {
		t.Fatalf("A remaining after 2 requests = %d, want 8", got)
	}
	for i := 0; i < 5; i++ {
		w := f.do(req())
		if w.Code != 429 {
			t.Fatalf("request %d: %d, want 429", i+3, w.Code)
		}
		if i == 0 {
			checkHeaders(t, "refused", w.Header(), map[string]string{
				"RateLimit-Policy":      `"A";q=10;w=60, "B";q=2;w=60`,
				"RateLimit":             `"A";r=8;t=12, "B";r=0;t=30`, // A's t from a peek: full again in two emission intervals
				"X-RateLimit-Limit":     "2",
				"X-RateLimit-Remaining": "0",
				"X-RateLimit-Reset":     "1767225630",
				"Retry-After":           "30",
			})
			if !strings.Contains(w.Body.String(), `"detail":"rate limit \"B\" exceeded; retry in 30 seconds","violated-policies":["B"]}`) {
				t.Errorf("body %s", w.Body)
			}
		}
	}
	if got := remainingA(); got != 8 {
		t.Errorf("A remaining after 5 refusals = %d, want 8 (a refusal charges no rule)", got)
	}
	if st := f.mw.Stats(); st[0].Allowed != 2 || st[0].Limited != 0 || st[1].Allowed != 2 || st[1].Limited != 5 {
		t.Errorf("Stats = %+v", st)
	}
}

// A request refused at the peek touches no rule's state: not even a slot
// for a key A has never seen is claimed (a charge and a refund would).
func TestRefusalClaimsNoSlot(t *testing.T) {
	f := newFixture(t, cfgWith(
		config.RateLimit{Name: "A", Path: "/*", Limit: 10, Window: time.Minute},
		config.RateLimit{Name: "B", Path: "/*", Limit: 1, Window: time.Minute, By: "global"},
	), shm.Options{Counters: 64})
	f.get("/", "192.0.2.1:1") // claims A's slot for this client, and B's one
	for i := 2; i <= 5; i++ {
		if w := f.get("/", fmt.Sprintf("192.0.2.%d:1", i)); w.Code != 429 {
			t.Fatalf("client %d: %d, want 429", i, w.Code)
		}
	}
	if st := f.region.Counters().Stats(); st.Claims != 2 || st.Live != 2 {
		t.Errorf("%d claims, %d live slots; want 2, 2", st.Claims, st.Live)
	}
}

// Several refusing rules: Retry-After is the latest, and every one is named.
func TestSeveralRulesRefuse(t *testing.T) {
	f := newFixture(t, cfgWith(
		config.RateLimit{Name: "short", Path: "/x", Limit: 1, Window: 10 * time.Second},
		config.RateLimit{Name: "long", Path: "/x", Limit: 1, Window: time.Hour},
	), shm.Options{Counters: 64})
	f.get("/x", "192.0.2.1:1")
	w := f.get("/x", "192.0.2.1:1")
	if w.Code != 429 || w.Header().Get("Retry-After") != "3600" {
		t.Fatalf("%d, Retry-After %q; want 429, 3600", w.Code, w.Header().Get("Retry-After"))
	}
	if !strings.Contains(w.Body.String(), `rate limit \"long\" exceeded; retry in 3600 seconds","violated-policies":["short","long"]}`) {
		t.Errorf("body %s", w.Body)
	}
	// The conventional headers describe the rule the Retry-After is of:
	// obeying X-RateLimit-Reset is never early.
	if got := w.Header().Get("X-RateLimit-Limit") + " " + w.Header().Get("X-RateLimit-Reset"); got != "1 1767229200" {
		t.Errorf("X-RateLimit-Limit, -Reset = %s", got)
	}
}

// The refund after a phase-2 refusal: A is charged, then B finds no slot
// for a new key and on_full "closed" refuses (a peek cannot know that); A
// must get its request back.
func TestRefundAfterLateRefusal(t *testing.T) {
	f := newFixture(t, cfgWith(
		config.RateLimit{Name: "A", Path: "/x", Limit: 100, Window: time.Hour, By: "global", MaxKeys: 8},
		config.RateLimit{Name: "B", Path: "/x", Limit: 100, Window: time.Hour, OnFull: bucket.Closed, MaxKeys: 8},
	), shm.Options{Counters: 8, Probe: 8})
	// A's one key and 7 clients of B fill the 8 slots.
	for i := 1; i <= 7; i++ {
		if w := f.get("/x", fmt.Sprintf("192.0.2.%d:1", i)); w.Code != 200 {
			t.Fatalf("client %d: %d", i, w.Code)
		}
	}
	remainingA := func() int64 {
		return f.mw.Limiter("A").Peek("g", f.clock.Now()).Remaining
	}
	if got := remainingA(); got != 93 {
		t.Fatalf("A remaining = %d, want 93", got)
	}
	w := f.get("/x", "192.0.2.99:1")
	if w.Code != http.StatusServiceUnavailable || w.Header().Get("Retry-After") != "1" {
		t.Fatalf("new client in a full table: %d, Retry-After %q; want 503, 1", w.Code, w.Header().Get("Retry-After"))
	}
	if got := remainingA(); got != 93 {
		t.Errorf("A remaining after the refusal = %d, want 93 (refunded)", got)
	}
	if got := w.Header().Get("RateLimit"); got != `"A";r=93;t=252, "B";r=0;t=1` {
		t.Errorf("RateLimit = %q", got)
	}
	if st := f.mw.Stats(); st[0].Allowed != 7 || st[1].Limited != 0 || st[1].FullClosed != 1 {
		t.Errorf("Stats = %+v", st)
	}
}

func TestOnFull(t *testing.T) {
	for _, onFull := range []bucket.OnFull{bucket.Open, bucket.Closed} {
		t.Run(onFull.String(), func(t *testing.T) {
			f := newFixture(t, cfgWith(config.RateLimit{Name: "ip", Path: "/*", Limit: 5, Window: 24 * time.Hour, OnFull: onFull}),
				shm.Options{Counters: 8, Probe: 8})
			for i := 1; i <= 8; i++ {
				if w := f.get("/", fmt.Sprintf("198.51.100.%d:1", i)); w.Code != 200 {
					t.Fatalf("client %d: %d", i, w.Code)
				}
			}
			// Hours later the 8 keys are still being limited: no slot is
			// reclaimed from them.
			f.clock.Advance(time.Hour)
			w := f.get("/", "198.51.100.200:1")
			st := f.mw.Stats()[0]
			switch onFull {
			case bucket.Open:
				if w.Code != 200 || st.FullOpen != 1 || st.Allowed != 8 {
					t.Errorf("%d, %+v; want 200, one FullOpen, 8 Allowed", w.Code, st)
				}
				// The rule knows nothing of this client: no item of it.
				if got := rateHeaders(w.Header()); len(got) != 0 {
					t.Errorf("rate-limit headers of a rule that failed open: %v", got)
				}
				if !strings.Contains(f.logs.String(), `msg="rule not enforced: counter table full (on_full open)" rule=ip`) {
					t.Errorf("no log line about the rule failing open:\n%s", f.logs)
				}
				for range 5 {
					f.get("/", "198.51.100.201:1")
				}
				if n := strings.Count(f.logs.String(), "rule not enforced"); n != 1 {
					t.Errorf("%d log lines in the same second, want 1", n)
				}
			case bucket.Closed:
				if w.Code != 503 || w.Header().Get("Retry-After") != "1" || st.FullClosed != 1 || st.Limited != 0 {
					t.Errorf("%d, Retry-After %q, %+v; want 503, 1, one FullClosed", w.Code, w.Header().Get("Retry-After"), st)
				}
				want := `{"type":"about:blank","title":"Service Unavailable","status":503,"detail":"rate limit \"ip\" is temporarily unavailable; retry in 1 second"}` + "\n"
				if w.Body.String() != want || w.Header().Get("Content-Type") != "application/problem+json" || w.Header().Get("Cache-Control") != "no-store" {
					t.Errorf("503: %v\n%s", w.Header(), w.Body)
				}
				if f.app.calls.Load() != 8 {
					t.Errorf("application ran %d times, want 8", f.app.calls.Load())
				}
			}
			// A client that has a slot is unaffected.
			if w := f.get("/", "198.51.100.1:1"); w.Code != 200 {
				t.Errorf("known client: %d", w.Code)
			}
		})
	}
}

func TestForwardedClients(t *testing.T) {
	rule := config.RateLimit{Name: "ip", Path: "/*", Limit: 2, Window: time.Minute}

	t.Run("untrusted peer", func(t *testing.T) {
		f := newFixture(t, cfgWith(rule), shm.Options{Counters: 64})
		for i := 1; i <= 5; i++ {
			w := f.get("/", "203.0.113.7:4000",
				"X-Forwarded-For", fmt.Sprintf("10.1.1.%d", i),
				"Forwarded", fmt.Sprintf("for=10.2.2.%d", i))
			if want := map[bool]int{true: 200, false: 429}[i <= 2]; w.Code != want {
				t.Errorf("request %d with a fresh X-Forwarded-For: %d, want %d", i, w.Code, want)
			}
		}
		if got := string(f.mw.KeyOf("ip", request("GET", "/", "203.0.113.7:1", "X-Forwarded-For", "10.1.1.1"))); got != "ip:203.0.113.7" {
			t.Errorf("KeyOf = %q, want the peer", got)
		}
	})

	t.Run("trusted proxy", func(t *testing.T) {
		cfg := cfgWith(rule)
		cfg.Server.TrustedProxies = []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}
		f := newFixture(t, cfg, shm.Options{Counters: 64})
		for round := 0; round < 2; round++ {
			for i := 1; i <= 5; i++ {
				w := f.get("/", "10.0.0.1:4000", "X-Forwarded-For", fmt.Sprintf("192.0.2.%d", i))
				if w.Code != 200 {
					t.Errorf("round %d, client %d: %d, want 200 (own budget)", round, i, w.Code)
				}
			}
		}
		if w := f.get("/", "10.0.0.1:4000", "X-Forwarded-For", "192.0.2.3"); w.Code != 429 {
			t.Errorf("client 3, third request: %d, want 429", w.Code)
		}
		// A client cannot pick a key by prepending to the header.
		if w := f.get("/", "10.0.0.1:4000", "X-Forwarded-For", "198.51.100.1, 192.0.2.3"); w.Code != 429 {
			t.Errorf("client 3 with a forged hop: %d, want 429", w.Code)
		}
		if got := string(f.mw.KeyOf("ip", request("GET", "/", "10.0.0.1:1", "X-Forwarded-For", "192.0.2.9"))); got != "ip:192.0.2.9" {
			t.Errorf("KeyOf = %q", got)
		}
	})
}

func TestHeaderModes(t *testing.T) {
	ietf := []string{"RateLimit-Policy", "RateLimit"}
	x := []string{"X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset"}
	for _, tt := range []struct {
		mode config.Headers
		want []string
	}{
		{config.HeadersBoth, append(append([]string{}, ietf...), x...)}, // the zero value
		{config.HeadersIETF, ietf},
		{config.HeadersX, x},
		{config.HeadersNone, nil},
	} {
		t.Run(tt.mode.String(), func(t *testing.T) {
			cfg := cfgWith(config.RateLimit{Name: "r", Path: "/", Limit: 1, Window: time.Second})
			cfg.Server.Headers = tt.mode
			f := newFixture(t, cfg, shm.Options{Counters: 64})
			for i, code := range []int{200, 429} {
				w := f.get("/", "192.0.2.1:1")
				if w.Code != code {
					t.Fatalf("request %d: %d, want %d", i+1, w.Code, code)
				}
				got := rateHeaders(w.Header())
				want := append([]string{}, tt.want...)
				if code == 429 {
					want = append(want, "Retry-After") // always, whatever the mode
				}
				for _, k := range want {
					if got[k] == "" {
						t.Errorf("request %d: no %s", i+1, k)
					}
					delete(got, k)
				}
				if len(got) > 0 {
					t.Errorf("request %d: unexpected %v", i+1, got)
				}
			}
		})
	}
	cfg := cfgWith()
	cfg.Server.Headers = 9
	if _, err := New(cfg, newRegion(t, shm.Options{Counters: 64}), &app{}, Options{}); err == nil {
		t.Error("Headers(9) accepted")
	}
}

// The headers are on the response whatever the next handler does with its
// own, and it can read them.
func TestHeadersSurviveNext(t *testing.T) {
	region := newRegion(t, shm.Options{Counters: 64})
	clk := newClock()
	var seen string
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen = w.Header().Get("RateLimit")
		w.Header().Set("X-App", "1")
		w.Header().Add("RateLimit", `"upstream";r=7`) // an upstream's own item joins the list
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "created")
	})
	mw, err := New(cfgWith(config.RateLimit{Name: "r", Path: "/", Limit: 5, Window: time.Minute}), region, next, Options{Now: clk.Now, Wall: clk.Wall})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(mw)
	defer srv.Close()
	resp, err := http.Post(srv.URL+"/", "text/plain", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if seen != `"r";r=4;t=12` {
		t.Errorf("next saw RateLimit %q", seen)
	}
	if resp.StatusCode != 201 || resp.Header.Get("X-App") != "1" {
		t.Errorf("%d %v", resp.StatusCode, resp.Header)
	}
	checkHeaders(t, "response", resp.Header, map[string]string{
		"RateLimit-Policy":      `"r";q=5;w=60`,
		"RateLimit":             `"r";r=4;t=12 | "upstream";r=7`,
		"X-RateLimit-Limit":     "5",
		"X-RateLimit-Remaining": "4",
		"X-RateLimit-Reset":     "1767225612",
	})
}

func TestShadow(t *testing.T) {
	f := newFixture(t, cfgWith(
		config.RateLimit{Name: "watch", Path: "/*", Limit: 1, Window: time.Minute, Mode: config.Shadow},
	), shm.Options{Counters: 64})
	for i := 1; i <= 5; i++ {
		w := f.get("/page", "192.0.2.1:1")
		if w.Code != 200 {
			t.Fatalf("request %d: %d, want 200 (shadow never refuses)", i, w.Code)
		}
		// Served: 0 left for 60s; refused in shadow: the next passes in 60s.
		want := `"watch";r=0;t=60`
		if got := w.Header().Get("RateLimit"); got != want || w.Header().Get("X-RateLimit-Remaining") != "0" {
			t.Errorf("request %d: RateLimit %q, X-RateLimit-Remaining %q", i, got, w.Header().Get("X-RateLimit-Remaining"))
		}
	}
	lines := func() []string { return strings.Split(strings.TrimSpace(f.logs.String()), "\n") }
	if l := lines(); len(l) != 1 || !strings.Contains(l[0], "rule=watch") || !strings.Contains(l[0], "suppressed=0") ||
		!strings.Contains(l[0], "client=192.0.2.1") || !strings.Contains(l[0], "level=WARN") {
		t.Fatalf("after 4 would-be refusals in one instant, log:\n%s", f.logs)
	}
	f.clock.Advance(999 * time.Millisecond)
	f.get("/page", "192.0.2.1:1")
	if l := lines(); len(l) != 1 {
		t.Fatalf("0.999s later, log:\n%s", f.logs)
	}
	f.clock.Advance(time.Millisecond)
	f.get("/page", "192.0.2.1:1")
	if l := lines(); len(l) != 2 || !strings.Contains(l[1], "suppressed=4") {
		t.Fatalf("1s later, log:\n%s", f.logs)
	}
	f.clock.Advance(time.Second)
	f.get("/page", "192.0.2.1:1")
	if l := lines(); len(l) != 3 || !strings.Contains(l[2], "suppressed=0") {
		t.Fatalf("2s later, log:\n%s", f.logs)
	}
	st := f.mw.Stats()[0]
	if st != (ruleCounts{Name: "watch", Allowed: 1, ShadowLimited: 7}) {
		t.Errorf("Stats = %+v", st)
	}
	if f.app.calls.Load() != 8 {
		t.Errorf("application ran %d times, want 8", f.app.calls.Load())
	}
}

// A shadow rule beside an enforcing one: it is not charged when the
// enforcing rule refuses, and it reports headers either way.
func TestShadowBesideEnforce(t *testing.T) {
	f := newFixture(t, cfgWith(
		config.RateLimit{Name: "enf", Path: "/*", Limit: 2, Window: time.Minute},
		config.RateLimit{Name: "shd", Path: "/*", Limit: 10, Window: time.Minute, Mode: config.Shadow},
	), shm.Options{Counters: 64})
	for i := 0; i < 4; i++ {
		f.get("/", "192.0.2.1:1")
	}
	w := f.get("/", "192.0.2.1:1")
	if w.Code != 429 || w.Header().Get("RateLimit") != `"enf";r=0;t=30, "shd";r=8;t=12` {
		t.Errorf("%d, RateLimit %q", w.Code, w.Header().Get("RateLimit"))
	}
	if st := f.mw.Stats(); st[1].Allowed != 2 || st[0].Limited != 3 {
		t.Errorf("Stats = %+v", st)
	}
}

func TestConcurrentExact(t *testing.T) {
	const limit, goroutines, each = 100, 8, 40
	for _, tt := range []struct {
		name  string
		rules []config.RateLimit
	}{
		{"one rule", []config.RateLimit{{Name: "L", Path: "/*", Limit: limit, Window: time.Hour}}},
		{"fixed window", []config.RateLimit{{Name: "L", Path: "/*", Limit: limit, Window: time.Hour, Algorithm: bucket.FixedWindow}}},
		// A wider rule first: every refusal by L after A's charge must be
		// refunded to A.
		{"two rules", []config.RateLimit{
			{Name: "A", Path: "/*", Limit: 250, Window: time.Hour},
			{Name: "L", Path: "/*", Limit: limit, Window: time.Hour},
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t, cfgWith(tt.rules...), shm.Options{Counters: 64})
			var ok, refused atomic.Int64
			var wg sync.WaitGroup
			for g := 0; g < goroutines; g++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := 0; i < each; i++ {
						switch w := f.get("/", "192.0.2.1:1"); w.Code {
						case 200:
							ok.Add(1)
						case 429:
							refused.Add(1)
						default:
							t.Errorf("status %d", w.Code)
						}
					}
				}()
			}
			wg.Wait()
			if ok.Load() != limit || refused.Load() != goroutines*each-limit {
				t.Errorf("%d allowed, %d refused; want exactly %d allowed", ok.Load(), refused.Load(), limit)
			}
			if f.mw.Limiter("A") != nil {
				if got := f.mw.Limiter("A").Peek("ip:192.0.2.1", f.clock.Now()).Remaining; got != 250-limit {
					t.Errorf("A remaining = %d, want %d: refused requests were charged", got, 250-limit)
				}
			}
		})
	}
}

func TestLimiterResetAfterLogin(t *testing.T) {
	f := newFixture(t, cfgWith(config.RateLimit{Name: "login", Path: "/login", Limit: 2, Window: time.Hour}), shm.Options{Counters: 64})
	r := request("POST", "/login", "192.0.2.1:1")
	f.do(r)
	f.do(r)
	if w := f.do(r); w.Code != 429 {
		t.Fatalf("%d, want 429", w.Code)
	}
	f.mw.Limiter("login").Reset(string(f.mw.KeyOf("login", r)), f.clock.Now())
	if w := f.do(r); w.Code != 200 {
		t.Errorf("after Reset: %d, want 200", w.Code)
	}
	if f.mw.Limiter("nope") != nil || f.mw.KeyOf("nope", r) != nil {
		t.Error("unknown rule: non-nil limiter or key")
	}
}

// headerWriter is a ResponseWriter that reuses its header map, so that
// allocation counts are the middleware's own.
type headerWriter struct{ h http.Header }

func (d *headerWriter) Header() http.Header         { return d.h }
func (d *headerWriter) Write(p []byte) (int, error) { return len(p), nil }
func (d *headerWriter) WriteHeader(int)             {}

func TestAllocations(t *testing.T) {
	region := newRegion(t, shm.Options{Counters: 1024})
	var tick atomic.Int64
	// Each reading is 1ms later: with 1000 per second the bucket never runs out.
	now := func() time.Duration { return time.Duration(tick.Add(int64(time.Millisecond))) }
	next := http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})
	mw, err := New(cfgWith(
		config.RateLimit{Name: "api", Path: "/api/*", Limit: 1000, Window: time.Second},
		config.RateLimit{Name: "login", Path: "/login", Methods: []string{"POST"}, Limit: 5, Window: time.Minute},
	), region, next, Options{Now: now})
	if err != nil {
		t.Fatal(err)
	}
	w := &headerWriter{h: http.Header{}}
	for _, tt := range []struct {
		target string
		max    float64
	}{
		{"/static/app.js", 0},
		{"/login", 0}, // a GET: the rule is for POST
		{"/api/v1/items", 2},
	} {
		r := request("GET", tt.target, "192.0.2.1:1234")
		allocs := testing.AllocsPerRun(200, func() {
			clear(w.h)
			mw.ServeHTTP(w, r)
		})
		if allocs > tt.max {
			t.Errorf("GET %s: %v allocations, want at most %v", tt.target, allocs, tt.max)
		}
	}
}

func BenchmarkMiddleware(b *testing.B) {
	for _, parallel := range []bool{false, true} {
		for _, target := range []string{"/api/v1/items", "/static/app.js", "/login"} {
			name := map[string]string{"/api/v1/items": "match-allowed", "/static/app.js": "no-match", "/login": "match-refused"}[target]
			method := map[bool]string{true: "POST", false: "GET"}[target == "/login"] // login's 5 a minute are spent at once
			if parallel {
				name += "-parallel"
			}
			b.Run(name, func(b *testing.B) {
				region := newRegion(b, shm.Options{Counters: 1 << 16})
				var tick atomic.Int64
				now := func() time.Duration { return time.Duration(tick.Add(int64(time.Microsecond))) }
				next := http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})
				mw, err := New(cfgWith(
					config.RateLimit{Name: "login", Path: "/login", Methods: []string{"POST"}, Limit: 5, Window: time.Minute},
					config.RateLimit{Name: "api", Path: "/api/*", Limit: 1_000_000, Window: time.Second},
				), region, next, Options{Now: now, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
				if err != nil {
					b.Fatal(err)
				}
				b.ReportAllocs()
				if !parallel {
					r := request(method, target, "192.0.2.1:1234")
					w := &headerWriter{h: http.Header{}}
					for b.Loop() {
						clear(w.h)
						mw.ServeHTTP(w, r)
					}
					return
				}
				var id atomic.Int32
				b.RunParallel(func(pb *testing.PB) {
					// One client per goroutine: contention is the table's, not one key's.
					r := request(method, target, fmt.Sprintf("192.0.2.%d:1234", id.Add(1)))
					w := &headerWriter{h: http.Header{}}
					for pb.Next() {
						clear(w.h)
						mw.ServeHTTP(w, r)
					}
				})
			})
		}
	}
}

// A key header sent twice is a 400 with nothing charged: the client could
// otherwise be counted under one value (r123) and served as the other
// (k1). One line stays a key; a repeated header the chain never reaches
// does not matter.
func TestRepeatedKeyHeader(t *testing.T) {
	f := newFixture(t, cfgWith(config.RateLimit{Name: "api", Path: "/api/*", Limit: 2, Window: time.Minute, By: "header:X-Api-Key|ip"}), shm.Options{Counters: 64})
	w := f.get("/api/x", "192.0.2.1:1", "X-Api-Key", "r123", "X-Api-Key", "k1")
	if w.Code != http.StatusBadRequest || !strings.Contains(w.Body.String(), "X-Api-Key") {
		t.Fatalf("repeated key header: %d %q", w.Code, w.Body)
	}
	if f.app.calls.Load() != 0 || f.region.Counters().Stats().Live != 0 {
		t.Fatalf("a refused request ran or was charged")
	}
	for i := 0; i < 2; i++ {
		if w := f.get("/api/x", "192.0.2.1:1", "X-Api-Key", "k1"); w.Code != http.StatusOK {
			t.Fatalf("k1 request %d: %d", i, w.Code)
		}
	}
	if w := f.get("/api/x", "192.0.2.1:1", "X-Api-Key", "k1"); w.Code != http.StatusTooManyRequests {
		t.Fatalf("k1 over its limit: %d", w.Code)
	}
}

// With two rules, one of which fails open, the headers describe only the
// rule that knows the client.
func TestFullOpenBesideKnowingRule(t *testing.T) {
	f := newFixture(t, cfgWith(
		config.RateLimit{Name: "keyed", Path: "/*", Limit: 5, Window: 24 * time.Hour, MaxKeys: 8},
		config.RateLimit{Name: "global", Path: "/*", Limit: 100, Window: time.Hour, By: "global", MaxKeys: 8},
	), shm.Options{Counters: 8, Probe: 8})
	for i := 1; i <= 7; i++ { // 7 client keys and the global key fill the 8 slots
		if w := f.get("/", fmt.Sprintf("198.51.100.%d:1", i)); w.Code != 200 {
			t.Fatalf("client %d: %d", i, w.Code)
		}
	}
	w := f.get("/", "198.51.100.200:1")
	if w.Code != 200 {
		t.Fatalf("new client: %d", w.Code)
	}
	want := map[string]string{
		"RateLimit-Policy": `"global";q=100;w=3600`, "RateLimit": `"global";r=92;t=288`,
		"X-RateLimit-Limit": "100", "X-RateLimit-Remaining": "92", "X-RateLimit-Reset": "1767225888",
	}
	checkHeaders(t, "new client", w.Header(), want)
}

// Path tricks that dodged a /login rule (a bypass for case-insensitive
// routers and for servers that drop ';' parameters or trailing dots) are
// counted against it; paths no application should see are 400; the next
// handler gets the path with dot segments removed and slashes merged.
func TestPathTricks(t *testing.T) {
	var seen []string
	f := newFixture(t, cfgWith(config.RateLimit{Name: "login", Path: "/login", Limit: 100, Window: time.Hour}), shm.Options{Counters: 64})
	f.mw.Handler = nethttp.New(f.mw.Core(), http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen = append(seen, r.URL.EscapedPath())
	}), nethttp.Options{})
	tricks := []string{"/login", "/LOGIN", "/login;x", "/login.", "/Login/", "//login", "/x/../login", "/%6Cogin", "/login%2e", "/login;jsessionid=1"}
	for i, p := range tricks {
		w := f.get(p, "192.0.2.1:1")
		if w.Code != 200 {
			t.Fatalf("%s: %d", p, w.Code)
		}
		if got := w.Header().Get("RateLimit"); got != fmt.Sprintf(`"login";r=%d;t=%d`, 100-i-1, 36*(i+1)) {
			t.Fatalf("%s not counted under login: RateLimit %q", p, got)
		}
	}
	if seen[6] != "/login" || seen[5] != "/login" || seen[2] != "/login;x" {
		t.Fatalf("forwarded paths %q", seen)
	}
	for _, p := range []string{`/\login`, "/a%2Fb", "/a%5cb", "/a%00", "/a%zz", "/a%2", "/.;/login", "/x/..;/login"} {
		req := request("GET", "/", "192.0.2.1:1")
		req.RequestURI = p
		w := f.do(req)
		if w.Code != 400 || w.Header().Get("Content-Type") != "application/problem+json" {
			t.Fatalf("%q: %d %q, want a 400 problem", p, w.Code, w.Body)
		}
	}
	if len(seen) != len(tricks) {
		t.Fatalf("a refused path reached the handler: %q", seen)
	}
}

// A flood of new keys on one rule takes at most its max_keys slots (here
// 32; half the table by default, with two rules): past it that rule fails open
// (no RateLimit item, a log line naming max_keys) or closed (503), and
// the other rule keeps its room and stays exact for new clients. An
// override's keys count against their rule's room.
func TestMaxKeys(t *testing.T) {
	for _, onFull := range []bucket.OnFull{bucket.Open, bucket.Closed} {
		t.Run(onFull.String(), func(t *testing.T) {
			flood := config.RateLimit{Name: "flood", Path: "/api/*", Limit: 1, Window: time.Hour, By: "header:X-Flood", OnFull: onFull,
				MaxKeys: 32, Overrides: []config.Override{{Key: "gold", Limit: 50}}}
			login := config.RateLimit{Name: "login", Path: "/login", Limit: 3, Window: time.Hour}
			f := newFixture(t, cfgWith(flood, login), shm.Options{Counters: 256})
			capped := 0
			for i := range 200 {
				w := f.get("/api/x", "192.0.2.1:1", "X-Flood", fmt.Sprint("k", i))
				switch {
				case i < 32 && (w.Code != 200 || w.Header().Get("RateLimit") == ""):
					t.Fatalf("flood key %d: %d %v", i, w.Code, rateHeaders(w.Header()))
				case i >= 32 && onFull == bucket.Open:
					if w.Code != 200 || len(rateHeaders(w.Header())) != 0 {
						t.Fatalf("capped key %d: %d %v", i, w.Code, rateHeaders(w.Header()))
					}
					capped++
				case i >= 32:
					if w.Code != 503 || w.Header().Get("Retry-After") != "1" {
						t.Fatalf("capped key %d: %d %v", i, w.Code, rateHeaders(w.Header()))
					}
					capped++
				}
			}
			if w := f.get("/api/x", "192.0.2.1:1", "X-Flood", "gold"); onFull == bucket.Open && w.Header().Get("RateLimit") != "" || onFull == bucket.Closed && w.Code != 503 {
				t.Errorf("an override's new key took a slot past the rule's max_keys: %d %v", w.Code, rateHeaders(w.Header()))
			}
			if w := f.get("/api/x", "192.0.2.1:1", "X-Flood", "k5"); w.Code != 429 {
				t.Errorf("a flood key with a slot: %d, want 429", w.Code)
			}
			for c := 1; c <= 20; c++ {
				addr := fmt.Sprintf("198.51.100.%d:1", c)
				for n := range 4 {
					w := f.get("/login", addr)
					if want := map[bool]int{true: 200, false: 429}[n < 3]; w.Code != want {
						t.Fatalf("login client %d request %d: %d, want %d (%v)", c, n, w.Code, want, rateHeaders(w.Header()))
					}
					if r := w.Header().Get("RateLimit"); n < 3 && r != fmt.Sprintf(`"login";r=%d;t=%d`, 2-n, 1200*(n+1)) {
						t.Fatalf("login client %d request %d: RateLimit %q", c, n, r)
					}
				}
			}
			st := f.mw.Stats()
			floodKeys, floodMax := f.mw.Core().Keys("flood")
			loginKeys, loginMax := f.mw.Core().Keys("login")
			if st[0].CappedOpen+st[0].CappedClosed != uint64(capped+1) || st[0].FullOpen+st[0].FullClosed != 0 || floodKeys != 32 || floodMax != 32 ||
				st[1].FullOpen+st[1].FullClosed+st[1].CappedOpen+st[1].CappedClosed != 0 || loginKeys != 20 || loginMax != 128 {
				t.Fatalf("stats %+v; keys %d of %d, %d of %d", st, floodKeys, floodMax, loginKeys, loginMax)
			}
			if onFull == bucket.Open && !strings.Contains(f.logs.String(), `msg="rule not enforced: its keys hold max_keys counter slots (on_full open)" rule=flood method=GET path=/api/x client=192.0.2.1 max_keys=32 keys=32`) {
				t.Errorf("no log line about max_keys:\n%s", f.logs)
			}
			if onFull == bucket.Closed && (!strings.Contains(f.logs.String(), `msg="request refused: its keys hold max_keys counter slots (on_full closed)" rule=flood method=GET path=/api/x client=192.0.2.1`) ||
				!strings.Contains(f.logs.String(), `max_keys=32 keys=32`) || strings.Contains(f.logs.String(), "counter table full")) {
				t.Errorf("a capped refusal's log line does not name max_keys:\n%s", f.logs)
			}
		})
	}
}

// Two rules whose names hash to one account are refused: they would share
// one count of slots.
func TestRulesOnOneAccount(t *testing.T) {
	o, err := cfgWith(
		config.RateLimit{Name: "rule-18", Path: "/a", Limit: 1, Window: time.Hour},
		config.RateLimit{Name: "rule-39", Path: "/b", Limit: 1, Window: time.Hour},
	).CoreOptions()
	if err != nil {
		t.Fatal(err)
	}
	_, err = core.New(newRegion(t, shm.Options{Counters: 64}), o)
	var ae *core.AccountError
	if !errors.As(err, &ae) || ae.Rule != "rule-39" || ae.Other != "rule-18" || ae.Index != 1 {
		t.Fatalf("New: %v", err)
	}
}

// A shadow rule whose keys hold max_keys slots says it is not counting,
// not that on_full "open" lets requests through: a shadow rule enforces
// nothing either way.
func TestMaxKeysShadow(t *testing.T) {
	dry := config.RateLimit{Name: "dry", Path: "/api/*", Limit: 1, Window: time.Hour, By: "header:X-Dry",
		Mode: config.Shadow, MaxKeys: 2}
	f := newFixture(t, cfgWith(dry), shm.Options{Counters: 64})
	for i := range 4 {
		if w := f.get("/api/x", "192.0.2.1:1", "X-Dry", fmt.Sprint("k", i)); w.Code != 200 {
			t.Fatalf("key %d: %d", i, w.Code)
		}
	}
	logs := f.logs.String()
	if !strings.Contains(logs, `msg="shadow rule not counting: its keys hold max_keys counter slots" rule=dry`) || strings.Contains(logs, "on_full") {
		t.Errorf("a capped shadow rule's log line:\n%s", logs)
	}
}
