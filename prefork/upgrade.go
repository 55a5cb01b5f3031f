package prefork

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/preforkd/preforkd/shm"
)

// The binary upgrade (USR2), as nginx does it: the supervisor starts the
// program's file on disk as a new supervisor that inherits the listening
// socket and the region (its memfd, or persist.live's file: the same
// descriptor either way, so the counts continue whether the region lives
// on tmpfs or not), and the program's own files (Options.Handover). The
// new supervisor starts its workers on worker indexes the old one's do
// not hold, and reports ready over a socket pair; only then does the old
// one make it the service's main process (MAINPID= to systemd), tell it
// so, and drain its own workers and exit, without Finish: nothing is
// dumped, the region lives on. A new supervisor that exits, or is not
// ready within Settings.UpgradeTimeout, is killed and the old one serves
// on; the indexes its workers held are reaped once they are gone.

// What a supervisor started by USR2 inherits: the variable, and from fd 3
// the region, the listener, its end of the socket pair, then the
// program's files.
const (
	envUpgrade  = "PREFORKD_UPGRADE"
	fdUpRegion  = 3
	fdUpListen  = 4
	fdUpChannel = 5
	fdUpFiles   = 6
)

// The messages on the socket pair: the new supervisor is ready; the old
// one made it the main process.
const (
	msgReady byte = 'R'
	msgMain  byte = 'M'
)

// Events of an upgrade, for the supervisor's loop.
type (
	// upgradeReadyEvent: the new supervisor (old side) reported ready.
	upgradeReadyEvent struct{ pid int }
	// upgradeExitEvent: the new supervisor (old side) exited.
	upgradeExitEvent struct {
		pid    int
		status string
	}
	// mainEvent: the old supervisor (new side) made this one the main
	// process, or is gone (gone).
	mainEvent struct{ gone bool }
	// orphanEvent: no live process is joined as the index any more.
	orphanEvent struct{ index int }
)

// upgradeProc is the new supervisor as the old one's seam returns it.
type upgradeProc struct {
	started
	// main tells it that it is the main process now.
	main func() error
}

// upgradeRun is the old supervisor's upgrade in progress.
type upgradeRun struct {
	proc     upgradeProc
	deadline time.Time
	ready    bool
	killed   bool
}

// inheritance is what a supervisor started by USR2 was handed.
type inheritance struct {
	region, listener *os.File
	channel          *net.UnixConn
	oldIndexes       []int
	files            map[string]*os.File
}

// takeInheritance reads what the old supervisor handed this process, or
// returns nil when it was not started by an upgrade. The variable is
// removed: no process started from here takes it for its own.
func takeInheritance() (*inheritance, error) {
	v, ok := os.LookupEnv(envUpgrade)
	if !ok {
		return nil, nil
	}
	os.Unsetenv(envUpgrade)
	in := &inheritance{files: map[string]*os.File{}}
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
		case "files":
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
				in.files[name] = f
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

// listen returns the inherited listener.
func (in *inheritance) listen() (net.Listener, error) {
	ln, err := net.FileListener(in.listener)
	in.listener.Close()
	if err != nil {
		return nil, fmt.Errorf("prefork: the inherited listener: %w", err)
	}
	return ln, nil
}

// attach maps the inherited region and checks that it has room for n
// workers beside the old supervisor's.
func (in *inheritance) attach(n int) (*shm.Region, error) {
	r, err := shm.Attach(in.region)
	if err != nil {
		return nil, fmt.Errorf("prefork: the inherited region: %w", err)
	}
	if free := r.Geometry().MaxWorkers - len(in.oldIndexes); free < n {
		r.Close()
		return nil, fmt.Errorf("prefork: the region has room for %d more workers beside the old supervisor's %d; %d workers need a restart",
			free, len(in.oldIndexes), n)
	}
	return r, nil
}

// watch reads the old supervisor's messages and posts them: it made this
// one the main process, then (EOF) it is gone.
func (in *inheritance) watch(post func(any)) {
	go func() {
		var b [1]byte
		for {
			if _, err := in.channel.Read(b[:]); err != nil {
				post(mainEvent{gone: true})
				return
			}
			if b[0] == msgMain {
				post(mainEvent{})
			}
		}
	}()
}

// tellReady reports this supervisor ready to the old one.
func (in *inheritance) tellReady() error {
	_, err := in.channel.Write([]byte{msgReady})
	return err
}

// upgradeEnviron is the new supervisor's environment: this one's, without
// what marks a worker, the watchdog's pid (the new supervisor is to ping
// it once it is the main process) and an earlier upgrade's variable.
func upgradeEnviron(environ []string, indexes []int, files []string) []string {
	out := make([]string, 0, len(environ)+1)
	for _, kv := range environ {
		k, _, _ := strings.Cut(kv, "=")
		switch k {
		case envWorker, envName, envRSSDelay, envWatchdogPID, envUpgrade:
			continue
		}
		out = append(out, kv)
	}
	is := make([]string, len(indexes))
	for i, x := range indexes {
		is[i] = strconv.Itoa(x)
	}
	return append(out, envUpgrade+"=indexes="+strings.Join(is, ",")+";files="+strings.Join(files, ","))
}

// upgrade is sysEnv.upgrade: it starts the program's file on disk as a
// new supervisor, handing it the listener, the region, its end of a socket
// pair and the program's files; indexes are the worker indexes this
// supervisor's workers hold.
func (e *osEnv) upgrade(indexes []int, handover func() (map[string]*os.File, error)) (upgradeProc, error) {
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
	var spec []string
	for _, name := range names {
		spec = append(spec, name+":"+strconv.Itoa(fdUpRegion+len(extra)))
		extra = append(extra, files[name])
	}
	cmd := &exec.Cmd{
		Path:       e.exe,
		Args:       e.args,
		Env:        upgradeEnviron(os.Environ(), indexes, spec),
		Stdin:      os.Stdin,
		Stdout:     os.Stdout,
		Stderr:     os.Stderr,
		ExtraFiles: extra,
		// No Pdeathsig, and not from the spawner's thread: the new
		// supervisor outlives this one.
	}
	if err := cmd.Start(); err != nil {
		mine.Close()
		return upgradeProc{}, fmt.Errorf("prefork: starting the new supervisor: %w", err)
	}
	conn, err := net.FileConn(mine)
	mine.Close()
	if err != nil {
		cmd.Process.Kill()
		go cmd.Wait()
		return upgradeProc{}, fmt.Errorf("prefork: the upgrade's socket: %w", err)
	}
	pid := cmd.Process.Pid
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
		cmd.Wait()
		status := "unknown"
		if ps := cmd.ProcessState; ps != nil {
			status = ps.String()
		}
		conn.Close()
		e.post(upgradeExitEvent{pid, status})
	}()
	proc := cmd.Process
	return upgradeProc{
		started: started{pid: pid, signal: func(sig syscall.Signal) error { return proc.Signal(sig) }},
		main: func() error {
			_, err := conn.Write([]byte{msgMain})
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
// zombie has).
func processAlive(pid int) bool {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	i := strings.LastIndexByte(string(stat), ')')
	if i < 0 || i+2 >= len(stat) {
		return false
	}
	state := stat[i+2]
	return state != 'Z' && state != 'X'
}
