// Package bench holds the side-by-side benchmarks: one rate-limit
// decision made by preforkd's shared-memory table (shm + bucket) beside the
// alternatives it replaces, in one run, so that the ratios hold on a noisy
// machine.
//
// The package has no API; everything is in its _test files:
//
//   - BenchmarkCheck/{shm,mutexmap,redis,sqlite}: one GCRA decision per op,
//     reading the clock included, over 10,000 keys.
//   - BenchmarkCheckParallel/...: the same under testing.B.RunParallel.
//   - BenchmarkMultiProcess/procs={1,2}: aggregate decisions per second of
//     separate processes (re-executions of the test binary) on one region.
//
// The one call most users want is bench/bench.sh (what `make bench` runs),
// which records the raw output and prints the summary table of
// bench/cmd/benchsummary with the target ratios. README.md in this directory
// says what each benchmark measures and records a run.
//
// # Limits
//
// The Redis comparison starts a throwaway redis-server on a free loopback
// port. Without the binary it is skipped with a message, and fails when
// the environment variable CI is set (CI installs it). Benchmarks are
// never asserted: a timed test fails on a busy machine for no reason. The
// tests in this package check only that each backend decides correctly,
// that the shared-memory path does not allocate, and that the
// multi-process machinery runs (TestMultiProcess).
package bench
