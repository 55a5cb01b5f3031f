package prefork

import (
	"fmt"
	"syscall"
)

// raiseOpenFileLimit sets this process's soft limit on open files
// (RLIMIT_NOFILE) to its hard limit and returns the limit in force after.
//
// A supervisor holds the listener, the region, pipes and the admin
// connections; a worker holds one descriptor per client and one per
// upstream connection: with a soft limit of 1024 a few hundred slow clients
// are enough to make accept fail. The Go runtime raises the limit too
// (Go 1.19 on), but does not say so; doing it here makes it part of the
// contract and lets the supervisor log the value. The supervisor and every
// worker call it for themselves, so that processes the application starts
// still get the original soft limit from the runtime (programs using
// select(2) need it below 1024).
func raiseOpenFileLimit() (uint64, error) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 0, fmt.Errorf("prefork: reading the open-file limit: %w", err)
	}
	if lim.Cur >= lim.Max {
		return lim.Cur, nil
	}
	raised := syscall.Rlimit{Cur: lim.Max, Max: lim.Max}
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &raised); err != nil {
		return lim.Cur, fmt.Errorf("prefork: raising the open-file limit from %d to %d: %w", lim.Cur, lim.Max, err)
	}
	return raised.Cur, nil
}
