package bench

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"testing"

	"github.com/preforkd/preforkd/bucket"
	"github.com/preforkd/preforkd/shm"
)

// The child role: the test binary re-executed with childEnv set runs
// runChild instead of the tests. Its inherited files are the region, the
// read end of the start pipe and the write end of the ready pipe.
const (
	childEnv          = "PREFORKD_BENCH_CHILD" // worker index
	childDecisionsEnv = "PREFORKD_BENCH_DECISIONS"
	childOffsetEnv    = "PREFORKD_BENCH_OFFSET" // first key index

	childRegionFD = 3
	childStartFD  = 4
	childReadyFD  = 5
)

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		if err := runChild(); err != nil {
			fmt.Fprintln(os.Stderr, "bench child:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// childReport is what a child prints on stdout when it is done.
type childReport struct {
	decisions, allowed, mallocs uint64
}

const childReportFormat = "decisions=%d allowed=%d mallocs=%d\n"

// runChild attaches the inherited region, joins its worker index, reports
// ready, waits for the start pipe to close, makes its decisions and reports.
func runChild() error {
	w, err := strconv.Atoi(os.Getenv(childEnv))
	if err != nil {
		return fmt.Errorf("%s: %w", childEnv, err)
	}
	n, err := strconv.Atoi(os.Getenv(childDecisionsEnv))
	if err != nil {
		return fmt.Errorf("%s: %w", childDecisionsEnv, err)
	}
	off, err := strconv.Atoi(os.Getenv(childOffsetEnv))
	if err != nil {
		return fmt.Errorf("%s: %w", childOffsetEnv, err)
	}
	r, err := shm.Attach(os.NewFile(childRegionFD, "region"))
	if err != nil {
		return err
	}
	defer r.Close()
	if err := r.Join(w); err != nil {
		return err
	}
	lim, err := bucket.NewLimiter(benchRule, r.Counters())
	if err != nil {
		return err
	}
	keys := visitOrder(makeKeys(numKeys)) // the parent warmed them in makeKeys order
	start, ready := os.NewFile(childStartFD, "start"), os.NewFile(childReadyFD, "ready")
	if _, err := ready.Write([]byte{1}); err != nil {
		return fmt.Errorf("reporting ready: %w", err)
	}
	ready.Close()
	if _, err := io.Copy(io.Discard, start); err != nil { // until the parent closes it
		return fmt.Errorf("waiting for the start: %w", err)
	}

	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	before := ms.Mallocs
	var allowed uint64
	for i := range n {
		if lim.Allow(keys[(off+i)%len(keys)], r.Now()).Allowed {
			allowed++
		}
	}
	runtime.ReadMemStats(&ms)
	_, err = fmt.Printf(childReportFormat, n, allowed, ms.Mallocs-before)
	return err
}

// fleet is a set of started children waiting for the start signal.
type fleet struct {
	cmds   []*exec.Cmd
	stdout []bytes.Buffer
	stderr []bytes.Buffer
	start  *os.File // write end; closing it starts every child
}

// launch starts procs children on r, splitting decisions between them, and
// returns once every one of them is ready (attached, joined, keys built).
// Each child's GOMAXPROCS is its share of the machine, as the supervisor
// sizes workers.
func launch(r *shm.Region, procs, decisions int) (_ *fleet, err error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	startR, startW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer startR.Close()
	readyR, readyW, err := os.Pipe()
	if err != nil {
		startW.Close()
		return nil, err
	}
	defer readyR.Close()
	defer readyW.Close() // ours: EOF on readyR once every child has exited

	f := &fleet{start: startW, stdout: make([]bytes.Buffer, procs), stderr: make([]bytes.Buffer, procs)}
	defer func() {
		if err != nil {
			f.kill()
		}
	}()
	gomaxprocs := max(1, runtime.NumCPU()/procs)
	for w := range procs {
		n := decisions / procs
		if w < decisions%procs {
			n++
		}
		cmd := exec.Command(exe, "-test.run=^$", "-test.bench=^$")
		cmd.Env = append(os.Environ(),
			childEnv+"="+strconv.Itoa(w),
			childDecisionsEnv+"="+strconv.Itoa(n),
			childOffsetEnv+"="+strconv.Itoa(w*numKeys/procs),
			"GOMAXPROCS="+strconv.Itoa(gomaxprocs),
		)
		cmd.ExtraFiles = []*os.File{r.File(), startR, readyW}
		cmd.Stdout, cmd.Stderr = &f.stdout[w], &f.stderr[w]
		if err := cmd.Start(); err != nil {
			return nil, fmt.Errorf("starting child %d: %w", w, err)
		}
		f.cmds = append(f.cmds, cmd)
	}
	readyW.Close()
	if _, err := io.ReadFull(readyR, make([]byte, procs)); err != nil {
		return nil, fmt.Errorf("waiting for %d children to be ready: %w", procs, err)
	}
	return f, nil
}

// release starts every child at once.
func (f *fleet) release() { f.start.Close() }

// wait waits for every child and sums their reports.
func (f *fleet) wait() (childReport, error) {
	var sum childReport
	var errs []error
	for w, cmd := range f.cmds {
		if err := cmd.Wait(); err != nil {
			errs = append(errs, fmt.Errorf("child %d: %w: %s", w, err, bytes.TrimSpace(f.stderr[w].Bytes())))
			continue
		}
		var rep childReport
		if _, err := fmt.Sscanf(f.stdout[w].String(), childReportFormat, &rep.decisions, &rep.allowed, &rep.mallocs); err != nil {
			errs = append(errs, fmt.Errorf("child %d: report %q: %w", w, f.stdout[w].String(), err))
			continue
		}
		sum.decisions += rep.decisions
		sum.allowed += rep.allowed
		sum.mallocs += rep.mallocs
	}
	return sum, errors.Join(errs...)
}

// kill stops the children of a launch that failed.
func (f *fleet) kill() {
	f.start.Close()
	for _, cmd := range f.cmds {
		cmd.Process.Kill()
		cmd.Wait()
	}
}

// warmRegion makes a region and installs every key in it from this process,
// joined as the last worker index (the children take 0, 1, …).
func warmRegion(tb testing.TB) *shm.Region {
	r, err := shm.Create(shm.Options{Counters: numSlots})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { r.Close() })
	if err := r.Join(r.Geometry().MaxWorkers - 1); err != nil {
		tb.Fatal(err)
	}
	lim, err := bucket.NewLimiter(benchRule, r.Counters())
	if err != nil {
		tb.Fatal(err)
	}
	for _, k := range makeKeys(numKeys) {
		lim.Allow(k, r.Now())
	}
	return r
}

// BenchmarkMultiProcess measures the aggregate rate of procs processes
// deciding on one region: b.N decisions split between them, timed from the
// start signal to the last exit, so ns/op is wall time per decision of the
// whole fleet (procs=2 at half of procs=1 is perfect scaling). The process
// start-up is not timed; their exit is. allocs/op counts this process only;
// child-allocs/op is what the children allocated between start and finish.
func BenchmarkMultiProcess(b *testing.B) {
	for _, procs := range []int{1, 2} {
		b.Run(fmt.Sprintf("procs=%d", procs), func(b *testing.B) {
			r := warmRegion(b)
			f, err := launch(r, procs, b.N)
			if err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			b.ResetTimer()
			f.release()
			rep, err := f.wait()
			b.StopTimer()
			if err != nil {
				b.Fatal(err)
			}
			if rep.decisions != uint64(b.N) {
				b.Fatalf("children made %d decisions, want %d", rep.decisions, b.N)
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "decisions/s")
			b.ReportMetric(float64(rep.mallocs)/float64(b.N), "child-allocs/op")
			b.ReportMetric(float64(rep.allowed)/float64(b.N), "allowed/op")
		})
	}
}

// TestMultiProcess runs the benchmark's machinery once, small: two children
// on one region make every decision they were given, all allowed (the bench
// rule never refuses at this rate), without allocating per decision.
func TestMultiProcess(t *testing.T) {
	r := warmRegion(t)
	f, err := launch(r, 2, 2*numKeys+1)
	if err != nil {
		t.Fatal(err)
	}
	f.release()
	rep, err := f.wait()
	if err != nil {
		t.Fatal(err)
	}
	if want := uint64(2*numKeys + 1); rep.decisions != want || rep.allowed != want {
		t.Errorf("children made %d decisions, %d allowed; want %d, all allowed", rep.decisions, rep.allowed, want)
	}
	// A handful of one-time runtime allocations may happen (a goroutine's
	// first time.Sleep allocates its timer, and shm sleeps when it waits
	// for an insert lock); one per decision may not.
	if rep.mallocs > 4 {
		t.Errorf("children allocated %d times in %d decisions, want none per decision", rep.mallocs, rep.decisions)
	}
}
