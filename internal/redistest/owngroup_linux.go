package redistest

import (
	"os/exec"
	"syscall"
)

// ownGroup has cmd start in a process group of its own, for killGroup,
// and die with the test binary that started it: one killed by its
// -timeout, or a panic, runs no cleanup, and would leave the server
// running.
func ownGroup(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
