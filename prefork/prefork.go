package prefork

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"time"

	"github.com/preforkd/preforkd/internal/cpuquota"
	"github.com/preforkd/preforkd/metrics"
	"github.com/preforkd/preforkd/shm"
)

// Options configures Run. Zero values are the documented defaults.
type Options struct {
	// Listen is the address of the one listening socket every worker
	// serves. "" means "127.0.0.1:8080".
	Listen string
	// Listener is an optional pre-opened TCP listener (tests) used
	// instead of Listen; Run takes it over and closes it. Without it, a
	// socket passed by the service manager (LISTEN_FDS, LISTEN_PID:
	// systemd's socket activation) is served instead of Listen.
	Listener net.Listener
	// ExtraListen are further listening sockets beside Listen, each with
	// a name: opened by the supervisor as Listen's is (net.Listen, or a
	// socket the service manager passed: see Run), inherited by every
	// worker (Worker.Listener) and handed on at a binary upgrade by name,
	// as Listen's is. The engine serves Listen's; the program serves the
	// others from Options.Engine, and drains them with it. Names are
	// distinct, non-empty, without ',', ':' or ';'.
	ExtraListen []NamedListen
	// Workers is the number of worker processes; 0 means one per CPU. Run
	// refuses a negative number.
	Workers int

	// Region is the geometry of the shared region the supervisor creates
	// before any worker starts; its MaxWorkers is raised to what the
	// workers need (2×Workers+2: a reload's overlap). The zero value is
	// shm's default geometry.
	Region shm.Options
	// NewRegion, if set, replaces shm.Create (e.g. a live region on tmpfs),
	// given Region with MaxWorkers raised and the statistics rows the
	// workers count in (StatWords...) added: it creates the region with
	// those options. The region must be shareable (a file) with room for
	// that many worker indexes and those rows; Run refuses another.
	NewRegion func(o shm.Options) (*shm.Region, error)

	// Settings are what the supervisor and each worker run with (the
	// drain's timeout, the canary, recycling, the workers' Payload).
	Settings Settings
	// Reload, if set, is called on HUP with the running settings, for the
	// ones to replace the workers with (e.g. a configuration file read
	// again). An error keeps the running settings, logged. nil: a HUP
	// replaces the workers with the running settings (a new binary on
	// disk, say).
	Reload func(running Settings) (Settings, error)

	// Engine builds the HTTP engine a worker serves the listener with,
	// once in each worker process (required). The engine runs every
	// request through the worker's decision core (package core), which
	// it builds over w.Region with core.Options.OnResponse = w.Responded,
	// so that the recycling limits see each response, closing it with
	// w.Defer, and with a core.Options.HealthPath, telling it of the
	// drain with w.OnDrain(c.Drain) (see the package's example:
	// engine/nethttp's Server over an http.Handler).
	Engine func(w *Worker) (Engine, error)

	// Logger receives one structured line per operator event, in the
	// supervisor and in every worker. nil means slog.Default().
	Logger *slog.Logger

	// Prepare, if set, runs in the supervisor after the region is created
	// and before any worker starts (e.g. to load a dump into it). An error
	// stops Run.
	Prepare func(r *shm.Region, log *slog.Logger) error
	// Finish, if set, runs in the supervisor after the last worker was
	// reaped at shutdown, when nothing else uses the region (e.g. to dump
	// it), with the settings that ran last. Its error is Run's.
	Finish func(r *shm.Region, s Settings, log *slog.Logger) error

	// Configured, if set, is called with the settings this process runs:
	// in the supervisor at start and after every accepted reload (on its
	// loop: it must return at once), in a worker as soon as it has read
	// the settings its supervisor handed it. E.g. to apply a [log] table
	// to Logger's handler.
	Configured func(s Settings)

	// Handover, if set, returns the files (by name) a new supervisor
	// started by USR2 inherits besides the listener and the region: what
	// the program holds for the whole instance (a lock, an admin
	// listener). It runs in the old supervisor when the upgrade begins;
	// the files are closed once handed over. See Adopt.
	Handover func() (map[string]*os.File, error)
	// HandedOver, if set, runs in the old supervisor once the new one is
	// ready, before the old one drains its workers (on its loop: it must
	// return at once): stop serving what the new one took over (an
	// admin endpoint on the inherited listener). Finish does not run
	// after a handover: the region lives on in the new supervisor. Nor
	// does it in a new supervisor stopped before the old one handed over:
	// the old one serves on and runs its own.
	HandedOver func()
	// Adopt, if set, is called in a supervisor started by USR2, before
	// Prepare, with the files Handover gave (by name): the program takes
	// them over. Prepare and Finish then run as usual, but Prepare gets
	// the old supervisor's region, counts and all: nothing is to be
	// loaded into it.
	Adopt func(files map[string]*os.File) error

	// OnStatus, if set, is called in the supervisor with a new snapshot
	// whenever a worker starts, becomes ready, retires or exits, and when
	// a reload or the drain begins. It runs on the supervisor's loop: it
	// must return at once (store the snapshot, say, for an admin endpoint).
	OnStatus func(Status)
}

// NamedListen is one of Options.ExtraListen: its name, and the address
// to open ("host:port").
type NamedListen struct {
	Name, Addr string
}

// checkExtraListen refuses names that cannot be told apart or passed on.
func checkExtraListen(ls []NamedListen) error {
	seen := make(map[string]bool, len(ls))
	for _, l := range ls {
		if l.Name == "" || strings.ContainsAny(l.Name, ",:;=") || seen[l.Name] {
			return fmt.Errorf("prefork: Options.ExtraListen: name %q is empty, repeated or holds one of \",:;=\"", l.Name)
		}
		seen[l.Name] = true
	}
	return nil
}

// DefaultListen is Options.Listen's default.
const DefaultListen = "127.0.0.1:8080"

// Engine is an HTTP engine a worker serves its listener with:
// loop.Server (the daemon's event loop), proxy.Server (fasthttp) and
// nethttp.Server are three. A net/http *http.Server has its methods, but
// a worker refuses it, as an engine that failed to build: it would drain
// by its own rule and take none of the [server] limits (serve its
// Handler with nethttp.NewServer).
type Engine interface {
	// Serve serves the connections of ln until Shutdown, and then returns
	// nil; it returns an error if it cannot go on serving.
	Serve(ln net.Listener) error
	// Shutdown drains by the rule of a retiring worker (package engine's
	// drain rule: stop accepting; every response from now on says
	// Connection: close; a connection with no request in progress is
	// closed only once it has been idle for a second, or five seconds when
	// it never sent one) and returns once no connection is left, or with
	// ctx's error when ctx is done first, having closed them all.
	Shutdown(ctx context.Context) error
}

// checkEngine refuses what Options.Engine returned when no worker should
// serve with it: nothing, or a net/http *http.Server, which has Engine's
// methods by accident. Its Shutdown closes idle connections at once and
// sends no Connection: close, and none of the limits of Settings.Payload
// reach it: a worker serving with it would lose the drain rule without a
// word. (It is known by methods only it has beside Engine's, so that a
// program without net/http does not link it for this.)
func checkEngine(eng Engine) error {
	if eng == nil {
		return errors.New("Options.Engine returned no engine")
	}
	if _, ok := eng.(interface {
		RegisterOnShutdown(func())
		SetKeepAlivesEnabled(bool)
		ServeTLS(l net.Listener, certFile, keyFile string) error
	}); ok {
		return errors.New("Options.Engine returned a *http.Server, which has neither the drain rule nor the server limits: " +
			"serve its Handler with engine/nethttp's Server (nethttp.NewServer)")
	}
	return nil
}

// WorkerCount is the number of workers n asks for: n, or for 0 the CPUs
// this process may use: its cgroup's CPU limit (a container's, a systemd
// unit's CPUQuota=) rounded up, else the host's.
func WorkerCount(n int) int {
	if n > 0 {
		return n
	}
	return cpuquota.CPUs()
}

// Run runs this process in the role it was started in, so that main calls
// it before it does anything else with side effects.
//
// In the supervisor (a process that was not started as a worker, see
// IsWorker) it opens the listeners, creates the region, runs Prepare,
// starts the workers and supervises them until ctx is done or a TERM or
// INT arrives; then it drains the workers, runs Finish and returns nil. It
// returns an error for a failure to start (Options.Engine failing, or a
// worker panicking before it was ready, before the workers were first
// ready among them: a worker that crashes otherwise is respawned, with a
// delay that grows), and Finish's error.
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

// regionOptions is the geometry of the region for n workers.
func regionOptions(opts Options, n int) shm.Options {
	o := opts.Region
	o.MaxWorkers = max(o.MaxWorkers, minMaxWorkers(n))
	if o.StatWords == 0 {
		// The statistics a reload's canary is judged by, and the metrics
		// of package core, need rows in the region.
		metrics.Geometry(&o, 0)
	}
	return o
}

// newRegion creates the shared region before any worker exists, with room
// for n workers and a reload's overlap.
func newRegion(opts Options, n int) (*shm.Region, error) {
	o := regionOptions(opts, n)
	if opts.NewRegion == nil {
		return shm.Create(o)
	}
	r, err := opts.NewRegion(o)
	if err != nil {
		return nil, err
	}
	if r.File() == nil {
		r.Close()
		return nil, errors.New("prefork: NewRegion returned a private region, which workers cannot map")
	}
	// A region made with other options than o: each worker would refuse
	// it (worker.go), respawned without end.
	const use = "create it with the shm.Options it is given"
	geo := r.Geometry()
	if geo.MaxWorkers < o.MaxWorkers {
		r.Close()
		return nil, fmt.Errorf("prefork: NewRegion's region has room for %d workers; %d workers need %d: %s", geo.MaxWorkers, n, o.MaxWorkers, use)
	}
	if geo.StatLayout != o.StatLayout || geo.StatWords < o.StatWords {
		r.Close()
		return nil, errors.New("prefork: NewRegion's region has not the statistics rows the workers count in: " + use)
	}
	return r, nil
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
