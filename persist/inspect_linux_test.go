//go:build linux

package persist

import (
	"io"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/preforkd/preforkd/shm"
)

// Inspect of a live region whose lock file is a FIFO (a name another
// user took first, in a directory others can write) says what it can
// and returns, rather than waiting for a writer that never comes.
func TestInspectLockFIFO(t *testing.T) {
	o := liveOptions(t)
	r, lock, _, err := OpenRegion(Options{Live: o.Live}, shm.Options{Counters: 64, MaxWorkers: 8}, quiet)
	if err != nil {
		t.Fatal(err)
	}
	r.Close()
	lock.Unlock()
	os.Remove(o.Live + ".lock")
	if err := syscall.Mkfifo(o.Live+".lock", 0o600); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- Inspect(o.Live, io.Discard) }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("inspect: %v", err)
		}
	case <-time.After(5 * time.Second):
		// Unblock the reader, which would otherwise outlive the test.
		if f, err := os.OpenFile(o.Live+".lock", os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
			f.Close()
		}
		t.Fatal("inspect still waits on the lock file, a FIFO, after 5s")
	}
}
