package persist

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
)

// CheckDirs reports whether the directories of o.Path and o.Live exist
// and take new files, as writing a dump (a temporary file, renamed) and
// creating a live region need. A supervisor calls it at start: a dump
// directory that is missing or read-only is then a configuration error at
// once, rather than a dump lost at shutdown.
func CheckDirs(o Options) error {
	for _, f := range []struct{ key, path, pattern string }{
		{"persist.path", o.Path, tempPattern(o.Path)},
		{"persist.live", o.Live, liveTempPrefix(o.Live) + "*"},
	} {
		if f.path == "" {
			continue
		}
		if err := checkDir(filepath.Dir(f.path), f.pattern); err != nil {
			return fmt.Errorf("persist: %s %q: %w", f.key, f.path, err)
		}
	}
	return nil
}

// checkDir creates and removes a file named after pattern in dir: the
// only test of writability that a read-only mount, an ACL and root agree
// on.
func checkDir(dir, pattern string) error {
	st, err := os.Stat(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("directory %s does not exist", dir)
	case err != nil:
		return err
	case !st.IsDir():
		return fmt.Errorf("%s is not a directory", dir)
	}
	f, err := os.CreateTemp(dir, pattern)
	if err != nil {
		return fmt.Errorf("directory %s is not writable: %w", dir, err)
	}
	f.Close()
	os.Remove(f.Name())
	return nil
}

// untrusted says why a file that a load would read must not be trusted,
// or "" when it may be. Checksums are no authentication: whoever can
// write the file can make it say anything, so it must belong to this
// process's user, and group and others must not be able to write it.
func untrusted(fi fs.FileInfo) string {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		if uid := os.Geteuid(); int(st.Uid) != uid {
			return fmt.Sprintf("owned by uid %d, not by this service's uid %d", st.Uid, uid)
		}
	}
	if m := fi.Mode().Perm(); m&0o022 != 0 {
		return fmt.Sprintf("mode %#o: writable by group or others", m)
	}
	return ""
}
