package persist

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// ErrInUse means another supervisor holds a file this one would use.
var ErrInUse = errors.New("persist: in use by another supervisor")

// Lock is a supervisor's exclusive hold on the files it persists to: an
// flock on FILE.lock beside each, which also names the holder's pid. The
// kernel releases it when the process ends, however it ends.
type Lock struct{ files []*os.File }

// lock adds the lock of path to l, without waiting: a file another
// process holds is an error that wraps ErrInUse and names the holder.
func (l *Lock) lock(path string) error {
	name := path + ".lock"
	f, err := os.OpenFile(name, os.O_RDWR|os.O_CREATE|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("persist: lock: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return fmt.Errorf("%w: %s (pid %s holds %s)", ErrInUse, path, holder(name), name)
		}
		return fmt.Errorf("persist: lock %s: %w", name, err)
	}
	// Informative: whoever is refused learns whom to look for.
	f.Truncate(0)
	f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	l.files = append(l.files, f)
	return nil
}

// holder is the pid a lock file names, or "unknown".
func holder(name string) string {
	b, _ := os.ReadFile(name)
	if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && pid > 0 {
		return strconv.Itoa(pid)
	}
	return "unknown"
}

// Unlock releases every lock l holds. Idempotent; a nil Lock holds none.
func (l *Lock) Unlock() error {
	if l == nil {
		return nil
	}
	var err error
	for _, f := range l.files {
		err = errors.Join(err, f.Close())
	}
	l.files = nil
	return err
}
