package prefork

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/preforkd/preforkd/metrics"
	"github.com/preforkd/preforkd/shm"
)

// handledSignals are the signals the supervisor listens to: those it acts
// on (TERM, INT, QUIT, HUP, USR1, USR2), and those an operator may send
// that Go would otherwise ignore without a word, which it logs as
// ignored. Never SIGURG (the runtime preempts with it), SIGCHLD or
// SIGPIPE, nor those whose default stops or dumps the process.
var handledSignals = []os.Signal{
	syscall.SIGTERM, syscall.SIGINT, syscall.SIGQUIT, syscall.SIGHUP, syscall.SIGUSR1, syscall.SIGUSR2,
	syscall.SIGWINCH, syscall.SIGALRM, syscall.SIGPWR, syscall.SIGVTALRM, syscall.SIGIO, syscall.SIGXCPU, syscall.SIGXFSZ,
}

// runSupervisor is Run in the supervisor.
func runSupervisor(ctx context.Context, opts Options) (err error) {
	log := opts.Logger
	if opts.Listener != nil {
		defer opts.Listener.Close() // Run owns it, whatever happens
	}
	if opts.Engine == nil {
		return errors.New("prefork: Options.Engine is nil")
	}
	if opts.Workers < 0 {
		return fmt.Errorf("prefork: Options.Workers %d is negative (0 means one per CPU)", opts.Workers)
	}
	cfg, err := opts.Settings.withDefaults()
	if err != nil {
		return err
	}
	if opts.Configured != nil {
		opts.Configured(cfg)
	}
	n := WorkerCount(opts.Workers)
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
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, handledSignals...)
	defer signal.Stop(sigs)

	ln := opts.Listener
	inherited, err := takeInheritance()
	if err != nil {
		return err
	}
	if inherited != nil && ln == nil {
		if ln, err = inherited.listen(); err != nil {
			return err
		}
		log.Info("upgrade: serving the old supervisor's listener and region", "listen", ln.Addr().String(),
			"old_worker_indexes", inherited.oldIndexes)
	}
	activated, err := activatedListener(log)
	if err != nil {
		return err
	}
	if ln == nil && activated != nil {
		ln = activated
		log.Info("listening on the socket passed by the service manager", "listen", ln.Addr().String())
	} else if activated != nil {
		activated.Close() // Options.Listener comes first
	}
	if ln == nil {
		addr := opts.Listen
		if addr == "" {
			addr = DefaultListen
		}
		if ln, err = net.Listen("tcp", addr); err != nil {
			return fmt.Errorf("prefork: %w", err)
		}
	}
	defer ln.Close()
	lnFile, err := ListenerFile(ln)
	if err != nil {
		return err
	}
	defer lnFile.Close()

	var region *shm.Region
	if inherited != nil {
		region, err = inherited.attach(n, regionOptions(opts, n).StatLayout)
	} else {
		region, err = newRegion(opts, n)
	}
	if err != nil {
		return err
	}
	defer region.Close()
	if inherited != nil && opts.Adopt != nil {
		if err := opts.Adopt(inherited.files); err != nil {
			return fmt.Errorf("prefork: adopting the old supervisor's files: %w", err)
		}
	}
	if opts.Prepare != nil {
		if err := opts.Prepare(region, log); err != nil {
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
		pid:      os.Getpid(),
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
	sys.load = opts.Reload
	sys.upgrade = func(indexes []int) (upgradeProc, error) { return env.upgrade(indexes, opts.Handover) }
	sys.waitGone = func(indexes []int) { env.waitGone(region, indexes) }
	if inherited != nil {
		sys.tellReady = inherited.tellReady
	}

	started := []any{"pid", os.Getpid(), "listen", ln.Addr().String(),
		"workers", n, "counters", region.Geometry().Counters, "max_workers", region.Geometry().MaxWorkers,
		"open_files", openFiles}
	if watchdog > 0 {
		started = append(started, "watchdog_ping", watchdog)
	}
	log.Info("supervisor started", started...)
	s := newSupervisor(sys, log, cfg, n, region.Geometry().MaxWorkers)
	s.onStatus, s.onConfig, s.onHandedOver = opts.OnStatus, opts.Configured, opts.HandedOver
	if inherited != nil {
		s.inherit(inherited.oldIndexes)
		inherited.watch(env.post)
	}
	stopBeat := beat(region)
	s.run(ctx, sigs, events)
	stopBeat()
	log.Info("drain finished")
	if s.fatal != nil {
		err = s.fatal
	}
	if why := s.regionLeft(); why != "" {
		log.Info(why)
		return err
	}
	if opts.Finish != nil {
		if ferr := opts.Finish(region, s.cfg, log); ferr != nil {
			err = errors.Join(err, fmt.Errorf("prefork: finish: %w", ferr))
		}
	}
	return err
}

// ListenerFile duplicates ln's socket, for the workers (and for a program's
// Options.Handover). Not with the listener's File method: that *os.File
// puts the socket in blocking mode whenever its Fd is read, as os/exec
// does at every start, and the mode belongs to the socket, shared by every
// worker: their accept would block a thread, and closing the listener to
// drain would hang.
func ListenerFile(ln net.Listener) (*os.File, error) {
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
