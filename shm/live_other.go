//go:build !linux

package shm

import "time"

// A live region is a file on tmpfs that the workers of a dead supervisor
// may still map (as /proc shows): elsewhere than Linux there is none.

// CreateFile answers ErrNeedsLinux.
func CreateFile(string, Options) (*Region, error) { return nil, ErrNeedsLinux }

// OpenFile answers ErrNeedsLinux.
func OpenFile(string) (*Region, error) { return nil, ErrNeedsLinux }

// KillOrphans kills nothing: no live region is opened here (OpenFile
// answers ErrNeedsLinux), and without /proc it could not tell which
// processes map a region's file.
func (r *Region) KillOrphans(time.Duration) []int { return nil }
