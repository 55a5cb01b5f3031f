package nethttp_test

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/preforkd/preforkd/bucket"
	"github.com/preforkd/preforkd/clientip"
	"github.com/preforkd/preforkd/core"
	"github.com/preforkd/preforkd/engine/nethttp"
	"github.com/preforkd/preforkd/internal/shmtest"
	"github.com/preforkd/preforkd/route"
	"github.com/preforkd/preforkd/shm"
)

// KeyOf and Reset make the key the decision made: of the request without
// the fields its Connection field names (which the handler drops before
// deciding), so a key header named there is not read by either.
func TestKeyOfIsTheDecisionsKey(t *testing.T) {
	c, err := core.New(shmtest.Private(t, shm.Options{Counters: 64, MaxWorkers: 2}), core.Options{RateLimits: []core.RateLimit{{
		Rule:  bucket.Rule{Name: "api", Limit: 2, Window: time.Hour},
		Route: route.MustCompile("/api", nil),
		By:    clientip.MustParseBy("header:X-Api-Key|ip"),
	}}})
	if err != nil {
		t.Fatal(err)
	}
	h := nethttp.New(c, http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}), nethttp.Options{})
	req := httptest.NewRequest("GET", "/api", nil)
	req.Header.Set("X-Api-Key", "k1")
	req.Header.Set("Connection", "X-Api-Key")
	k := nethttp.KeyOf(c, "api", req)
	if want := "ip:192.0.2.1"; string(k) != want {
		t.Fatalf("KeyOf = %q, want %q (the key header is named by Connection)", k, want)
	}
	h.ServeHTTP(httptest.NewRecorder(), req)
	if d := c.Limiter("api").Peek(string(k), c.Now()); d.Remaining != 1 {
		t.Fatalf("after one request, the key KeyOf names has %d remaining, want 1", d.Remaining)
	}
	if err := nethttp.Reset(c, "api", req); err != nil {
		t.Fatal(err)
	}
	if d := c.Limiter("api").Peek(string(k), c.Now()); d.Remaining != 2 {
		t.Fatalf("after Reset, the key has %d remaining, want 2", d.Remaining)
	}
}

func TestNewRefusesNil(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Error("New with a nil core did not panic")
		}
	}()
	nethttp.New(nil, http.NotFoundHandler(), nethttp.Options{})
}
