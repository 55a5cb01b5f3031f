package redisstore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/preforkd/preforkd/bucket"
	"github.com/preforkd/preforkd/internal/redistest"
	"github.com/preforkd/preforkd/redisstore"
)

// A Cluster whose nodes want a password: the Store reaches every master
// with the password from its seed URLs, or from Password, and decides
// exactly on keys spread over the masters.
func TestClusterAuth(t *testing.T) {
	t.Parallel()
	cl := redistest.StartCluster(t, redistest.ClusterOptions{Masters: 3, NodeTimeout: 5 * time.Second, Password: "pw-of-cluster"})
	o := counting
	for _, a := range cl.Seeds() {
		o.Cluster = append(o.Cluster, "redis://:pw-of-cluster@"+a)
	}
	h := newHost(t, cl.Nodes[0], 0, o)
	for k := range 12 {
		exactly10key(t, h, "seed-urls", fmt.Sprint("k", k))
	}
	o.Cluster, o.Password = cl.Seeds()[:1], "pw-of-cluster"
	h = newHost(t, cl.Nodes[0], 0, o)
	for k := range 12 {
		exactly10key(t, h, "password", fmt.Sprint("k", k))
	}
	masters := map[string]bool{}
	for _, m := range cl.Masters() {
		if m.Calls("evalsha")+m.Calls("eval") > 0 {
			masters[m.Addr] = true
		}
	}
	if len(masters) != 3 {
		t.Errorf("decisions reached %d masters of 3", len(masters))
	}
}

// Keys of one request in several Cluster slots: a slot that refuses, or
// one whose master is down (Redis did not decide the request whole, and
// the caller's on_unavailable answers it), leaves every count as it was.
// What the other slots charged is given back, and nothing more: a shadow
// rule that would have refused was not charged, and is not refunded.
func TestClusterRefundsWhatItCharged(t *testing.T) {
	t.Parallel()
	cl := redistest.StartCluster(t, redistest.ClusterOptions{Masters: 3, NodeTimeout: 5 * time.Second})
	o := counting
	o.Cluster = cl.Seeds()
	h := newHost(t, cl.Nodes[0], 0, o)
	enforce := h.limiter(t, rule("enforce", bucket.FixedWindow, 1, time.Hour))
	shadowed := h.limiter(t, rule("shadowed", bucket.FixedWindow, 2, time.Hour))
	wide := h.limiter(t, rule("wide", bucket.FixedWindow, 5, time.Hour))
	decide := func(hits ...redisstore.Hit) (bool, error) {
		return h.store.Decide(context.Background(), hits, h.region.Now())
	}
	hit := func(l *redisstore.Limiter, id string, shadow bool) redisstore.Hit {
		k := l.Key([]byte(id))
		return redisstore.Hit{Lim: l, Key: &k, Shadow: shadow}
	}
	remaining := func(l *redisstore.Limiter, id string) int64 {
		k := l.Key([]byte(id))
		d, _, err := l.State(&k, h.region.Now())
		if err != nil {
			t.Fatal(err)
		}
		return d.Remaining
	}

	// A refusal by one slot, a shadow rule in another that would refuse.
	for i, id := range []string{"a1", "a2", "a3"} {
		if refused, err := decide(hit(enforce, id, false), hit(shadowed, "g", true)); err != nil || refused {
			t.Fatalf("request %d: refused %v, %v", i, refused, err)
		}
	}
	if refused, err := decide(hit(enforce, "a1", false), hit(shadowed, "g", true)); err != nil || !refused {
		t.Fatalf("a1 again: refused %v, %v; want refused", refused, err)
	}
	if n := remaining(shadowed, "g"); n != 0 {
		t.Errorf("the shadow rule has %d left after the refusal, want 0: a charge it never made was given back", n)
	}

	// A master down: find one key on it and one on a live master.
	k := wide.Key([]byte("y"))
	if refused, err := decide(redisstore.Hit{Lim: wide, Key: &k}); err != nil || refused {
		t.Fatalf("y: refused %v, %v", refused, err)
	}
	var down *redistest.Server
	for _, m := range cl.Masters() {
		if n, _ := m.Client().Exists(t.Context(), redisstore.RedisKey(wide, &k)).Result(); n == 1 {
			down = m
		}
	}
	if down == nil {
		t.Fatal("no master holds y's key")
	}
	live := ""
	for i := 0; live == ""; i++ {
		id := fmt.Sprint("x", i)
		kx := wide.Key([]byte(id))
		if refused, err := decide(redisstore.Hit{Lim: wide, Key: &kx}); err != nil || refused {
			t.Fatalf("%s: refused %v, %v", id, refused, err)
		}
		if n, _ := down.Client().Exists(t.Context(), redisstore.RedisKey(wide, &kx)).Result(); n == 0 {
			live = id
		}
	}
	down.Kill()
	before := remaining(wide, live)
	for range 3 {
		if _, err := decide(hit(wide, live, false), hit(wide, "y", false)); err == nil {
			t.Fatal("a request with a key on a dead master was decided")
		}
	}
	if n := remaining(wide, live); n != before {
		t.Errorf("the live key has %d left after 3 undecided requests, %d before: they stayed counted", n, before)
	}
}
