//go:build !linux

package persist

import (
	"fmt"
	"log/slog"
	"os"

	"github.com/preforkd/preforkd/shm"
)

// Elsewhere than Linux, persist builds for development: a dump can be
// written, inspected and judged, but no supervisor's region is made or
// locked here.

// OpenRegion answers an error that wraps shm.ErrNeedsLinux: the region of
// a supervisor (a memfd, or a live region on tmpfs) and the locks of its
// files need Linux.
func OpenRegion(Options, shm.Options, *slog.Logger) (*shm.Region, *Lock, bool, error) {
	return nil, nil, false, fmt.Errorf("persist: opening a supervisor's region: %w", shm.ErrNeedsLinux)
}

// Files answers an error that wraps shm.ErrNeedsLinux for a lock that
// holds files (none can be taken here: OpenRegion needs Linux).
func (l *Lock) Files() ([]*os.File, error) {
	if l == nil || len(l.files) == 0 {
		return nil, nil
	}
	return nil, fmt.Errorf("persist: handing a lock over: %w", shm.ErrNeedsLinux)
}

// lowPriority runs f on the calling goroutine, at the process's priority:
// a thread's own priority is Linux's (a dump while serving is the
// supervisor's, which runs on Linux only).
func lowPriority[T any](f func() T) T { return f() }

// lockRefusal has nothing to refuse where no lock is taken.
func lockRefusal(string) string { return "" }
