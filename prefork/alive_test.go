//go:build linux

package prefork

import (
	"os"
	"syscall"
	"testing"
)

// A process out of descriptors cannot read /proc: processAlive must not
// take that for the process's end, or a binary upgrade would reap the
// region index of a worker that still runs.
func TestProcessAliveOutOfDescriptors(t *testing.T) {
	var orig syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &orig); err != nil {
		t.Fatal(err)
	}
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	low := syscall.Rlimit{Cur: uint64(len(fds)) + 64, Max: orig.Max}
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &low); err != nil {
		t.Fatal(err)
	}
	var held []*os.File
	defer func() {
		for _, f := range held {
			f.Close()
		}
		syscall.Setrlimit(syscall.RLIMIT_NOFILE, &orig)
	}()
	for {
		f, err := os.Open(os.DevNull)
		if err != nil {
			break
		}
		held = append(held, f)
	}
	if _, err := os.Open(os.DevNull); err == nil {
		t.Fatal("not out of descriptors")
	}
	if !processAlive(os.Getpid()) {
		t.Error("processAlive(this process) = false out of descriptors")
	}
	for _, f := range held {
		f.Close()
	}
	held = nil
	if processAlive(1 << 22) { // above pid_max's largest value: no such process
		t.Error("processAlive(no process) = true")
	}
}
