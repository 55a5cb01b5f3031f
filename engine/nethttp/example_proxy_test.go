package nethttp_test

import (
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"time"

	"github.com/preforkd/preforkd/bucket"
	"github.com/preforkd/preforkd/clientip"
	"github.com/preforkd/preforkd/core"
	"github.com/preforkd/preforkd/engine/nethttp"
	"github.com/preforkd/preforkd/route"
	"github.com/preforkd/preforkd/shm"
)

// Behind a load balancer every client arrives from its address: a rule
// by ip then counts them all as one, unless the core is told to believe
// the balancer's X-Forwarded-For (core.Options.Resolver). A client that
// connects directly cannot choose its key with that field.
func ExampleHandler_trustedProxy() {
	region, err := shm.CreatePrivate(shm.Options{Counters: 1024, MaxWorkers: 1})
	if err != nil {
		log.Fatal(err)
	}
	defer region.Close()
	if err := region.Join(0); err != nil {
		log.Fatal(err)
	}
	c, err := core.New(region, core.Options{
		RateLimits: []core.RateLimit{{
			Rule:  bucket.Rule{Name: "api", Limit: 1, Window: time.Minute},
			Route: route.MustCompile("/*", nil),
			By:    clientip.MustParseBy("ip"),
		}},
		Resolver: clientip.Resolver{Trusted: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	h := nethttp.New(c, http.NotFoundHandler(), nethttp.Options{})

	for _, r := range []struct{ peer, xff string }{
		{"10.0.0.2:4000", "198.51.100.1"}, // through the balancer
		{"10.0.0.2:4001", "198.51.100.2"}, // another client through it
		{"10.0.0.2:4002", "198.51.100.1"}, // the first one again
		{"203.0.113.9:5000", "198.51.100.3"},
		{"203.0.113.9:5001", "198.51.100.4"}, // direct: the field is not believed
	} {
		req := httptest.NewRequest("GET", "/", nil)
		req.RemoteAddr = r.peer
		req.Header.Set("X-Forwarded-For", r.xff)
		fmt.Println(string(nethttp.KeyOf(c, "api", req)), status(h, req))
	}
	// Output:
	// ip:198.51.100.1 404
	// ip:198.51.100.2 404
	// ip:198.51.100.1 429
	// ip:203.0.113.9 404
	// ip:203.0.113.9 429
}

func status(h http.Handler, req *http.Request) int {
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec.Code
}
