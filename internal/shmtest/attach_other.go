//go:build !unix

package shmtest

import (
	"testing"

	"github.com/preforkd/preforkd/shm"
)

// Attach fails the test: a region another process maps needs Linux
// (shm.ErrNeedsLinux), and so does mapping it again.
func Attach(tb testing.TB, _ *shm.Region, _ int) *shm.Region {
	tb.Helper()
	tb.Fatalf("shmtest: Attach: %v", shm.ErrNeedsLinux)
	return nil
}
