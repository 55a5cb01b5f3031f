package main

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/preforkd/preforkd/config"
	"github.com/preforkd/preforkd/persist"
	"github.com/preforkd/preforkd/prefork"
	"github.com/preforkd/preforkd/shm"
)

func dumpFormatVersion() int   { return persist.FormatVersion }
func regionLayoutVersion() int { return shm.LayoutVersion }

// checkPersist refuses a configuration whose dump or live region could
// not be written (exit 2), at start and in check, rather than losing the
// state at shutdown.
func checkPersist(cfg config.Config) error {
	o := persistOptions(cfg, "")
	path, live := o, o
	path.Live, live.Path = "", ""
	if err := persist.CheckDirs(path); err != nil {
		return &keyError{"persist.path", err}
	}
	if err := persist.CheckDirs(live); err != nil {
		return &keyError{"persist.live", err}
	}
	if key, err := persist.CheckNames(o); err != nil {
		return &keyError{key, err}
	}
	return nil
}

// persistWarnings says, for check and the start, which of persist.path
// and persist.live is in a directory every user can write (/dev/shm,
// /tmp): any of them can take a name there first (the file, its lock)
// and keep the service from starting, or its state from being kept.
func persistWarnings(cfg config.Config) []string {
	var out []string
	for _, f := range []struct{ key, path string }{{"persist.path", cfg.Persist.Path}, {"persist.live", cfg.Persist.Live}} {
		if f.path == "" {
			continue
		}
		dir := filepath.Dir(f.path)
		if fi, err := os.Stat(dir); err == nil && fi.Mode().Perm()&0o002 != 0 {
			out = append(out, fmt.Sprintf("%s %q: its directory %s is writable by every user (mode %#o): any of them can take the file's name or its lock's first and keep the service from starting; use a directory of the service's own (install -d -m 0700 -o USER %s)",
				f.key, f.path, dir, fi.Mode().Perm(), filepath.Join(dir, "preforkd")))
		}
	}
	return out
}

// persistHooks wires [persist] into the supervisor: the region is made
// with persist.path and persist.live locked (the live region, if any,
// replaces the memfd), a dump is loaded before the first worker starts and
// written after the last one has exited, and with persist.interval also
// while the workers serve: once at start (the dump just loaded was
// consumed), then every interval, with the configuration then in force.
// stop ends the periodic dumps if Finish did not run (Run failed after
// Prepare); the caller defers it.
// makeRoom, called when the final dump finds the supervisor out of
// descriptors, gives some back; the dump is then tried again.
func persistHooks(opts *prefork.Options, cfg config.Config, build string, makeRoom func()) (stop func()) {
	stop = func() {}
	if cfg.Persist.Path == "" && cfg.Persist.Live == "" {
		return stop
	}
	var lock *persist.Lock
	var dumper *persist.Dumper
	stop = func() {
		if dumper != nil {
			dumper.Stop()
		}
	}
	reattached := false
	// adopted: the locks were handed over by the old supervisor of a
	// binary upgrade; claimed: this one's pid is written in them.
	adopted, claimed := false, false
	// The options of the configuration in force, for the periodic dumps:
	// a reload changes the rules and the key; the files are the starting
	// ones.
	var running atomic.Pointer[persist.Options]
	current := func(s prefork.Settings) {
		if last, err := configOf(s); err == nil {
			last.Persist.Path, last.Persist.Live = cfg.Persist.Path, cfg.Persist.Live
			o := persistOptions(last, build)
			running.Store(&o)
		}
	}
	configured := opts.Configured
	opts.Configured = func(s prefork.Settings) {
		if configured != nil {
			configured(s)
		}
		current(s)
	}
	// A binary upgrade (USR2) hands the locks to the new supervisor,
	// which takes the old one's region as it is: nothing is loaded.
	addHandover(opts, func(files map[string]*os.File) error {
		fs, err := lock.Files()
		for i, f := range fs {
			files[fmt.Sprintf("persist.lock.%d", i)] = f
		}
		return err
	})
	addAdopt(opts, func(files map[string]*os.File) error {
		var fs []*os.File
		for i := 0; ; i++ {
			f := files[fmt.Sprintf("persist.lock.%d", i)]
			if f == nil {
				break
			}
			fs = append(fs, f)
		}
		lock, reattached, adopted = persist.AdoptLock(fs), true, true
		// The region goes on as it is, persisted where it was: files the
		// old supervisor did not lock would be written unguarded (a
		// second supervisor could take them), as a reload keeps them.
		for _, f := range []struct{ key, path string }{{"persist.path", cfg.Persist.Path}, {"persist.live", cfg.Persist.Live}} {
			if f.path != "" && !lock.Holds(f.path) {
				return fmt.Errorf("%s %q is not a file the running supervisor persists to: a binary upgrade keeps the running files (set it back, or restart to change it)", f.key, f.path)
			}
		}
		return nil
	})
	// The adopted locks name the old supervisor, which holds them too,
	// until this one serves: an upgrade that fails before then leaves
	// them naming the one that serves on.
	// So do its periodic dumps, which would race the old one's to the
	// same file until then (and leave a failed upgrade's last dump the
	// new build's, with its configuration).
	var startDumps func()
	onStatus := opts.OnStatus
	opts.OnStatus = func(st prefork.Status) {
		if adopted && !claimed && st.Serving {
			claimed = true
			lock.Claim()
			if startDumps != nil {
				startDumps()
			}
		}
		if onStatus != nil {
			onStatus(st)
		}
	}
	// Once the new supervisor serves, its periodic dumps are the ones:
	// the old one's stop (its workers drain without Finish).
	handedOver := opts.HandedOver
	opts.HandedOver = func() {
		stop()
		if handedOver != nil {
			handedOver()
		}
	}
	// OpenRegion also locks persist.path, so it makes the region even
	// without a live one.
	opts.NewRegion = func(o shm.Options) (*shm.Region, error) {
		r, l, re, err := persist.OpenRegion(persistOptions(cfg, build), o, opts.Logger)
		lock, reattached = l, re
		return r, err
	}
	prepare, finish := opts.Prepare, opts.Finish
	opts.Prepare = func(r *shm.Region, log *slog.Logger) error {
		if cfg.Persist.Path != "" && !reattached {
			if rep, err := persist.Load(r, persistOptions(cfg, build), log); err != nil && rep.Loaded {
				// Served from, but left at its path: a start after a crash
				// would load it again.
				log.Error("dump loaded but not set aside", "path", cfg.Persist.Path, "err", err)
			} else if err != nil {
				log.Error("dump not loaded", "path", cfg.Persist.Path, "err", err)
			}
		}
		if prepare != nil {
			if err := prepare(r, log); err != nil {
				return err
			}
		}
		if every := cfg.Persist.Interval; every > 0 && cfg.Persist.Path != "" {
			o := persistOptions(cfg, build)
			if running.Load() == nil {
				running.Store(&o)
			}
			startDumps = func() {
				dumper = persist.StartDumper(r, every, func() persist.Options { return *running.Load() }, log)
			}
			if adopted {
				// The old supervisor dumps until it hands over; the
				// region goes on, nothing was loaded.
				log.Info("periodic dumps every interval once this supervisor serves", "interval", every, "path", o.Path)
				return nil
			}
			// The dump just loaded was consumed: until the first interval
			// ends, a crash must find what it held.
			if st, err := persist.Dump(r, o); err != nil {
				log.Warn("persist: first periodic dump failed", "path", o.Path, "err", err)
			} else {
				st.LogRoomMade(log, o.Path)
				log.Info("periodic dumps every interval", "interval", every, "path", o.Path, "counters", st.Entries, "bytes", st.Bytes)
			}
			startDumps()
		}
		return nil
	}
	opts.Finish = func(r *shm.Region, s prefork.Settings, log *slog.Logger) error {
		stop() // the last periodic dump is done before the final one
		var err error
		if finish != nil {
			err = finish(r, s, log)
		}
		// The last configuration that ran: its rules guard the dump, its
		// persist.key stamps it (the files are the starting ones).
		if last, cerr := configOf(s); cerr == nil {
			last.Persist.Path, last.Persist.Live = cfg.Persist.Path, cfg.Persist.Live
			cfg = last
		}
		if cfg.Persist.Path != "" {
			if st, derr := finalDump(r, persistOptions(cfg, build), makeRoom, log); derr != nil {
				err = errors.Join(err, derr)
			} else {
				st.LogRoomMade(log, cfg.Persist.Path)
				log.Info("dump written", "path", cfg.Persist.Path, "counters", st.Entries, "responses", st.Responses, "cached", st.Cached, "tag_generations", st.TagGens, "bytes", st.Bytes)
			}
		}
		if lock != nil {
			lock.Unlock()
		}
		return err
	}
	return stop
}

// finalDump is the dump at the stop, which no later one replaces: out of
// descriptors (the admin endpoint's clients can take the last ones, and
// those the workers gave back), it calls makeRoom and tries again while
// the descriptors come back (a closed connection's may be released a
// moment later), for up to a second.
func finalDump(r *shm.Region, o persist.Options, makeRoom func(), log *slog.Logger) (persist.DumpStats, error) {
	st, err := persist.Dump(r, o)
	if !errors.Is(err, syscall.EMFILE) && !errors.Is(err, syscall.ENFILE) {
		return st, err
	}
	log.Warn("persist: out of descriptors for the dump; closing the admin endpoint and trying again", "err", err)
	makeRoom()
	for range 20 {
		time.Sleep(50 * time.Millisecond)
		st, err = persist.Dump(r, o)
		if !errors.Is(err, syscall.EMFILE) && !errors.Is(err, syscall.ENFILE) {
			break
		}
	}
	return st, err
}

func persistOptions(cfg config.Config, build string) persist.Options {
	o := persist.Options{Path: cfg.Persist.Path, Key: cfg.Persist.AppKey(), Live: cfg.Persist.Live, Build: build}
	// Every limit whose state the core keeps, overrides included, so that
	// each is guarded by its own definition. The configuration validated,
	// so it translates.
	if co, err := cfg.CoreOptions(); err == nil {
		o.Rules = co.StateRules()
	}
	return o
}

func cmdInspect(args []string, stdout, stderr io.Writer) error {
	if len(args) != 1 {
		return &usageError{"inspect needs exactly one FILE"}
	}
	return persist.Inspect(args[0], stdout)
}

// addHandover makes opts.Handover give, after the files of the one set
// before it, those add puts in the map. When either fails, every file
// given so far is closed.
func addHandover(opts *prefork.Options, add func(files map[string]*os.File) error) {
	prev := opts.Handover
	opts.Handover = func() (map[string]*os.File, error) {
		files := map[string]*os.File{}
		if prev != nil {
			fs, err := prev()
			if err != nil {
				closeFiles(fs)
				return nil, err
			}
			if fs != nil {
				files = fs
			}
		}
		if err := add(files); err != nil {
			closeFiles(files)
			return nil, err
		}
		return files, nil
	}
}

// addAdopt makes opts.Adopt have take take its files over, then the one
// set before it.
func addAdopt(opts *prefork.Options, take func(files map[string]*os.File) error) {
	prev := opts.Adopt
	opts.Adopt = func(files map[string]*os.File) error {
		if err := take(files); err != nil || prev == nil {
			return err
		}
		return prev(files)
	}
}

func closeFiles(files map[string]*os.File) {
	for _, f := range files {
		f.Close()
	}
}
