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
)

// Set by the build (see the Makefile).
var (
	version = "dev"
	commit  = "none"
)

// Exit codes (README "Command line").
const (
	exitOK      = 0
	exitRuntime = 1
	exitUsage   = 2
)

const usage = `usage:
  preforkd run     -config FILE [-listen ADDR] [-workers N] [-upstream URL]
  preforkd check   -config FILE     validate; print the effective rules
  preforkd inspect FILE             a dump or a live region: header, guards, occupancy
  preforkd version                  version, commit, dump format version
`

func main() {
	os.Exit(run(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
}

// usageError is a command-line mistake: exit 2 after printing it.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	err := dispatch(ctx, args, stdout, stderr)
	var ue *usageError
	var ce *configError
	switch {
	case err == nil:
		return exitOK
	case errors.Is(err, flag.ErrHelp):
		return exitOK // -h: the flag package printed the usage asked for
	case errors.As(err, &ue):
		fmt.Fprintf(stderr, "preforkd: %v\n%s", err, usage)
		return exitUsage
	case errors.As(err, &ce):
		fmt.Fprintf(stderr, "preforkd: %v\n", ce.err)
		return exitUsage
	default:
		fmt.Fprintf(stderr, "preforkd: %v\n", err)
		return exitRuntime
	}
}

func dispatch(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return &usageError{"no command"}
	}
	cmd, rest := args[0], args[1:]
	switch cmd {
	case "run":
		return cmdRun(ctx, rest, stderr)
	case "check":
		return cmdCheck(rest, stdout, stderr)
	case "inspect":
		return cmdInspect(rest, stdout, stderr)
	case "version":
		return cmdVersion(rest, stdout)
	case "help", "-h", "-help", "--help":
		fmt.Fprint(stdout, usage)
		return nil
	}
	return &usageError{fmt.Sprintf("unknown command %q", cmd)}
}

// configError is a bad configuration: exit 2.
type configError struct{ err error }

func (e *configError) Error() string { return e.err.Error() }
func (e *configError) Unwrap() error { return e.err }

func newFlags(name string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("preforkd "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	return fs
}

// parseFlags parses and refuses stray arguments.
func parseFlags(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return &usageError{err.Error()}
	}
	if fs.NArg() > 0 {
		return &usageError{fmt.Sprintf("unexpected argument %q", fs.Arg(0))}
	}
	return nil
}
