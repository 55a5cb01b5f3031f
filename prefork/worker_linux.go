package prefork

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/preforkd/preforkd/metrics"
)

// A worker ignores the supervisor's signals (INT, HUP, USR2) from Run on,
// and takes USR1 as a reopen; but a program may have work to do before
// it calls Run (its flags, its logs), and a signal that reached it then
// would end it, as it ends a Go program that does not listen for it: a
// HUP that `systemctl kill` sends every process of the unit would kill a
// canary as it starts, and abort the reload. So a worker ignores them
// from this package's initialization on, until Run listens (a USR1 then
// has nothing to reopen: the files are not open yet).
func init() {
	if IsWorker() {
		signal.Ignore(syscall.SIGINT, syscall.SIGHUP, syscall.SIGUSR2, sigReopen)
	}
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
	extraFDs := 0
	if v := os.Getenv(envListeners); v != "" {
		extraFDs = strings.Count(v, ",") + 1
	}
	os.Unsetenv(envWorker)
	os.Unsetenv(envName)
	for fd := fdRegion; fd < fdExtra+extraFDs; fd++ {
		syscall.CloseOnExec(fd)
	}
	if n, err := raiseOpenFileLimit(); err != nil {
		log.Warn("open-file limit not raised", "open_files", n, "err", err)
	}
	// Ctrl-C, HUP and USR2 (the binary upgrade) are the supervisor's
	// business. From the supervisor: TERM (or QUIT, as nginx's workers
	// take it) means drain, USR1 reopen the files, sigDrain that the
	// instance is stopping (its health answers 503 while it still
	// serves, Settings.DrainDelay).
	signal.Ignore(syscall.SIGINT, syscall.SIGHUP, syscall.SIGUSR2)
	term := make(chan os.Signal, 1)
	signal.Notify(term, syscall.SIGTERM, syscall.SIGQUIT)
	notes := make(chan os.Signal, 4)
	signal.Notify(notes, sigReopen, sigDrain)

	w, ln, err := joinWorker(opts, index, log)
	os.Unsetenv(envListeners)
	if err != nil {
		log.Error("worker failed to start", "err", err)
		return 1
	}
	eng, err := opts.Engine(w)
	if err == nil {
		err = checkEngine(eng)
	}
	if err != nil {
		log.Error("worker failed to start", "err", fmt.Errorf("prefork: building the engine: %w", err))
		w.runDeferred(log)
		return exitNoEngine
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
		w.closeExtra()
		go func() { recycled <- eng.Shutdown(recycleCtx) }()
	})
	report, lifeline := os.NewFile(fdReady, "ready"), watchLifeline(os.NewFile(fdLifeline, "lifeline"))
	why, served, ok := serveUntilTold(ctx, w, report, lifeline, func() error { return eng.Serve(ln) }, recycle, term, notes, log)
	if !ok {
		w.runDeferred(log) // what it opened still closes (a store's last counts)
		return 1
	}
	log.Info("worker draining", "reason", why, "timeout", timeout)
	w.draining()
	// A draining worker still reopens its files (USR1): logrotate may
	// rename the access log while its last requests are written. Not once
	// what it opened is being closed (runDeferred, below).
	reopenDone, reopening := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(reopening)
		for {
			select {
			case sig := <-notes:
				if sig == syscall.SIGUSR1 {
					w.reopen(log)
				}
			case <-reopenDone:
				return
			}
		}
	}()
	stopReopening := func() {
		signal.Stop(notes)
		close(reopenDone)
		<-reopening
	}
	drained, cut := recycled, cutRecycleDrain
	if !w.pastLimit() {
		sctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		done := make(chan error, 1)
		go func() { done <- eng.Shutdown(sctx) }()
		drained, cut = done, cancel
	}
	drainOutcome(w, drained, cut, timeout, log)
	select {
	case <-served:
	case <-time.After(time.Second): // Serve returns once its listener is closed
	}
	stopReopening()
	w.runDeferred(log)
	return 0
}

// drainOutcome waits for the engine's drain to end (drained), cutting it
// (cut) once timeout has passed, and logs its outcome in one line: the
// worker drained, or its drain was cut at the timeout with so many
// connections still open, as its statistics row counted them just before
// the cut. The engine's error then is only the context's, whose text
// ("context canceled") says nothing of a timeout.
func drainOutcome(w *Worker, drained <-chan error, cut func(), timeout time.Duration, log *slog.Logger) {
	start := time.Now()
	t := time.NewTimer(timeout)
	var err error
	select {
	case err = <-drained:
		t.Stop()
	case <-t.C:
		var s metrics.Snapshot
		metrics.ReadWorker(w.Region, w.Index, &s)
		open := s.Conns(metrics.ConnReading) + s.Conns(metrics.ConnWriting) + s.Conns(metrics.ConnIdle)
		cut()
		if err = <-drained; err != nil {
			log.Warn("worker drain cut at shutdown_timeout", "timeout", timeout, "connections", open)
			return
		}
	}
	if err != nil {
		log.Warn("worker drain failed", "err", err)
		return
	}
	log.Info("worker drained", "took", time.Since(start).Round(time.Millisecond))
}

// serveUntilTold reports the worker ready and serves with serve until it
// is told to drain: TERM, the supervisor gone, or ctx done; it returns
// why. Connections that arrive before serve runs wait in the shared
// listener's backlog. The readiness pipe stays open: a worker past a
// recycling limit (recycle) asks through it for a successor, and its
// listener, closed then, makes serve return early, which is expected.
// served has serve's result once it returned. ok is false when the
// worker could not report ready or serve stopped on its own (logged).
func serveUntilTold(ctx context.Context, w *Worker, report *os.File, lifeline <-chan struct{}, serve func() error, recycle <-chan []byte, term, notes <-chan os.Signal, log *slog.Logger) (why string, served <-chan error, ok bool) {
	if _, err := report.Write([]byte{1}); err != nil {
		log.Error("worker failed to report readiness", "err", err)
		return "", nil, false
	}
	result := make(chan error, 1)
	told := make(chan struct{}) // closed once told to drain
	go func() {
		result <- serve()
		// The engine accepts no more (Serve returns once it stopped
		// accepting on every listener it serves): a retiring worker's
		// word, which the supervisor waits for before it announces a
		// reload finished. Said only once told to drain, so that it is
		// the pipe's last message: a worker past a recycling limit stops
		// serving before it asks for a successor, and a supervisor of a
		// build without this word reads whole recycle requests, then the
		// one byte before EOF, which it ignores. The supervisor may be
		// gone: no error to report.
		<-told
		_, _ = report.Write([]byte{stoppedMsg})
	}()
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
			if sig == sigReopen {
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
	close(told)
	return why, result, true
}
