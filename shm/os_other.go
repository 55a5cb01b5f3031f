//go:build !linux

package shm

import (
	"os"
	"time"
)

// Elsewhere than Linux, making a shared region answers ErrNeedsLinux; a
// private region (CreatePrivate) works, its waiters polling.

func memfd(string) (*os.File, error) { return nil, ErrNeedsLinux }

func seal(*os.File) error { return ErrNeedsLinux }

func allocate(*os.File, uint64) error { return ErrNeedsLinux }

func adviseHuge([]byte) {}

// futexWait sleeps a little: a private region's waiters poll.
func futexWait(_ *uint32, _ uint32, d time.Duration) { time.Sleep(min(d, time.Millisecond)) }

func futexWake(*uint32) {}
