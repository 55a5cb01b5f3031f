package redisstore_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/preforkd/preforkd/bucket"
	"github.com/preforkd/preforkd/internal/redistest"
	"github.com/preforkd/preforkd/internal/shmtest"
	"github.com/preforkd/preforkd/redisstore"
	"github.com/preforkd/preforkd/shm"
)

// host is one "host": a region of its own (joined as worker w) and a
// Store over it.
type host struct {
	region *shm.Region
	store  *redisstore.Store
}

func newHost(t *testing.T, srv *redistest.Server, w int, o redisstore.Options) *host {
	t.Helper()
	r, err := shm.CreatePrivate(shm.Options{Counters: 4096})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Join(w); err != nil {
		t.Fatal(err)
	}
	if o.URL == "" && o.Client == nil && len(o.Cluster) == 0 && o.Sentinel.Master == "" {
		o.URL = srv.URL()
	}
	s, err := redisstore.New(r, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	<-s.Warmed() // the first call must not dial under its timeout
	return &host{region: r, store: s}
}

// newHosts starts n hosts with options o, each with a limiter of r.
func newHosts(t *testing.T, srv *redistest.Server, n int, o redisstore.Options, r redisstore.Rule) ([]*host, []*redisstore.Limiter) {
	t.Helper()
	hs := make([]*host, n)
	ls := make([]*redisstore.Limiter, n)
	for i := range hs {
		hs[i] = newHost(t, srv, 0, o)
		ls[i] = hs[i].limiter(t, r)
	}
	return hs, ls
}

// counting are the options of the tests that count decisions.
var counting = redisstore.Options{Timeout: redistest.CallTimeout}

func (h *host) limiter(t *testing.T, r redisstore.Rule) *redisstore.Limiter {
	t.Helper()
	l, err := h.store.NewLimiter(r)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// oneHost starts a Redis and one host on it (worker 0, options o) with a
// limiter of r.
func oneHost(t *testing.T, o redisstore.Options, r redisstore.Rule) (*redistest.Server, *host, *redisstore.Limiter) {
	t.Helper()
	srv := redistest.Start(t)
	h := newHost(t, srv, 0, o)
	return srv, h, h.limiter(t, r)
}

// decide decides one request for id under lims (all enforcing).
func (h *host) decide(t *testing.T, id string, lims ...*redisstore.Limiter) (refused bool, hits []redisstore.Hit, err error) {
	t.Helper()
	keys := make([]redisstore.Key, len(lims))
	hits = make([]redisstore.Hit, len(lims))
	for i, l := range lims {
		keys[i] = l.Key([]byte(id))
		hits[i] = redisstore.Hit{Lim: l, Key: &keys[i]}
	}
	refused, err = h.store.Decide(context.Background(), hits, h.region.Now())
	return refused, hits, err
}

func rule(name string, algo bucket.Algorithm, limit int64, window time.Duration) redisstore.Rule {
	return redisstore.Rule{Rule: bucket.Rule{Name: name, Limit: limit, Window: window, Algorithm: algo}}
}

// Two hosts (two regions, two stores, one Redis): a limit of 10 per
// hour lets exactly 10 of 40 requests through, for either algorithm.
// (Fixed windows here are hours: they are aligned to Redis's clock, and a
// test that straddled a minute's end would count in two windows.)
func TestExactAcrossHosts(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	for _, algo := range []bucket.Algorithm{bucket.GCRA, bucket.FixedWindow} {
		hs, ls := newHosts(t, srv, 2, counting, rule("exact-"+algo.String(), algo, 10, time.Hour))
		allowed := 0
		for i := range 40 {
			h, l := hs[i%2], ls[i%2]
			refused, hits, err := h.decide(t, "client", l)
			if err != nil {
				t.Fatal(err)
			}
			if !refused {
				allowed++
				if d := hits[0].D; !d.Allowed || d.Remaining != int64(10-allowed) {
					t.Fatalf("%v: allowed #%d: %+v", algo, allowed, d)
				}
			} else if d := hits[0].D; d.Allowed || d.RetryAfter <= 0 || d.Remaining != 0 {
				t.Fatalf("%v: refusal: %+v", algo, d)
			}
		}
		if allowed != 10 {
			t.Fatalf("%v: %d of 40 allowed, want exactly 10", algo, allowed)
		}
	}
}

// A host with a lower limit than the count already in Redis (a reload, a
// fleet mid-deploy) refuses with nothing remaining, never a negative count.
func TestLowerLimitRemainingNotNegative(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	for _, algo := range []bucket.Algorithm{bucket.GCRA, bucket.FixedWindow} {
		a, b := newHost(t, srv, 0, counting), newHost(t, srv, 0, counting)
		la := a.limiter(t, rule("lower-"+algo.String(), algo, 5, time.Hour))
		lb := b.limiter(t, rule("lower-"+algo.String(), algo, 2, time.Hour))
		for range 5 {
			if refused, _, err := a.decide(t, "client", la); refused || err != nil {
				t.Fatalf("%v: the limit of 5 refused: %v %v", algo, refused, err)
			}
		}
		refused, hits, err := b.decide(t, "client", lb)
		if err != nil || !refused {
			t.Fatalf("%v: the limit of 2 after 5: refused %v, %v", algo, refused, err)
		}
		if d := hits[0].D; d.Remaining != 0 || d.RetryAfter <= 0 {
			t.Fatalf("%v: refusal %+v, want 0 remaining", algo, d)
		}
	}
}

// Several rules on one request: one EVALSHA, and when one refuses, no
// rule is charged.
func TestOneRoundTripAndRefusalChargesNone(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	h := newHost(t, srv, 0, counting)
	wide := h.limiter(t, rule("wide", bucket.GCRA, 100, time.Minute))
	narrow := h.limiter(t, rule("narrow", bucket.FixedWindow, 2, time.Hour))
	third := h.limiter(t, rule("third", bucket.GCRA, 50, time.Hour))
	before := srv.Calls("evalsha")
	for i := range 5 {
		refused, hits, err := h.decide(t, "k", wide, narrow, third)
		if err != nil {
			t.Fatal(err)
		}
		if refused != (i >= 2) {
			t.Fatalf("request %d: refused %v", i+1, refused)
		}
		if refused && (hits[1].D.Allowed || !hits[0].D.Allowed || !hits[2].D.Allowed) {
			t.Fatalf("request %d: decisions %+v", i+1, hits)
		}
	}
	if n := srv.Calls("evalsha") - before; n != 5 {
		t.Fatalf("%d EVALSHA for 5 requests of 3 rules, want 5", n)
	}
	// Three refused requests charged nothing: wide took 2 of 100.
	_, hits, err := h.decide(t, "k", wide)
	if err != nil {
		t.Fatal(err)
	}
	if got := hits[0].D.Remaining; got != 97 {
		t.Fatalf("wide has %d remaining after 2 served requests and this one, want 97", got)
	}
}

// A refused key is remembered for every worker of the host: no call until
// its retry time.
func TestDenyCache(t *testing.T) {
	t.Parallel()
	srv, h, l := oneHost(t, counting, rule("deny", bucket.FixedWindow, 1, time.Hour))
	if refused, _, err := h.decide(t, "flood", l); err != nil || refused {
		t.Fatalf("first: refused %v, %v", refused, err)
	}
	refused, hits, err := h.decide(t, "flood", l)
	if err != nil || !refused {
		t.Fatalf("second: refused %v, %v", refused, err)
	}
	k := l.Key([]byte("flood"))
	retry, ok := l.Denied(&k, h.region.Now())
	if !ok || retry <= 0 || retry > hits[0].D.RetryAfter {
		t.Fatalf("deny cache: %v %v, the refusal said retry in %v", retry, ok, hits[0].D.RetryAfter)
	}
	// Another worker of the host (another Store on the same region).
	other, err := redisstore.New(h.region, redisstore.Options{URL: srv.URL()})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	lo, err := other.NewLimiter(rule("deny", bucket.FixedWindow, 1, time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	ko := lo.Key([]byte("flood"))
	if _, ok := lo.Denied(&ko, h.region.Now()); !ok {
		t.Fatal("the deny entry is not seen by another store on the region")
	}
	if _, ok := l.Denied(&k, h.region.Now()+retry); ok {
		t.Fatal("the deny entry outlived its retry time")
	}
	other2 := l.Key([]byte("someone else"))
	if _, ok := l.Denied(&other2, h.region.Now()); ok {
		t.Fatal("another key is denied")
	}
	// The rule with a higher limit (a reload): what Redis refused under
	// the old one is not refused from the cache.
	raised, err := other.NewLimiter(rule("deny", bucket.FixedWindow, 5, time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	kr := raised.Key([]byte("flood"))
	if _, ok := raised.Denied(&kr, h.region.Now()); ok {
		t.Fatal("the deny entry of the old limit refuses under the raised one")
	}
	if got := h.store.Stats(h.region.Now()).DenyHits; got != 1 {
		t.Fatalf("deny hits %d", got)
	}
}

// The warm-up loads the script, so the first call finds it; after SCRIPT
// FLUSH (or a restart) the next call finds NOSCRIPT and decisions go on.
func TestNoScript(t *testing.T) {
	t.Parallel()
	srv, h, l := oneHost(t, counting, rule("noscript", bucket.GCRA, 3, time.Minute))
	want := []uint64{0, 1, 1, 2, 2} // NoScript after each request
	for i := range 5 {
		if i == 1 || i == 3 {
			if err := srv.Client().ScriptFlush(context.Background()).Err(); err != nil {
				t.Fatal(err)
			}
		}
		refused, _, err := h.decide(t, "k", l)
		if err != nil {
			t.Fatalf("request %d: %v", i+1, err)
		}
		if refused != (i >= 3) {
			t.Fatalf("request %d: refused %v", i+1, refused)
		}
		if n := h.store.Stats(h.region.Now()).NoScript; n != want[i] {
			t.Fatalf("after request %d: NoScript %d, want %d", i+1, n, want[i])
		}
	}
}

// Redis killed: every call fails within the timeout, the breaker opens
// after the configured failures and calls stop but for the probes;
// restarted, three probes in a row close it.
func TestBreakerOpensAndRecovers(t *testing.T) {
	t.Parallel()
	o := redisstore.Options{Breaker: redisstore.Breaker{Failures: 3, Backoff: 200 * time.Millisecond}}
	srv, h, l := oneHost(t, o, rule("breaker", bucket.GCRA, 1000, time.Minute))
	if _, _, err := h.decide(t, "k", l); err != nil {
		t.Fatal(err)
	}
	srv.Kill()
	for i := range 10 {
		start := time.Now()
		_, _, err := h.decide(t, "k", l)
		if !errors.Is(err, redisstore.ErrUnavailable) {
			t.Fatalf("call %d with Redis dead: %v", i+1, err)
		}
		if d := time.Since(start); d > 10*redisstore.DefaultTimeout {
			t.Fatalf("call %d took %v", i+1, d)
		}
	}
	st := h.store.Stats(h.region.Now())
	if st.Breaker.Phase != redisstore.Open || st.Errors+st.Timeouts != 3 || st.ShortCircuits != 7 {
		t.Fatalf("after 10 failed decisions: %+v", st)
	}
	srv.Restart()
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, _, err := h.decide(t, "k", l)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the breaker never closed: %+v", h.store.Stats(h.region.Now()))
		}
		time.Sleep(10 * time.Millisecond)
	}
	// One probe answered: half-open still, the next request probes; the
	// third in a row closes it.
	for i := 1; i <= 2; i++ {
		if st := h.store.Stats(h.region.Now()); st.Breaker.Phase != redisstore.HalfOpen || st.Breaker.Successes != i {
			t.Fatalf("after %d successful probes: %+v", i, st.Breaker)
		}
		if _, _, err := h.decide(t, "k", l); err != nil {
			t.Fatalf("probe %d: %v", i+1, err)
		}
	}
	if st := h.store.Stats(h.region.Now()); st.Breaker.Phase != redisstore.Closed || st.Breaker.Failures != 0 {
		t.Fatalf("after recovery: %+v", st.Breaker)
	}
}

func TestOptionsErrors(t *testing.T) {
	r := shmtest.Private(t, shm.Options{Counters: 64})
	// Each is a *FieldError naming the field at fault.
	for _, c := range []struct {
		o           redisstore.Options
		field, want string
	}{
		{redisstore.Options{}, "", "no Redis"},
		{redisstore.Options{URL: "redis://x:1", Cluster: []string{"a:1"}}, "", "only one"},
		{redisstore.Options{Sentinel: redisstore.Sentinel{Master: "m"}}, "Sentinel", "both a master name and addresses"},
		{redisstore.Options{URL: "http://x"}, "URL", "want redis://"},
		{redisstore.Options{URL: "redis://x:1", Timeout: time.Hour}, "Timeout", "must be between 1ms and 1m0s, got 1h0m0s"},
		{redisstore.Options{URL: "redis://x:1", PoolSize: -1}, "PoolSize", "got -1"},
		{redisstore.Options{URL: "redis://x:1", Prefix: "app{}:"}, "Prefix", "brace"},
		{redisstore.Options{URL: "redis://x:1", Prefix: "{preforkd}:"}, "Prefix", "brace"},
		{redisstore.Options{URL: "redis://x:1", Breaker: redisstore.Breaker{Failures: -1}}, "Breaker.Failures", "got -1"},
		{redisstore.Options{URL: "redis://x:1", Breaker: redisstore.Breaker{Backoff: 2 * time.Hour}}, "Breaker.Backoff", "got 2h0m0s"},
		{redisstore.Options{URL: "redis://x:1", Breaker: redisstore.Breaker{ProbeTimeout: 2 * time.Hour}}, "Breaker.ProbeTimeout", "got 2h0m0s"},
		{redisstore.Options{URL: "redis://x:1", Breaker: redisstore.Breaker{Successes: 17}}, "Breaker.Successes", "got 17"},
		{redisstore.Options{Sentinel: redisstore.Sentinel{Master: "m", Addrs: []string{"s"}}}, "Sentinel.Addrs", `address "s"`},
		{redisstore.Options{URL: "redis://x:1", Sentinel: redisstore.Sentinel{Username: "u"}}, "Sentinel.Username", "no sentinel"},
	} {
		_, err := redisstore.New(r, c.o)
		var fe *redisstore.FieldError
		if !errors.As(err, &fe) || fe.Field != c.field || !contains(fe.Msg, c.want) || !contains(err.Error(), "redisstore: ") {
			t.Errorf("%+v: %v, want a *FieldError about %q: %q", c.o, err, c.field, c.want)
		}
		if c.o.Validate() == nil {
			t.Errorf("%+v: Validate accepts what New refuses", c.o)
		}
	}
	s, err := redisstore.New(r, redisstore.Options{URL: "redis://127.0.0.1:1"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var fe *redisstore.FieldError
	if _, err := s.NewLimiter(redisstore.Rule{Rule: bucket.Rule{Name: "g", Limit: 1, Window: time.Second}, Sync: time.Second}); !errors.As(err, &fe) || fe.Field != "Sync" || fe.Rule != "g" {
		t.Errorf("sync on a gcra rule: %v, want a *FieldError about Sync", err)
	}
	_, err = s.NewLimiter(redisstore.Rule{Rule: bucket.Rule{Name: "c", Limit: 4, Window: time.Second, Cost: 3}, OnUnavailable: redisstore.FailLocal, LocalShare: 2})
	var be *bucket.RuleError
	if !errors.As(err, &fe) || fe.Field != "LocalShare" || !errors.As(err, &be) {
		t.Errorf("a local share that cannot hold one request's cost: %v, want a *FieldError about LocalShare, from a *bucket.RuleError", err)
	}
}

// An OnUnavailable's text is what ParseOnUnavailable reads back.
func TestOnUnavailableText(t *testing.T) {
	for want, text := range map[redisstore.OnUnavailable]string{
		redisstore.FailLocal:  "local",
		redisstore.FailOpen:   "open",
		redisstore.FailClosed: "closed",
	} {
		if got := want.String(); got != text {
			t.Errorf("OnUnavailable %d is %q, want %q", uint8(want), got, text)
		}
		var u redisstore.OnUnavailable
		if err := u.UnmarshalText([]byte(text)); err != nil || u != want {
			t.Errorf("UnmarshalText(%q) = %d, %v; want %d", text, uint8(u), err, uint8(want))
		}
		if b, err := want.MarshalText(); err != nil || string(b) != text {
			t.Errorf("MarshalText of %d = %q, %v; want %q", uint8(want), b, err, text)
		}
	}
	if got := redisstore.OnUnavailable(3).String(); got != "OnUnavailable(3)" {
		t.Errorf("OnUnavailable 3 is %q", got)
	}
	if b, err := redisstore.OnUnavailable(3).MarshalText(); err == nil {
		t.Errorf("MarshalText of 3 = %q, want an error", b)
	}
	for _, s := range []string{"", "Open", "maybe"} {
		if u, err := redisstore.ParseOnUnavailable(s); err == nil {
			t.Errorf("ParseOnUnavailable(%q) = %v, want an error", s, u)
		}
	}
}

// An error of the Go API speaks of Options' fields, never of a
// configuration file's keys (that is package config's wording: Message
// names each field as its caller knows it).
func TestOptionsErrorsNameFields(t *testing.T) {
	for _, c := range []struct {
		o          redisstore.Options
		want, keys string
	}{
		{redisstore.Options{}, "no Redis: set URL, Cluster or Sentinel", "no Redis: set url, cluster or sentinel"},
		{redisstore.Options{URL: "redis://x:1", Cluster: []string{"a:1"}}, "set only one of URL, Cluster and Sentinel", "set only one of url, cluster and sentinel"},
		{redisstore.Options{URL: "redis://x:1", Sentinel: redisstore.Sentinel{Username: "u"}},
			"set Sentinel, or drop Sentinel.Username and Sentinel.Password", "set sentinel, or drop sentinel.username and sentinel.password"},
		{redisstore.Options{URL: "redis://x:1", CA: []byte("x")}, "TLS is off: set TLS, or", "TLS is off: set tls, or"},
		{redisstore.Options{URL: "redis://u:p@x:1", Username: "v"}, `given twice: the URL names "u"`, `given twice: the url names "u"`},
		{redisstore.Options{Cluster: []string{"redis://u:p@x:1"}, Username: "v"}, `given twice: a Cluster seed names "u"`, `given twice: a cluster seed names "u"`},
	} {
		err := c.o.Validate()
		var fe *redisstore.FieldError
		if !errors.As(err, &fe) || !contains(fe.Msg, c.want) {
			t.Errorf("%+v: %v, want %q", c.o, err, c.want)
			continue
		}
		if got := fe.Message(strings.ToLower); !contains(got, c.keys) {
			t.Errorf("%+v: Message(lower) = %q, want %q", c.o, got, c.keys)
		}
	}
}

func contains(s, sub string) bool { return strings.Contains(s, sub) }
