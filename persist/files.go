package persist

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// CheckDirs reports whether the directories of o.Path and o.Live exist
// and take new files, as writing a dump (a temporary file, renamed) and
// creating a live region need, whether whatever is at o.Path and o.Live
// already is a regular file (and at o.Live no dump, which a region would
// be made over), whether a consumed dump's name beside o.Path
// (PATH.loaded, PATH.refused, PATH.superseded) is free of a directory
// that a rename could not replace, and whether a lock file beside either
// is one OpenRegion would take. A supervisor calls it at start: a dump
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
		if err := CheckDir(filepath.Dir(f.path), f.pattern); err != nil {
			return fmt.Errorf("persist: %s %q: %w", f.key, f.path, err)
		}
		// What is there must be a file that a rename can replace: a
		// directory there (the path read as "the state directory") would
		// pass every load as a refused dump and fail every dump.
		if fi, err := os.Lstat(f.path); err == nil && !fi.Mode().IsRegular() {
			return fmt.Errorf("persist: %s %q is not a regular file (%s): name a file, e.g. %s", f.key, f.path, fi.Mode().Type(),
				filepath.Join(f.path, "dump"))
		}
		// Nor may the live region be made over a dump (the two files'
		// names swapped, or live set to the dump's): a file that is no
		// region is replaced by a fresh one.
		if f.key == "persist.live" && isDump(f.path) {
			return liveIsDump(f.path)
		}
		// Nor may a directory take a consumed dump's name: the rename
		// of a loaded dump to it fails, which leaves the dump to be
		// loaded again after a crash, and so does setting a refused dump
		// aside, which then stops every dump.
		if f.key == "persist.path" {
			for _, sfx := range []string{SuffixLoaded, SuffixRefused, SuffixSuperseded} {
				if fi, err := os.Lstat(f.path + sfx); err == nil && fi.IsDir() {
					return fmt.Errorf("persist: %s %q: %s is a directory, where a consumed dump is renamed: remove it", f.key, f.path, f.path+sfx)
				}
			}
		}
		// And its lock file, if there is one already, one that
		// OpenRegion takes (see Lock).
		if why := lockRefusal(f.path); why != "" {
			return fmt.Errorf("persist: %s %q: lock %s %s: refused (remove it; keep the file in a directory of the service's own)",
				f.key, f.path, f.path+".lock", why)
		}
	}
	return nil
}

// CheckNames reports whether o.Path and o.Live name files that stay
// apart: neither may be a file that persistence keeps beside the other
// (its lock, a consumed dump, a temporary file), which the other's
// handling would truncate, rename over or remove: a live region named
// PATH.loaded would be replaced by the dump a load consumes, a dump named
// LIVE.lock truncated as the live region's lock. key is the option that
// names the other's file ("persist.path" or "persist.live"). Either ""
// passes.
func CheckNames(o Options) (key string, err error) {
	if o.Path == "" || o.Live == "" {
		return "", nil
	}
	path, live := absPath(o.Path), absPath(o.Live)
	// within says which of the files kept beside a b is, or "".
	within := func(a, b, temp string) string {
		for _, s := range []string{lockSuffix, SuffixLoaded, SuffixRefused, SuffixSuperseded} {
			if b == a+s {
				return s + " file"
			}
		}
		if filepath.Dir(a) == filepath.Dir(b) && strings.HasPrefix(filepath.Base(b), temp) {
			return "temporary files' name"
		}
		return ""
	}
	switch {
	case path == live:
		return "persist.live", fmt.Errorf("persist: persist.live %q is persist.path", o.Live)
	case within(path, live, filepath.Base(path)+".tmp-") != "":
		return "persist.live", fmt.Errorf("persist: persist.live %q is persist.path's %s: name another", o.Live, within(path, live, filepath.Base(path)+".tmp-"))
	case within(live, path, liveTempPrefix(live)) != "":
		return "persist.path", fmt.Errorf("persist: persist.path %q is persist.live's %s: name another", o.Path, within(live, path, liveTempPrefix(live)))
	}
	return "", nil
}

// isDump reports whether the regular file at path opens with a dump's
// magic.
func isDump(path string) bool {
	// O_NONBLOCK: a FIFO there is refused, never waited on.
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return false
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		return false
	}
	magic := make([]byte, len(Magic))
	_, err = io.ReadFull(f, magic)
	return err == nil && string(magic) == Magic
}

// liveIsDump is the refusal of a dump at persist.live.
func liveIsDump(path string) error {
	return fmt.Errorf("persist: persist.live %q is a dump, which a live region would replace: name another file for persist.live (a dump is loaded from persist.path)", path)
}

// absPath is path made absolute (and clean), or clean when it cannot be.
func absPath(path string) string {
	if abs, err := filepath.Abs(path); err == nil {
		return abs
	}
	return filepath.Clean(path)
}

// liveTempPrefix starts the names of the temporary files of a live region
// at path: shm.CreateFile's, which OpenRegion removes when a crash left
// them.
func liveTempPrefix(path string) string { return filepath.Base(path) + ".new-" }

// CheckDir reports whether dir exists and takes new files: it creates
// and removes a file named after pattern (os.CreateTemp's) in dir, the
// only test of writability that a read-only mount, an ACL and root agree
// on. The daemon checks an admin socket's directory with it too.
func CheckDir(dir, pattern string) error {
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
