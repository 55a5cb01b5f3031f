package nethttp_test

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"testing"

	"github.com/preforkd/preforkd/config"
	"github.com/preforkd/preforkd/core"
	"github.com/preforkd/preforkd/engine"
	"github.com/preforkd/preforkd/engine/nethttp"
	"github.com/preforkd/preforkd/internal/wiretest"
	"github.com/preforkd/preforkd/shm"
)

// Forwarding, the core sees the request as the upstream gets it: a field
// the forwarder drops (Keep-Alive, hop by hop) keys nothing, and
// X-Forwarded-Proto is the one it writes.
func TestForwardingView(t *testing.T) {
	up := wiretest.Application(t, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
	cfg, err := config.Parse([]byte(`
[[ratelimit]]
name = "by-hop"
path = "/hop"
limit = 1
window = "1h"
by = "header:Keep-Alive|ip"
[[ratelimit]]
name = "by-proto"
path = "/proto"
limit = 1
window = "1h"
by = "header:X-Forwarded-Proto"
`), "t")
	if err != nil {
		t.Fatal(err)
	}
	o, err := cfg.CoreOptions()
	if err != nil {
		t.Fatal(err)
	}
	c, err := core.New(newRegion(t, shm.Options{Counters: 64}), o)
	if err != nil {
		t.Fatal(err)
	}
	u, err := nethttp.NewUpstream(c, up, engine.Upstream{})
	if err != nil {
		t.Fatal(err)
	}
	s, err := nethttp.NewServer(nethttp.ServerOptions{Core: c, Upstream: u, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go s.Serve(ln)
	t.Cleanup(func() { s.Shutdown(context.Background()) })
	get := func(path, name, value string) int {
		req, _ := http.NewRequest("GET", "http://"+ln.Addr().String()+path, nil)
		req.Header.Set(name, value)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	// Two values of a hop-by-hop field are one client: the second is
	// refused.
	if a, b := get("/hop", "Keep-Alive", "timeout=1"), get("/hop", "Keep-Alive", "timeout=2"); a != 200 || b != 429 {
		t.Errorf("keyed by a hop-by-hop field: %d, %d; want 200, 429", a, b)
	}
	// Whatever the client claims, X-Forwarded-Proto is http here: one key.
	if a, b := get("/proto", "X-Forwarded-Proto", "https"), get("/proto", "X-Forwarded-Proto", "gopher"); a != 200 || b != 429 {
		t.Errorf("keyed by X-Forwarded-Proto: %d, %d; want 200, 429", a, b)
	}
}

// NewUpstream refuses a nil core, which it reports the upstream's
// failures to: accepted, it panicked at the first response the
// upstream broke off, instead of the 502s and the log lines.
func TestNewUpstreamNeedsACore(t *testing.T) {
	if _, err := nethttp.NewUpstream(nil, "http://127.0.0.1:1", engine.Upstream{}); err == nil {
		t.Fatal("NewUpstream accepted a nil core")
	}
}
