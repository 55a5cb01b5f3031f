package prefork

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/preforkd/preforkd/shm"
)

// Worker is what a worker process hands to Options.Engine: its place
// among the workers, the shared region and the settings it runs.
type Worker struct {
	// Index is the region worker index this process joined as: unique
	// among the running workers, 0 <= Index < the region's MaxWorkers. A
	// replacement (after a crash or a reload) may get another one.
	Index int
	// Region is the shared region, joined as Index.
	Region *shm.Region
	// Settings are the supervisor's settings at the time this worker was
	// started (after a HUP, the new ones), with their Payload.
	Settings Settings
	// Logger is Options.Logger with the worker's index and pid.
	Logger *slog.Logger

	served atomic.Int64 // responses, counted by Responded
	limits *limits      // recycling limits; nil without any

	mu      sync.Mutex
	closes  []func() error // Defer's, run after the drain
	reopens []func() error // OnReopen's
	drains  []func()       // OnDrain's, until they ran
	drained bool           // OnDrain's functions ran
}

// OnReopen has f run whenever the supervisor is told USR1 (logrotate):
// f reopens the files the worker writes (its access log) at their
// paths. An error is logged.
func (w *Worker) OnReopen(f func() error) {
	w.mu.Lock()
	w.reopens = append(w.reopens, f)
	w.mu.Unlock()
}

// OnDrain has f run once, when the worker is about to stop serving: the
// supervisor began to stop (TERM or QUIT: at the start of
// Settings.DrainDelay, while the worker still serves), or this worker
// was told to drain (a reload, a recycling), whichever comes first. A
// health check answers 503 from then on (core.Core.Drain). f must
// return at once. Registered after that moment, f runs at once.
func (w *Worker) OnDrain(f func()) {
	w.mu.Lock()
	if !w.drained {
		w.drains = append(w.drains, f)
		w.mu.Unlock()
		return
	}
	w.mu.Unlock()
	f()
}

// draining runs OnDrain's functions, once.
func (w *Worker) draining() {
	w.mu.Lock()
	fs := w.drains
	w.drains, w.drained = nil, true
	w.mu.Unlock()
	for _, f := range fs {
		f()
	}
}

// reopen runs OnReopen's functions.
func (w *Worker) reopen(log *slog.Logger) {
	w.mu.Lock()
	fs := append([]func() error(nil), w.reopens...)
	w.mu.Unlock()
	failed := 0
	for _, f := range fs {
		if err := f(); err != nil {
			failed++
			log.Warn("worker: reopening a file failed: writing on to the open one", "err", err)
		}
	}
	if len(fs) > 0 {
		log.Info("worker reopened its files", "files", len(fs), "failed", failed)
	}
}

// Defer has f run once the worker has drained, before it exits, in the
// reverse order of the calls: what the engine's factory opened (its
// decision core, whose Close adds the last counts to a shared store).
// An error is logged.
func (w *Worker) Defer(f func() error) {
	w.mu.Lock()
	w.closes = append(w.closes, f)
	w.mu.Unlock()
}

// runDeferred runs what Defer was given.
func (w *Worker) runDeferred(log *slog.Logger) {
	w.mu.Lock()
	fs := w.closes
	w.closes = nil
	w.mu.Unlock()
	for i := len(fs) - 1; i >= 0; i-- {
		if err := fs[i](); err != nil {
			log.Warn("worker: closing at exit", "err", err)
		}
	}
}

// Responded records one response this worker sent, with its status, for
// the worker's recycling limits (server.max_requests, server.max_rss); the
// statistics a reload's canary is judged by are counted by the core
// (core.Core.Responded), whatever the engine.
// The worker's core calls it for every response it counts, when the
// engine's factory built the core with core.Options.OnResponse =
// w.Responded, so that a worker past a limit stops accepting before its
// client can connect again.
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
	// Ctrl-C and HUP are the supervisor's business. From the supervisor:
	// TERM (or QUIT, as nginx's workers take it) means drain, USR1
	// reopen the files, USR2 that the instance is stopping (its health
	// answers 503 while it still serves, Settings.DrainDelay).
	signal.Ignore(syscall.SIGINT, syscall.SIGHUP)
	term := make(chan os.Signal, 1)
	signal.Notify(term, syscall.SIGTERM, syscall.SIGQUIT)
	notes := make(chan os.Signal, 4)
	signal.Notify(notes, syscall.SIGUSR1, syscall.SIGUSR2)

	w, ln, err := joinWorker(opts, index, log)
	if err != nil {
		log.Error("worker failed to start", "err", err)
		return 1
	}
	eng, err := opts.Engine(w)
	if err == nil && eng == nil {
		err = errors.New("Options.Engine returned no engine")
	}
	if err != nil {
		log.Error("worker failed to start", "err", fmt.Errorf("prefork: building the engine: %w", err))
		w.runDeferred(log)
		return 1
	}
	timeout := w.Settings.ShutdownTimeout
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
	why, served, ok := serveUntilTold(ctx, w, func() error { return eng.Serve(ln) }, recycle, term, notes, log)
	if !ok {
		w.runDeferred(log) // what it opened still closes (a store's last counts)
		return 1
	}
	log.Info("worker draining", "reason", why, "timeout", timeout)
	w.draining()
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
	w.runDeferred(log)
	return 0
}

// serveUntilTold reports the worker ready and serves with serve until it
// is told to drain: TERM, the supervisor gone, or ctx done; it returns
// why. Connections that arrive before serve runs wait in the shared
// listener's backlog. The readiness pipe stays open: a worker past a
// recycling limit (recycle) asks through it for a successor, and its
// listener, closed then, makes serve return early, which is expected.
// served has serve's result once it returned. ok is false when the
// worker could not report ready or serve stopped on its own (logged).
func serveUntilTold(ctx context.Context, w *Worker, serve func() error, recycle <-chan []byte, term, notes <-chan os.Signal, log *slog.Logger) (why string, served <-chan error, ok bool) {
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
		case sig := <-notes:
			if sig == syscall.SIGUSR1 {
				w.reopen(log)
			} else {
				w.draining()
			}
		case sig := <-term:
			why = "TERM"
			if sig == syscall.SIGQUIT {
				why = "QUIT"
			}
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

// joinWorker reads the configuration the supervisor handed over (and
// hands it to Options.Configured), joins the region as index and opens
// the inherited listener.
func joinWorker(opts Options, index int, log *slog.Logger) (*Worker, net.Listener, error) {
	cfg, err := readSettings(os.NewFile(fdConfig, "config"))
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
	rssDelay, err := inheritedRSSDelay()
	if err != nil {
		return nil, nil, err
	}
	lim, err := newLimits(cfg, randomJitter(), rssDelay, time.Now())
	if err != nil {
		return nil, nil, err
	}
	return &Worker{Index: index, Region: region, Settings: cfg, Logger: log, limits: lim}, ln, nil
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
