package main

import (
	"os"
	"strconv"
	"strings"

	"github.com/preforkd/preforkd/config"
	"github.com/preforkd/preforkd/core"
	"github.com/preforkd/preforkd/engine/loop"
	"github.com/preforkd/preforkd/prefork"
)

// loopEngine is the event-loop engine (Linux only), forwarding to
// server.upstream or serving the demo.
func loopEngine(w *prefork.Worker, cfg config.Config, c *core.Core) (prefork.Engine, error) {
	o := loop.Options{Core: c, Limits: cfg.Server.Limits(), Client: cfg.Server.UpstreamClient(), Logger: w.Logger}
	if u := cfg.Server.Upstream; u == "" || u == demoUpstream {
		o.App = demo(w.Index)
	} else {
		o.Upstream = u
	}
	return loop.New(o)
}

// demo answers every request with 200 and a small JSON body naming the
// method, path and worker, so that preforkd runs with nothing else. A
// path under /cacheable/ may be cached for a minute (Cache-Control), so
// that a [[cache]] block can be tried with it at once. It is served by
// the event-loop engine, in the worker, and allocates nothing.
func demo(worker int) loop.App {
	pid := strconv.Itoa(os.Getpid())
	w := strconv.Itoa(worker)
	return func(resp *loop.AppResponse, req *loop.AppRequest) {
		resp.Header("Content-Type", "application/json")
		path := req.Path()
		if strings.HasPrefix(path, demoCacheable) {
			resp.Header("Cache-Control", "max-age=60")
		}
		resp.SetBody(appendDemo(resp.Body()[:0], req.Method(), path, w, pid))
	}
}
