package persist

import (
	"errors"
	"os"
	"strconv"
	"strings"

	"github.com/preforkd/preforkd/internal/smallfile"
)

// lockSuffix names the lock file beside a file persisted to: FILE.lock.
const lockSuffix = ".lock"

// ErrInUse means another supervisor holds a file this one would use.
var ErrInUse = errors.New("persist: in use by another supervisor")

// Lock is a supervisor's exclusive hold on the files it persists to: an
// flock on FILE.lock beside each, which also names the holder's pid. The
// kernel releases it when the process ends, however it ends.
type Lock struct{ files []*os.File }

// holder is the pid a lock file names, or "unknown".
func holder(name string) string {
	b, _ := smallfile.Read(name, 64, nil) // a regular file only: never blocks on a FIFO
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

// AdoptLock takes over the locks whose descriptors files are (Files of
// the process that took them). The files keep naming that process, which
// holds them too until this one serves: Claim names this one then, so
// that a takeover that fails before (a binary upgrade whose new
// supervisor exits) leaves them naming the process that still holds
// them.
func AdoptLock(files []*os.File) *Lock {
	return &Lock{files: files}
}

// Holds reports whether l holds the lock of path (FILE.lock beside it is
// one of l's files): a supervisor that adopted its locks checks that the
// files its configuration names are the ones they guard.
func (l *Lock) Holds(path string) bool {
	if l == nil {
		return false
	}
	want, err := os.Stat(path + lockSuffix)
	if err != nil {
		return false
	}
	for _, f := range l.files {
		if fi, err := f.Stat(); err == nil && os.SameFile(fi, want) {
			return true
		}
	}
	return false
}

// Claim writes this process's pid in every lock file l holds: whoever is
// refused the lock learns whom to look for. A nil Lock holds none.
func (l *Lock) Claim() {
	if l == nil {
		return
	}
	for _, f := range l.files {
		f.Truncate(0)
		f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
}
