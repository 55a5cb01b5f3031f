package prefork

import (
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/preforkd/preforkd/internal/cpuquota"
)

// spawner starts processes from one goroutine locked to its OS thread for
// its whole life. The kernel sends a child's Pdeathsig when the thread that
// forked it exits, not the process: starting children from whatever thread
// the scheduler picks would kill them when the runtime retires that thread.
type spawner struct {
	reqs chan spawnRequest
	done chan struct{}
}

type spawnRequest struct {
	start func() error
	reply chan<- error
}

func newSpawner() *spawner {
	s := &spawner{reqs: make(chan spawnRequest), done: make(chan struct{})}
	go s.loop()
	return s
}

func (s *spawner) loop() {
	defer close(s.done)
	// Never unlocked: when the loop ends, the goroutine exits locked and the
	// runtime terminates the thread — by then no child of it is alive.
	runtime.LockOSThread()
	for r := range s.reqs {
		r.reply <- r.start()
	}
}

// start runs start, which starts a process, on the spawner's thread.
func (s *spawner) start(start func() error) error {
	reply := make(chan error, 1)
	s.reqs <- spawnRequest{start, reply}
	return <-reply
}

// startProcess starts the program at path with args and env, its
// standard input stdin (nil: /dev/null), its standard output and error
// this process's, and extra as its descriptors from 3 on. os.StartProcess
// rather than os/exec, whose Cmd adds nothing a process started with
// files only needs (it looks up paths and copies streams) and some 11 KB
// to every program that embeds the supervisor.
func startProcess(path string, args, env []string, stdin *os.File, extra []*os.File, sys *syscall.SysProcAttr) (*os.Process, error) {
	if stdin == nil {
		null, err := os.Open(os.DevNull)
		if err != nil {
			return nil, err
		}
		defer null.Close()
		stdin = null
	}
	files := append([]*os.File{stdin, os.Stdout, os.Stderr}, extra...)
	return os.StartProcess(path, args, &os.ProcAttr{Env: env, Files: files, Sys: sys})
}

// stop ends the spawner's goroutine (and thread) and waits for it. Only
// once every child has exited.
func (s *spawner) stop() {
	close(s.reqs)
	<-s.done
}

// osEnv is the real seam: it starts workers as copies of this program and
// watches them. Its files are referenced for the supervisor's whole life:
// a file collected by the garbage collector would close its descriptor and
// a later respawn would pass a wrong one.
type osEnv struct {
	spawner *spawner
	// exe is the program's file on disk, opened again for every new
	// generation: a binary deployed there (by rename) since the last one
	// is what a reload starts.
	exe      string
	name     string   // the supervisor's process name, which workers take
	args     []string // the supervisor's; a worker's argv[0] is its title
	environ  []string // for every worker; without NOTIFY_SOCKET and the worker markers
	region   *os.File
	listener *os.File
	lifeline *os.File    // read end; the supervisor holds the write end
	extra    []namedFile // Options.ExtraListen's sockets, from fdExtra on

	gens map[int]genFiles // by generation, those that may be started
	// first is the generation this supervisor starts with, which runs
	// its own binary: 0, or after a binary upgrade the one after the old
	// supervisor's (startsAt).
	first int

	events chan<- any
	quit   <-chan struct{} // closed when the loop no longer reads events
	wg     sync.WaitGroup  // one per process watcher
}

// namedFile is a named listener's socket, as passed to a process.
type namedFile struct {
	name string
	file *os.File
}

// genFiles are what every worker of one generation is started from: its
// binary, open, so that it stays the same file whatever is deployed at
// the path later (a worker of a generation always runs the binary that
// generation started with, also when it is respawned after a crash), and
// its configuration.
type genFiles struct {
	exe, config *os.File
}

func (g genFiles) close() {
	g.exe.Close()
	g.config.Close()
}

// workerEnviron is the environment of every worker: this process's, without
// NOTIFY_SOCKET and the watchdog's variables (workers never talk to the
// service manager) and with
// GOMAXPROCS sized to a worker's share of the CPUs this process may use
// (its cgroup's CPU limit, else the host's) unless the user set it.
func workerEnviron(environ []string, workers int) []string {
	out := make([]string, 0, len(environ)+1)
	gomaxprocs := false
	for _, kv := range environ {
		k, _, _ := strings.Cut(kv, "=")
		switch k {
		case envNotifySocket, envWatchdogUsec, envWatchdogPID, envWorker, envName, envRSSDelay, envListeners:
			continue
		case "GOMAXPROCS":
			gomaxprocs = true
		}
		out = append(out, kv)
	}
	if !gomaxprocs {
		out = append(out, "GOMAXPROCS="+strconv.Itoa(max(1, cpuquota.CPUs()/max(1, workers))))
	}
	return out
}

// start is sysEnv.start.
func (e *osEnv) start(sp spawnSpec) (started, error) {
	files, err := e.filesFor(sp)
	if err != nil {
		return started{}, err
	}
	readyR, readyW, err := os.Pipe()
	if err != nil {
		return started{}, fmt.Errorf("prefork: readiness pipe: %w", err)
	}
	args := []string{workerTitle(e.name, sp.Index, sp.Gen)}
	if len(e.args) > 1 {
		args = append(args, e.args[1:]...)
	}
	env := append(e.environ[:len(e.environ):len(e.environ)], envWorker+"="+strconv.Itoa(sp.Index))
	if e.name != "" {
		env = append(env, envName+"="+e.name)
	}
	if sp.RSSDelay > 0 {
		env = append(env, envRSSDelay+"="+sp.RSSDelay.String())
	}
	fds := []*os.File{e.region, e.listener, e.lifeline, readyW, files.config} // fdRegion..fdConfig
	if len(e.extra) > 0 {
		names := make([]string, len(e.extra))
		for i, x := range e.extra {
			names[i] = x.name
			fds = append(fds, x.file)
		}
		env = append(env, envListeners+"="+strings.Join(names, ","))
	}
	var proc *os.Process
	err = e.spawner.start(func() (err error) {
		proc, err = startProcess(
			// The supervisor's descriptor, by its /proc path: the child
			// resolves it before its own descriptors are shuffled into place.
			fmt.Sprintf("/proc/%d/fd/%d", os.Getpid(), files.exe.Fd()), args, env, nil,
			fds,
			&syscall.SysProcAttr{
				Setpgid:   true, // a terminal's Ctrl-C reaches the supervisor only
				Pdeathsig: syscall.SIGKILL,
			})
		return err
	})
	readyW.Close() // the child has its copy; EOF on readyR now means it exited
	if err != nil {
		readyR.Close()
		return started{}, fmt.Errorf("prefork: starting a worker: %w", err)
	}
	e.wg.Add(1)
	go e.watch(proc, readyR)
	// os.Process signals through a pidfd: a reaped worker's pid may be
	// reused, its Process is never confused with the new owner. One that
	// exited (and was waited for by watch) before the loop handled its
	// exit has nothing left to be told: that is no failure to warn about.
	return started{pid: proc.Pid, signal: func(sig syscall.Signal) error {
		if err := proc.Signal(sig); !errors.Is(err, os.ErrProcessDone) {
			return err
		}
		return nil
	}}, nil
}

// startsAt makes gen the generation this supervisor starts with.
func (e *osEnv) startsAt(gen int) { e.first = gen }

// filesFor returns the files of generation sp.Gen, opening them at its
// first start, and closes those of the generations that will not be
// started again. The first generation (e.first) runs the supervisor's own binary;
// each later one the file at e.exe when it is first started.
func (e *osEnv) filesFor(sp spawnSpec) (genFiles, error) {
	g, ok := e.gens[sp.Gen]
	if !ok {
		path := e.exe
		if len(e.gens) == 0 && sp.Gen == e.first {
			path = "/proc/self/exe"
		}
		exe, err := os.Open(path)
		if err != nil {
			return genFiles{}, fmt.Errorf("prefork: opening the program to start: %w", err)
		}
		cfg, err := settingsFile(sp.Settings)
		if err != nil {
			exe.Close()
			return genFiles{}, err
		}
		g = genFiles{exe: exe, config: cfg}
		if e.gens == nil {
			e.gens = make(map[int]genFiles)
		}
		e.gens[sp.Gen] = g
	}
	for gen, old := range e.gens {
		if gen != sp.Gen && !slices.Contains(sp.Keep, gen) {
			old.close()
			delete(e.gens, gen)
		}
	}
	return g, nil
}

// watch waits for one worker's readiness report, then for its exit, and
// sends both to the loop, with what the worker says in between.
func (e *osEnv) watch(proc *os.Process, ready *os.File) {
	defer e.wg.Done()
	pid := proc.Pid
	var b [1]byte
	if n, _ := ready.Read(b[:]); n == 1 {
		e.post(readyEvent{pid})
		// Then requests to be recycled, and the word that it stopped
		// accepting, until the worker exits (EOF).
		msg := make([]byte, recycleMsgLen)
		for {
			if _, err := io.ReadFull(ready, msg[:1]); err != nil {
				break
			}
			if msg[0] == stoppedMsg {
				e.post(stoppedEvent{pid})
				continue
			}
			if _, err := io.ReadFull(ready, msg[1:]); err != nil {
				break
			}
			ev, err := decodeRecycle(pid, msg)
			if err != nil {
				e.post(err)
				break
			}
			e.post(ev)
		}
	}
	ready.Close()
	ps, err := proc.Wait()
	ev := exitEvent{pid: pid, status: "unknown"}
	if ps != nil {
		ev.status, ev.clean, ev.code = ps.String(), ps.Success(), ps.ExitCode()
	} else if err != nil {
		ev.status = err.Error()
	}
	e.post(ev)
}

func (e *osEnv) post(ev any) {
	select {
	case e.events <- ev:
	case <-e.quit:
	}
}

// close releases what the env holds, once every worker was reaped.
func (e *osEnv) close() {
	e.wg.Wait()
	e.spawner.stop()
	for _, g := range e.gens {
		g.close()
	}
}
