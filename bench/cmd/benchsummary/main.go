// Command benchsummary reads `go test -bench` output on standard input and
// prints a table of the results and the ratios the benchmarks are
// judged by, each marked met or MISSED. Rows it does not know are listed
// and otherwise ignored; targets whose rows are missing (a skipped Redis,
// a package not run) say so instead of failing.
//
// Usage:
//
//	go test ./bench/ -run '^$' -bench . -benchmem | go run ./bench/cmd/benchsummary
//
// It exits 0 whatever the verdicts (performance is reported, not
// asserted) and 1 when it cannot read its input.
package main

import (
	"fmt"
	"os"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func run() error {
	rep, err := Parse(os.Stdin)
	if err != nil {
		return err
	}
	if len(rep.Results) == 0 && len(rep.Skips) == 0 {
		return fmt.Errorf("benchsummary: no benchmark results on standard input")
	}
	return Write(os.Stdout, rep)
}
