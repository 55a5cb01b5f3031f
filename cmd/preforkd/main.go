// Command preforkd is a prefork reverse proxy whose workers share their
// rate-limit counters in one shared-memory region. See the README.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
)

// Exit codes (README "Command line").
const (
	exitOK      = 0
	exitRuntime = 1
	exitUsage   = 2
)

func main() {
	os.Exit(run(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
}

// command is one subcommand of preforkd.
type command struct {
	name     string
	synopsis string // its arguments, as the usage shows them
	summary  string // one line
	// setup defines the command's flags on fs and returns what runs the
	// command once they are parsed, with the arguments left after them.
	setup func(fs *flag.FlagSet) func(ctx context.Context, args []string, stdout, stderr io.Writer) error
}

// commands returns every subcommand, in the order the usage lists them.
func commands() []*command {
	return []*command{
		{"run", "-config FILE [-listen ADDR] [-workers N] [-upstream URL] [-shadow] [-log-format FORMAT] [-log-level LEVEL]",
			"run the supervisor and its workers; flags override the file, also at every reload", setupRun},
		{"check", "-config FILE",
			"validate the file and print the effective configuration; exit 2 on error", setupCheck},
		{"inspect", "FILE",
			"describe a dump or a live region (header, guards, occupancy); exit 1 if a load would refuse it", setupInspect},
		{"health", "[-admin ADDR] [-timeout D]",
			"ask a running instance's /readyz; exit 0 when it serves, 1 otherwise (a container's HEALTHCHECK)", setupHealth},
		{"tune", "-admin ADDR [-upstream URL] [-upstream-pid PID] [-path PATH] [-requests N]",
			"advise on table sizes and workers of a running instance, with the evidence and what was not measured", setupTune},
		{"example-config", "",
			"print an example configuration that documents every key, to start from", setupExampleConfig},
		{"version", "",
			"print the version, the commit, the dump format and the region layout versions (also: preforkd -version)", setupVersion},
		{"help", "[COMMAND]",
			"print this usage, or a command's usage and flags", setupHelp},
	}
}

func findCommand(name string) *command {
	for _, c := range commands() {
		if c.name == name {
			return c
		}
	}
	return nil
}

// usageError is a command-line mistake: exit 2 after printing it with the
// usage (of the command, when there is one).
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

// configError is a bad configuration: exit 2.
type configError struct{ err error }

func (e *configError) Error() string { return e.err.Error() }
func (e *configError) Unwrap() error { return e.err }

// keyError is what the daemon itself found wrong with the value of a key
// (a file it reads, a directory it writes to): atKey places it at the
// key's line, as the configuration's own problems are.
type keyError struct {
	key string // dotted: "admin.token_file"
	err error
}

func (e *keyError) Error() string { return e.err.Error() }
func (e *keyError) Unwrap() error { return e.err }

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	c, err := dispatch(ctx, args, stdout, stderr)
	var ue *usageError
	var ce *configError
	var nr *notReadyError
	switch {
	case err == nil:
		return exitOK
	case errors.As(err, &nr):
		fmt.Fprintf(stderr, "preforkd %v\n", nr)
		return exitRuntime
	case errors.As(err, &ue):
		if c == nil {
			fmt.Fprintf(stderr, "preforkd: %v\n\n", ue)
			writeUsage(stderr)
		} else {
			fmt.Fprintf(stderr, "preforkd %s: %v\n\n", c.name, ue)
			writeCommandUsage(stderr, c)
		}
		return exitUsage
	case errors.As(err, &ce):
		fmt.Fprintf(stderr, "preforkd: %v\n", ce.err)
		return exitUsage
	default:
		fmt.Fprintf(stderr, "preforkd: %v\n", err)
		return exitRuntime
	}
}

// dispatch runs the command args name; it returns that command (nil when
// there is none) with its error.
func dispatch(ctx context.Context, args []string, stdout, stderr io.Writer) (*command, error) {
	if len(args) == 0 {
		return nil, &usageError{"no command"}
	}
	name, rest := args[0], args[1:]
	switch name {
	case "-h", "-help", "--help":
		writeUsage(stdout)
		return nil, nil
	case "-version", "--version":
		return nil, runVersion(rest, stdout)
	}
	c := findCommand(name)
	if c == nil {
		if strings.HasPrefix(name, "-") {
			return nil, &usageError{fmt.Sprintf("unknown flag %s: flags come after the command", name)}
		}
		return nil, &usageError{fmt.Sprintf("unknown command %q", name)}
	}
	fs := commandFlags(c)
	runCommand := c.setup(fs)
	if err := fs.Parse(rest); err != nil {
		if errors.Is(err, flag.ErrHelp) { // -h: the usage asked for, on stdout
			writeCommandUsage(stdout, c)
			return c, nil
		}
		return c, &usageError{err.Error()}
	}
	return c, runCommand(ctx, fs.Args(), stdout, stderr)
}

// commandFlags is an empty flag set for c. It prints nothing itself:
// dispatch reports a bad flag once, with c's usage.
func commandFlags(c *command) *flag.FlagSet {
	fs := flag.NewFlagSet("preforkd "+c.name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	return fs
}

func writeUsage(w io.Writer) {
	fmt.Fprintf(w, "usage:\n")
	for _, c := range commands() {
		fmt.Fprintf(w, "  %s\n    \t%s\n", strings.TrimSpace("preforkd "+c.name+" "+c.synopsis), c.summary)
	}
	fmt.Fprint(w, `
preforkd help COMMAND shows a command's flags; preforkd -version its version.
Exit codes: 0 ok, 1 runtime failure (inspect: the file would be refused),
2 usage or configuration error.
`)
}

func writeCommandUsage(w io.Writer, c *command) {
	fmt.Fprintf(w, "usage: %s\n\n%s\n", strings.TrimSpace("preforkd "+c.name+" "+c.synopsis), upperFirst(c.summary)+".")
	fs := commandFlags(c)
	c.setup(fs)
	n := 0
	fs.VisitAll(func(*flag.Flag) { n++ })
	if n > 0 {
		fmt.Fprintf(w, "\nflags:\n")
		fs.SetOutput(w)
		fs.PrintDefaults()
	}
}

func upperFirst(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}

// noArgs is for the commands that take no argument.
func noArgs(args []string) error {
	if len(args) > 0 {
		return &usageError{fmt.Sprintf("unexpected argument %q", args[0])}
	}
	return nil
}

func setupHelp(*flag.FlagSet) func(context.Context, []string, io.Writer, io.Writer) error {
	return func(_ context.Context, args []string, stdout, _ io.Writer) error {
		switch len(args) {
		case 0:
			writeUsage(stdout)
			return nil
		case 1:
			c := findCommand(args[0])
			if c == nil {
				return &usageError{fmt.Sprintf("unknown command %q", args[0])}
			}
			writeCommandUsage(stdout, c)
			return nil
		}
		return &usageError{fmt.Sprintf("unexpected argument %q", args[1])}
	}
}
