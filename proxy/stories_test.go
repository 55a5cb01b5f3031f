package proxy_test

import (
	"context"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/preforkd/preforkd/core"
	"github.com/preforkd/preforkd/engine"
	"github.com/preforkd/preforkd/engine/nethttp"
	"github.com/preforkd/preforkd/proxy"
)

// The stories of server_test.go (streaming, timeouts, limits, upgrades,
// the drain) are told once and run on every engine that reads HTTP/1.1
// itself: the fast engine here, the event loop (loop_linux_test.go adds
// it). Those the net/http engine honours the same way run on it too.

// storyOptions are what a story sets; each engine takes them into its own
// options.
type storyOptions struct {
	Upstream string
	// App, instead of Upstream, answers each request itself with the
	// status it returns for the request's path, and no body.
	App        func(path string) int
	Core       *core.Core // nil: one without rules
	Limits     engine.Limits
	Client     engine.Upstream
	OnResponse func(status int)
}

// storyEngine is an engine the stories run on.
type storyEngine struct {
	name  string
	start func(t *testing.T, ln net.Listener, o storyOptions) *running
}

// running is an engine serving a listener.
type running struct {
	Addr     string
	Shutdown func(context.Context) error
	// Stats is what the engine counted; nil for an engine that keeps no
	// engine.Stats (net/http).
	Stats func() engine.Stats

	served <-chan error
	once   sync.Once
	err    error
}

// Served waits for Serve to return, and is what it returned.
func (r *running) Served() error {
	r.once.Do(func() { r.err = <-r.served })
	return r.err
}

// readers are the engines that read HTTP/1.1 themselves.
var readers = []storyEngine{{"fasthttp", startFastStory}}

// netHTTPStory is the net/http engine forwarding by itself, as the
// daemon's TLS listeners serve.
var netHTTPStory = storyEngine{"nethttp-forward", startNetHTTPStory}

// withNetHTTP is readers and the net/http engine, for the stories it
// honours as they do.
func withNetHTTP() []storyEngine { return append(readers[:len(readers):len(readers)], netHTTPStory) }

// watchingEngines are the engines of withNetHTTP that watch a client's
// connection while its request is with the upstream or the handler: all
// but fasthttp (README says so).
func watchingEngines() []storyEngine {
	var es []storyEngine
	for _, e := range withNetHTTP() {
		if e.name != "fasthttp" {
			es = append(es, e)
		}
	}
	return es
}

// eachEngine runs story on each of es, in parallel.
func eachEngine(t *testing.T, es []storyEngine, story func(t *testing.T, e storyEngine)) {
	t.Helper()
	for _, e := range es {
		t.Run(e.name, func(t *testing.T) {
			t.Parallel()
			story(t, e)
		})
	}
}

// serve starts e for o on a loopback listener. It is stopped when the
// test ends, and the test fails if Serve then returns an error.
func (e storyEngine) serve(t *testing.T, o storyOptions) *running {
	t.Helper()
	return e.start(t, listen(t), o)
}

// stopAtEnd closes r when the test ends with stop, and checks what Serve
// returned, and that no connection is still served (its goroutine would
// touch the core's region, unmapped next).
func stopAtEnd(t *testing.T, r *running, stop func()) {
	t.Cleanup(func() {
		stop()
		if err := r.Served(); err != nil {
			t.Errorf("Serve: %v", err)
		}
		if r.Stats != nil {
			if n := r.Stats().Open; n > 0 {
				leftRunning(t, fmt.Sprintf("%d connections", n))
			}
		}
	})
}

func startFastStory(t *testing.T, ln net.Listener, o storyOptions) *running {
	t.Helper()
	po := proxy.Options{Upstream: o.Upstream, Core: o.Core, Limits: o.Limits, Client: o.Client, OnResponse: o.OnResponse}
	if app := o.App; app != nil {
		po.App = func(ctx *fasthttp.RequestCtx) { ctx.SetStatusCode(app(string(ctx.Path()))) }
	}
	s, served := start(t, ln, po)
	r := &running{Addr: ln.Addr().String(), Shutdown: s.Shutdown, Stats: s.Stats, served: served}
	stopAtEnd(t, r, func() { s.Close() })
	return r
}

func startNetHTTPStory(t *testing.T, ln net.Listener, o storyOptions) *running {
	t.Helper()
	if o.App != nil || o.OnResponse != nil {
		t.Fatal("the net/http engine's stories forward, and report no responses")
	}
	c := o.Core
	if c == nil {
		c = configCore(t, "", nil)
	}
	up, err := nethttp.NewUpstream(c, o.Upstream, o.Client)
	if err != nil {
		t.Fatal(err)
	}
	s, err := nethttp.NewServer(nethttp.ServerOptions{Core: c, Upstream: up, Limits: o.Limits, Logger: quietLog})
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- s.Serve(ln) }()
	r := &running{Addr: ln.Addr().String(), Shutdown: s.Shutdown, served: served}
	stopAtEnd(t, r, func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		s.Shutdown(ctx)
	})
	return r
}
