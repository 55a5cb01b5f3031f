package core_test

import (
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/preforkd/preforkd/bucket"
	"github.com/preforkd/preforkd/clientip"
	"github.com/preforkd/preforkd/core"
	"github.com/preforkd/preforkd/shm"
)

// A rule's key function keys by what the application reads (here a
// header standing for a verified session's user): each user has its own
// allowance whatever its address, an empty value falls back to by (the
// client address), and KeyOf makes the key a decision makes, for a reset.
func TestKeyFunc(t *testing.T) {
	region := joinedRegion(t, shm.Options{Counters: 64})
	user := func(r core.Request) string { v, _ := r.Header("X-User"); return v }
	c, err := core.New(region, core.Options{RateLimits: []core.RateLimit{{
		Rule:    bucket.Rule{Name: "per-user", Limit: 1, Window: time.Hour},
		Route:   mustRoute(t, "/api/*"),
		By:      clientip.MustParseBy("ip"),
		KeyFunc: user,
	}}})
	if err != nil {
		t.Fatal(err)
	}
	for _, step := range []struct {
		peer, user string
		status     int
	}{
		{"192.0.2.1", "alice", 200},
		{"192.0.2.2", "alice", 429}, // alice from elsewhere: her allowance
		{"192.0.2.1", "bob", 200},   // bob from alice's address: his own
		{"192.0.2.1", "", 200},      // no user: the address's allowance
		{"192.0.2.1", "", 429},
	} {
		r := newReq("GET", "/api/x", step.peer)
		if step.user != "" {
			r.header["X-User"] = []string{step.user}
		}
		if got := decide(c, r); got != step.status {
			t.Fatalf("%s as %q: %d, want %d", step.peer, step.user, got, step.status)
		}
	}
	r := newReq("GET", "/api/x", "192.0.2.9", "X-User", "alice")
	key, err := c.KeyOf("per-user", r)
	if err != nil || string(key) != "f:alice" {
		t.Fatalf("KeyOf = %q, %v; want f:alice", key, err)
	}
	c.Limiter("per-user").Reset(string(key), c.Now())
	if got := decide(c, r); got != 200 {
		t.Fatalf("alice after a reset: %d, want 200", got)
	}
}

// Core.Reset forgives a request's key under the limit that applies to it:
// an override's clients, a keyed override's key and the rule's own alike
// (Limiter(name) is the rule's own limit alone, and once left an
// override's client refused). No such rule is ErrUnknownRule.
func TestResetRequest(t *testing.T) {
	r := joinedRegion(t, shm.Options{Counters: 256})
	c, err := core.New(r, core.Options{RateLimits: []core.RateLimit{{
		Rule:  bucket.Rule{Name: "login", Limit: 2, Window: time.Minute},
		Route: mustRoute(t, "/login"),
		By:    clientip.MustParseBy("header:X-Key|ip"),
		Overrides: []core.Override{
			{Clients: []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}, Limit: 1},
			{Key: "gold", Limit: 3},
		},
	}}})
	if err != nil {
		t.Fatal(err)
	}
	for _, req := range []func() *fakeReq{
		func() *fakeReq { return newReq("GET", "/login", "198.51.100.1") },                  // the rule's own
		func() *fakeReq { return newReq("GET", "/login", "192.0.2.1") },                     // a client override
		func() *fakeReq { return newReq("GET", "/login", "198.51.100.2", "X-Key", "gold") }, // a keyed override
	} {
		n := 0
		for decide(c, req()) == 200 {
			n++
		}
		if err := c.Reset("login", req()); err != nil {
			t.Fatal(err)
		}
		if got := decide(c, req()); got != 200 {
			t.Errorf("%s after %d passed and a Reset: %d, want 200", req().peer, n, got)
		}
	}
	if err := c.Reset("nope", newReq("GET", "/", "192.0.2.1")); !errors.Is(err, core.ErrUnknownRule) {
		t.Errorf("Reset of no such rule: %v, want ErrUnknownRule", err)
	}
}

// An operator names a key function's key as "func:VALUE" (the value the
// function gave): a Control looks it up and resets it, under an
// override that names the value too; a rule without a key function has
// no such key.
func TestControlKeyFunc(t *testing.T) {
	region := joinedRegion(t, shm.Options{Counters: 64})
	opts := core.Options{RateLimits: []core.RateLimit{{
		Rule:      bucket.Rule{Name: "per-user", Limit: 1, Window: time.Hour},
		Route:     mustRoute(t, "/api/*"),
		KeyFunc:   func(r core.Request) string { v, _ := r.Header("X-User"); return v },
		Overrides: []core.Override{{Key: "gold", Limit: 2}},
	}, {
		Rule: bucket.Rule{Name: "plain", Limit: 1, Window: time.Hour}, Route: mustRoute(t, "/x"),
	}}}
	c, err := core.New(region, opts)
	if err != nil {
		t.Fatal(err)
	}
	ctl := c.Control()
	for _, user := range []string{"alice", "gold"} {
		r := func() *fakeReq { return newReq("GET", "/api/x", "192.0.2.1", "X-User", user) }
		for decide(c, r()) == 200 {
		}
		st, err := ctl.KeyState("per-user", "func:"+user)
		if err != nil || !st.Stored || !st.Limited || st.Element != "func" || st.Override != (user == "gold") {
			t.Fatalf("KeyState(func:%s) = %+v, %v; want stored, limited, element func", user, st, err)
		}
		if _, err := ctl.ResetKey("per-user", "func:"+user); err != nil {
			t.Fatalf("ResetKey(func:%s): %v", user, err)
		}
		if got := decide(c, r()); got != 200 {
			t.Errorf("%s after ResetKey: %d, want 200", user, got)
		}
	}
	var ke *core.KeyError
	if _, err := ctl.KeyState("plain", "func:alice"); !errors.As(err, &ke) {
		t.Errorf("func key of a rule without a key function: %v, want a KeyError", err)
	}
}
