package core_test

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/preforkd/preforkd/bucket"
	"github.com/preforkd/preforkd/clientip"
	"github.com/preforkd/preforkd/core"
	"github.com/preforkd/preforkd/redisstore"
	"github.com/preforkd/preforkd/shm"
)

// A Redis rule's local share, which decides while Redis is away, takes
// a request whose clock reading is older than another's decision on its
// key at the core's clock read again, as a local rule does: with a share
// of 2, two requests pass in either order.
func TestStaleReadingOnALocalShare(t *testing.T) {
	var stale atomic.Bool
	clock := func() time.Duration {
		if stale.CompareAndSwap(true, false) {
			return time.Hour // read before the other request's decision
		}
		return time.Hour + time.Millisecond
	}
	region := joinedRegion(t, shm.Options{Counters: 64})
	store, err := redisstore.New(region, redisstore.Options{URL: "redis://127.0.0.1:1", Timeout: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	c, err := core.New(region, core.Options{Now: clock, Redis: store, RateLimits: []core.RateLimit{{
		Rule:  bucket.Rule{Name: "per-url", Limit: 2, Window: time.Hour},
		Route: mustRoute(t, "/pages/*"),
		By:    clientip.MustParseBy("path"),
		Redis: &core.RedisRule{OnUnavailable: core.FailLocal},
	}}})
	if err != nil {
		t.Fatal(err)
	}
	if got := decide(c, newReq("GET", "/pages/a", "192.0.2.1")); got != 200 {
		t.Fatalf("first request: %d", got)
	}
	stale.Store(true)
	if got := decide(c, newReq("GET", "/pages/a", "192.0.2.2")); got != 200 {
		t.Fatalf("second request, its clock read before the first's decision: %d, want 200", got)
	}
	if got := decide(c, newReq("GET", "/pages/a", "192.0.2.3")); got != 429 {
		t.Fatalf("third request: %d, want 429", got)
	}
}
