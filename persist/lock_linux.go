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
	name := path + lockSuffix
	// Never through a link, and only a file of this user's: in a
	// directory others can write (/dev/shm), another user could plant a
	// link that the truncation below would follow, or a file of theirs
	// whose lock they hold.
	f, err := os.OpenFile(name, os.O_RDWR|os.O_CREATE|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		if errors.Is(err, unix.ELOOP) {
			return fmt.Errorf("persist: lock %s is a symbolic link: refused (remove it; keep the file in a directory of the service's own)", name)
		}
		return fmt.Errorf("persist: lock: %w", err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		f.Close()
		return fmt.Errorf("persist: lock %s: %w", name, err)
	}
	if why := untrustedLock(st); why != "" {
		f.Close()
		return fmt.Errorf("persist: lock %s %s: refused (remove it; keep the file in a directory of the service's own)", name, why)
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

// lockRefusal says why lock would refuse the lock file of path that is
// there already, without opening it: CheckDirs asks, so that check and
// the start refuse it as a configuration error, as they refuse a dump
// directory that cannot be written. "" when none is there, or lock would
// take it. Its owner is not judged here: check often runs as another
// user than the service (root, before a reload, beside an instance whose
// lock is the service user's); the start judges it.
func lockRefusal(path string) string {
	var st unix.Stat_t
	if err := unix.Lstat(path+lockSuffix, &st); err != nil {
		return ""
	}
	if st.Mode&unix.S_IFMT == unix.S_IFLNK {
		return "is a symbolic link"
	}
	st.Uid = uint32(os.Geteuid())
	return untrustedLock(st)
}

// untrustedLock says what makes an opened lock file one this process
// must not use, or "": it must be a regular file of this user's, with one
// name (a hard link to another file would be truncated with it).
func untrustedLock(st unix.Stat_t) string {
	switch {
	case st.Mode&unix.S_IFMT != unix.S_IFREG:
		return "is not a regular file"
	case st.Uid != uint32(os.Geteuid()):
		return fmt.Sprintf("is owned by uid %d, not this process's %d", st.Uid, os.Geteuid())
	case st.Nlink != 1:
		return fmt.Sprintf("has %d names (a hard link)", st.Nlink)
	}
	return ""
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
