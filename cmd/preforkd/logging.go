package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/preforkd/preforkd/config"
	"github.com/preforkd/preforkd/prefork"
)

// logFlags are -log-format and -log-level: how the supervisor and its
// workers (which run with the same arguments) write their log. A flag
// given overrides the file's [log].
type logFlags struct {
	format string
	level  string
}

func (lf *logFlags) define(fs *flag.FlagSet) {
	fs.StringVar(&lf.format, "log-format", "", "log `FORMAT`: text (logfmt) or json, one line per event; overrides log.format")
	fs.StringVar(&lf.level, "log-level", "", "least `LEVEL` logged: debug, info, warn or error; overrides log.level")
}

// check refuses a flag value that names no format or level. Flags are
// read in any case (-log-level INFO, -log-format JSON), as slog and
// shells write them; the file's values are exact, as every key's.
func (lf *logFlags) check() error {
	var f config.LogFormat
	var l config.LogLevel
	if lf.format != "" && f.UnmarshalText([]byte(strings.ToLower(lf.format))) != nil {
		return &usageError{"-log-format " + lf.format + ": want text or json"}
	}
	if lf.level != "" && l.UnmarshalText([]byte(strings.ToLower(lf.level))) != nil {
		return &usageError{"-log-level " + lf.level + ": want debug, info, warn or error"}
	}
	return nil
}

// effective is the file's [log] with the flags given applied over it.
func (lf *logFlags) effective(file config.Log) config.Log {
	if lf.format != "" {
		file.Format.UnmarshalText([]byte(strings.ToLower(lf.format)))
	}
	if lf.level != "" {
		file.Level.UnmarshalText([]byte(strings.ToLower(lf.level)))
	}
	return file
}

// logSwitch is the daemon's slog.Handler: it writes to w as the current
// [log] says, and a configuration (at start, at every reload in the
// supervisor, once read in a worker) can change that while loggers made
// from it live on.
type logSwitch struct {
	w       io.Writer
	flags   logFlags
	mu      sync.Mutex
	cur     config.Log
	base    atomic.Pointer[slog.Handler]
	version atomic.Uint64
}

func newLogSwitch(w io.Writer, flags logFlags) *logSwitch {
	s := &logSwitch{w: w, flags: flags}
	s.configure(config.Log{})
	return s
}

// configure applies the file's [log] (and the flags over it).
func (s *logSwitch) configure(file config.Log) {
	eff := s.flags.effective(file)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.base.Load() != nil && eff == s.cur {
		return
	}
	h := newHandler(s.w, eff)
	s.cur = eff
	s.base.Store(&h)
	s.version.Add(1)
}

// newHandler writes lines to w as eff says.
func newHandler(w io.Writer, eff config.Log) slog.Handler {
	opts := &slog.HandlerOptions{Level: eff.Level.Slog()}
	if eff.Format == config.LogJSON {
		opts.ReplaceAttr = durationSeconds
		return slog.NewJSONHandler(w, opts)
	}
	return slog.NewTextHandler(w, opts)
}

// direct writes one line to w as the switch's loggers would now, but not
// through the switch's own writer.
func (s *logSwitch) direct(w io.Writer, level slog.Level, msg string, args ...any) {
	s.mu.Lock()
	eff := s.cur
	s.mu.Unlock()
	slog.New(newHandler(w, eff)).Log(context.Background(), level, msg, args...)
}

// durationSeconds writes a time.Duration as a number of seconds
// ("timeout":30, "downtime":6.039320691) in the JSON format, whose
// default is integer nanoseconds: what a log pipeline can compare and
// sum without knowing the field. The text format keeps Go's "30s".
func durationSeconds(_ []string, a slog.Attr) slog.Attr {
	if a.Value.Kind() == slog.KindDuration {
		a.Value = slog.Float64Value(a.Value.Duration().Seconds())
	}
	return a
}

// logger is a logger over the switch.
// configured is prefork.Options.Configured: the [log] table of the
// configuration a process runs.
func (s *logSwitch) configured(st prefork.Settings) {
	if cfg, err := configOf(st); err == nil {
		s.configure(cfg.Log)
	}
}

func (s *logSwitch) logger() *slog.Logger { return slog.New(&switchHandler{sw: s}) }

// switchHandler is a handler of the switch with the attributes and
// groups its logger was given, replayed over the current handler.
type switchHandler struct {
	sw    *logSwitch
	chain []func(slog.Handler) slog.Handler
	cache atomic.Pointer[derived]
}

type derived struct {
	version uint64
	h       slog.Handler
}

func (h *switchHandler) current() slog.Handler {
	v := h.sw.version.Load()
	if d := h.cache.Load(); d != nil && d.version == v {
		return d.h
	}
	cur := *h.sw.base.Load()
	for _, f := range h.chain {
		cur = f(cur)
	}
	h.cache.Store(&derived{v, cur})
	return cur
}

func (h *switchHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return h.current().Enabled(ctx, l)
}

func (h *switchHandler) Handle(ctx context.Context, r slog.Record) error {
	return h.current().Handle(ctx, r)
}

func (h *switchHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return h.with(func(x slog.Handler) slog.Handler { return x.WithAttrs(attrs) })
}

func (h *switchHandler) WithGroup(name string) slog.Handler {
	return h.with(func(x slog.Handler) slog.Handler { return x.WithGroup(name) })
}

func (h *switchHandler) with(f func(slog.Handler) slog.Handler) slog.Handler {
	chain := append(append([]func(slog.Handler) slog.Handler(nil), h.chain...), f)
	return &switchHandler{sw: h.sw, chain: chain}
}

// lineQueue writes each line written to it to w from a goroutine of its
// own while it runs (Start to Close): a worker's event loop never waits
// on its stderr (a pipe to the supervisor, which may be slow to read it).
// A line that finds the queue full is dropped, and counted in the next
// line written, by notice. Before Start and after Close, lines are
// written at once: what a worker says before it serves and after it
// drained is never lost to an exit.
type lineQueue struct {
	w io.Writer
	// notice says that n lines were dropped, in the log's format; the
	// queue's goroutine calls it, and it writes to w itself.
	notice  func(n uint64)
	mu      sync.RWMutex
	running bool
	lines   chan []byte
	done    chan struct{}
	dropped atomic.Uint64
}

// workerLogs is a worker's logging: a switch over a queue to w, whose
// notices of dropped lines are in the switch's format. A notice is
// written by the queue's goroutine straight to w, not queued: queued, it
// could be dropped in turn, and the count it carries lost.
func workerLogs(w io.Writer, lf logFlags) (*lineQueue, *logSwitch, *slog.Logger) {
	q := newLineQueue(w)
	logs := newLogSwitch(q, lf)
	q.notice = func(n uint64) {
		logs.direct(w, slog.LevelWarn, "log lines dropped: the log was not read fast enough", "lines", n)
	}
	return q, logs, logs.logger()
}

// lineQueueSize is how many lines wait at most.
const lineQueueSize = 256

func newLineQueue(w io.Writer) *lineQueue {
	q := &lineQueue{w: w}
	q.notice = func(n uint64) {
		fmt.Fprintf(q.w, "preforkd: %d log lines dropped: the log was not read fast enough\n", n)
	}
	return q
}

// Start begins writing from the queue's goroutine.
func (q *lineQueue) Start() {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.running || q.done != nil {
		return
	}
	q.running = true
	q.lines, q.done = make(chan []byte, lineQueueSize), make(chan struct{})
	go q.run(q.lines, q.done)
}

func (q *lineQueue) Write(p []byte) (int, error) {
	q.mu.RLock()
	defer q.mu.RUnlock()
	if !q.running {
		return q.w.Write(p)
	}
	select {
	case q.lines <- append([]byte(nil), p...):
	default:
		q.dropped.Add(1)
	}
	return len(p), nil
}

func (q *lineQueue) run(lines <-chan []byte, done chan<- struct{}) {
	defer close(done)
	for line := range lines {
		_, _ = q.w.Write(line)
		if n := q.dropped.Swap(0); n > 0 {
			q.notice(n)
		}
	}
}

// Close writes what is queued, and the lines after it at once; it may be
// called more than once.
func (q *lineQueue) Close() error {
	q.mu.Lock()
	running := q.running
	if running {
		q.running = false
		close(q.lines)
	}
	q.mu.Unlock()
	if running {
		<-q.done
	}
	return nil
}
