//go:build !unix

package redistest

import "os/exec"

// ownGroup leaves cmd as it is: there are no process groups here.
func ownGroup(*exec.Cmd) {}

// killGroup kills the process of cmd.
func killGroup(cmd *exec.Cmd) { cmd.Process.Kill() }
