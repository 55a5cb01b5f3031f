package persist

import (
	"errors"
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

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
