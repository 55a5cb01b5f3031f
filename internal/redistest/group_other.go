//go:build !unix

package redistest

import "os/exec"

// ownGroup leaves cmd as it is: there are no process groups here.
func ownGroup(*exec.Cmd) {}

// killGroup kills the process of cmd.
func killGroup(cmd *exec.Cmd) { cmd.Process.Kill() }

// stopGroup cannot stop a process here: the test that needs it fails.
func stopGroup(*exec.Cmd, bool) { panic("redistest: Freeze needs a Unix system") }
