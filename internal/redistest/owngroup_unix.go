//go:build unix && !linux

package redistest

import (
	"os/exec"
	"syscall"
)

// ownGroup has cmd start in a process group of its own, for killGroup.
func ownGroup(cmd *exec.Cmd) { cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} }
