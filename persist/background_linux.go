package persist

import (
	"runtime"

	"golang.org/x/sys/unix"
)

// niceness is the CPU priority of a dump made while workers serve: the
// lowest, so that on a host whose CPUs the workers keep busy the dump
// takes the time they leave (it may then take longer), rather than
// taking time from them.
const niceness = 19

// lowPriority runs f on an OS thread of its own at the lowest CPU
// priority and returns what it returns. The thread ends with f: its
// priority is never seen by another goroutine.
func lowPriority[T any](f func() T) T {
	out := make(chan T, 1)
	go func() {
		// Never unlocked: the runtime ends the thread with the goroutine.
		runtime.LockOSThread()
		// On Linux a thread id as PRIO_PROCESS sets that thread alone.
		_ = unix.Setpriority(unix.PRIO_PROCESS, unix.Gettid(), niceness)
		out <- f()
	}()
	return <-out
}
