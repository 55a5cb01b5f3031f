package shm

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// A live region lives in a file on tmpfs instead of a memfd, so that it
// survives a crash of the whole process tree; the next supervisor attaches
// it again (after ReapAll) in preference to a dump.

// CreateFile makes a new region in a file at path (normally on tmpfs),
// written to a temporary name and renamed into place, with its memory
// reserved up front (on a full tmpfs this fails here, not with SIGBUS
// later). The caller holds an exclusive lock on path (package persist
// takes one), so that no other process creates or attaches it meanwhile.
func CreateFile(path string, opts Options) (*Region, error) {
	o, size, err := plan(opts)
	if err != nil {
		return nil, err
	}
	f, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".new-*")
	if err != nil {
		return nil, fmt.Errorf("shm: live region: %w", err)
	}
	fail := func(err error) (*Region, error) {
		f.Close()
		os.Remove(f.Name())
		return nil, err
	}
	if err := unix.Fchmod(int(f.Fd()), 0o600); err != nil {
		return fail(fmt.Errorf("shm: live region: %w", err))
	}
	if err := reserve(f, size); err != nil {
		return fail(err)
	}
	r, err := mapFile(f, int(size))
	if err != nil {
		return fail(err)
	}
	if err := r.format(o); err != nil {
		r.unmap()
		return fail(err)
	}
	if err := os.Rename(f.Name(), path); err != nil {
		r.unmap()
		return fail(fmt.Errorf("shm: live region: %w", err))
	}
	return r, nil
}

// OpenFile attaches the region in the file at path (a live region left by
// an earlier supervisor). The caller holds an exclusive lock on path and
// calls ReapAll before any worker starts.
func OpenFile(path string) (*Region, error) {
	f, err := os.OpenFile(path, os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("shm: live region: %w", err)
	}
	r, err := Attach(f)
	if err != nil {
		f.Close()
		return nil, err
	}
	return r, nil
}

// KillOrphans kills the processes recorded in the worker table that still
// map this region's file: workers left by a supervisor that died, which
// would otherwise keep writing under retired identities. A process that
// does not map the file (a pid reused since) is left alone. It waits up to
// timeout for them to go and reports the pids it killed. Call it before
// ReapAll when re-attaching a live region.
func (r *Region) KillOrphans(timeout time.Duration) []int {
	if r.file == nil {
		return nil
	}
	st, err := r.file.Stat()
	if err != nil {
		return nil
	}
	sys, ok := st.Sys().(*syscall.Stat_t)
	if !ok {
		return nil
	}
	var killed []int
	for _, w := range r.Workers() {
		if w.PID <= 0 || w.PID == os.Getpid() || !mapsInode(w.PID, uint64(sys.Dev), uint64(sys.Ino)) {
			continue
		}
		if unix.Kill(w.PID, unix.SIGKILL) == nil {
			killed = append(killed, w.PID)
		}
	}
	deadline := time.Now().Add(timeout)
	for _, pid := range killed {
		for unix.Kill(pid, 0) == nil && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
	}
	return killed
}

// mapsInode reports whether process pid maps the file dev:ino.
func mapsInode(pid int, dev, ino uint64) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/maps")
	if err != nil {
		return false
	}
	want := " " + strconv.FormatUint(ino, 10) + " "
	major, minor := unix.Major(dev), unix.Minor(dev)
	devs := fmt.Sprintf(" %02x:%02x ", major, minor)
	for _, line := range strings.Split(string(b), "\n") {
		if strings.Contains(line, devs) && strings.Contains(line, want) {
			return true
		}
	}
	return false
}
