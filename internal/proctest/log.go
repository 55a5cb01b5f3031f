package proctest

import (
	"bufio"
	"io"
	"os"
	"strings"
	"sync"
	"testing"
	"time"
)

// Log is the lines of a stream, or the records a test hands to [Log.Add],
// in order, for a test to wait on. T is what a line becomes: a string, or
// whatever the stream's parser makes of it. Safe for concurrent use.
type Log[T any] struct {
	mu      sync.Mutex
	lines   []T
	changed chan struct{} // closed and replaced at every line and at the end
	ended   bool

	follow sync.Once
	stop   sync.Once
	r      io.Closer     // the followed stream
	done   chan struct{} // closed when the follower has returned
}

// NewLog returns an empty log.
func NewLog[T any]() *Log[T] { return &Log[T]{changed: make(chan struct{})} }

// Add appends a line and wakes whoever waits.
func (l *Log[T]) Add(line T) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, line)
	close(l.changed)
	l.changed = make(chan struct{})
}

// End marks the end of the stream: no line follows, and a wait for one
// returns at once.
func (l *Log[T]) End() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.ended {
		l.ended = true
		close(l.changed)
	}
}

// Ended reports whether the stream has ended.
func (l *Log[T]) Ended() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.ended
}

// Len returns the number of lines so far: the index the next line will
// have, for a later [Log.WaitFor].
func (l *Log[T]) Len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.lines)
}

// Lines returns the lines so far. The slice is the caller's to read; an
// append to it does not reach the log.
func (l *Log[T]) Lines() []T {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lines[:len(l.lines):len(l.lines)]
}

// WaitFor returns the index of the first line at or after index from that
// satisfies match, and the line, waiting up to timeout for it. ok is false
// when the timeout passed or the stream ended without one. match sees each
// line once, in order, so that it may count.
func (l *Log[T]) WaitFor(from int, timeout time.Duration, match func(T) bool) (i int, line T, ok bool) {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		l.mu.Lock()
		lines, changed, ended := l.lines, l.changed, l.ended
		l.mu.Unlock()
		for ; from < len(lines); from++ {
			if match(lines[from]) {
				return from, lines[from], true
			}
		}
		if ended {
			var zero T
			return -1, zero, false
		}
		select {
		case <-changed:
		case <-deadline.C:
			var zero T
			return -1, zero, false
		}
	}
}

// WaitEnd waits up to timeout for the end of the stream and reports
// whether it came: every writer closed it and every line was read.
func (l *Log[T]) WaitEnd(timeout time.Duration) bool {
	l.WaitFor(l.Len(), timeout, func(T) bool { return false })
	return l.Ended()
}

// Follow reads r line by line in a goroutine of the log's own, adding
// parse's result for each line it keeps (ok), until the end of r, then
// ends the log. The goroutine stops at tb's cleanup (see [Log.Stop]). A
// log follows one stream at most; Close of r must unblock a Read in
// progress, as it does for the files of [os.Pipe].
func (l *Log[T]) Follow(tb testing.TB, r io.ReadCloser, parse func(line string) (T, bool)) {
	l.follow.Do(func() {
		l.r, l.done = r, make(chan struct{})
		go l.read(r, parse)
	})
	tb.Cleanup(func() {
		if !l.Stop(5 * time.Second) {
			tb.Errorf("proctest: a log's reader did not stop within 5s")
		}
	})
}

// Pipe returns the write end of a pipe whose read end the log follows
// ([Log.Follow]). Give it to a process as its stdout or stderr, then
// close it: the log ends once every process that inherited it has closed
// it too.
func (l *Log[T]) Pipe(tb testing.TB, parse func(line string) (T, bool)) *os.File {
	tb.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		tb.Fatalf("proctest: %v", err)
	}
	l.Follow(tb, r, parse)
	return w
}

// Stop closes the followed stream and waits up to timeout for the
// follower to return; it reports whether it did. Lines not read by then
// are lost. Stop is idempotent, and a no-op for a log that follows
// nothing.
func (l *Log[T]) Stop(timeout time.Duration) bool {
	if l.done == nil {
		return true
	}
	l.stop.Do(func() { l.r.Close() })
	select {
	case <-l.done:
		return true
	case <-time.After(timeout):
		return false
	}
}

func (l *Log[T]) read(r io.Reader, parse func(string) (T, bool)) {
	defer close(l.done)
	defer l.End()
	br := bufio.NewReader(r)
	for {
		// No limit on a line's length: a reader that stopped at a long
		// line would block every writer of the stream.
		s, err := br.ReadString('\n')
		if s != "" {
			if line, ok := parse(strings.TrimSuffix(s, "\n")); ok {
				l.Add(line)
			}
		}
		if err != nil {
			return
		}
	}
}

// Text is the parser of a log of plain lines.
func Text(line string) (string, bool) { return line, true }
