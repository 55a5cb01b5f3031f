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

// A request whose clock reading (at Begin) is older than another's
// decision on its key is decided at the core's clock read again once the
// key's state is loaded: with a limit of 2, two requests pass in either
// order. Decided at the stale reading, the second found the bucket fuller
// by the gap and was refused (three concurrent first requests to one path
// across workers got one 200 and two 429s). So for a local rule, and for
// a Redis rule's local share, which decides while Redis is away.
func TestStaleReadingDecidedAtTheCoresClock(t *testing.T) {
	for _, redis := range []bool{false, true} {
		var stale atomic.Bool
		clock := func() time.Duration {
			if stale.CompareAndSwap(true, false) {
				return time.Hour // read before the other request's decision
			}
			return time.Hour + time.Millisecond
		}
		region := joinedRegion(t, shm.Options{Counters: 64})
		rl := core.RateLimit{
			Rule:  bucket.Rule{Name: "per-url", Limit: 2, Window: time.Hour},
			Route: mustRoute(t, "/pages/*"),
			By:    clientip.MustParseBy("path"),
		}
		o := core.Options{Now: clock}
		if redis {
			store, err := redisstore.New(region, redisstore.Options{URL: "redis://127.0.0.1:1", Timeout: 50 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			defer store.Close()
			o.Redis, rl.Redis = core.RedisRules(store), &core.RedisRule{OnUnavailable: core.FailLocal}
		}
		o.RateLimits = []core.RateLimit{rl}
		c, err := core.New(region, o)
		if err != nil {
			t.Fatal(err)
		}
		if got := decide(c, newReq("GET", "/pages/a", "192.0.2.1")); got != 200 {
			t.Fatalf("redis %v, first request: %d", redis, got)
		}
		stale.Store(true)
		if got := decide(c, newReq("GET", "/pages/a", "192.0.2.2")); got != 200 {
			t.Fatalf("redis %v, second request, its clock read before the first's decision: %d, want 200", redis, got)
		}
		if got := decide(c, newReq("GET", "/pages/a", "192.0.2.3")); got != 429 {
			t.Fatalf("redis %v, third request: %d, want 429", redis, got)
		}
	}
}
