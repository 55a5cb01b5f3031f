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

// Files returns duplicates of the descriptors that hold l's locks, for a
// process that takes them over (a supervisor started by a binary
// upgrade): an flock belongs to the open file, so the lock holds while
// any process keeps a duplicate open. The caller closes them.
func (l *Lock) Files() ([]*os.File, error) {
	if l == nil {
		return nil, nil
	}
	var out []*os.File
	for _, f := range l.files {
		fd, err := unix.FcntlInt(f.Fd(), unix.F_DUPFD_CLOEXEC, 0)
		if err != nil {
			for _, o := range out {
				o.Close()
			}
			return nil, fmt.Errorf("persist: lock: %w", err)
		}
		out = append(out, os.NewFile(uintptr(fd), f.Name()))
	}
	return out, nil
}

// AdoptLock takes over the locks whose descriptors files are (Files of
// the process that took them), and writes this process's pid in them.
func AdoptLock(files []*os.File) *Lock {
	for _, f := range files {
		f.Truncate(0)
		f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return &Lock{files: files}
}
