package proctest

import (
	"runtime"
	"strings"
	"time"
)

// Leaked waits up to wait for the goroutines that run code of files whose
// path contains dir ("/prefork/") to end, and returns the stacks of those
// that did not, or "" if none is left. A goroutine with a test file's
// frame (its test is its owner) does not count. TestMain calls it after
// m.Run, so that a goroutine nobody stopped fails the package.
func Leaked(dir string, wait time.Duration) string {
	deadline := time.Now().Add(wait)
	for {
		buf := make([]byte, 1<<20)
		buf = buf[:runtime.Stack(buf, true)]
		var leaked []string
		for _, g := range strings.Split(string(buf), "\n\n") {
			if strings.Contains(g, dir) && !strings.Contains(g, "_test.go") {
				leaked = append(leaked, g)
			}
		}
		if len(leaked) == 0 || time.Now().After(deadline) {
			return strings.Join(leaked, "\n\n")
		}
		time.Sleep(20 * time.Millisecond)
	}
}
