// Package shmtest makes shared-memory regions for tests: each is closed when
// the test that made it ends.
package shmtest

import (
	"testing"

	"github.com/preforkd/preforkd/shm"
)

// Create makes a region in memory that other processes can map
// (shm.Create), not joined: the supervisor's view.
func Create(tb testing.TB, o shm.Options) *shm.Region {
	tb.Helper()
	r, err := shm.Create(o)
	return closeAtEnd(tb, r, err)
}

// Joined is [Create] joined as worker 0.
func Joined(tb testing.TB, o shm.Options) *shm.Region {
	tb.Helper()
	return join(tb, Create(tb, o), 0)
}

// Private makes a region in this process's heap (shm.CreatePrivate),
// joined as worker 0.
func Private(tb testing.TB, o shm.Options) *shm.Region {
	tb.Helper()
	r, err := shm.CreatePrivate(o)
	return join(tb, closeAtEnd(tb, r, err), 0)
}

// closeAtEnd fails the test with err, if any, or closes r when the test
// ends.
func closeAtEnd(tb testing.TB, r *shm.Region, err error) *shm.Region {
	tb.Helper()
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { r.Close() })
	return r
}

// join joins r as worker w, failing the test if it cannot.
func join(tb testing.TB, r *shm.Region, w int) *shm.Region {
	tb.Helper()
	if err := r.Join(w); err != nil {
		tb.Fatal(err)
	}
	return r
}
