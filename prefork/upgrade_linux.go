package prefork

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/preforkd/preforkd/shm"
)

// takeInheritance reads what the old supervisor handed this process, or
// returns nil when it was not started by an upgrade. The variable is
// removed: no process started from here takes it for its own.
func takeInheritance() (*inheritance, error) {
	v, ok := os.LookupEnv(envUpgrade)
	if !ok {
		return nil, nil
	}
	os.Unsetenv(envUpgrade)
	in := &inheritance{gen: -1, files: map[string]*os.File{}, listeners: map[string]*os.File{}}
	for part := range strings.SplitSeq(v, ";") {
		key, val, _ := strings.Cut(part, "=")
		switch key {
		case "indexes":
			for s := range strings.SplitSeq(val, ",") {
				if s == "" {
					continue
				}
				i, err := strconv.Atoi(s)
				if err != nil || i < 0 {
					return nil, fmt.Errorf("prefork: %s: bad index %q", envUpgrade, s)
				}
				in.oldIndexes = append(in.oldIndexes, i)
			}
		case "generation":
			g, err := strconv.Atoi(val)
			if err != nil || g < 0 {
				return nil, fmt.Errorf("prefork: %s: bad generation %q", envUpgrade, val)
			}
			in.gen = g
		case "files", "listeners":
			for s := range strings.SplitSeq(val, ",") {
				if s == "" {
					continue
				}
				name, fd, _ := strings.Cut(s, ":")
				n, err := strconv.Atoi(fd)
				if err != nil || n < fdUpFiles {
					return nil, fmt.Errorf("prefork: %s: bad file %q", envUpgrade, s)
				}
				f := os.NewFile(uintptr(n), name)
				syscall.CloseOnExec(n)
				if key == "listeners" {
					in.listeners[name] = f
				} else {
					in.files[name] = f
				}
			}
		}
	}
	for fd := fdUpRegion; fd <= fdUpChannel; fd++ {
		syscall.CloseOnExec(fd)
	}
	in.region = os.NewFile(fdUpRegion, "region")
	in.listener = os.NewFile(fdUpListen, "listener")
	ch := os.NewFile(fdUpChannel, "upgrade")
	c, err := net.FileConn(ch)
	ch.Close()
	if err != nil {
		return nil, fmt.Errorf("prefork: the upgrade's socket: %w", err)
	}
	uc, ok := c.(*net.UnixConn)
	if !ok {
		c.Close()
		return nil, errors.New("prefork: the upgrade's socket is not a unix socket")
	}
	in.channel = uc
	return in, nil
}

// upgrade is sysEnv.upgrade: it starts the program's file on disk as a
// new supervisor, handing it the listeners, the region, its end of a socket
// pair and the program's files; indexes are the worker indexes this
// supervisor's workers hold.
func (e *osEnv) upgrade(indexes []int, gen int, handover func() (map[string]*os.File, error)) (upgradeProc, error) {
	var files map[string]*os.File
	if handover != nil {
		var err error
		if files, err = handover(); err != nil {
			return upgradeProc{}, fmt.Errorf("prefork: the program's files for the upgrade: %w", err)
		}
	}
	defer func() {
		for _, f := range files {
			f.Close() // the child has its copies
		}
	}()
	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return upgradeProc{}, fmt.Errorf("prefork: the upgrade's socket pair: %w", err)
	}
	mine, theirs := os.NewFile(uintptr(pair[0]), "upgrade"), os.NewFile(uintptr(pair[1]), "upgrade")
	defer theirs.Close()
	names := make([]string, 0, len(files))
	for name := range files {
		names = append(names, name)
	}
	sort.Strings(names)
	extra := []*os.File{e.region, e.listener, theirs}
	var lspec []string
	for _, x := range e.extra {
		lspec = append(lspec, x.name+":"+strconv.Itoa(fdUpRegion+len(extra)))
		extra = append(extra, x.file)
	}
	var spec []string
	for _, name := range names {
		spec = append(spec, name+":"+strconv.Itoa(fdUpRegion+len(extra)))
		extra = append(extra, files[name])
	}
	// No Pdeathsig, and not from the spawner's thread: the new
	// supervisor outlives this one.
	proc, err := startProcess(e.exe, e.args, upgradeEnviron(os.Environ(), indexes, gen, spec, lspec), os.Stdin, extra, nil)
	if err != nil {
		mine.Close()
		return upgradeProc{}, fmt.Errorf("prefork: starting the new supervisor: %w", err)
	}
	conn, err := net.FileConn(mine)
	mine.Close()
	if err != nil {
		proc.Kill()
		go proc.Wait()
		return upgradeProc{}, fmt.Errorf("prefork: the upgrade's socket: %w", err)
	}
	pid := proc.Pid
	go func() {
		var b [1]byte
		for {
			n, err := conn.Read(b[:])
			if n == 1 && b[0] == msgReady {
				e.post(upgradeReadyEvent{pid})
			}
			if err != nil {
				break
			}
		}
		status := "unknown"
		if ps, _ := proc.Wait(); ps != nil {
			status = ps.String()
		}
		conn.Close()
		e.post(upgradeExitEvent{pid, status})
	}()
	return upgradeProc{
		started: started{pid: pid, signal: func(sig syscall.Signal) error { return proc.Signal(sig) }},
		tell: func(msg byte) error {
			_, err := conn.Write([]byte{msg})
			return err
		},
	}, nil
}

// orphanWait is how long a process joined as an index of the other
// supervisor is waited for once that supervisor is gone; past it the
// index is reaped anyway (its pid may have been reused).
const orphanWait = 10 * time.Second

// waitGone posts an orphanEvent for each of indexes once no live process
// is joined as it in the region: the workers of a supervisor that is
// gone, which die with it (Pdeathsig) or have exited already.
func (e *osEnv) waitGone(r *shm.Region, indexes []int) {
	left := slices.Clone(indexes)
	deadline := time.Now().Add(orphanWait)
	go func() {
		for len(left) > 0 {
			workers := r.Workers()
			left = slices.DeleteFunc(left, func(i int) bool {
				if i < len(workers) && workers[i].PID != 0 && processAlive(workers[i].PID) && time.Now().Before(deadline) {
					return false
				}
				e.post(orphanEvent{i})
				return true
			})
			if len(left) > 0 {
				time.Sleep(20 * time.Millisecond)
			}
		}
	}()
}

// processAlive reports whether pid is a process that has not exited (a
// zombie has). When /proc cannot be read for another reason than the
// process's end (out of descriptors), kill(2) tells, zombies as alive.
func processAlive(pid int) bool {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return !errors.Is(err, fs.ErrNotExist) && syscall.Kill(pid, 0) != syscall.ESRCH
	}
	i := strings.LastIndexByte(string(stat), ')')
	if i < 0 || i+2 >= len(stat) {
		return false
	}
	state := stat[i+2]
	return state != 'Z' && state != 'X'
}
