package prefork

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// settingsFile writes s (handoff_codec.go) into a sealed memory file for the workers
// of one generation. A file rather than an environment variable: a
// payload has no size limit, and it stays out of /proc/PID/environ.
func settingsFile(s Settings) (*os.File, error) {
	b := s.appendHandoff(nil)
	fd, err := unix.MemfdCreate("preforkd-settings", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, fmt.Errorf("prefork: memfd_create: %w", err)
	}
	f := os.NewFile(uintptr(fd), "preforkd-settings")
	if _, err := f.Write(b); err != nil {
		f.Close()
		return nil, fmt.Errorf("prefork: writing the settings: %w", err)
	}
	const seals = unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_WRITE | unix.F_SEAL_SEAL
	if _, err := unix.FcntlInt(f.Fd(), unix.F_ADD_SEALS, seals); err != nil {
		f.Close()
		return nil, fmt.Errorf("prefork: sealing the settings: %w", err)
	}
	return f, nil
}
