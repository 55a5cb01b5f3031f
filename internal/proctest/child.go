package proctest

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
)

// Role is what a child does. Its error ends the child with status 1 and
// the error on stderr; nil ends it with status 0.
type Role func(c *Child) error

// readyLine is what Child.Ready says.
const readyLine = "ready"

// Main runs the role this process was started in by [Start], and exits.
// In any other process (the test itself) it returns at once. TestMain
// calls it first, before anything a child must not do.
func Main(roles map[string]Role) {
	js, ok := os.LookupEnv(envChild)
	if !ok {
		return
	}
	os.Unsetenv(envChild)
	var env childEnv
	if err := json.Unmarshal([]byte(js), &env); err != nil {
		fmt.Fprintf(os.Stderr, "proctest: %s: %v\n", envChild, err)
		os.Exit(2)
	}
	role, ok := roles[env.Role]
	if !ok {
		fmt.Fprintf(os.Stderr, "proctest: no role %q in this test binary\n", env.Role)
		os.Exit(2)
	}
	c := &Child{env: env, in: bufio.NewReader(os.Stdin)}
	if err := role(c); err != nil {
		fmt.Fprintf(os.Stderr, "proctest: role %s: %v\n", env.Role, err)
		os.Exit(1)
	}
	os.Exit(0)
}

// Child is the test binary running a role: what [Start] gave it, and its
// lines to the test.
type Child struct {
	env childEnv
	in  *bufio.Reader
	mu  sync.Mutex // one line at a time on stdout
}

// Spec decodes the role's spec ([Options.Spec]) into v.
func (c *Child) Spec(v any) error {
	if err := json.Unmarshal(c.env.Spec, v); err != nil {
		return fmt.Errorf("proctest: the spec of role %s: %w", c.env.Role, err)
	}
	return nil
}

// File returns inherited file i (fd 3+i: [Options.Files][i]), or nil if
// there is no such file.
func (c *Child) File(i int) *os.File {
	if i < 0 || i >= c.env.Files {
		return nil
	}
	return os.NewFile(uintptr(3+i), fmt.Sprintf("proctest file %d", i))
}

// Say writes one line to the test ([Proc.Line]): format as in fmt.Printf,
// without the newline. Lines of concurrent calls do not mix.
func (c *Child) Say(format string, args ...any) error {
	line := fmt.Sprintf(format, args...)
	if strings.Contains(line, "\n") {
		return fmt.Errorf("proctest: a line with a newline: %q", line)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	_, err := os.Stdout.WriteString(line + "\n")
	return err
}

// Report writes v as one line of JSON ([Proc.Decode]).
func (c *Child) Report(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("proctest: report: %w", err)
	}
	return c.Say("%s", b)
}

// Ready tells the test the child is ready ([Proc.WaitReady]) and, with a
// [Barrier], returns once the test releases it.
func (c *Child) Ready() error {
	if err := c.Say(readyLine); err != nil {
		return err
	}
	if c.env.Barrier == 0 {
		return nil
	}
	b := os.NewFile(uintptr(c.env.Barrier), "proctest barrier")
	defer b.Close()
	if _, err := io.Copy(io.Discard, b); err != nil { // EOF: released
		return fmt.Errorf("proctest: waiting at the barrier: %w", err)
	}
	return nil
}

// ReadLine returns the next line the test sent ([Proc.Send]), without its
// newline; io.EOF once the test closed the child's stdin (or ended).
func (c *Child) ReadLine() (string, error) {
	s, err := c.in.ReadString('\n')
	if err != nil {
		if err == io.EOF && s != "" {
			return s, nil
		}
		return "", err
	}
	return strings.TrimSuffix(s, "\n"), nil
}

// EachLine calls fn with each line the test sends, in order, until the
// test closes the child's stdin (or ends): then it returns nil. fn's
// error, or an error reading, ends it at once and is returned.
func (c *Child) EachLine(fn func(line string) error) error {
	for {
		line, err := c.ReadLine()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		if err := fn(line); err != nil {
			return err
		}
	}
}
