package prefork

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
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
	// Region is the shared region, joined as Index. The worker never
	// closes it (the kernel unmaps it at exit): what Defer runs must not
	// either, as an engine's goroutine it gave up on may still touch it.
	Region *shm.Region
	// Settings are the supervisor's settings at the time this worker was
	// started (after a HUP, the new ones), with their Payload.
	Settings Settings
	// Logger is Options.Logger with the worker's index and pid.
	Logger *slog.Logger

	main  net.Listener            // Options.Listen's socket
	extra map[string]net.Listener // Options.ExtraListen's sockets, by name

	served atomic.Int64 // responses, counted by Responded
	limits *limits      // recycling limits; nil without any

	mu      sync.Mutex
	closes  []func() error // Defer's, run after the drain
	reopens []func() error // OnReopen's
	drains  []func()       // OnDrain's, until they ran
	drained bool           // OnDrain's functions ran
}

// Listener is the extra listener called name (Options.ExtraListen) that
// this worker inherited, or nil when the supervisor passed none by that
// name; "" names Options.Listen's, which the engine serves (for its
// address: the port a client is sent to). The program serves an extra
// one from Options.Engine and drains it with the engine's Shutdown (an
// Engine that serves several listeners); past a recycling limit the
// worker closes it with the main one.
func (w *Worker) Listener(name string) net.Listener {
	if name == "" {
		return w.main
	}
	return w.extra[name]
}

// closeExtra closes the extra listeners: the worker stops accepting on
// every socket.
func (w *Worker) closeExtra() {
	for _, ln := range w.extra {
		ln.Close()
	}
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

// draining runs OnDrain's functions, once, and turns the recycling limits
// off: the worker leaves with the instance.
func (w *Worker) draining() {
	if w.limits != nil {
		w.limits.disarm()
	}
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
func (w *Worker) pastLimit() bool { return w.limits != nil && w.limits.state.Load() == limitsTripped }

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
	// A reload starts the binary on disk: a newer build than the
	// supervisor's, whose statistics rows may mean other things. Its
	// counts would be misread (the canary judged by them), so it does not
	// serve.
	if want := regionOptions(opts, 0).StatLayout; region.Geometry().StatLayout != want {
		region.Close()
		return nil, nil, errors.New("prefork: this build lays out the region's statistics rows otherwise than the supervisor's (other metrics): " +
			"it cannot serve under that supervisor; restart the service to run it")
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
	extra, err := inheritedExtra(os.Getenv(envListeners))
	if err != nil {
		return nil, nil, err
	}
	rssDelay, err := inheritedRSSDelay()
	if err != nil {
		return nil, nil, err
	}
	lim, err := newLimits(cfg, randomJitter(), rssDelay, time.Now())
	if err != nil {
		return nil, nil, err
	}
	return &Worker{Index: index, Region: region, Settings: cfg, Logger: log, limits: lim, main: ln, extra: extra}, ln, nil
}

// inheritedExtra opens the extra listeners named by names (envListeners),
// from fdExtra on.
func inheritedExtra(names string) (map[string]net.Listener, error) {
	if names == "" {
		return nil, nil
	}
	extra := map[string]net.Listener{}
	for i, name := range strings.Split(names, ",") {
		f := os.NewFile(uintptr(fdExtra+i), name)
		ln, err := net.FileListener(f)
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("prefork: inherited listener %q: %w", name, err)
		}
		extra[name] = ln
	}
	return extra, nil
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
