//go:build unix

package accesslog_test

import (
	"bufio"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/preforkd/preforkd/accesslog"
)

// A FIFO as the access log (a log shipper's): one that nothing reads is
// refused at once, saying so, by Check and New alike; neither blocks its
// caller (a supervisor's reload, a worker's start) until a reader comes.
// One that is read gets the lines.
func TestFIFO(t *testing.T) {
	path := newFIFO(t)
	done := make(chan error, 2)
	go func() {
		done <- accesslog.Check(path)
		_, err := accesslog.New(accesslog.Options{Path: path})
		done <- err
	}()
	for range 2 {
		select {
		case err := <-done:
			if err == nil || !strings.Contains(err.Error(), "a FIFO that nothing reads") {
				t.Errorf("a FIFO nothing reads: %v", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("opening a FIFO that nothing reads blocked")
		}
	}
	r := readFIFO(t, path)
	if err := accesslog.Check(path); err != nil {
		t.Fatalf("a FIFO that is read: %v", err)
	}
	l, err := accesslog.New(accesslog.Options{Path: path, FlushEvery: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	l.Log(entry())
	l.Close()
	r.SetReadDeadline(time.Now().Add(5 * time.Second))
	line, err := bufio.NewReader(r).ReadString('\n')
	if err != nil || !strings.Contains(line, `"GET /a?b=1 HTTP/1.1" 200`) {
		t.Errorf("read from the FIFO: %q, %v", line, err)
	}
}

// A rotation while the log's reader stalls (a shipper that stopped
// reading its FIFO, a disk that hangs): Reopen, which a worker runs on
// USR1 between its other duties (a TERM to act on), returns at once
// rather than wait behind the stalled write. Once the reader reads again,
// every line arrives.
func TestReopenDoesNotWaitOnAStalledWrite(t *testing.T) {
	path := newFIFO(t)
	r := readFIFO(t, path)
	l, err := accesslog.New(accesslog.Options{Path: path, FlushEvery: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	const lines = 2000 // far over a pipe's 64 KiB: the writer waits for room
	for range lines {
		l.Log(entry())
	}
	reopened := make(chan error, 1)
	go func() { reopened <- l.Reopen() }()
	select {
	case err := <-reopened:
		if err != nil {
			t.Error(err)
		}
	case <-time.After(2 * time.Second):
		t.Error("Reopen waited for the stalled write")
	}
	l.Log(entry())
	read := make(chan int, 1)
	go func() {
		r.SetReadDeadline(time.Now().Add(10 * time.Second))
		b, _ := io.ReadAll(r) // to the end: every writer closed
		read <- strings.Count(string(b), "\n")
	}()
	l.Close()
	if n := <-read; n != lines+1 {
		t.Errorf("%d lines read, want %d", n, lines+1)
	}
}

// newFIFO makes a FIFO in a directory of t's own and returns its path.
func newFIFO(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "access.fifo")
	if err := syscall.Mkfifo(path, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// readFIFO opens the FIFO at path for reading, without waiting for a
// writer; it is closed when t ends.
func readFIFO(t *testing.T, path string) *os.File {
	t.Helper()
	r, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}
