//go:build !linux

package shm

import (
	"errors"
	"os"
	"time"
)

// ErrNeedsLinux is what making a shared region answers on a system other
// than Linux: it needs memfd and futexes. A private region
// (CreatePrivate) works anywhere.
var ErrNeedsLinux = errors.New("shm: a shared region needs Linux (memfd, futex)")

func memfd(string) (*os.File, error) { return nil, ErrNeedsLinux }

func seal(*os.File) error { return ErrNeedsLinux }

// futexWait sleeps a little: a private region's waiters poll.
func allocate(*os.File, uint64) error { return ErrNeedsLinux }

func adviseHuge([]byte) {}

func futexWait(_ *uint32, _ uint32, d time.Duration) { time.Sleep(min(d, time.Millisecond)) }

func futexWake(*uint32) {}
