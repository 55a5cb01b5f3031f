package redisstore_test

import (
	"log"
	"net/http"
	"time"

	"github.com/preforkd/preforkd/bucket"
	"github.com/preforkd/preforkd/core"
	"github.com/preforkd/preforkd/engine/nethttp"
	"github.com/preforkd/preforkd/redisstore"
	"github.com/preforkd/preforkd/route"
	"github.com/preforkd/preforkd/shm"
)

// One limit for every host: a rule marked as a Redis rule
// (core.RateLimit.Redis) over a Store that the core is given as its Redis
// stage (core.RedisRules). In a prefork worker the region is the
// worker's (prefork.Worker.Region) and the Core is closed with
// w.Defer(c.Close), which closes the Store too. Nothing is sent to Redis
// before the first request. (It needs a Redis, so it does not run here.)
func Example() {
	region, err := shm.CreatePrivate(shm.Options{Counters: 1024, MaxWorkers: 1})
	if err != nil {
		log.Fatal(err)
	}
	defer region.Close()
	if err := region.Join(0); err != nil { // New decides only over a joined region
		log.Fatal(err)
	}
	store, err := redisstore.New(region, redisstore.Options{URL: "redis://127.0.0.1:6379/0"})
	if err != nil {
		log.Fatal(err)
	}
	c, err := core.New(region, core.Options{
		RateLimits: []core.RateLimit{{
			Rule:  bucket.Rule{Name: "login", Limit: 10, Window: time.Minute},
			Route: route.MustCompile("/login", []string{"POST"}),
			// Redis away: this host enforces 10 ÷ 2, one host of two.
			Redis: &core.RedisRule{OnUnavailable: core.FailLocal, LocalShare: 2},
		}},
		Redis: core.RedisRules(store), // the Core owns the store from here on
	})
	if err != nil {
		store.Close()
		log.Fatal(err)
	}
	defer c.Close()
	app := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("welcome\n")) })
	log.Fatal(http.ListenAndServe("127.0.0.1:8080", nethttp.New(c, app, nethttp.Options{})))
}
