package core_test

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/preforkd/preforkd/bucket"
	"github.com/preforkd/preforkd/clientip"
	"github.com/preforkd/preforkd/core"
	"github.com/preforkd/preforkd/shm"
)

// An operator resets one client of a rule, named as the rule's `by` sees
// it, from a process that never joined the region (the supervisor): the
// client's next request passes in every worker, and no other key moves.
func TestControlResetKey(t *testing.T) {
	region := joinedRegion(t, shm.Options{Counters: 256})
	mustBy := func(s string) clientip.By {
		b, err := clientip.ParseBy(s)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	now := time.Hour
	opts := core.Options{
		Resolver: clientip.Resolver{IPv6Prefix: 64},
		Now:      func() time.Duration { return now },
		RateLimits: []core.RateLimit{
			{Rule: bucket.Rule{Name: "login", Limit: 2, Window: time.Minute}, Route: mustRoute(t, "/login"), By: mustBy("ip")},
			{Rule: bucket.Rule{Name: "api", Limit: 1, Window: time.Minute}, Route: mustRoute(t, "/api/*"),
				By:        mustBy("header:X-Api-Key|ip"),
				Overrides: []core.Override{{Key: "gold", Limit: 3}, {Clients: []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24")}, Limit: 2}}},
			{Rule: bucket.Rule{Name: "urls", Limit: 1, Window: time.Minute}, Route: mustRoute(t, "/u/*"), By: mustBy("path")},
		},
	}
	c, err := core.New(region, opts)
	if err != nil {
		t.Fatal(err)
	}
	unjoined, err := shm.CreatePrivate(shm.Options{Counters: 8})
	if err != nil {
		t.Fatal(err)
	}
	defer unjoined.Close()
	if _, err := core.NewControl(unjoined, opts); err != nil {
		t.Fatalf("NewControl over a region nobody joined: %v", err)
	}
	ctl, err := core.NewControl(region, opts)
	if err != nil {
		t.Fatal(err)
	}

	// login: 192.0.2.1 and 2001:db8::1 (keyed by its /64) use their allowance.
	for _, peer := range []string{"192.0.2.1", "192.0.2.2", "2001:db8::1"} {
		for range 2 {
			decide(c, newReq("POST", "/login", peer))
		}
		if got := decide(c, newReq("POST", "/login", peer)); got != 429 {
			t.Fatalf("%s's third login: %d, want 429", peer, got)
		}
	}
	st, err := ctl.KeyState("login", "192.0.2.1")
	if err != nil || !st.Stored || !st.Limited || st.Remaining != 0 || st.Limit != 2 || st.RetryAfter <= 0 || st.Element != "ip" {
		t.Fatalf("KeyState(login, 192.0.2.1) = %+v, %v; want stored and limited", st, err)
	}
	before, err := ctl.ResetKey("login", "ip:192.0.2.1")
	if err != nil || !before.Limited {
		t.Fatalf("ResetKey = %+v, %v", before, err)
	}
	if got := decide(c, newReq("POST", "/login", "192.0.2.1")); got != 200 {
		t.Errorf("after the reset, 192.0.2.1's login: %d, want 200", got)
	}
	if got := decide(c, newReq("POST", "/login", "192.0.2.2")); got != 429 {
		t.Errorf("after resetting 192.0.2.1, 192.0.2.2's login: %d, want 429 (untouched)", got)
	}
	// Another address of the same /64 is the same key.
	if _, err := ctl.ResetKey("login", "2001:db8::ffff"); err != nil {
		t.Fatal(err)
	}
	if got := decide(c, newReq("POST", "/login", "2001:db8::1")); got != 200 {
		t.Errorf("after resetting its /64, 2001:db8::1's login: %d, want 200", got)
	}

	// api: a header key, an override by key value, one by client range.
	key := func(k string) *fakeReq { return newReq("GET", "/api/x", "192.0.2.9", "X-Api-Key", k) }
	decide(c, key("plain"))
	if got := decide(c, key("plain")); got != 429 {
		t.Fatalf("second request of key plain: %d, want 429", got)
	}
	for range 3 {
		decide(c, key("gold"))
	}
	if st, _ := ctl.KeyState("api", "header:x-api-key:gold"); !st.Override || !st.Limited || st.Limit != 3 {
		t.Errorf("KeyState of the gold key: %+v; want its override's limit, used up", st)
	}
	fromRange := newReq("GET", "/api/x", "198.51.100.7", "X-Api-Key", "ranged")
	decide(c, fromRange)
	decide(c, fromRange)
	if st, _ := ctl.KeyState("api", "header:X-Api-Key:ranged"); !st.Override || !st.Limited || st.Limit != 2 {
		t.Errorf("KeyState of a key sent from an overridden range: %+v; want the range's limit, used up", st)
	}
	for _, k := range []string{"header:X-Api-Key:plain", "header:X-Api-Key:gold", "header:X-Api-Key:ranged"} {
		if _, err := ctl.ResetKey("api", k); err != nil {
			t.Fatal(err)
		}
	}
	for _, r := range []*fakeReq{key("plain"), key("gold"), fromRange} {
		if got := decide(c, r); got != 200 {
			t.Errorf("after the reset, %s: %d, want 200", r.header["X-Api-Key"], got)
		}
	}
	if st, _ := ctl.KeyState("api", "header:X-Api-Key:never-seen"); st.Stored || st.Limited || st.Remaining != 1 {
		t.Errorf("KeyState of an unseen key: %+v; want fresh", st)
	}

	// urls: the path as rules see it (normalized, case-folded).
	decide(c, newReq("GET", "/u/Report", "192.0.2.1"))
	if got := decide(c, newReq("GET", "/u/report", "192.0.2.3")); got != 429 {
		t.Fatalf("second request of /u/report: %d, want 429", got)
	}
	if st, _ := ctl.KeyState("urls", "path:/u//REPORT"); !st.Limited {
		t.Errorf("KeyState(urls, path:/u//REPORT) = %+v; want the key of /u/report, limited", st)
	}

	for _, tc := range []struct{ rule, key string }{
		{"login", "header:X-Api-Key:k"}, // login counts by ip only
		{"login", "not a key"},
		{"api", "cookie:s:v"},
		// No request path has a control character: the key would be
		// the client address's, of no address.
		{"urls", "path:/u/\x01report"},
	} {
		var ke *core.KeyError
		if _, err := ctl.KeyState(tc.rule, tc.key); !errors.As(err, &ke) || strings.Count(err.Error(), ": ") < 1 {
			t.Errorf("KeyState(%s, %q) = %v; want a KeyError", tc.rule, tc.key, err)
		}
	}
	if _, err := ctl.ResetKey("nope", "192.0.2.1"); !errors.Is(err, core.ErrUnknownRule) {
		t.Errorf("ResetKey of an unknown rule: %v; want ErrUnknownRule", err)
	}
}

// An operator drops a stored response by its key and the client it
// belongs to: the retry runs again; a request still running is not
// dropped.
func TestControlForgetResponse(t *testing.T) {
	region := joinedRegion(t, shm.Options{Counters: 64, Responses: 64, ResponseBytes: 64 << 10, BlockSize: 256})
	by, _ := clientip.ParseBy("header:Authorization|ip")
	opts := core.Options{Idempotency: core.IdempotencyBlocks(core.Idempotency{Route: mustRoute(t, "/orders", "POST"), TTL: time.Hour, MaxBody: 1 << 10, By: by})}
	c, err := core.New(region, opts)
	if err != nil {
		t.Fatal(err)
	}
	ctl, err := core.NewControl(region, opts)
	if err != nil {
		t.Fatal(err)
	}
	order := func(auth string) *fakeReq {
		r := newReq("POST", "/orders", "192.0.2.1", "Idempotency-Key", `"k-1"`)
		if auth != "" {
			r.header["Authorization"] = []string{auth}
		}
		return r
	}
	// run sends a request and completes it (201) when it runs; it reports
	// whether it ran.
	run := func(r *fakeReq) bool {
		ran := false
		serve(c, r, func(core.Forward) fakeResp {
			ran = true
			return fakeResp{status: 201, body: []byte("created")}
		})
		return ran
	}
	if !run(order("")) || run(order("")) {
		t.Fatal("the first request did not run, or the retry was not replayed")
	}
	if n, err := ctl.ForgetResponse("k-1", "ip:192.0.2.1"); n != 1 || err != nil {
		t.Fatalf("ForgetResponse = %d, %v; want 1", n, err)
	}
	if !run(order("")) {
		t.Fatal("the retry after ForgetResponse was replayed, want it to run")
	}
	// A client keyed by its Authorization value; the token form of the key.
	run(order("Bearer abc"))
	if n, _ := ctl.ForgetResponse("k-1", "ip:192.0.2.9"); n != 0 {
		t.Fatalf("another client's key forgot %d", n)
	}
	if n, err := ctl.ForgetResponse(`"k-1"`, "header:authorization:Bearer abc"); n != 1 || err != nil {
		t.Fatalf("ForgetResponse by header = %d, %v", n, err)
	}
	// In flight: not dropped.
	ex := c.Begin(order("Bearer xyz"))
	if ex.Decide() != core.Pass {
		t.Fatal("not reserved")
	}
	if _, err := ctl.ForgetResponse("k-1", "header:Authorization:Bearer xyz"); !errors.Is(err, core.ErrInFlight) {
		t.Errorf("in flight: %v, want ErrInFlight", err)
	}
	ex.Finish(errCut)
	for _, tc := range []struct{ key, by string }{{"k-1", "cookie:s:v"}, {"", "ip:192.0.2.1"}, {"a b", "ip:192.0.2.1"}, {"k-1", "nope"}} {
		var ke *core.KeyError
		if _, err := ctl.ForgetResponse(tc.key, tc.by); !errors.As(err, &ke) {
			t.Errorf("ForgetResponse(%q, %q) = %v, want a KeyError", tc.key, tc.by, err)
		}
	}
}
