package prefork

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/valyala/fasthttp"
	"golang.org/x/sys/unix"

	"github.com/preforkd/preforkd/config"
	"github.com/preforkd/preforkd/core"
	"github.com/preforkd/preforkd/metrics"
	"github.com/preforkd/preforkd/shm"
)

// Options configures Run. Zero values are the documented defaults.
type Options struct {
	// Config is the configuration to run (required). Zero values in it
	// stand for its defaults (config.Config.WithDefaults). A worker runs
	// the configuration its supervisor hands it, whatever its own
	// Options.Config says.
	Config config.Config
	// ConfigPath, if set, is read again with config.Load on HUP. A file
	// that does not load is logged and the running configuration kept.
	ConfigPath string
	// LoadConfig, if set, is called on HUP instead of loading ConfigPath,
	// e.g. to apply command-line overrides to the file again. An error
	// keeps the running configuration.
	LoadConfig func() (config.Config, error)

	// Listener is an optional pre-opened TCP listener (tests, socket
	// activation); Run takes it over and closes it. nil: Run listens on
	// Config.Server.Listen.
	Listener net.Listener

	// Handler builds the application, once in each worker process, served
	// by net/http with the worker's decision core (rate limits, idempotent
	// replay) in front of it. Exactly one of Handler, FastHandler and
	// Engine is set.
	Handler func(w *Worker) (http.Handler, error)
	// FastHandler builds a fasthttp application (Fiber's app.Handler(),
	// say), once in each worker process, served by the fast engine
	// (package proxy) with the worker's decision core in front of it.
	FastHandler func(w *Worker) (fasthttp.RequestHandler, error)
	// Engine builds the engine a worker serves with, once in each worker
	// process: preforkd's proxy, for one. It must ask w.Core() about
	// every request; nothing else applies the rules for it.
	Engine func(w *Worker) (Engine, error)

	// Refuse, if set, writes the answer to a request the rate limits
	// refused, in place of the default problem+json (see
	// nethttp.Options.Refuse).
	Refuse func(w http.ResponseWriter, r *http.Request, ref *core.Refusal)

	// Logger receives one structured line per operator event, in the
	// supervisor and in every worker. nil means slog.Default().
	Logger *slog.Logger

	// Prepare, if set, runs in the supervisor after the region is created
	// and before any worker starts (e.g. to load a dump into it). An error
	// stops Run.
	Prepare func(r *shm.Region, cfg config.Config, log *slog.Logger) error
	// Finish, if set, runs in the supervisor after the last worker was
	// reaped at shutdown, when nothing else uses the region (e.g. to dump
	// it). Its error is Run's.
	Finish func(r *shm.Region, cfg config.Config, log *slog.Logger) error
	// NewRegion, if set, replaces shm.Create (e.g. a live region on tmpfs).
	// The region must have room for 2×workers+2 worker indexes.
	NewRegion func(cfg config.Config) (*shm.Region, error)

	// Configured, if set, is called with the configuration this process
	// runs: in the supervisor at start and after every accepted reload (on
	// its loop: it must return at once), in a worker as soon as it has
	// read the configuration its supervisor handed it. E.g. to apply a
	// [log] table to Logger's handler.
	Configured func(cfg config.Config)

	// OnStatus, if set, is called in the supervisor with a new snapshot
	// whenever a worker starts, becomes ready, retires or exits, and when
	// a reload or the drain begins. It runs on the supervisor's loop: it
	// must return at once (store the snapshot, say, for an admin endpoint).
	OnStatus func(Status)
}

// Run runs this process in the role it was started in, so that main calls
// it before it does anything else with side effects.
//
// In the supervisor (a process that was not started as a worker, see
// IsWorker) it opens the listener, creates the region, runs Prepare,
// starts the workers and supervises them until ctx is done or a TERM or
// INT arrives; then it drains the workers, runs Finish and returns nil. It
// returns an error for a failure to start, and Finish's error.
//
// In a worker it serves the application until it is told to drain, and
// then exits the process itself: it never returns.
func Run(ctx context.Context, opts Options) error {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if IsWorker() {
		os.Exit(runWorker(ctx, opts))
	}
	return runSupervisor(ctx, opts)
}

// minMaxWorkers is how many region worker indexes n workers need: n
// running, n draining after a reload, one successor and one spare.
func minMaxWorkers(n int) int { return 2*n + 2 }

// runSupervisor is Run in the supervisor.
func runSupervisor(ctx context.Context, opts Options) (err error) {
	log := opts.Logger
	if opts.Listener != nil {
		defer opts.Listener.Close() // Run owns it, whatever happens
	}
	if err := validApplication(opts); err != nil {
		return err
	}
	cfg, err := validated(opts.Config, nil)
	if err != nil {
		return err
	}
	if opts.Configured != nil {
		opts.Configured(cfg)
	}
	n := cfg.Server.WorkerCount()
	note, err := newNotifier(os.Getenv(envNotifySocket))
	if err != nil {
		return err
	}
	var watchdog time.Duration
	if note != nil {
		if watchdog, err = watchdogPings(os.Getenv(envWatchdogUsec), os.Getenv(envWatchdogPID), os.Getpid()); err != nil {
			return err
		}
	}
	openFiles, err := raiseOpenFileLimit()
	if err != nil {
		log.Warn("open-file limit not raised", "open_files", openFiles, "err", err)
	}

	// Handled signals only, buffered: a TERM that arrives while the loop is
	// busy is not lost. Never all signals: the runtime uses some itself.
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	defer signal.Stop(sigs)

	ln := opts.Listener
	if ln == nil {
		if ln, err = net.Listen("tcp", cfg.Server.Listen); err != nil {
			return fmt.Errorf("prefork: %w", err)
		}
	}
	defer ln.Close()
	lnFile, err := listenerFile(ln)
	if err != nil {
		return err
	}
	defer lnFile.Close()

	region, err := newRegion(opts, cfg, n)
	if err != nil {
		return err
	}
	defer region.Close()
	if opts.Prepare != nil {
		if err := opts.Prepare(region, cfg, log); err != nil {
			return fmt.Errorf("prefork: prepare: %w", err)
		}
	}

	lifeR, lifeW, err := os.Pipe()
	if err != nil {
		return fmt.Errorf("prefork: lifeline pipe: %w", err)
	}
	defer lifeR.Close()
	defer lifeW.Close() // only once every worker is gone: its EOF tells them to go

	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("prefork: locating this program's file: %w", err)
	}
	events := make(chan any)
	quit := make(chan struct{})
	env := &osEnv{
		spawner:  newSpawner(),
		exe:      exe,
		name:     processName(),
		args:     os.Args,
		environ:  workerEnviron(os.Environ(), n),
		region:   region.File(),
		listener: lnFile,
		lifeline: lifeR,
		events:   events,
		quit:     quit,
	}
	defer env.close()
	defer close(quit)

	sys := sysEnv{
		now:      timeNow,
		start:    env.start,
		reap:     region.Reap,
		notify:   note.send,
		watchdog: watchdog,
		// From the region's statistics: a worker index's row, and the sum
		// of every other row and of the reaped workers' (it never goes
		// down), read together so the two never overlap.
		requests: func(w int) RequestCounts {
			var s metrics.Snapshot
			metrics.ReadWorker(region, w, &s)
			return RequestCounts{Requests: s.Requests(), Errors: s.Errors5xx()}
		},
		fleetRequests: func(except int) RequestCounts {
			var s metrics.Snapshot
			metrics.ReadOthers(region, except, &s)
			return RequestCounts{Requests: s.Requests(), Errors: s.Errors5xx()}
		},
		stopListening: func() {
			ln.Close()
			lnFile.Close()
		},
	}
	fits := func(cfg config.Config, err error) (config.Config, error) {
		if err == nil {
			err = fitsRegion(region, cfg)
		}
		return cfg, err
	}
	switch {
	case opts.LoadConfig != nil:
		sys.load = func() (config.Config, error) { return fits(validated(opts.LoadConfig())) }
	case opts.ConfigPath != "":
		sys.load = func() (config.Config, error) { return fits(validated(config.Load(opts.ConfigPath))) }
	}

	started := []any{"pid", os.Getpid(), "listen", ln.Addr().String(),
		"workers", n, "counters", region.Geometry().Counters, "max_workers", region.Geometry().MaxWorkers,
		"open_files", openFiles}
	if watchdog > 0 {
		started = append(started, "watchdog_ping", watchdog)
	}
	log.Info("supervisor started", started...)
	s := newSupervisor(sys, log, cfg, region.Geometry().MaxWorkers)
	s.onStatus, s.onConfig = opts.OnStatus, opts.Configured
	stopBeat := beat(region)
	s.run(ctx, sigs, events)
	stopBeat()
	log.Info("drain finished")
	if s.fatal != nil {
		err = s.fatal
	}
	if opts.Finish != nil {
		if ferr := opts.Finish(region, s.cfg, log); ferr != nil {
			err = errors.Join(err, fmt.Errorf("prefork: finish: %w", ferr))
		}
	}
	return err
}

// listenerFile duplicates ln's socket for the workers. Not with the
// listener's File method: that *os.File puts the socket in blocking mode
// whenever its Fd is read, as os/exec does at every start, and the mode
// belongs to the socket, shared by every worker: their accept would block
// a thread, and closing the listener to drain would hang.
func listenerFile(ln net.Listener) (*os.File, error) {
	sc, ok := ln.(syscall.Conn)
	if !ok {
		return nil, fmt.Errorf("prefork: a %T cannot be passed to workers", ln)
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return nil, fmt.Errorf("prefork: listener: %w", err)
	}
	dup := -1
	cerr := rc.Control(func(fd uintptr) {
		dup, err = unix.FcntlInt(fd, unix.F_DUPFD_CLOEXEC, 0)
	})
	if cerr != nil || err != nil {
		return nil, fmt.Errorf("prefork: duplicating the listener: %w", errors.Join(cerr, err))
	}
	// os.NewFile leaves the mode of a non-blocking descriptor alone.
	return os.NewFile(uintptr(dup), "listener"), nil
}

// RegionOptions is the geometry of the region for cfg: its [table]
// section (config.Config.RegionTable: no response table without a block
// that stores responses), room in the worker table for a reload's overlap, and the
// statistics rows and rule names of package metrics.
func RegionOptions(cfg config.Config) shm.Options {
	t := cfg.RegionTable() // no response table without a block that stores responses
	o := shm.Options{
		Counters:      t.Counters,
		MaxWorkers:    minMaxWorkers(cfg.Server.WorkerCount()),
		Responses:     t.Responses,
		ResponseBytes: int64(t.ResponseBytes),
	}
	metrics.Geometry(&o, len(cfg.RateLimits))
	return o
}

// newRegion creates the shared region before any worker exists.
func newRegion(opts Options, cfg config.Config, n int) (*shm.Region, error) {
	need := minMaxWorkers(n)
	if opts.NewRegion == nil {
		return shm.Create(RegionOptions(cfg))
	}
	r, err := opts.NewRegion(cfg)
	if err != nil {
		return nil, err
	}
	if r.File() == nil {
		r.Close()
		return nil, errors.New("prefork: NewRegion returned a private region, which workers cannot map")
	}
	if got := r.Geometry().MaxWorkers; got < need {
		r.Close()
		return nil, fmt.Errorf("prefork: the region has room for %d workers; %d workers need %d", got, n, need)
	}
	if err := fitsRegion(r, cfg); err != nil {
		r.Close()
		return nil, err
	}
	return r, nil
}

// fitsRegion refuses a configuration whose [[idempotency]] or [[cache]]
// blocks need a response table that the region was made without: it
// would refuse every keyed request and store nothing. The region's
// geometry is fixed for its life, so a reload that adds the first such
// block is refused (the running configuration goes on) and a restart
// makes the region anew.
func fitsRegion(r *shm.Region, cfg config.Config) error {
	if cfg.RegionTable().Responses > 0 && r.Geometry().Responses == 0 {
		return errors.New("prefork: [[idempotency]] and [[cache]] blocks need the response table, which the running region was made without (it had no such block at start): restart to add them")
	}
	return nil
}

// validated checks a configuration that loaded and fills in its defaults.
func validated(cfg config.Config, err error) (config.Config, error) {
	if err == nil {
		err = cfg.Validate()
	}
	if err != nil {
		return config.Config{}, err
	}
	return cfg.WithDefaults(), nil
}

func timeNow() time.Time { return time.Now() }

// beatInterval is how often the supervisor records the region's clock
// against the wall clock (shm.Region.Beat), for a region re-attached after
// a crash whose time base cannot be trusted.
const beatInterval = time.Second

// beat records the region's clock every beatInterval until the returned
// function is called; that function waits for the last beat.
func beat(r *shm.Region) (stop func()) {
	done := make(chan struct{})
	exited := make(chan struct{})
	r.Beat(time.Now())
	go func() {
		defer close(exited)
		tick := time.NewTicker(beatInterval)
		defer tick.Stop()
		for {
			select {
			case <-done:
				r.Beat(time.Now())
				return
			case <-tick.C:
				r.Beat(time.Now())
			}
		}
	}()
	return func() {
		close(done)
		<-exited
	}
}
