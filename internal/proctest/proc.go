package proctest

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// envChild holds a child's role, spec, file count and barrier fd, as JSON
// (childEnv). Main clears it, so that the child's own children do not
// take a role.
const envChild = "PROCTEST_CHILD"

type childEnv struct {
	Role    string
	Spec    json.RawMessage
	Files   int // inherited as fd 3 … 3+Files-1
	Barrier int // fd of the barrier's read end; 0: none
}

// Options says how to start a child.
type Options struct {
	Role string // a key of the roles given to Main in the child
	// Exe is the binary to start; "" is this test binary. A copy of it
	// (a "new build" of a program under test) has the same roles.
	Exe string
	// Spec is encoded as JSON for [Child.Spec]; nil is JSON null. It
	// travels in the environment: a few KiB at most.
	Spec any
	// Files are inherited as fd 3, 4, … in this order.
	Files []*os.File
	// Barrier, if not nil, holds the child at [Child.Ready] until
	// [Barrier.Release]. Its fd follows Files.
	Barrier *Barrier
	// Env is added to this process's environment (GOMAXPROCS=1, …).
	Env []string
	// Stderr is the child's stderr; nil is this process's (the test's
	// output). A file is written by the child directly, so that a
	// process that inherits it from the child does not delay [Proc.Wait].
	Stderr *os.File
	// SysProcAttr, if not nil, is the child's (namespaces of its own, on
	// Linux: a file system of a size the test chooses).
	SysProcAttr *syscall.SysProcAttr
}

// Proc is a child started by [Start].
type Proc struct {
	tb    testing.TB
	name  string // role and pid, for messages
	cmd   *exec.Cmd
	stdin *os.File
	out   *Log[string]
	next  int  // index of the next stdout line for Line
	ready bool // said "ready" (WaitReady, Barrier.Release)

	exited chan struct{} // closed once cmd.Wait has returned
	err    error         // cmd.Wait's, once exited
	once   sync.Once     // the cleanup
}

// Start starts the test binary in role o.Role. The child is killed and
// waited for at the end of tb unless it has exited by then.
func Start(tb testing.TB, o Options) *Proc {
	tb.Helper()
	exe := o.Exe
	if exe == "" {
		var err error
		if exe, err = os.Executable(); err != nil {
			tb.Fatalf("proctest: %v", err)
		}
	}
	spec, err := json.Marshal(o.Spec)
	if err != nil {
		tb.Fatalf("proctest: the spec of role %s: %v", o.Role, err)
	}
	env := childEnv{Role: o.Role, Spec: spec, Files: len(o.Files)}
	files := o.Files
	if o.Barrier != nil {
		files = append(files[:len(files):len(files)], o.Barrier.r)
		env.Barrier = 3 + len(o.Files)
	}
	js, err := json.Marshal(env)
	if err != nil {
		tb.Fatalf("proctest: %v", err)
	}
	// The test flags keep a child that never reaches Main (a TestMain
	// that does not call it) from running the tests again.
	cmd := exec.Command(exe, "-test.run=^$", "-test.bench=^$")
	cmd.Env = append(append(os.Environ(), o.Env...), envChild+"="+string(js))
	cmd.ExtraFiles = files
	cmd.SysProcAttr = o.SysProcAttr
	cmd.Stderr = os.Stderr
	if o.Stderr != nil {
		cmd.Stderr = o.Stderr
	}
	inR, inW, err := os.Pipe()
	if err != nil {
		tb.Fatalf("proctest: %v", err)
	}
	defer inR.Close()
	cmd.Stdin = inR
	p := &Proc{tb: tb, cmd: cmd, stdin: inW, out: NewLog[string](), exited: make(chan struct{})}
	// The log's pipe: a file, so that Wait does not wait for a copy.
	outW := p.out.Pipe(tb, Text)
	defer outW.Close()
	cmd.Stdout = outW
	if err := cmd.Start(); err != nil {
		inW.Close()
		tb.Fatalf("proctest: starting role %s: %v", o.Role, err)
	}
	p.name = fmt.Sprintf("role %s (pid %d)", o.Role, cmd.Process.Pid)
	go func() {
		p.err = cmd.Wait()
		close(p.exited)
	}()
	tb.Cleanup(p.cleanup) // after the log's: runs before it
	if o.Barrier != nil {
		o.Barrier.add(p)
	}
	return p
}

// CopyExe writes a copy of the test binary, followed by tail, to path as
// a deploy would: to a file beside it, renamed over it. The copy runs the
// same roles ([Options.Exe]).
func CopyExe(tb testing.TB, path string, tail []byte) {
	tb.Helper()
	self, err := os.Executable()
	if err != nil {
		tb.Fatalf("proctest: %v", err)
	}
	b, err := os.ReadFile(self)
	if err != nil {
		tb.Fatalf("proctest: %v", err)
	}
	tmp := path + ".new"
	if err := os.WriteFile(tmp, append(b, tail...), 0o755); err != nil {
		tb.Fatalf("proctest: %v", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		tb.Fatalf("proctest: %v", err)
	}
}

// cleanup kills the child unless it has exited, and waits for it.
func (p *Proc) cleanup() {
	p.once.Do(func() {
		select {
		case <-p.exited:
		default:
			p.cmd.Process.Kill()
			select {
			case <-p.exited:
			case <-time.After(10 * time.Second):
				p.tb.Errorf("proctest: %s survived SIGKILL for 10s", p.name)
			}
		}
		p.stdin.Close()
	})
}

// Pid returns the child's process id.
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// Line returns the child's next stdout line, waiting up to timeout for
// it. Its error says whether the child ended (and how) or the time ran
// out. Unlike Expect and Decode, Line may be called from any goroutine
// (one at a time).
func (p *Proc) Line(timeout time.Duration) (string, error) {
	i, line, ok := p.out.WaitFor(p.next, timeout, func(string) bool { return true })
	if ok {
		p.next = i + 1
		return line, nil
	}
	if !p.out.Ended() {
		return "", fmt.Errorf("proctest: %s: no line within %v", p.name, timeout)
	}
	// Its stdout ended: the child is gone, or about to be.
	select {
	case <-p.exited:
		return "", fmt.Errorf("proctest: %s ended without a line: %v", p.name, p.exitStatus())
	case <-time.After(time.Second):
		return "", fmt.Errorf("proctest: %s closed its stdout without a line", p.name)
	}
}

// Expect fails the test unless the child's next line is want, within
// timeout.
func (p *Proc) Expect(want string, timeout time.Duration) {
	p.tb.Helper()
	line, err := p.Line(timeout)
	if err != nil {
		p.tb.Fatalf("waiting for %q: %v", want, err)
	}
	if line != want {
		p.tb.Fatalf("proctest: %s said %q, want %q", p.name, line, want)
	}
}

// Decode reads the child's next line, within timeout, as JSON into v,
// and fails the test if it cannot.
func (p *Proc) Decode(v any, timeout time.Duration) {
	p.tb.Helper()
	line, err := p.Line(timeout)
	if err != nil {
		p.tb.Fatalf("waiting for a report: %v", err)
	}
	if err := json.Unmarshal([]byte(line), v); err != nil {
		p.tb.Fatalf("proctest: %s reported %q: %v", p.name, line, err)
	}
}

// WaitReady fails the test unless the child says it is ready
// ([Child.Ready]) within timeout. A child with a [Barrier] is still held.
func (p *Proc) WaitReady(timeout time.Duration) {
	p.tb.Helper()
	if !p.ready {
		p.Expect(readyLine, timeout)
		p.ready = true
	}
}

// Send writes line and a newline to the child's stdin ([Child.ReadLine]).
func (p *Proc) Send(line string) error {
	if strings.Contains(line, "\n") {
		return fmt.Errorf("proctest: a line with a newline: %q", line)
	}
	_, err := p.stdin.WriteString(line + "\n")
	return err
}

// CloseStdin closes the child's stdin: its ReadLine returns io.EOF.
func (p *Proc) CloseStdin() { p.stdin.Close() }

// Signal sends sig to the child.
func (p *Proc) Signal(sig syscall.Signal) error { return p.cmd.Process.Signal(sig) }

// Kill kills the child (SIGKILL) and waits for it, failing the test if it
// is not gone within 10s.
func (p *Proc) Kill() {
	p.tb.Helper()
	p.cmd.Process.Kill()
	p.Wait(10 * time.Second)
}

// Wait waits up to timeout for the child to exit and returns how:
// nil for status 0, else an *exec.ExitError. It fails the test if the
// child is still running after timeout.
func (p *Proc) Wait(timeout time.Duration) error {
	p.tb.Helper()
	select {
	case <-p.exited:
		return p.err
	case <-time.After(timeout):
		p.tb.Fatalf("proctest: %s did not exit within %v", p.name, timeout)
		return nil
	}
}

// Done is closed once the child has exited and was waited for.
func (p *Proc) Done() <-chan struct{} { return p.exited }

// State is the child's exit state, once Done is closed (else nil).
func (p *Proc) State() *os.ProcessState {
	select {
	case <-p.exited:
		return p.cmd.ProcessState
	default:
		return nil
	}
}

func (p *Proc) exitStatus() string {
	if p.err == nil {
		return "exit status 0"
	}
	return p.err.Error()
}

// Barrier holds the children started with it at [Child.Ready] until
// [Barrier.Release] lets them all go at once.
type Barrier struct {
	tb    testing.TB
	r, w  *os.File // a pipe: the children read to EOF, which closing w sends
	mu    sync.Mutex
	procs []*Proc
}

// NewBarrier returns a closed barrier.
func NewBarrier(tb testing.TB) *Barrier {
	tb.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		tb.Fatalf("proctest: %v", err)
	}
	b := &Barrier{tb: tb, r: r, w: w}
	tb.Cleanup(func() { r.Close(); w.Close() })
	return b
}

func (b *Barrier) add(p *Proc) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.procs = append(b.procs, p)
}

// Release waits until every child started with b so far is ready, all
// within timeout, then lets them go. It fails the test if one is not.
func (b *Barrier) Release(timeout time.Duration) {
	b.tb.Helper()
	b.mu.Lock()
	procs := b.procs
	b.mu.Unlock()
	deadline := time.Now().Add(timeout)
	for _, p := range procs {
		p.WaitReady(max(time.Until(deadline), 0))
	}
	b.w.Close()
}
