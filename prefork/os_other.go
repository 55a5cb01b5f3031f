//go:build !linux

package prefork

import (
	"context"
	"fmt"
	"net"
	"os"
	"syscall"

	"github.com/preforkd/preforkd/shm"
)

// Elsewhere than Linux, prefork builds for development (Settings, Status,
// WorkerCount and the rest work), but no supervisor or worker runs: Run
// answers an error that wraps shm.ErrNeedsLinux. Workers are Linux
// processes (a parent-death signal, a sealed memfd of settings, a shared
// region of memfd and futexes).

// errNeedsLinux is Run's error here.
var errNeedsLinux = fmt.Errorf("prefork: running a supervisor and its workers: %w", shm.ErrNeedsLinux)

// runSupervisor answers errNeedsLinux, having closed opts.Listener (Run
// owns it, whatever happens).
func runSupervisor(_ context.Context, opts Options) error {
	if opts.Listener != nil {
		opts.Listener.Close()
	}
	return errNeedsLinux
}

// runWorker logs errNeedsLinux and answers a failure's exit status: no
// supervisor here started this process.
func runWorker(_ context.Context, opts Options) int {
	opts.Logger.Error("worker cannot start", "err", errNeedsLinux)
	return 1
}

// reloadingState is the message that starts a reload: never sent here,
// where no supervisor runs.
func reloadingState() string { return "RELOADING=1" }

// sigReopen and sigDrain are never sent here (no worker runs); Windows
// names no USR1 or USR2. Invalid signals: sending one would fail.
const (
	sigReopen = syscall.Signal(-1)
	sigDrain  = syscall.Signal(-2)
)

// ListenerFile answers an error that wraps shm.ErrNeedsLinux: the socket
// is for workers, which run on Linux only.
func ListenerFile(net.Listener) (*os.File, error) {
	return nil, fmt.Errorf("prefork: duplicating a listener for workers: %w", shm.ErrNeedsLinux)
}
