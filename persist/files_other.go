//go:build !unix

package persist

import "io/fs"

// untrusted refuses every file: the owner a load checks (this process's
// user) cannot be read from a file's information on this system.
func untrusted(fs.FileInfo) string {
	return "its owner cannot be checked on this system"
}

// processAlive cannot tell on this system: every temporary file left is
// taken as a dead writer's.
func processAlive(int) bool { return false }
