package core_test

import (
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/preforkd/preforkd/core"
	"github.com/preforkd/preforkd/engine/nethttp"
	"github.com/preforkd/preforkd/route"
	"github.com/preforkd/preforkd/shm"
)

// The response cache in front of a handler: a region with a response
// table (shm.Options.Responses; prefork.Options.Region's in a supervised
// program), a block for GET (and HEAD) under /pages/, and a handler that
// says how long its answer stays fresh. The second GET is served from the
// region without reaching the handler, in this process or any other that
// maps the region; a POST to the URL invalidates its entry.
func ExampleCacheBlocks() {
	region, err := shm.CreatePrivate(shm.Options{Counters: 1024, MaxWorkers: 1, Responses: 64})
	if err != nil {
		log.Fatal(err)
	}
	defer region.Close()
	if err := region.Join(0); err != nil {
		log.Fatal(err)
	}
	c, err := core.New(region, core.Options{Caches: core.CacheBlocks(core.Cache{
		Route:   route.MustCompile("/pages/*", []string{"GET", "HEAD"}), // nil methods (every one) is refused
		TTL:     time.Minute,
		MaxBody: 1 << 20,
	})})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	made := 0
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == "GET" {
			made++
			w.Header().Set("Cache-Control", "max-age=60") // without it nothing is stored
			fmt.Fprintf(w, "page made %d time(s)\n", made)
		}
	})
	h := nethttp.New(c, app, nethttp.Options{})
	for _, method := range []string{"GET", "GET", "POST", "GET"} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(method, "/pages/a", nil))
		fmt.Printf("%-4s %d %-6s %q\n", method, rec.Code, rec.Header().Get("X-Cache"), rec.Body)
	}
	// Output:
	// GET  200 MISS   "page made 1 time(s)\n"
	// GET  200 HIT    "page made 1 time(s)\n"
	// POST 200 BYPASS ""
	// GET  200 MISS   "page made 2 time(s)\n"
}
