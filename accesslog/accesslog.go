package accesslog

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/preforkd/preforkd/core"
)

// Stderr is the Path that writes the log to standard error.
const Stderr = "stderr"

// Options configures a Log. Zero values are the documented defaults.
type Options struct {
	// Path is the file the lines are appended to (created with mode
	// 0640 when missing; its directory must exist), or Stderr.
	Path string
	// Format is Combined (the zero value) or JSON.
	Format Format
	// FlushEvery is the longest a line waits in memory. 0 means 1s.
	FlushEvery time.Duration
	// MaxPending bounds the bytes waiting to be written; a line that
	// does not fit is dropped and counted. 0 means 4 MiB.
	MaxPending int
	// Logger receives a line when writing fails or lines were dropped,
	// at most once per FlushEvery. nil means slog.Default().
	Logger *slog.Logger
	// Stderr is where Path Stderr writes. nil means os.Stderr.
	Stderr io.Writer
}

// Defaults of Options.
const (
	DefaultFlushEvery = time.Second
	DefaultMaxPending = 4 << 20
	// flushAt is how many pending bytes wake the writer before its tick.
	flushAt = 64 << 10
	// keepBuffer is the largest buffer kept for the next lines.
	keepBuffer = 1 << 20
	// pipeBuf is the largest write a pipe takes whole (PIPE_BUF).
	pipeBuf = 4096
)

// Log is an access log: a core.AccessLog whose lines are written by a
// goroutine of its own (see the package documentation).
type Log struct {
	o   Options
	log *slog.Logger

	mu      sync.Mutex
	pending []byte // lines not yet handed to the writer
	kicked  bool   // the writer was woken for pending
	closed  bool
	next    *os.File // Reopen's file, for the writer to switch to
	cut     int      // the bytes of pending that go to the file before next

	fileMu sync.Mutex // the file and the writes to it
	file   *os.File   // nil for Stderr
	out    io.Writer
	spare  []byte // the writer's buffer, swapped with pending
	torn   bool   // a write to file stopped within a line (a full disk)
	pipe   bool   // file is no regular file (a FIFO): written as Stderr is

	dropped atomic.Uint64
	failed  atomic.Uint64 // writes that failed, since New

	scratch sync.Pool // *[]byte: a line being formatted
	stamp   atomic.Pointer[stamp]

	kick      chan struct{}
	stop      chan struct{}
	done      chan struct{}
	closeOnce sync.Once
}

// New opens the log at o.Path and starts its writer.
func New(o Options) (*Log, error) {
	if o.Path == "" {
		return nil, errors.New("accesslog: Options.Path is empty (a file, or \"stderr\")")
	}
	if o.Format > JSON {
		return nil, fmt.Errorf("accesslog: unknown format %d", o.Format)
	}
	if o.FlushEvery < 0 || o.MaxPending < 0 {
		return nil, errors.New("accesslog: FlushEvery and MaxPending must not be negative")
	}
	if o.FlushEvery == 0 {
		o.FlushEvery = DefaultFlushEvery
	}
	if o.MaxPending == 0 {
		o.MaxPending = DefaultMaxPending
	}
	if o.Stderr == nil {
		o.Stderr = os.Stderr
	}
	l := &Log{o: o, log: o.Logger, kick: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	if l.log == nil {
		l.log = slog.Default()
	}
	l.scratch.New = func() any { b := make([]byte, 0, 512); return &b }
	// Room for what comes between two wake-ups of the writer: a line is
	// appended, never a buffer grown on the request path.
	l.pending, l.spare = make([]byte, 0, 2*flushAt), make([]byte, 0, 2*flushAt)
	if err := l.open(); err != nil {
		return nil, err
	}
	go l.write()
	return l, nil
}

// Check reports whether the access log at path could be opened for
// appending (Stderr always can), for a configuration check before any
// worker starts. It creates nothing that stays: a file that does not exist
// yet is judged by creating and removing another in its directory, so
// that a check run as root leaves no root-owned log behind that the
// service's own user could not open.
func Check(path string) error {
	if path == Stderr {
		return nil
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|syscall.O_NONBLOCK, 0)
	if errors.Is(err, fs.ErrNotExist) {
		f, err = os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".check-*")
		if err == nil {
			defer os.Remove(f.Name())
		}
	}
	if err != nil {
		return openError(path, err)
	}
	return f.Close()
}

// openFile opens path for appending, creating it. O_NONBLOCK: a FIFO
// that nothing reads fails at once (ENXIO) rather than blocking the
// opener (a supervisor's reload, a worker's start) until a reader comes;
// a FIFO that is read is written through Go's poller all the same.
func openFile(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE|syscall.O_NONBLOCK, 0o640)
	if err != nil {
		return nil, openError(path, err)
	}
	return f, nil
}

// openError says why path could not be opened.
func openError(path string, err error) error {
	if errors.Is(err, syscall.ENXIO) {
		return fmt.Errorf("accesslog: %s is a FIFO that nothing reads: start its reader first", path)
	}
	return fmt.Errorf("accesslog: %w", err)
}

// open opens the file at its path, replacing the one open.
func (l *Log) open() error {
	if l.o.Path == Stderr {
		l.out = l.o.Stderr
		return nil
	}
	f, err := openFile(l.o.Path)
	if err != nil {
		return err
	}
	l.fileMu.Lock()
	l.switchTo(f)
	l.fileMu.Unlock()
	return nil
}

// switchTo makes f the file written, closing the one before. Requires
// fileMu.
func (l *Log) switchTo(f *os.File) {
	old := l.file
	if l.torn { // the torn line stays in the file it is in
		l.torn = sameFile(old, f)
	}
	l.file, l.out = f, f
	l.pipe = !isRegular(f)
	if old != nil && old.Close() != nil {
		l.failed.Add(1) // a close reports a write that failed late (NFS)
	}
}

// Reopen opens the file again at its path: after a rotation renamed it,
// the lines logged from now on go to a new file at the path, those before
// to the file open until now. The writer switches files once it has
// written those: Reopen never waits on a write (a disk or a FIFO's reader
// that stalls). An error (the directory is gone) keeps the open file.
func (l *Log) Reopen() error {
	if l.o.Path == Stderr {
		return nil
	}
	f, err := openFile(l.o.Path)
	if err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return f.Close()
	}
	if l.next != nil {
		l.next.Close() // one the writer has not switched to: this is newer
	} else {
		l.cut = len(l.pending)
	}
	l.next = f
	l.wake()
	return nil
}

// wake has the writer write what is pending now. Requires mu.
func (l *Log) wake() {
	if !l.kicked {
		l.kicked = true
		select {
		case l.kick <- struct{}{}:
		default:
		}
	}
}

// Log formats e and queues its line; it never waits on the file.
func (l *Log) Log(e *core.AccessEntry) {
	bp := l.scratch.Get().(*[]byte)
	line := (*bp)[:0]
	if l.o.Format == JSON {
		line = appendJSON(line, e)
	} else {
		line = l.appendCombined(line, e)
	}
	l.mu.Lock()
	switch {
	case l.closed:
	case len(l.pending)+len(line) > l.o.MaxPending:
		l.dropped.Add(1)
	default:
		l.pending = append(l.pending, line...)
		if len(l.pending) >= flushAt {
			l.wake()
		}
	}
	l.mu.Unlock()
	*bp = line
	l.scratch.Put(bp)
}

// Dropped is how many lines were dropped because MaxPending bytes were
// waiting.
func (l *Log) Dropped() uint64 { return l.dropped.Load() }

// write is the writer's goroutine: every FlushEvery, when woken, and a
// last time at Close.
func (l *Log) write() {
	defer close(l.done)
	tick := time.NewTicker(l.o.FlushEvery)
	defer tick.Stop()
	var reported struct{ dropped, failed uint64 }
	for {
		select {
		case <-l.stop:
			l.flush()
			return
		case <-tick.C:
		case <-l.kick:
		}
		l.flush()
		if d, f := l.dropped.Load(), l.failed.Load(); d != reported.dropped || f != reported.failed {
			l.log.Warn("access log behind: lines dropped or not written", "path", l.o.Path,
				"dropped", d-reported.dropped, "failed_writes", f-reported.failed)
			reported.dropped, reported.failed = d, f
		}
	}
}

// flush writes what is pending.
func (l *Log) flush() {
	l.fileMu.Lock()
	defer l.fileMu.Unlock()
	l.mu.Lock()
	buf := l.pending
	next, cut := l.next, l.cut
	l.pending, l.spare, l.next = l.spare[:0], nil, nil
	l.kicked = false
	l.mu.Unlock()
	rest := buf
	if next != nil {
		l.put(buf[:cut])
		l.switchTo(next)
		rest = buf[cut:]
	}
	l.put(rest)
	l.spare = buf[:0]
	if cap(l.spare) > keepBuffer {
		l.spare = make([]byte, 0, 2*flushAt) // a burst's buffer is not kept
	}
}

// put writes lines, counting a failure. Requires fileMu.
func (l *Log) put(lines []byte) {
	if len(lines) > 0 && l.writeLines(lines) != nil {
		l.failed.Add(1)
	}
}

// writeLines writes buf, whole lines: a file in one append, standard
// error and a FIFO in pieces a pipe writes whole (a pipe takes a write
// whole only up to PIPE_BUF: a longer one may be split around another
// worker's). Requires fileMu.
//
// A write to the file that stops within a line (the disk filled) leaves
// part of it at the file's end: the next write ends that line first, so
// that the lines after it are lines of their own, not its end.
func (l *Log) writeLines(buf []byte) error {
	if l.file != nil && !l.pipe {
		if l.torn {
			buf = append([]byte{'\n'}, buf...) // rare: a copy
		}
		n, err := l.file.Write(buf)
		if n > 0 {
			l.torn = buf[n-1] != '\n'
		}
		return err
	}
	for len(buf) > 0 {
		n := len(buf)
		if n > pipeBuf {
			n = bytes.LastIndexByte(buf[:pipeBuf], '\n') + 1
			if n == 0 { // a line longer than a pipe's atomic write
				n = bytes.IndexByte(buf, '\n') + 1
				if n == 0 {
					n = len(buf)
				}
			}
		}
		if _, err := l.out.Write(buf[:n]); err != nil {
			return err
		}
		buf = buf[n:]
	}
	return nil
}

// isRegular reports whether f is a regular file; false when it cannot be
// told (pieces are whole lines in a file too).
func isRegular(f *os.File) bool {
	fi, err := f.Stat()
	return err == nil && fi.Mode().IsRegular()
}

// sameFile reports whether a and b are one file; false when either
// cannot be told.
func sameFile(a, b *os.File) bool {
	if a == nil {
		return false
	}
	ai, err := a.Stat()
	if err != nil {
		return false
	}
	bi, err := b.Stat()
	return err == nil && os.SameFile(ai, bi)
}

// Close writes what is pending, stops the writer and closes the file.
// Lines logged after it are dropped. It is idempotent.
func (l *Log) Close() error {
	var err error
	l.closeOnce.Do(func() {
		close(l.stop)
		<-l.done
		l.mu.Lock()
		l.closed = true
		l.mu.Unlock()
		l.flush() // what came between the last flush and closed
		l.fileMu.Lock()
		if l.file != nil {
			err = l.file.Close()
			l.file = nil
		}
		l.fileMu.Unlock()
	})
	return err
}

var _ core.AccessLog = (*Log)(nil)
