package nethttp_test

import (
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/preforkd/preforkd/bucket"
	"github.com/preforkd/preforkd/core"
	"github.com/preforkd/preforkd/engine/nethttp"
	"github.com/preforkd/preforkd/route"
	"github.com/preforkd/preforkd/shm"
)

// tokens stands for the application's verification of a bearer token.
var tokens = map[string]string{"t-alice": "alice", "t-bob": "bob"}

// userOf is the verified user of r, or "".
func userOf(r *http.Request) string {
	return tokens[strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")]
}

// A limit per user rather than per address: the rule's key function
// verifies the request's token itself. It runs before the handler, on
// the request as the client sent it, so it cannot read what a middleware
// inside the handler adds (a user put in the request's context): it would
// find nothing there and the rule would count by address (By), while
// Reset and KeyOf, given the handler's request, would name the user's key
// and forgive a count that was never made. A request with no valid token
// counts by its address.
func ExampleHTTPRequest() {
	region, err := shm.CreatePrivate(shm.Options{Counters: 1024, MaxWorkers: 1})
	if err != nil {
		log.Fatal(err)
	}
	defer region.Close()
	if err := region.Join(0); err != nil {
		log.Fatal(err)
	}
	c, err := core.New(region, core.Options{RateLimits: []core.RateLimit{{
		Rule:  bucket.Rule{Name: "per-user", Limit: 2, Window: time.Minute},
		Route: route.MustCompile("/api/*", nil),
		KeyFunc: func(r core.Request) string {
			if hr := nethttp.HTTPRequest(r); hr != nil {
				return userOf(hr)
			}
			return "" // another engine's request: counted by address
		},
	}}})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/api/forgive" { // say, a support tool
			fmt.Printf("  %s forgiven: %v\n", nethttp.KeyOf(c, "per-user", r), nethttp.Reset(c, "per-user", r))
		}
	})
	h := nethttp.New(c, app, nethttp.Options{})

	for _, step := range []struct{ addr, token, path string }{
		{"192.0.2.1:1000", "t-alice", "/api/a"},
		{"198.51.100.7:2000", "t-alice", "/api/a"}, // alice from elsewhere: her count
		{"192.0.2.1:1000", "t-alice", "/api/a"},
		{"192.0.2.1:1000", "t-bob", "/api/a"}, // bob from alice's address: his own
		{"192.0.2.1:1000", "", "/api/a"},      // no token: the address's count
		{"192.0.2.1:1000", "t-bob", "/api/forgive"},
		{"192.0.2.1:1000", "t-bob", "/api/a"},
		{"192.0.2.1:1000", "t-bob", "/api/a"},
	} {
		req := httptest.NewRequest("GET", step.path, nil)
		req.RemoteAddr = step.addr
		if step.token != "" {
			req.Header.Set("Authorization", "Bearer "+step.token)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		fmt.Println(step.addr, step.token, step.path, rec.Code, rec.Header().Get("X-Ratelimit-Remaining"))
	}
	// Output:
	// 192.0.2.1:1000 t-alice /api/a 200 1
	// 198.51.100.7:2000 t-alice /api/a 200 0
	// 192.0.2.1:1000 t-alice /api/a 429 0
	// 192.0.2.1:1000 t-bob /api/a 200 1
	// 192.0.2.1:1000  /api/a 200 1
	//   f:bob forgiven: <nil>
	// 192.0.2.1:1000 t-bob /api/forgive 200 0
	// 192.0.2.1:1000 t-bob /api/a 200 1
	// 192.0.2.1:1000 t-bob /api/a 200 0
}
