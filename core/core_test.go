package core_test

import (
	"errors"
	"math"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/preforkd/preforkd/bucket"
	"github.com/preforkd/preforkd/clientip"
	"github.com/preforkd/preforkd/core"
	"github.com/preforkd/preforkd/internal/shmtest"
	"github.com/preforkd/preforkd/route"
	"github.com/preforkd/preforkd/shm"
)

func mustRoute(t *testing.T, p string, methods ...string) route.Route {
	t.Helper()
	rt, err := route.Compile(p, methods)
	if err != nil {
		t.Fatal(err)
	}
	return rt
}

// joinedRegion is a private region joined as worker 0, closed when the
// test ends.
func joinedRegion(t testing.TB, o shm.Options) *shm.Region {
	t.Helper()
	return shmtest.Private(t, o)
}

// New refuses what it cannot decide by, each with an error that says which
// rule or block and why, prefixed once.
func TestNewErrors(t *testing.T) {
	withTable := joinedRegion(t, shm.Options{Counters: 64, Responses: 8})
	noTable := joinedRegion(t, shm.Options{Counters: 64})
	unjoined, err := shm.CreatePrivate(shm.Options{Counters: 64})
	if err != nil {
		t.Fatal(err)
	}
	defer unjoined.Close()
	good := core.RateLimit{Rule: bucket.Rule{Name: "r", Limit: 1, Window: time.Second}, Route: mustRoute(t, "/")}
	rule := func(mod func(*core.RateLimit)) core.Options {
		r := good
		mod(&r)
		return core.Options{RateLimits: []core.RateLimit{r}}
	}
	orders := core.Idempotency{Route: mustRoute(t, "/orders", "POST"), TTL: time.Hour, MaxBody: 1 << 10}
	block := func(mod func(*core.Idempotency)) core.Options {
		d := orders
		mod(&d)
		return core.Options{Idempotency: core.IdempotencyBlocks(d)}
	}
	for _, tt := range []struct {
		name   string
		region *shm.Region
		opts   core.Options
		want   string
	}{
		{"nil region", nil, core.Options{}, "nil region"},
		{"duplicate", withTable, core.Options{RateLimits: []core.RateLimit{good, good}}, `rule "r" defined twice`},
		{"name", withTable, rule(func(r *core.RateLimit) { r.Rule.Name = "a\nb" }), "printable ASCII"},
		{"no name", withTable, rule(func(r *core.RateLimit) { r.Rule.Name = "" }), "printable ASCII"},
		{"limit", withTable, rule(func(r *core.RateLimit) { r.Rule.Limit = 0 }), "limit must be between 1"},
		{"window", withTable, rule(func(r *core.RateLimit) { r.Rule.Window = 0 }), "window"},
		{"burst", withTable, rule(func(r *core.RateLimit) { r.Rule.Algorithm = bucket.FixedWindow; r.Rule.Burst = 3 }), "burst"},
		// A Route left out would match no request: a rule that never counts.
		{"no route", withTable, rule(func(r *core.RateLimit) { r.Route = route.Route{} }), "route"},
		{"no response table", noTable, block(func(*core.Idempotency) {}), "no response table"},
		{"header", withTable, block(func(d *core.Idempotency) { d.Header = "Idempotency Key" }), "header"},
		{"ttl", withTable, block(func(d *core.Idempotency) { d.TTL = 0 }), "ttl"},
		{"long ttl", withTable, block(func(d *core.Idempotency) { d.TTL = bucket.MaxWindow + time.Microsecond }), "ttl"},
		{"wait", withTable, block(func(d *core.Idempotency) { d.Wait = -1 }), "wait"},
		{"max_body", withTable, block(func(d *core.Idempotency) { d.MaxBody = 0 }), "max_body"},
		{"block without route", withTable, block(func(d *core.Idempotency) { d.Route = route.Route{} }), "route"},
		{"resolver", withTable, core.Options{Resolver: clientip.Resolver{IPv6Prefix: 200}}, "IPv6Prefix"},
		{"max request body", withTable, core.Options{MaxRequestBody: -1}, "MaxRequestBody"},
		{"huge request body", withTable, core.Options{MaxRequestBody: math.MaxInt64}, "MaxRequestBody"},
		// The zero Prefix (netip.ParsePrefix's with its error) matches no
		// client: an exemption or override of it would silently do nothing.
		{"invalid exempt", withTable, core.Options{Exempt: []netip.Prefix{{}}}, "Exempt"},
		{"invalid rule exempt", withTable, rule(func(r *core.RateLimit) {
			r.Exempt = []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), {}}
		}), `rule "r": an invalid (zero) netip.Prefix in Exempt`},
		{"invalid override clients", withTable, rule(func(r *core.RateLimit) {
			r.Overrides = []core.Override{{Clients: []netip.Prefix{{}}, Limit: 2}}
		}), "Clients"},
		// Options.Redis is a Stage: the message says how to build one, not
		// that a field is nil that a caller cannot set to a store.
		{"redis rule without the stage", withTable, rule(func(r *core.RateLimit) { r.Redis = &core.RedisRule{} }),
			`rule "r" is a Redis rule, but Options.Redis has no store: set it to core.RedisRules(store)`},
	} {
		_, err := core.New(tt.region, tt.opts)
		if err == nil {
			t.Errorf("%s: New accepted it", tt.name)
			continue
		}
		prefixes := strings.Count(err.Error(), "core: ") + strings.Count(err.Error(), "bucket: ") + strings.Count(err.Error(), "clientip: ")
		if !strings.Contains(err.Error(), tt.want) || prefixes != 1 {
			t.Errorf("%s: New = %v, want one error about %q", tt.name, err, tt.want)
		}
	}
	if _, err := core.New(unjoined, core.Options{}); !errors.Is(err, shm.ErrNotJoined) {
		t.Errorf("unjoined region: %v, want ErrNotJoined", err)
	}
}

// An override's state shares no 16-bit tag with another rule's or
// override's, a Redis rule's included (its overrides' counts are in this
// host's table in sync mode and for on_unavailable "local").
func TestCheckAccountsOverrideTags(t *testing.T) {
	api := bucket.Rule{Name: "api", Limit: 100, Window: time.Minute, Algorithm: bucket.FixedWindow}
	for _, redis := range []*core.RedisRule{nil, {Sync: time.Second}} {
		rls := []core.RateLimit{{Rule: api, Redis: redis, Overrides: []core.Override{{Key: "k1", Limit: 1000}, {Key: "k56449", Limit: 1000}}}}
		var ae *core.AccountError
		if err := core.CheckAccounts(rls); !errors.As(err, &ae) || ae.Override != 2 || ae.Other != `rule "api"` {
			t.Errorf("redis %v: %v, want override 2 on rule api's tag", redis != nil, err)
		}
		rls[0].Overrides = rls[0].Overrides[:1]
		if err := core.CheckAccounts(rls); err != nil {
			t.Errorf("redis %v, no collision: %v", redis != nil, err)
		}
	}
}

// A rule's name is what the reset header lists, comma-separated: a name
// that such a list cannot hold is refused.
func TestRuleNameFitsAList(t *testing.T) {
	for name, ok := range map[string]bool{"login": true, "a b": true, "a,b": false, " a": false, "a ": false, "": false, "é": false} {
		rl := core.RateLimit{Rule: bucket.Rule{Name: name, Limit: 1, Window: time.Second}, Route: mustRoute(t, "/*")}
		var fe *core.FieldError
		if err := rl.Check(); (err == nil) != ok || !ok && (!errors.As(err, &fe) || fe.Field != "Name") {
			t.Errorf("name %q: %v, want accepted %v", name, err, ok)
		}
	}
}

// An override of clients that the rule's exempt ranges or the client
// overrides before it take whole would never apply: Check refuses it,
// and accepts one with a range left to it.
func TestOverrideShadowed(t *testing.T) {
	pfx := func(ss ...string) (out []netip.Prefix) {
		for _, s := range ss {
			out = append(out, netip.MustParsePrefix(s))
		}
		return out
	}
	rule := bucket.Rule{Name: "r", Limit: 1, Window: time.Second}
	for _, tc := range []struct {
		exempt  []netip.Prefix
		clients [][]netip.Prefix
		refused bool
	}{
		{nil, [][]netip.Prefix{pfx("10.0.0.0/8"), pfx("10.1.0.0/16")}, true},
		{nil, [][]netip.Prefix{pfx("10.0.0.0/8"), pfx("10.1.0.0/16", "192.0.2.0/24")}, false},
		{pfx("10.0.0.0/8"), [][]netip.Prefix{pfx("10.1.2.3/32")}, true},
		{pfx("10.0.0.0/8"), [][]netip.Prefix{pfx("2001:db8::/32")}, false},
		{nil, [][]netip.Prefix{pfx("10.1.0.0/16"), pfx("10.0.0.0/8")}, false}, // the wider one still has the rest
	} {
		rl := core.RateLimit{Rule: rule, Route: mustRoute(t, "/*"), Exempt: tc.exempt}
		for _, c := range tc.clients {
			rl.Overrides = append(rl.Overrides, core.Override{Clients: c, Limit: 2})
		}
		err := rl.Check()
		var oe *core.OverrideError
		if got := errors.As(err, &oe); got != tc.refused {
			t.Errorf("exempt %v, overrides %v: %v, want refused %v", tc.exempt, tc.clients, err, tc.refused)
		}
	}
}

// A key override of a rule that counts by path applies to the requests
// for the path it names as the application's routes write it, in any
// case and with a trailing '/': a request's path value is its match
// path, case-folded, and an override keyed by the path as written once
// matched no request (the rule's own limit applied to it).
func TestPathKeyOverride(t *testing.T) {
	c, err := core.New(joinedRegion(t, shm.Options{Counters: 256}), core.Options{RateLimits: []core.RateLimit{{
		Rule:  bucket.Rule{Name: "per-url", Limit: 3, Window: time.Hour},
		Route: mustRoute(t, "/api/*"),
		By:    clientip.MustParseBy("path"),
		Overrides: []core.Override{
			{Key: "/api/Export", Limit: 1},
			{Key: "/api/report/", Limit: 2},
			// Two that read the same path: the first written takes it,
			// in every worker; one naming it exactly takes it over.
			{Key: "/api/Twice", Limit: 1},
			{Key: "/api/twice/", Limit: 2},
			{Key: "/api/Exact", Limit: 1},
			{Key: "/api/exact", Limit: 2},
		},
	}}})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		path   string
		passes int
	}{
		{"/api/Export", 1},
		{"/api/report", 2},
		{"/api/twice", 1},
		{"/api/exact", 2},
		{"/api/other", 3},
	} {
		n := 0
		for n < 5 && decide(c, newReq("GET", tc.path, "192.0.2.1")) == 200 {
			n++
		}
		if n != tc.passes {
			t.Errorf("%s: %d passed, want %d", tc.path, n, tc.passes)
		}
	}
	st, err := c.Control().KeyState("per-url", "path:/API/EXPORT/")
	if err != nil || !st.Override || st.Limit != 1 || !st.Limited {
		t.Errorf("KeyState of path:/API/EXPORT/: %+v, %v; want the override's limit of 1, used up", st, err)
	}
}

// An override whose own rate is wrong is named by its rule and its
// number, as the program wrote them: not by the internal name its state
// is kept under (the rule's name, NUL, its key), which is no field of
// the program's.
func TestOverrideErrorNamesTheOverride(t *testing.T) {
	rl := core.RateLimit{
		Rule:      bucket.Rule{Name: "login", Limit: 3, Window: time.Minute},
		Route:     mustRoute(t, "/*"),
		Overrides: []core.Override{{Key: "k"}},
	}
	err := rl.Check()
	const want = `core: rule "login": override 1: limit must be between 1 and 1048575, got 0`
	if err == nil || err.Error() != want {
		t.Fatalf("got %v, want %s", err, want)
	}
	var re *bucket.RuleError
	if !errors.As(err, &re) || re.Field != "Limit" {
		t.Errorf("%v: want a *bucket.RuleError for Limit underneath", err)
	}
}

// A stage that needs stored responses, over a region made without a
// response table, is refused with the way to one: the region's
// geometry, which a supervised program gives in prefork.Options.Region.
func TestNoResponseTableSaysHow(t *testing.T) {
	r := joinedRegion(t, shm.Options{Counters: 64})
	for name, o := range map[string]core.Options{
		"idempotency": {Idempotency: core.IdempotencyBlocks(core.Idempotency{Route: mustRoute(t, "/*")})},
		"cache":       {Caches: core.CacheBlocks(core.Cache{Route: mustRoute(t, "/*")})},
	} {
		_, err := core.New(r, o)
		if !errors.Is(err, shm.ErrNoResponses) || !strings.Contains(err.Error(), "shm.Options.Responses") || !strings.Contains(err.Error(), "prefork.Options.Region") {
			t.Errorf("%s: %v: want shm.ErrNoResponses, saying to set shm.Options.Responses (prefork.Options.Region)", name, err)
		}
	}
}
