//go:build unix

package shmtest

import (
	"os"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/preforkd/preforkd/shm"
)

// Attach maps r (not a private region) again from a duplicate of its file
// descriptor, as a worker process does, and joins the new mapping as
// worker w.
func Attach(tb testing.TB, r *shm.Region, w int) *shm.Region {
	tb.Helper()
	fd, err := unix.Dup(int(r.File().Fd()))
	if err != nil {
		tb.Fatal(err)
	}
	f := os.NewFile(uintptr(fd), "region")
	a, err := shm.Attach(f)
	if err != nil {
		f.Close() // a failed Attach leaves f open
	}
	return join(tb, closeAtEnd(tb, a, err), w)
}
