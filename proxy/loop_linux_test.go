package proxy_test

import (
	"net"
	"testing"

	"github.com/preforkd/preforkd/core"
	preforkdengine "github.com/preforkd/preforkd/engine"
	"github.com/preforkd/preforkd/engine/loop"
)

// The event-loop engine (Linux only) runs every row of the tables.
func init() {
	engines = append(engines, servingEngine{"loop", startLoop})
	coreEngines = append(coreEngines, coreEngine{"loop", func(t *testing.T, ln net.Listener, upstream string, c *core.Core) {
		s, _ := startLoopServer(t, ln, loop.Options{Upstream: upstream}, c)
		t.Cleanup(func() { s.Close() })
	}})
	readers = append(readers, storyEngine{"loop", startLoopStory})
}

func startLoopStory(t *testing.T, ln net.Listener, o storyOptions) *running {
	t.Helper()
	lo := loop.Options{Upstream: o.Upstream, Limits: o.Limits, Client: o.Client, OnResponse: o.OnResponse}
	if app := o.App; app != nil {
		lo.App = func(w *loop.AppResponse, r *loop.AppRequest) { w.WriteHeader(app(r.Path())) }
	}
	s, served := startLoopServer(t, ln, lo, o.Core)
	r := &running{Addr: ln.Addr().String(), Shutdown: s.Shutdown, Stats: s.Stats, served: served}
	// Closed before the core's region is (cleanups run last first).
	stopAtEnd(t, r, func() { s.Close() })
	return r
}

// startLoop serves ln with the event-loop engine (engine/loop).
func startLoop(t *testing.T, ln net.Listener, upstream string) {
	t.Helper()
	s, served := startLoopServer(t, ln, loop.Options{Upstream: upstream, Limits: engineLimits(8 << 10)}, nil)
	stopAtCleanup(t, s, served)
}

// startLoopServer serves ln with the event-loop engine for o, with core c
// (one without rules when nil), logging to quietLog; served gets what
// Serve returns. Stopping it is the caller's.
func startLoopServer(t testing.TB, ln net.Listener, o loop.Options, c *core.Core) (*loop.Server, <-chan error) {
	t.Helper()
	if c == nil {
		c = configCore(t, "", nil)
	}
	o.Core, o.Logger = c, quietLog
	s, err := loop.New(o)
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- s.Serve(ln) }()
	return s, served
}

func engineLimits(maxHeader int) preforkdengine.Limits {
	return preforkdengine.Limits{MaxHeaderBytes: maxHeader}
}
