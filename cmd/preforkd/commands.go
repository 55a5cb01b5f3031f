package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/preforkd/preforkd/accesslog"
	"github.com/preforkd/preforkd/config"
	"github.com/preforkd/preforkd/examples"
	"github.com/preforkd/preforkd/prefork"
	"github.com/preforkd/preforkd/shm"
)

// Set by the build (see the Makefile). Empty: the version and commit that
// go build recorded in the binary (debug.ReadBuildInfo) are shown.
var (
	version string
	commit  string
)

// buildVersion is the version and commit this binary reports.
func buildVersion() (v, c string) {
	bi, _ := debug.ReadBuildInfo()
	return versionOf(version, commit, bi)
}

// versionOf prefers what the Makefile stamped; else the module version
// that go build or go install recorded in bi (a tag, or a pseudo-version
// from the VCS, or "(devel)" when it knew none) and the VCS revision.
func versionOf(stamped, stampedCommit string, bi *debug.BuildInfo) (v, c string) {
	v, c = stamped, stampedCommit
	if bi != nil {
		if v == "" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			v = bi.Main.Version
		}
		var rev string
		var dirty bool
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.modified":
				dirty = s.Value == "true"
			}
		}
		if c == "" && rev != "" {
			c = rev[:min(12, len(rev))]
			if dirty {
				c += "-dirty"
			}
		}
	}
	if v == "" {
		v = "dev"
	}
	if c == "" {
		c = "unknown"
	}
	return v, c
}

// optionalInt is an int flag that knows whether it was given, so that its
// help shows no made-up default.
type optionalInt struct {
	n   int
	set bool
}

func (o *optionalInt) String() string {
	if o == nil || !o.set {
		return ""
	}
	return strconv.Itoa(o.n)
}

func (o *optionalInt) Set(s string) error {
	n, err := strconv.Atoi(s)
	if err != nil {
		return errors.New("not a whole number")
	}
	if n < 0 {
		return errors.New("want 0 (one per CPU) or more")
	}
	o.n, o.set = n, true
	return nil
}

// overrides are the run flags that replace config values, re-applied to
// the file at every reload.
type overrides struct {
	listen   string
	workers  optionalInt
	upstream string
	shadow   bool
}

func (o overrides) apply(cfg config.Config) (config.Config, error) {
	if o.listen != "" {
		cfg.Server.Listen = o.listen
	}
	if o.workers.set {
		cfg.Server.Workers = o.workers.n
	}
	if o.upstream != "" {
		cfg.Server.Upstream = o.upstream
	}
	if o.shadow {
		cfg.Server.Shadow = true
	}
	return cfg, o.blame(cfg.Validate())
}

// blame names the flag that set the value err is about, rather than the
// key it overrode: the file alone was valid.
func (o overrides) blame(err error) error {
	var ce *config.Error
	if !errors.As(err, &ce) {
		return err
	}
	for _, f := range []struct {
		key, flag string
		set       bool
	}{
		{"server.listen: ", "-listen", o.listen != ""},
		{"server.workers: ", "-workers", o.workers.set},
		{"server.upstream: ", "-upstream", o.upstream != ""},
	} {
		if rest, ok := strings.CutPrefix(ce.Msg, f.key); ok && f.set {
			return fmt.Errorf("%s: %s", f.flag, rest)
		}
	}
	return err
}

func loadConfig(path string, o overrides) (config.Config, error) {
	cfg, _, err := loadConfigOver(path, o, nil)
	return cfg, err
}

// loadToStart is what run refuses before it starts, and so what check
// refuses: -config missing, a configuration that does not load, a dump or
// live region that could not be written, an admin socket that could not
// be made.
func loadToStart(path string, o overrides) (config.Config, error) {
	if path == "" {
		return config.Config{}, &usageError{"-config FILE is required"}
	}
	cfg, err := loadConfig(path, o)
	if err != nil {
		return cfg, err
	}
	if err := checkPersist(cfg); err != nil {
		return cfg, atKey(path, err)
	}
	if err := checkAdminListen(cfg.Admin.Listen); err != nil {
		return cfg, atKey(path, &keyError{"admin.listen", err})
	}
	return cfg, nil
}

// atKey is a keyError as a configError of the file at path, at the key's
// line there; any other error as it is.
func atKey(path string, err error) error {
	var ke *keyError
	if !errors.As(err, &ke) {
		return err
	}
	return &configError{config.KeyError(path, ke.key, ke.err.Error())}
}

// loadConfigOver is loadConfig for a reload of running: a TLS
// certificate that cannot be used keeps the running one, and kept says
// which and why.
func loadConfigOver(path string, o overrides, running *config.Config) (config.Config, []error, error) {
	var cfg config.Config
	var kept []error
	var err error
	if running == nil {
		cfg, err = config.Load(path)
	} else {
		cfg, kept, err = config.LoadReload(path, *running)
	}
	if err != nil {
		return cfg, nil, &configError{err}
	}
	cfg, err = checkLoaded(cfg, o)
	return cfg, kept, atKey(path, err)
}

// checkLoaded applies the flags to a configuration read from its file
// and checks what only the daemon can.
func checkLoaded(cfg config.Config, o overrides) (config.Config, error) {
	var err error
	cfg, err = o.apply(cfg)
	if err != nil {
		return cfg, &configError{err}
	}
	// At start, in check and at every reload: a token file that would
	// refuse every action refuses the configuration instead.
	if cfg.Admin.TokenFile != "" {
		if _, err := readToken(cfg.Admin.TokenFile); err != nil {
			return cfg, &keyError{"admin.token_file", err}
		}
	}
	// So does an access log no worker could open.
	if path, on := cfg.Log.AccessLog(); on {
		if err := accesslog.Check(path); err != nil {
			return cfg, &keyError{"log.access", fmt.Errorf("log.access: %w", err)}
		}
	}
	return cfg, nil
}

func setupRun(fs *flag.FlagSet) func(context.Context, []string, io.Writer, io.Writer) error {
	path := fs.String("config", "", "configuration `FILE` (TOML); preforkd example-config prints one")
	var o overrides
	fs.StringVar(&o.listen, "listen", "", "listen address `ADDR` (host:port), overrides server.listen")
	fs.Var(&o.workers, "workers", "`N` worker processes (0 = one per CPU), overrides server.workers")
	fs.StringVar(&o.upstream, "upstream", "", "upstream `URL` (http://host:port) or \"builtin:demo\", overrides server.upstream")
	var lf logFlags
	lf.define(fs)
	fs.BoolVar(&o.shadow, "shadow", false, "every rule in shadow mode (a dry run: nothing refused), as server.shadow = true")
	return func(ctx context.Context, args []string, _, stderr io.Writer) error {
		if err := lf.check(); err != nil {
			return err
		}
		if prefork.IsWorker() {
			// A worker runs the supervisor's configuration, handed over by
			// it: the file may have changed (even broken) since. Its lines
			// are written by a goroutine of their own: its engine's loops
			// never wait on a pipe.
			q, logs, log := workerLogs(stderr, lf)
			quietRedisLog(log)
			withQueue := func(w *prefork.Worker) (prefork.Engine, error) {
				q.Start()
				w.Defer(q.Close) // the last to run: what the others log is written
				return engine(w)
			}
			return prefork.Run(ctx, prefork.Options{Engine: withQueue, Logger: log, Configured: logs.configured})
		}
		logs := newLogSwitch(stderr, lf)
		log := logs.logger()
		if err := noArgs(args); err != nil {
			return err
		}
		cfg, err := loadToStart(*path, o)
		if err != nil {
			return err
		}
		if cfg, err = withTickets(cfg, nil, time.Now()); err != nil {
			return err
		}
		logs.configure(cfg.Log)
		settings, err := settingsOf(cfg)
		if err != nil {
			return err
		}
		var region atomic.Pointer[shm.Region] // once the supervisor made it
		opts := prefork.Options{
			Listen:      cfg.Server.Listen,
			ExtraListen: extraListen(cfg),
			Workers:     cfg.Server.Workers,
			Region:      cfg.RegionOptions(),
			Settings:    settings,
			Reload:      reloader(*path, o, region.Load, log),
			Prepare: func(r *shm.Region, _ *slog.Logger) error {
				region.Store(r)
				return fitsRegion(r, cfg) // a live region re-attached from a run without the table
			},
			Engine:     engine,
			Logger:     log,
			Configured: logs.configured,
		}
		v, c := buildVersion()
		abs, err := filepath.Abs(*path)
		if err != nil {
			abs = *path
		}
		banner(log, v, c, abs, cfg)
		logWarnings(log, cfg)
		for _, w := range persistWarnings(cfg) { // read at start only
			log.Warn("configuration: " + w)
		}
		// The final dump, out of descriptors, closes the admin endpoint,
		// whose connections may hold the last ones, and tries again.
		var closeAdmin func()
		defer persistHooks(&opts, cfg, v, func() {
			if closeAdmin != nil {
				closeAdmin()
			}
		})()
		adminHooks(&opts, cfg, adminInfo{version: v, commit: c, configPath: abs, closer: &closeAdmin})
		// The supervisor listens for signals once Prepare runs: the ones
		// held since the start go to it first, before a dump is loaded.
		prepare := opts.Prepare
		opts.Prepare = func(r *shm.Region, log *slog.Logger) error {
			releaseSignals()
			return prepare(r, log)
		}
		return tableError(prefork.Run(ctx, opts), cfg)
	}
}

// tableError adds to err, when it is that of a region the machine cannot
// hold, the keys of the file that size the region and their values.
func tableError(err error, cfg config.Config) error {
	if !errors.Is(err, shm.ErrNoRoom) {
		return err
	}
	t := cfg.RegionTable()
	return fmt.Errorf("%w: [table] sizes it (table.counters = %d, table.responses = %d, table.response_bytes = %v)", err, t.Counters, t.Responses, t.ResponseBytes)
}

func setupCheck(fs *flag.FlagSet) func(context.Context, []string, io.Writer, io.Writer) error {
	path := fs.String("config", "", "configuration `FILE` (TOML)")
	return func(_ context.Context, args []string, stdout, stderr io.Writer) error {
		if err := noArgs(args); err != nil {
			return err
		}
		cfg, err := loadToStart(*path, overrides{})
		if err != nil {
			return err
		}
		if why := adminExposure(cfg.Admin.Listen); why != "" {
			fmt.Fprintf(stderr, "preforkd check: warning: admin.listen %q: %s, and /metrics and /status answer without a token: keep it on loopback (127.0.0.1:9901) or a unix: socket\n", cfg.Admin.Listen, why)
		}
		for _, w := range append(cfg.Warnings(), persistWarnings(cfg)...) {
			fmt.Fprintf(stderr, "preforkd check: warning: %s\n", w)
		}
		for _, n := range cfg.Notes() {
			fmt.Fprintf(stderr, "preforkd check: note: %s\n", n)
		}
		fmt.Fprintf(stdout, "%s: ok\n", *path)
		return cfg.WriteEffective(stdout)
	}
}

func setupInspect(*flag.FlagSet) func(context.Context, []string, io.Writer, io.Writer) error {
	return func(_ context.Context, args []string, stdout, stderr io.Writer) error {
		return cmdInspect(args, stdout, stderr)
	}
}

func setupExampleConfig(*flag.FlagSet) func(context.Context, []string, io.Writer, io.Writer) error {
	return func(_ context.Context, args []string, stdout, _ io.Writer) error {
		if err := noArgs(args); err != nil {
			return err
		}
		_, err := io.WriteString(stdout, examples.Config)
		return err
	}
}

func setupVersion(*flag.FlagSet) func(context.Context, []string, io.Writer, io.Writer) error {
	return func(_ context.Context, args []string, stdout, _ io.Writer) error {
		return runVersion(args, stdout)
	}
}

func runVersion(args []string, stdout io.Writer) error {
	if err := noArgs(args); err != nil {
		return err
	}
	v, c := buildVersion()
	fmt.Fprintf(stdout, "preforkd %s (commit %s)\ndump format %d\nregion layout %d\n", v, c, dumpFormatVersion(), regionLayoutVersion())
	return nil
}

// banner is the first line of a run: what runs, from which file, where.
// The upstream's password, if its URL has one, is masked.
func banner(log *slog.Logger, version, commit, path string, cfg config.Config) {
	rules := make([]string, len(cfg.RateLimits))
	for i, r := range cfg.RateLimits {
		rules[i] = r.Name
	}
	blocks := make([]string, len(cfg.Idempotency))
	for i, d := range cfg.Idempotency {
		blocks[i] = d.Path
	}
	log.Info("preforkd starting", "version", version, "commit", commit, "config", path,
		"listen", cfg.Server.Listen, "workers", cfg.Server.WorkerCount(), "upstream", redactedURL(cfg.Server.Upstream),
		"rules", rules, "idempotency", blocks, "admin", cfg.Admin.Listen)
}

// logWarnings logs what the configuration does that an operator most
// likely did not mean (config.Config.Warnings), at start and after each
// reload it is accepted in.
func logWarnings(log *slog.Logger, cfg config.Config) {
	for _, w := range cfg.Warnings() {
		log.Warn("configuration: " + w)
	}
}
