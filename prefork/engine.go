package prefork

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"time"

	"github.com/preforkd/preforkd/core"

	"github.com/valyala/fasthttp"

	"github.com/preforkd/preforkd/proxy"
)

// Engine is an HTTP engine a worker serves its connections with, in place
// of the net/http server around Options.Handler. *proxy.Server is one.
type Engine interface {
	// Serve serves the connections of ln until Shutdown, and then returns
	// nil; it returns an error if it cannot go on serving.
	Serve(ln net.Listener) error
	// Shutdown drains by the rule of a retiring worker (see drain.go:
	// stop accepting; every response from now on says Connection: close;
	// a connection with no request in progress is closed only once it has
	// been idle for a second, or five seconds when it never sent one) and
	// returns once no connection is left, or with ctx's error when ctx is
	// done first, having closed them all.
	Shutdown(ctx context.Context) error
}

// validApplication checks that exactly one way of serving is set.
func validApplication(opts Options) error {
	n := 0
	for _, set := range []bool{opts.Handler != nil, opts.FastHandler != nil, opts.Engine != nil} {
		if set {
			n++
		}
	}
	switch n {
	case 0:
		return errors.New("prefork: none of Options.Handler, FastHandler and Engine is set")
	case 1:
		return nil
	}
	return errors.New("prefork: more than one of Options.Handler, FastHandler and Engine is set")
}

// runEngineWorker is runWorker for Options.Engine and Options.FastHandler,
// from the point where the worker's process is set up: it joins the
// region, builds the core and the engine, reports ready, serves, and
// drains when told to. It returns the exit code.
func runEngineWorker(ctx context.Context, opts Options, index int, term <-chan os.Signal, log *slog.Logger) int {
	w, eng, ln, c, err := setUpEngine(opts, index, log)
	if err != nil {
		log.Error("worker failed to start", "err", err)
		return 1
	}
	timeout := w.Config.Server.ShutdownTimeout
	// Past a recycling limit the listener closes at once (before the
	// response that passed the limit leaves), and the engine drains in
	// the background; TERM, once the successor is ready, waits for it.
	recycled := make(chan error, 1)
	recycleCtx, cutRecycleDrain := context.WithCancel(context.Background())
	defer cutRecycleDrain()
	recycle := w.recycling(func() {
		ln.Close()
		go func() { recycled <- eng.Shutdown(recycleCtx) }()
	})
	why, served, ok := serveUntilTold(ctx, w, func() error { return eng.Serve(ln) }, recycle, term, log)
	if !ok {
		return 1
	}
	log.Info("worker draining", "reason", why, "timeout", timeout)
	if w.pastLimit() {
		select {
		case err = <-recycled:
		case <-time.After(timeout):
			cutRecycleDrain()
			err = <-recycled
		}
	} else {
		sctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		err = eng.Shutdown(sctx)
	}
	if err != nil {
		log.Warn("worker drain timed out: closing the remaining connections", "err", err)
	}
	select {
	case <-served:
	case <-time.After(time.Second): // Serve returns once its listener is closed
	}
	closeCore(c, log)
	return 0
}

// setUpEngine joins the region and builds the worker's core and engine.
func setUpEngine(opts Options, index int, log *slog.Logger) (_ *Worker, _ Engine, _ net.Listener, _ *core.Core, err error) {
	w, ln, err := joinWorker(opts, index, log)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	if w.c, err = newCore(w.Config, w.Region, log, w.Responded); err != nil {
		return nil, nil, nil, nil, err
	}
	var eng Engine
	if opts.Engine != nil {
		eng, err = opts.Engine(w)
	} else {
		eng, err = fastEngine(opts, w)
	}
	if err != nil {
		return nil, nil, nil, nil, fmt.Errorf("prefork: building the engine: %w", err)
	}
	return w, eng, ln, w.c, nil
}

// fastEngine serves Options.FastHandler's application with the fast
// engine, the worker's core in front of it.
func fastEngine(opts Options, w *Worker) (Engine, error) {
	app, err := opts.FastHandler(w)
	if err != nil {
		return nil, err
	}
	if app == nil {
		return nil, errors.New("prefork: Options.FastHandler returned a nil handler")
	}
	o := w.Config.ProxyOptions()
	o.App, o.Core, o.Logger = app, w.c, w.Logger
	return proxy.New(o)
}

// FastHandlerFunc adapts a plain fasthttp handler to Options.FastHandler.
func FastHandlerFunc(h fasthttp.RequestHandler) func(*Worker) (fasthttp.RequestHandler, error) {
	return func(*Worker) (fasthttp.RequestHandler, error) { return h, nil }
}
