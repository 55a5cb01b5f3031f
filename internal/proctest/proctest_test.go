package proctest

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

var roles = map[string]Role{
	// echo reports its spec and the contents of its files, in order, then
	// echoes every line it is sent until its stdin closes, or fails at a
	// line "quit".
	"echo": func(c *Child) error {
		var spec struct{ Greeting string }
		if err := c.Spec(&spec); err != nil {
			return err
		}
		rep := echoReport{Greeting: spec.Greeting}
		for i := 0; c.File(i) != nil; i++ {
			b, err := io.ReadAll(c.File(i))
			if err != nil {
				return err
			}
			rep.Files = append(rep.Files, string(b))
		}
		if err := c.Report(rep); err != nil {
			return err
		}
		return c.EachLine(func(line string) error {
			if line == "quit" {
				return errors.New("quit")
			}
			return c.Say("echo: %s", line)
		})
	},
	// gate says "through" once its barrier lets it go.
	"gate": func(c *Child) error {
		if err := c.Ready(); err != nil {
			return err
		}
		return c.Say("through")
	},
	// sleep is ready, then sleeps until it is killed.
	"sleep": func(c *Child) error {
		c.Ready()
		time.Sleep(time.Hour)
		return nil
	},
	// exe says which binary runs it.
	"exe": func(c *Child) error {
		exe, err := os.Executable()
		if err != nil {
			return err
		}
		return c.Say("%s", exe)
	},
	"fail":   func(*Child) error { return errors.New("boom") },
	"silent": func(*Child) error { return nil },
}

type echoReport struct {
	Greeting string
	Files    []string
}

func TestMain(m *testing.M) {
	Main(roles)
	code := m.Run()
	if code == 0 {
		if leaked := Leaked("/internal/proctest/", 2*time.Second); leaked != "" {
			fmt.Fprintf(os.Stderr, "goroutines of package proctest outlived the tests:\n%s\n", leaked)
			code = 1
		}
	}
	os.Exit(code)
}

func TestSpecFilesLinesAndStdin(t *testing.T) {
	dir := t.TempDir()
	var files []*os.File
	for _, name := range []string{"first", "second", "third"} {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte("contents of "+name), 0o600); err != nil {
			t.Fatal(err)
		}
		f, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		files = append(files, f)
	}
	p := Start(t, Options{Role: "echo", Spec: map[string]string{"Greeting": "hello"}, Files: files})
	var rep echoReport
	p.Decode(&rep, 10*time.Second)
	want := echoReport{"hello", []string{"contents of first", "contents of second", "contents of third"}}
	if fmt.Sprint(rep) != fmt.Sprint(want) {
		t.Fatalf("the child reported %+v, want %+v", rep, want)
	}
	for _, s := range []string{"one", "two"} {
		if err := p.Send(s); err != nil {
			t.Fatal(err)
		}
		p.Expect("echo: "+s, 10*time.Second)
	}
	if err := p.Send("a\nb"); err == nil {
		t.Error("Send took a line with a newline")
	}
	p.CloseStdin()
	if err := p.Wait(10 * time.Second); err != nil {
		t.Fatalf("the child ended with %v, want status 0 at the end of its stdin", err)
	}
	if st := p.State(); st == nil || st.ExitCode() != 0 {
		t.Fatalf("State() = %v after the exit", st)
	}
}

// An error of EachLine's fn ends the role at once, with status 1.
func TestEachLineError(t *testing.T) {
	p := Start(t, Options{Role: "echo"})
	var rep echoReport
	p.Decode(&rep, 10*time.Second)
	for _, s := range []string{"one", "quit"} {
		if err := p.Send(s); err != nil {
			t.Fatal(err)
		}
	}
	p.Expect("echo: one", 10*time.Second)
	if err := p.Wait(10 * time.Second); err == nil || !strings.Contains(err.Error(), "exit status 1") {
		t.Fatalf("the child ended with %v, want exit status 1 at the line quit", err)
	}
}

// A barrier holds every child at Ready until Release, then lets all go.
func TestBarrier(t *testing.T) {
	b := NewBarrier(t)
	var procs []*Proc
	for range 3 {
		procs = append(procs, Start(t, Options{Role: "gate", Barrier: b}))
	}
	for _, p := range procs {
		p.WaitReady(10 * time.Second)
	}
	// Ready, and held: nothing more comes.
	for i, p := range procs {
		if line, err := p.Line(200 * time.Millisecond); err == nil || !strings.Contains(err.Error(), "no line within") {
			t.Fatalf("child %d before the release: %q %v, want no line", i, line, err)
		}
	}
	b.Release(10 * time.Second)
	for _, p := range procs {
		p.Expect("through", 10*time.Second)
		if err := p.Wait(10 * time.Second); err != nil {
			t.Fatal(err)
		}
	}

	// Release waits for the ready lines it has not seen.
	b2 := NewBarrier(t)
	p := Start(t, Options{Role: "gate", Barrier: b2})
	b2.Release(10 * time.Second)
	p.Expect("through", 10*time.Second)
}

// A child that is still running at the end of its test is killed and
// reaped; so are the goroutines that watched it (TestMain checks).
func TestCleanupKillsAndWaits(t *testing.T) {
	var pid int
	t.Run("child", func(t *testing.T) {
		p := Start(t, Options{Role: "sleep"})
		p.WaitReady(10 * time.Second)
		pid = p.Pid()
	})
	if pid == 0 {
		t.Fatal("no child")
	}
	if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Fatalf("the child %d of a finished test: kill -0 says %v, want no such process", pid, err)
	}
}

// Every way a wait for a line ends says why.
func TestLineErrors(t *testing.T) {
	cases := []struct {
		role, says string
	}{
		{"fail", "ended without a line: exit status 1"},
		{"silent", "ended without a line: exit status 0"},
		{"no such role", "ended without a line: exit status 2"},
		{"sleep", "no line within"},
	}
	for _, tc := range cases {
		t.Run(tc.role, func(t *testing.T) {
			p := Start(t, Options{Role: tc.role})
			if tc.role == "sleep" {
				p.WaitReady(10 * time.Second)
			}
			_, err := p.Line(2 * time.Second)
			if err == nil || !strings.Contains(err.Error(), tc.says) || !strings.Contains(err.Error(), fmt.Sprint(p.Pid())) {
				t.Fatalf("Line: %v, want an error naming the pid and %q", err, tc.says)
			}
		})
	}
	t.Run("kill", func(t *testing.T) {
		p := Start(t, Options{Role: "sleep"})
		p.WaitReady(10 * time.Second)
		p.Kill()
		if ws, ok := p.State().Sys().(syscall.WaitStatus); !ok || ws.Signal() != syscall.SIGKILL {
			t.Fatalf("after Kill: %v", p.State())
		}
	})
}

func TestLogWaitFor(t *testing.T) {
	l := NewLog[string]()
	go func() {
		for _, s := range []string{"a", "b", "a", "c"} {
			time.Sleep(5 * time.Millisecond)
			l.Add(s)
		}
	}()
	is := func(want string) func(string) bool { return func(s string) bool { return s == want } }
	if i, s, ok := l.WaitFor(0, 10*time.Second, is("c")); !ok || i != 3 || s != "c" {
		t.Fatalf("WaitFor c: %d %q %v, want line 3", i, s, ok)
	}
	if i, _, ok := l.WaitFor(1, time.Second, is("a")); !ok || i != 2 {
		t.Fatalf("WaitFor a from 1: %d %v, want line 2", i, ok)
	}
	// match sees each line once, in order: it may count.
	seen := 0
	if i, _, ok := l.WaitFor(0, time.Second, func(s string) bool { seen++; return s == "a" && seen > 1 }); !ok || i != 2 || seen != 3 {
		t.Fatalf("the second a: line %d (%v) after %d calls of match, want line 2 after 3", i, ok, seen)
	}
	start := time.Now()
	if _, _, ok := l.WaitFor(0, 50*time.Millisecond, is("d")); ok {
		t.Fatal("found a line that was never added")
	}
	if d := time.Since(start); d < 50*time.Millisecond || d > 5*time.Second {
		t.Fatalf("a 50ms wait took %v", d)
	}
	if got := strings.Join(l.Lines(), ""); got != "abac" || l.Len() != 4 {
		t.Fatalf("Lines %q, Len %d", got, l.Len())
	}
	// At the end, a wait returns at once.
	go l.End()
	start = time.Now()
	if _, _, ok := l.WaitFor(0, 10*time.Second, is("d")); ok || time.Since(start) > 5*time.Second {
		t.Fatalf("a wait at the end: %v after %v", ok, time.Since(start))
	}
	if !l.Ended() || !l.WaitEnd(0) {
		t.Fatal("the log did not end")
	}
}

func TestLogFollow(t *testing.T) {
	l := NewLog[string]()
	w := l.Pipe(t, func(s string) (string, bool) { return strings.ToUpper(s), !strings.HasPrefix(s, "#") })
	io.WriteString(w, "one\n# a comment\ntwo\nno newline at the end")
	w.Close()
	if !l.WaitEnd(10 * time.Second) {
		t.Fatal("the log did not end with its stream")
	}
	if got := strings.Join(l.Lines(), "|"); got != "ONE|TWO|NO NEWLINE AT THE END" {
		t.Fatalf("lines %q", got)
	}

	// Stop ends a follower whose stream is still open.
	l2 := NewLog[string]()
	w2 := l2.Pipe(t, Text)
	defer w2.Close()
	io.WriteString(w2, "x\n")
	if _, _, ok := l2.WaitFor(0, 10*time.Second, func(s string) bool { return s == "x" }); !ok {
		t.Fatal("no line x")
	}
	if !l2.Stop(5*time.Second) || !l2.Ended() {
		t.Fatal("Stop did not end the follower")
	}
	if !l2.Stop(time.Second) {
		t.Fatal("a second Stop failed")
	}
}

// Leaked finds a goroutine of this package's code that nobody stopped,
// and none once it is stopped.
func TestLeaked(t *testing.T) {
	l := NewLog[string]()
	w := l.Pipe(t, Text)
	defer w.Close()
	if leaked := Leaked("/internal/proctest/", 50*time.Millisecond); !strings.Contains(leaked, "proctest/log.go") {
		t.Fatalf("a following log's reader not reported:\n%s", leaked)
	}
	l.Stop(5 * time.Second)
	if leaked := Leaked("/internal/proctest/", 5*time.Second); leaked != "" {
		t.Fatalf("reported after it stopped:\n%s", leaked)
	}
}

// A copy of the test binary runs the same roles.
func TestExe(t *testing.T) {
	cp := filepath.Join(t.TempDir(), "copy.test")
	CopyExe(t, cp, nil)
	p := Start(t, Options{Role: "exe", Exe: cp})
	p.Expect(cp, 10*time.Second)
}
