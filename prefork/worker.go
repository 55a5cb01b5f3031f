package prefork

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/preforkd/preforkd/bucket"
	"github.com/preforkd/preforkd/config"
	"github.com/preforkd/preforkd/core"
	"github.com/preforkd/preforkd/core/nethttp"
	"github.com/preforkd/preforkd/shm"
)

// Timeouts of a worker's http.Server. There is no read or write timeout on
// the whole request: a proxied response may stream for as long as the
// upstream needs.
const (
	readHeaderTimeout = 10 * time.Second
	idleTimeout       = 2 * time.Minute
)

// Worker is what a worker process hands to Options.Handler: its place
// among the workers, the shared region and the configuration it runs.
type Worker struct {
	// Index is the region worker index this process joined as: unique
	// among the running workers, 0 <= Index < the region's MaxWorkers. A
	// replacement (after a crash or a reload) may get another one.
	Index int
	// Region is the shared region, joined as Index.
	Region *shm.Region
	// Config is the supervisor's configuration at the time this worker
	// was started (after a HUP, the new one).
	Config config.Config
	// Logger is Options.Logger with the worker's index and pid.
	Logger *slog.Logger

	h *nethttp.Handler
	c *core.Core // the core, before h exists or without it

	served atomic.Int64 // responses, counted by Responded
	limits *limits      // recycling limits; nil without any
}

// Responded records one response this worker sent, with its status, for
// the worker's recycling limits (server.max_requests, server.max_rss); the
// statistics a reload's canary is judged by are counted by the core
// (core.Core.Responded), whatever the engine.
// The worker's core calls it for every response an engine counts
// (core.Options.OnResponse), before the response leaves, so that a worker
// past a limit stops accepting before its client can connect again; an
// Options.Engine built on Worker.Core needs nothing more.
func (w *Worker) Responded(status int) {
	n := w.served.Add(1)
	if w.limits != nil {
		w.limits.check(n)
	}
}

// recycling returns the channel on which the message asking to be
// recycled comes once a limit is passed (nil without limits), after stop
// has run; stop must stop accepting connections.
func (w *Worker) recycling(stop func()) <-chan []byte {
	if w.limits == nil {
		return nil
	}
	w.limits.stop = stop
	return w.limits.trip
}

// pastLimit reports whether a recycling limit was passed.
func (w *Worker) pastLimit() bool { return w.limits != nil && w.limits.tripped.Load() }

// Core returns the decision core the worker's requests go through; nil
// before Options.Handler has returned (with Options.FastHandler and
// Engine, it is there from the start).
func (w *Worker) Core() *core.Core {
	if w.h == nil {
		return w.c
	}
	return w.h.Core()
}

// Limiter returns the limiter of the rate-limit rule name, e.g. to Reset a
// client after a successful login; nil for an unknown rule, and before
// Options.Handler has returned. The time it takes is Region.Now().
func (w *Worker) Limiter(name string) *bucket.Limiter {
	if c := w.Core(); c != nil {
		return c.Limiter(name)
	}
	return nil
}

// ClientKey returns the key the rule called rule counts r under
// ("ip:192.0.2.1", "h:X-Api-Key:…", "g"): the id to pass to its Limiter,
// as in w.Limiter("login").Reset(w.ClientKey("login", r), w.Region.Now()).
// It is "" for an unknown rule.
func (w *Worker) ClientKey(rule string, r *http.Request) string {
	if w.h == nil {
		return ""
	}
	return string(w.h.KeyOf(rule, r))
}

// runWorker is Run in a worker: it returns the process's exit code.
func runWorker(ctx context.Context, opts Options) int {
	log := opts.Logger.With("pid", os.Getpid())
	index, err := workerIndex()
	if err != nil {
		log.Error("worker failed to start", "err", err)
		return 1
	}
	log = log.With("worker", index)
	if err := nameWorker(os.Getenv(envName)); err != nil {
		log.Warn("worker keeps the name the kernel gave it", "err", err)
	}
	// Nothing this worker starts is a worker, nor inherits its descriptors.
	os.Unsetenv(envWorker)
	os.Unsetenv(envName)
	for fd := fdRegion; fd <= fdConfig; fd++ {
		syscall.CloseOnExec(fd)
	}
	if n, err := raiseOpenFileLimit(); err != nil {
		log.Warn("open-file limit not raised", "open_files", n, "err", err)
	}
	// Ctrl-C and HUP are the supervisor's business; TERM means drain.
	signal.Ignore(syscall.SIGINT, syscall.SIGHUP)
	term := make(chan os.Signal, 1)
	signal.Notify(term, syscall.SIGTERM)

	if opts.Handler == nil {
		return runEngineWorker(ctx, opts, index, term, log)
	}
	conns := &connTracker{}
	w, srv, ln, c, err := setUpWorker(opts, index, conns, log)
	if err != nil {
		log.Error("worker failed to start", "err", err)
		return 1
	}
	srv.Handler = conns.closeWhenDraining(srv.Handler)
	// Past a recycling limit: no new connection (the other workers, or
	// the successor, take them from the shared listener), and Connection:
	// close on every response from now on.
	recycle := w.recycling(func() {
		conns.draining.Store(true)
		ln.Close()
	})
	why, served, ok := serveUntilTold(ctx, w, func() error { return srv.Serve(ln) }, recycle, term, log)
	if !ok {
		return 1
	}
	code := drainWorker(srv, ln, served, conns, w.Config.Server.ShutdownTimeout, why, log)
	waitRefreshes(w.h, log)
	closeCore(c, log)
	return code
}

// serveUntilTold reports the worker ready and serves with serve until it
// is told to drain: TERM, the supervisor gone, or ctx done; it returns
// why. Connections that arrive before serve runs wait in the shared
// listener's backlog. The readiness pipe stays open: a worker past a
// recycling limit (recycle) asks through it for a successor, and its
// listener, closed then, makes serve return early, which is expected.
// served has serve's result once it returned. ok is false when the
// worker could not report ready or serve stopped on its own (logged).
func serveUntilTold(ctx context.Context, w *Worker, serve func() error, recycle <-chan []byte, term <-chan os.Signal, log *slog.Logger) (why string, served <-chan error, ok bool) {
	lifeline := watchLifeline(os.NewFile(fdLifeline, "lifeline"))
	report := os.NewFile(fdReady, "ready")
	if _, err := report.Write([]byte{1}); err != nil {
		log.Error("worker failed to report readiness", "err", err)
		return "", nil, false
	}
	result := make(chan error, 1)
	go func() { result <- serve() }()
	serving := (<-chan error)(result)
	gc := newGCCounter(w.Region)
	gc.publish()
	gcTick := time.NewTicker(gcEvery)
	defer gcTick.Stop()
	for why == "" {
		select {
		case <-gcTick.C:
			gc.publish()
		case err := <-serving:
			if !w.pastLimit() {
				if err == nil {
					err = errors.New("serving returned without being shut down")
				}
				log.Error("worker stopped serving", "err", err)
				return "", nil, false
			}
			// The listener was closed for recycling: wait to be told,
			// and put the result back for the drain.
			serving = nil
			result <- err
		case msg := <-recycle:
			recycle = nil
			askRecycling(report, msg, log)
		case <-term:
			why = "TERM"
		case <-lifeline:
			why = "supervisor gone"
		case <-ctx.Done():
			why = context.Cause(ctx).Error()
		}
	}
	return why, result, true
}

// askRecycling tells the supervisor, through the readiness pipe, that
// this worker passed a recycling limit. The supervisor sends TERM once a
// successor is ready, and the drain goes on from there.
func askRecycling(report *os.File, msg []byte, log *slog.Logger) {
	if _, err := report.Write(msg); err != nil {
		log.Error("worker failed to ask to be recycled", "err", err)
		return
	}
	log.Info("worker past a recycling limit: stopped accepting")
}

// refreshWait bounds the wait for the cache's background refreshes once a
// worker drained: one cut short gives up its lock when the worker is
// reaped, and the next request fetches instead.
const refreshWait = 5 * time.Second

// waitRefreshes waits, up to refreshWait, for h's background refreshes.
func waitRefreshes(h *nethttp.Handler, log *slog.Logger) {
	done := make(chan struct{})
	go func() {
		h.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(refreshWait):
		log.Warn("worker: cache refreshes still running at exit")
	}
}

// closeCore closes a drained worker's core: no request decides any more,
// and closing adds the last sync-mode counts to Redis.
func closeCore(c *core.Core, log *slog.Logger) {
	if err := c.Close(); err != nil {
		log.Warn("worker: closing the decision core", "err", err)
	}
}

// setUpWorker maps the region, builds the handler and the server.
func setUpWorker(opts Options, index int, conns *connTracker, log *slog.Logger) (_ *Worker, _ *http.Server, _ net.Listener, _ *core.Core, err error) {
	w, ln, err := joinWorker(opts, index, log)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	cfg, region := w.Config, w.Region
	app, err := opts.Handler(w)
	if err != nil {
		return nil, nil, nil, nil, fmt.Errorf("prefork: building the handler: %w", err)
	}
	// The core decides first: rate limits, so that a refused request
	// never reserves an idempotency key; then idempotent replay; then the
	// application.
	c, err := newCore(cfg, region, log, w.Responded)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	w.h = nethttp.New(c, app, nethttp.Options{Refuse: opts.Refuse})
	srv := &http.Server{
		ConnState:         conns.track,
		Handler:           w.h,
		ReadHeaderTimeout: readHeaderTimeout,
		IdleTimeout:       idleTimeout,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	return w, srv, ln, c, nil
}

// joinWorker reads the configuration the supervisor handed over (and
// hands it to Options.Configured), joins the region as index and opens
// the inherited listener.
func joinWorker(opts Options, index int, log *slog.Logger) (*Worker, net.Listener, error) {
	cfg, err := readConfig(os.NewFile(fdConfig, "config"))
	if err != nil {
		return nil, nil, err
	}
	if opts.Configured != nil {
		opts.Configured(cfg)
	}
	region, err := shm.Attach(os.NewFile(fdRegion, "region"))
	if err != nil {
		return nil, nil, err
	}
	if err := region.Join(index); err != nil {
		return nil, nil, err
	}
	lnFile := os.NewFile(fdListener, "listener")
	ln, err := net.FileListener(lnFile)
	if err != nil {
		return nil, nil, fmt.Errorf("prefork: inherited listener: %w", err)
	}
	lnFile.Close() // FileListener holds its own descriptor
	lim, err := newLimits(cfg.Server, randomJitter())
	if err != nil {
		return nil, nil, err
	}
	return &Worker{Index: index, Region: region, Config: cfg, Logger: log, limits: lim}, ln, nil
}

// watchLifeline returns a channel closed when the supervisor is gone: the
// pipe's write end, held by the supervisor only, is closed by its exit,
// however it dies. The reading goroutine lives as long as the process.
func watchLifeline(f *os.File) <-chan struct{} {
	gone := make(chan struct{})
	go func() {
		defer close(gone)
		_, _ = io.Copy(io.Discard, f)
	}()
	return gone
}
