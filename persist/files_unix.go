//go:build unix

package persist

import (
	"fmt"
	"io/fs"
	"os"
	"syscall"
)

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

// processAlive reports whether a process of that pid exists (one of
// another user's too).
func processAlive(pid int) bool {
	return pid > 0 && syscall.Kill(pid, 0) != syscall.ESRCH
}
