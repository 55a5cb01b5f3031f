package nethttp_test

// The rate-limit features (exempt, cookie/query/path keys, overrides,
// cost, refusal status, shadow), through the net/http adapter.

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/preforkd/preforkd/bucket"
	"github.com/preforkd/preforkd/clientip"
	"github.com/preforkd/preforkd/core"
	"github.com/preforkd/preforkd/engine/nethttp"
	"github.com/preforkd/preforkd/route"
	"github.com/preforkd/preforkd/shm"
)

func coreRule(t testing.TB, name, path string, limit int64, window time.Duration, by string) core.RateLimit {
	t.Helper()
	rt, err := route.Compile(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, err := clientip.ParseBy(by)
	if err != nil {
		t.Fatal(err)
	}
	return core.RateLimit{Rule: bucket.Rule{Name: name, Limit: limit, Window: window}, Route: rt, By: b}
}

func prefixes(ss ...string) []netip.Prefix {
	var out []netip.Prefix
	for _, s := range ss {
		out = append(out, netip.MustParsePrefix(s))
	}
	return out
}

// count sends n requests and counts them by status.
func (f *fixture) count(n int, target, remote string, hdr ...string) map[int]int {
	got := map[int]int{}
	for range n {
		got[f.get(target, remote, hdr...).Code]++
	}
	return got
}

// An exempt client is never counted, never refused and gets no header,
// whether exempt globally or by the rule; a non-exempt client in the same
// run gets exactly the limit.
func TestExempt(t *testing.T) {
	for _, where := range []string{"global", "rule"} {
		t.Run(where, func(t *testing.T) {
			o := core.Options{RateLimits: []core.RateLimit{coreRule(t, "login", "/login", 5, time.Minute, "ip")}}
			if where == "global" {
				o.Exempt = prefixes("10.0.0.0/8", "2001:db8::/32")
			} else {
				o.RateLimits[0].Exempt = prefixes("10.0.0.0/8", "2001:db8::/32")
			}
			f := newCoreFixture(t, o, shm.Options{Counters: 64})
			for i := range 1000 {
				w := f.get("/login", "10.1.2.3:1")
				if w.Code != 200 || len(rateHeaders(w.Header())) != 0 {
					t.Fatalf("exempt request %d: %d %v", i, w.Code, rateHeaders(w.Header()))
				}
			}
			if w := f.get("/login", "[2001:db8::7]:1"); w.Code != 200 || len(rateHeaders(w.Header())) != 0 {
				t.Fatalf("exempt IPv6: %d %v", w.Code, w.Header())
			}
			if got := f.count(8, "/login", "192.0.2.1:1"); got[200] != 5 || got[429] != 3 {
				t.Fatalf("non-exempt client: %v, want 5 allowed", got)
			}
			if st := f.region.Counters().Stats(); st.Live != 1 {
				t.Fatalf("%d keys in the table, want only the non-exempt client's", st.Live)
			}
		})
	}
}

// Exemption is judged on the resolved client: an exempt range behind a
// trusted proxy is exempt, and a direct client cannot claim it with
// X-Forwarded-For.
func TestExemptBehindProxy(t *testing.T) {
	o := core.Options{
		Resolver:   clientip.Resolver{Trusted: prefixes("127.0.0.1/32")},
		Exempt:     prefixes("10.0.0.0/8"),
		RateLimits: []core.RateLimit{coreRule(t, "login", "/login", 2, time.Minute, "ip")},
	}
	f := newCoreFixture(t, o, shm.Options{Counters: 64})
	if got := f.count(10, "/login", "127.0.0.1:1", "X-Forwarded-For", "10.9.9.9"); got[200] != 10 {
		t.Fatalf("exempt client behind the proxy: %v", got)
	}
	if got := f.count(5, "/login", "192.0.2.7:1", "X-Forwarded-For", "10.9.9.9"); got[200] != 2 || got[429] != 3 {
		t.Fatalf("direct client claiming an exempt address: %v, want 2 allowed", got)
	}
}

// by = "cookie:session|ip": two sessions from one IP get separate budgets,
// no cookie falls back to the IP; the same for query:.
func TestCookieAndQueryKeys(t *testing.T) {
	for _, tt := range []struct {
		by      string
		a, b    func(target string) (string, []string)
		nothing func(target string) (string, []string)
	}{
		{"cookie:session|ip",
			func(p string) (string, []string) { return p, []string{"Cookie", "theme=dark; session=A"} },
			func(p string) (string, []string) { return p, []string{"Cookie", "session=B"} },
			func(p string) (string, []string) { return p, nil }},
		{"query:key|ip",
			func(p string) (string, []string) { return p + "?key=A", nil },
			func(p string) (string, []string) { return p + "?x=1&key=B", nil },
			func(p string) (string, []string) { return p + "?x=1", nil }},
	} {
		t.Run(tt.by, func(t *testing.T) {
			f := newCoreFixture(t, core.Options{RateLimits: []core.RateLimit{coreRule(t, "r", "/api/*", 3, time.Minute, tt.by)}}, shm.Options{Counters: 64})
			for _, who := range []func(string) (string, []string){tt.a, tt.b, tt.nothing} {
				target, hdr := who("/api/x")
				if got := f.count(5, target, "192.0.2.1:1", hdr...); got[200] != 3 || got[429] != 2 {
					t.Fatalf("%s %v: %v, want 3 allowed", target, hdr, got)
				}
			}
		})
	}
}

// by = "path" on "/*": each path has its own budget, the query is not
// part of it, and the spellings of one path are one key.
func TestPathKey(t *testing.T) {
	f := newCoreFixture(t, core.Options{RateLimits: []core.RateLimit{coreRule(t, "per-url", "/*", 2, time.Minute, "path")}}, shm.Options{Counters: 64})
	if got := f.count(3, "/a", "192.0.2.1:1"); got[200] != 2 {
		t.Fatalf("/a: %v", got)
	}
	if got := f.count(3, "/b", "192.0.2.1:1"); got[200] != 2 {
		t.Fatalf("/b: %v", got)
	}
	for _, p := range []string{"/a?x=1", "/a/", "//a", "/x/../a", "/A"} {
		if w := f.get(p, "192.0.2.2:1"); w.Code != 429 {
			t.Fatalf("%s counts as /a: %d, want 429", p, w.Code)
		}
	}
}

// An override key = "gold" with limit 50 next to the rule's 5: exactly 50
// and 5 in one run, with the override's limit in the headers; a client
// override likewise.
func TestOverrides(t *testing.T) {
	r := coreRule(t, "api", "/api/*", 5, time.Hour, "header:X-Api-Key|ip")
	r.Overrides = []core.Override{
		{Key: "gold", Limit: 50},
		{Clients: prefixes("198.51.100.0/24"), Limit: 20, Window: time.Minute},
	}
	f := newCoreFixture(t, core.Options{RateLimits: []core.RateLimit{r}}, shm.Options{Counters: 256})
	if got := f.count(60, "/api/x", "192.0.2.1:1", "X-Api-Key", "gold"); got[200] != 50 || got[429] != 10 {
		t.Fatalf("gold: %v, want 50 allowed", got)
	}
	if got := f.count(8, "/api/x", "192.0.2.1:1", "X-Api-Key", "silver"); got[200] != 5 || got[429] != 3 {
		t.Fatalf("silver: %v, want 5 allowed", got)
	}
	if got := f.count(25, "/api/x", "198.51.100.9:1"); got[200] != 20 {
		t.Fatalf("client override: %v, want 20 allowed", got)
	}
	w := f.get("/api/y", "192.0.2.2:1", "X-Api-Key", "gold")
	checkHeaders(t, "gold, refused", w.Header(), map[string]string{
		"RateLimit-Policy": `"api";q=50;w=3600`, "RateLimit": `"api";r=0;t=72`,
		"X-RateLimit-Limit": "50", "X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "1767225672",
		"Retry-After": "72",
	})
}

// cost = 3 with limit 10: the 4th request is refused.
func TestCostPerRequest(t *testing.T) {
	r := coreRule(t, "expensive", "/report", 10, time.Hour, "ip")
	r.Rule.Cost = 3
	f := newCoreFixture(t, core.Options{RateLimits: []core.RateLimit{r}}, shm.Options{Counters: 64})
	for i := 1; i <= 4; i++ {
		w := f.get("/report", "192.0.2.1:1")
		if want := map[bool]int{true: 200, false: 429}[i <= 3]; w.Code != want {
			t.Fatalf("request %d: %d, want %d", i, w.Code, want)
		}
	}
}

// status = 503: refusals are 503 with Retry-After and the same
// problem+json as a 429.
func TestRefusalStatus(t *testing.T) {
	r := coreRule(t, "busy", "/x", 1, time.Minute, "ip")
	r.Status = 503
	f := newCoreFixture(t, core.Options{RateLimits: []core.RateLimit{r}}, shm.Options{Counters: 64})
	f.get("/x", "192.0.2.1:1")
	w := f.get("/x", "192.0.2.1:1")
	var p struct {
		Type     string   `json:"type"`
		Status   int      `json:"status"`
		Detail   string   `json:"detail"`
		Violated []string `json:"violated-policies"`
	}
	if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil {
		t.Fatal(err)
	}
	if w.Code != 503 || w.Header().Get("Retry-After") != "60" || p.Status != 503 ||
		!strings.HasSuffix(p.Type, "#quota-exceeded") || len(p.Violated) != 1 || p.Violated[0] != "busy" {
		t.Fatalf("%d %v %+v", w.Code, w.Header(), p)
	}
	if _, err := core.New(f.region, core.Options{RateLimits: []core.RateLimit{{Rule: r.Rule, Route: r.Route, Status: 418}}}); err == nil {
		t.Fatal("status 418 accepted")
	}
}

// A global dry run: nothing is refused, would-be refusals are counted and
// logged, headers are sent.
func TestGlobalShadow(t *testing.T) {
	f := newCoreFixture(t, core.Options{Shadow: true, RateLimits: []core.RateLimit{coreRule(t, "login", "/login", 2, time.Minute, "ip")}},
		shm.Options{Counters: 64})
	if got := f.count(10, "/login", "192.0.2.1:1"); got[200] != 10 {
		t.Fatalf("%v: a dry run refused", got)
	}
	if st := f.mw.Stats()[0]; st.Allowed != 2 || st.ShadowLimited != 8 {
		t.Fatalf("%+v", st)
	}
	if w := f.get("/login", "192.0.2.1:1"); w.Header().Get("RateLimit") == "" {
		t.Fatal("no headers in a dry run")
	}
	if !strings.Contains(f.logs.String(), "shadow rule would refuse") {
		t.Fatalf("no log line:\n%s", f.logs)
	}
}

// An embedder can write the refusal itself; the rate-limit headers and
// Retry-After are set for it.
func TestRefuseFunction(t *testing.T) {
	region := newRegion(t, shm.Options{Counters: 64})
	c, err := core.New(region, core.Options{RateLimits: []core.RateLimit{coreRule(t, "login", "/login", 1, time.Minute, "ip")}})
	if err != nil {
		t.Fatal(err)
	}
	h := nethttp.New(c, &app{}, nethttp.Options{Refuse: func(w http.ResponseWriter, r *http.Request, ref *core.Refusal) {
		w.WriteHeader(ref.Status)
		fmt.Fprintf(w, "<h1>slow down: %s, %v</h1>", ref.Rule, ref.RetryAfter.Round(time.Second))
	}})
	for i := range 2 {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, request("GET", "/login", "192.0.2.1:1"))
		if i == 1 && (w.Code != 429 || w.Body.String() != "<h1>slow down: login, 1m0s</h1>" ||
			w.Header().Get("Retry-After") != "60" || w.Header().Get("RateLimit") == "") {
			t.Fatalf("%d %v %q", w.Code, w.Header(), w.Body)
		}
	}
}
