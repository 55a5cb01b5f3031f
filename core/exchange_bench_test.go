package core_test

import (
	"strconv"
	"testing"
	"time"

	"github.com/preforkd/preforkd/bucket"
	"github.com/preforkd/preforkd/clientip"
	"github.com/preforkd/preforkd/core"
	"github.com/preforkd/preforkd/route"
	"github.com/preforkd/preforkd/shm"
)

// BenchmarkExchange is one request's whole life in the core, as an engine
// runs it (Begin, Decide, Forward, Head, Body, Finish), without an
// engine: what every engine pays per request on top of carrying bytes.
// rules=10 is nine rules on other paths and one that matches (never
// refusing); refuse is every request answered 429 by a rule.
func BenchmarkExchange(b *testing.B) {
	rule := func(name, path string, limit int64, window time.Duration) core.RateLimit {
		rt, err := route.Compile(path, nil)
		if err != nil {
			b.Fatal(err)
		}
		return core.RateLimit{Rule: bucket.Rule{Name: name, Limit: limit, Window: window}, Route: rt, By: clientip.MustParseBy("ip")}
	}
	var ten []core.RateLimit
	for i := 1; i < 10; i++ {
		ten = append(ten, rule("other"+strconv.Itoa(i), "/other"+strconv.Itoa(i)+"/*", 10, time.Minute))
	}
	ten = append(ten, rule("api", "/api/*", 1000, time.Millisecond))
	body := []byte("ok\n")
	// As an interface once: a slice converted at each Head would allocate.
	var hdr core.Header = fakeHeader{{Name: "Content-Type", Value: []byte("text/plain")}, {Name: "Content-Length", Value: []byte("3")}}
	for _, bc := range []struct {
		name  string
		rules []core.RateLimit
	}{
		{"rules=off", nil},
		{"rules=on", []core.RateLimit{rule("api", "/api/*", 1000, time.Millisecond)}},
		{"rules=10", ten},
		{"refuse", []core.RateLimit{rule("api", "/api/*", 1, time.Hour)}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			r := joinedRegion(b, shm.Options{Counters: 1024})
			// A clock 10 µs further at each reading: the 1,000 a
			// millisecond of "api" never refuses, and nothing waits.
			var clock time.Duration
			now := func() time.Duration { clock += 10 * time.Microsecond; return clock }
			c, err := core.New(r, core.Options{RateLimits: bc.rules, Now: now})
			if err != nil {
				b.Fatal(err)
			}
			req := newReq("GET", "/api/items?id=7", "192.0.2.1", "Host", "bench.example", "User-Agent", "bench", "Accept", "*/*")
			b.ReportAllocs()
			for b.Loop() {
				ex := c.Begin(req)
				if ex.Decide() == core.Pass {
					_ = ex.Forward()
					if ex.Head(200, hdr) == nil {
						ex.Body(body)
					}
				}
				ex.Finish(nil)
			}
		})
	}
}
