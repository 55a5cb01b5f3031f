//go:build unix

package redistest

import (
	"os/exec"
	"syscall"
)

// killGroup kills (SIGKILL) the process group of cmd, started by ownGroup:
// the server and whatever it forked (a background save).
func killGroup(cmd *exec.Cmd) { syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }

// stopGroup stops (SIGSTOP) or continues (SIGCONT) cmd's process group.
func stopGroup(cmd *exec.Cmd, stop bool) {
	sig := syscall.SIGCONT
	if stop {
		sig = syscall.SIGSTOP
	}
	syscall.Kill(-cmd.Process.Pid, sig)
}
