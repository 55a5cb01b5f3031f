package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"strings"

	"github.com/preforkd/preforkd/config"
	"github.com/preforkd/preforkd/prefork"
)

// overrides are the run flags that replace config values, re-applied to
// the file at every reload.
type overrides struct {
	listen   string
	workers  int
	upstream string
}

func (o overrides) apply(cfg config.Config) (config.Config, error) {
	if o.listen != "" {
		cfg.Server.Listen = o.listen
	}
	if o.workers >= 0 {
		cfg.Server.Workers = o.workers
	}
	if o.upstream != "" {
		cfg.Server.Upstream = o.upstream
	}
	return cfg, cfg.Validate()
}

func loadConfig(path string, o overrides) (config.Config, error) {
	cfg, err := config.Load(path)
	if err != nil {
		return cfg, &configError{err}
	}
	cfg, err = o.apply(cfg)
	if err != nil {
		return cfg, &configError{err}
	}
	return cfg, nil
}

func cmdRun(ctx context.Context, args []string, stderr io.Writer) error {
	log := slog.New(slog.NewTextHandler(stderr, nil))
	if prefork.IsWorker() {
		// A worker runs the supervisor's configuration, handed over by it:
		// the file may have changed (even broken) since.
		return prefork.Run(ctx, prefork.Options{Handler: appHandler, Logger: log})
	}
	fs := newFlags("run", stderr)
	path := fs.String("config", "", "configuration file (TOML)")
	var o overrides
	fs.StringVar(&o.listen, "listen", "", "listen address, overrides server.listen")
	fs.IntVar(&o.workers, "workers", -1, "number of workers (0 = CPUs), overrides server.workers")
	fs.StringVar(&o.upstream, "upstream", "", `upstream URL or "builtin:demo", overrides server.upstream`)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *path == "" {
		return &usageError{"run needs -config FILE"}
	}
	// -1 stands for "not given": a negative count given on purpose is a
	// mistake, not a request to use the file's value.
	if o.workers < 0 && flagGiven(fs, "workers") {
		return &usageError{fmt.Sprintf("-workers %d: want 0 (one per CPU) or more", o.workers)}
	}
	cfg, err := loadConfig(*path, o)
	if err != nil {
		return err
	}
	if _, err := upstreamURL(cfg.Server.Upstream); err != nil {
		return &configError{err}
	}
	if err := checkPersist(cfg); err != nil {
		return err
	}
	opts := prefork.Options{
		Config:     cfg,
		LoadConfig: func() (config.Config, error) { return loadConfig(*path, o) },
		Handler:    appHandler,
		Logger:     log,
	}
	persistHooks(&opts, version)
	adminHooks(&opts)
	return prefork.Run(ctx, opts)
}

func cmdCheck(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("check", stderr)
	path := fs.String("config", "", "configuration file (TOML)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *path == "" {
		return &usageError{"check needs -config FILE"}
	}
	cfg, err := loadConfig(*path, overrides{workers: -1})
	if err != nil {
		return err
	}
	if _, err := upstreamURL(cfg.Server.Upstream); err != nil {
		return &configError{err}
	}
	if err := checkPersist(cfg); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%s: ok\n", *path)
	return cfg.WriteEffective(stdout)
}

func cmdVersion(args []string, stdout io.Writer) error {
	if len(args) > 0 {
		return &usageError{fmt.Sprintf("unexpected argument %q", args[0])}
	}
	fmt.Fprintf(stdout, "preforkd %s (commit %s)\ndump format %d\nregion layout %d\n", version, commit, dumpFormatVersion(), regionLayoutVersion())
	return nil
}

// flagGiven reports whether the flag name was set on the command line.
func flagGiven(fs *flag.FlagSet, name string) bool {
	given := false
	fs.Visit(func(f *flag.Flag) { given = given || f.Name == name })
	return given
}

// upstreamURL parses server.upstream: nil for the demo application.
func upstreamURL(s string) (*url.URL, error) {
	if s == "" || s == demoUpstream {
		return nil, nil
	}
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("config: server.upstream %q: want http://host:port or %q", s, demoUpstream)
	}
	u.Path = strings.TrimSuffix(u.Path, "/")
	return u, nil
}
