package prefork

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
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
	if err := checkExtraListen(opts.ExtraListen); err != nil {
		return err
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
	wanted := make([]string, len(opts.ExtraListen))
	for i, l := range opts.ExtraListen {
		wanted[i] = l.Name
	}
	activated, activatedExtra, err := activatedListeners(wanted, log)
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
	extra, err := openExtra(opts.ExtraListen, inherited, activatedExtra, log)
	for _, x := range extra {
		defer x.ln.Close()
		defer x.file.Close()
	}
	if err != nil {
		return err
	}

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
	// Prepare last of what can fail: it may take the state a graceful stop
	// left (persist consumes the dump), which only Finish gives back.
	if opts.Prepare != nil {
		if err := opts.Prepare(region, log); err != nil {
			return fmt.Errorf("prefork: prepare: %w", err)
		}
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
		extra:    namedFiles(extra),
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
			for _, x := range extra {
				x.ln.Close()
				x.file.Close()
			}
		},
	}
	sys.load = opts.Reload
	sys.upgrade = func(indexes []int, gen int) (upgradeProc, error) { return env.upgrade(indexes, gen, opts.Handover) }
	sys.waitGone = func(indexes []int) { env.waitGone(region, indexes) }
	if inherited != nil {
		sys.tellReady = inherited.tellReady
	}

	started := []any{"pid", os.Getpid(), "listen", ln.Addr().String(),
		"workers", n, "counters", region.Geometry().Counters, "max_workers", region.Geometry().MaxWorkers,
		"open_files", openFiles}
	for _, x := range extra {
		started = append(started, "listen_"+x.name, x.ln.Addr().String())
	}
	if watchdog > 0 {
		started = append(started, "watchdog_ping", watchdog)
	}
	log.Info("supervisor started", started...)
	s := newSupervisor(sys, log, cfg, n, region.Geometry().MaxWorkers)
	s.onStatus, s.onConfig, s.onHandedOver = opts.OnStatus, opts.Configured, opts.HandedOver
	if inherited != nil {
		s.inherit(inherited.oldIndexes, inherited.gen)
		env.startsAt(s.gen)
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

// extraListener is one of Options.ExtraListen, open, with the socket's
// duplicate the workers inherit.
type extraListener struct {
	name string
	ln   net.Listener
	file *os.File
}

// openExtra opens Options.ExtraListen's listeners: each the old
// supervisor's of its name after an upgrade, else the one the service
// manager passed by its name, else a new socket at its address. Those
// inherited or passed that serve nothing are closed. What was opened is
// returned with an error too, for the caller to close.
func openExtra(ls []NamedListen, in *inheritance, activated map[string]net.Listener, log *slog.Logger) ([]extraListener, error) {
	var out []extraListener
	var err error
	for _, l := range ls {
		var ln net.Listener
		how := "inherited from the old supervisor"
		if in != nil {
			if ln, err = in.extra(l.Name); err != nil {
				break
			}
		}
		if a := activated[l.Name]; a != nil {
			delete(activated, l.Name)
			if ln == nil {
				ln, how = a, "passed by the service manager"
			} else {
				a.Close()
			}
		}
		if ln == nil {
			if ln, err = net.Listen("tcp", l.Addr); err != nil {
				err = fmt.Errorf("prefork: %s: %w", l.Name, err)
				break
			}
			how = ""
		}
		if how != "" {
			log.Info("listening on a socket "+how, "name", l.Name, "listen", ln.Addr().String())
		}
		f, ferr := ListenerFile(ln)
		if ferr != nil {
			ln.Close()
			err = ferr
			break
		}
		out = append(out, extraListener{l.Name, ln, f})
	}
	for _, a := range activated {
		a.Close()
	}
	if in != nil {
		for name, f := range in.listeners {
			log.Warn("upgrade: the old supervisor's listener serves nothing here: closed", "name", name)
			f.Close()
		}
		in.listeners = nil
	}
	return out, err
}

// namedFiles are the sockets of xs, for the workers.
func namedFiles(xs []extraListener) []namedFile {
	out := make([]namedFile, len(xs))
	for i, x := range xs {
		out[i] = namedFile{x.name, x.file}
	}
	return out
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
