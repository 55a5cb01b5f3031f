package nethttp_test

import (
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/preforkd/preforkd/bucket"
	"github.com/preforkd/preforkd/clientip"
	"github.com/preforkd/preforkd/core"
	"github.com/preforkd/preforkd/engine/nethttp"
	"github.com/preforkd/preforkd/route"
	"github.com/preforkd/preforkd/shm"
)

// The decision core as a middleware in one process, without a
// supervisor: a region of its own, a rule of 2 requests a minute per
// client on /api/*, in front of any http.Handler. Several processes
// that map one region (package prefork) share its counts.
func ExampleHandler() {
	region, err := shm.Create(shm.Options{Counters: 1024, MaxWorkers: 1})
	if err != nil {
		log.Fatal(err)
	}
	defer region.Close()
	if err := region.Join(0); err != nil {
		log.Fatal(err)
	}
	c, err := core.New(region, core.Options{RateLimits: []core.RateLimit{{
		Rule:  bucket.Rule{Name: "api", Limit: 2, Window: time.Minute},
		Route: route.MustCompile("/api/*", nil),
		By:    clientip.MustParseBy("header:X-Api-Key|ip"),
	}}})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	app := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "data\n") })
	h := nethttp.New(c, app, nethttp.Options{})

	for _, key := range []string{"a", "a", "a", "b"} {
		req := httptest.NewRequest("GET", "/api/things", nil)
		req.Header.Set("X-Api-Key", key)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		fmt.Println(key, rec.Code, rec.Header().Get("RateLimit-Policy"), rec.Header().Get("X-Ratelimit-Remaining"))
	}
	// Output:
	// a 200 "api";q=2;w=60 1
	// a 200 "api";q=2;w=60 0
	// a 429 "api";q=2;w=60 0
	// b 200 "api";q=2;w=60 1
}
