package persist

import (
	"errors"
	"os"
	"strconv"
	"strings"
)

// ErrInUse means another supervisor holds a file this one would use.
var ErrInUse = errors.New("persist: in use by another supervisor")

// Lock is a supervisor's exclusive hold on the files it persists to: an
// flock on FILE.lock beside each, which also names the holder's pid. The
// kernel releases it when the process ends, however it ends.
type Lock struct{ files []*os.File }

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

// AdoptLock takes over the locks whose descriptors files are (Files of
// the process that took them), and writes this process's pid in them.
func AdoptLock(files []*os.File) *Lock {
	for _, f := range files {
		f.Truncate(0)
		f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return &Lock{files: files}
}
