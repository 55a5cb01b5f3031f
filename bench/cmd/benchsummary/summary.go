package main

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
)

// Result is one benchmark's numbers: the median of its rows when it ran
// more than once (-count).
type Result struct {
	Pkg     string             // import path from the preceding "pkg:" line
	Name    string             // "BenchmarkCheck/shm", without the -GOMAXPROCS suffix
	Runs    int                // rows merged
	Metrics map[string]float64 // unit → value: "ns/op", "allocs/op", "decisions/s", …
}

// Skip is a benchmark that reported --- SKIP, with the first line of its
// message.
type Skip struct {
	Name   string
	Reason string
}

// Report is everything read from one `go test -bench` output.
type Report struct {
	Results []Result // in order of first appearance
	Skips   []Skip
	Context []string // goos, goarch, cpu, and "# " lines of bench.sh
}

// Lookup returns the named result (the first one, across packages).
func (r *Report) Lookup(name string) (Result, bool) {
	for _, res := range r.Results {
		if res.Name == name {
			return res, true
		}
	}
	return Result{}, false
}

// skipped returns why name was skipped, if it was.
func (r *Report) skipped(name string) (string, bool) {
	for _, s := range r.Skips {
		if s.Name == name {
			return s.Reason, true
		}
	}
	return "", false
}

var procsSuffix = regexp.MustCompile(`-\d+$`)

// Parse reads `go test -bench` output. Lines it does not know (test logs,
// PASS, ok, other tools' output) are ignored, so output from several
// packages and later benchmarks can be piped in as it is.
func Parse(in io.Reader) (*Report, error) {
	rep := &Report{}
	rows := map[string][]map[string]float64{} // pkg\x00name → rows
	index := map[string]int{}                 // pkg\x00name → position in rep.Results
	pkg := ""
	lastLog := ""     // the latest indented log line since a benchmark's name
	pendingSkip := -1 // index of a SKIP whose message may be on the next line
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		line := sc.Text()
		trimmed := strings.TrimSpace(line)
		if pendingSkip >= 0 {
			if rep.Skips[pendingSkip].Reason == "" && trimmed != "" && line != trimmed {
				rep.Skips[pendingSkip].Reason = stripFileLine(trimmed)
				pendingSkip = -1
				continue
			}
			pendingSkip = -1
		}
		switch {
		case trimmed != "" && line != trimmed && !strings.HasPrefix(trimmed, "---"):
			lastLog = stripFileLine(trimmed) // -v prints a skip's message before "--- SKIP"
		case strings.HasPrefix(line, "pkg: "):
			pkg = strings.TrimPrefix(line, "pkg: ")
		case strings.HasPrefix(line, "goos: "), strings.HasPrefix(line, "goarch: "),
			strings.HasPrefix(line, "cpu: "), strings.HasPrefix(line, "# "):
			if !slices.Contains(rep.Context, line) {
				rep.Context = append(rep.Context, line)
			}
		case strings.HasPrefix(trimmed, "--- SKIP: Benchmark"):
			name := strings.Fields(strings.TrimPrefix(trimmed, "--- SKIP: "))[0]
			rep.Skips = append(rep.Skips, Skip{Name: procsSuffix.ReplaceAllString(name, ""), Reason: lastLog})
			pendingSkip = len(rep.Skips) - 1
			lastLog = ""
		case strings.HasPrefix(line, "Benchmark"):
			lastLog = ""
			name, metrics, ok := parseRow(line)
			if !ok {
				continue // a benchmark's log line, or a name printed before its numbers
			}
			key := pkg + "\x00" + name
			if _, seen := index[key]; !seen {
				index[key] = len(rep.Results)
				rep.Results = append(rep.Results, Result{Pkg: pkg, Name: name})
			}
			rows[key] = append(rows[key], metrics)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("benchsummary: reading: %w", err)
	}
	for key, i := range index {
		rep.Results[i].Runs = len(rows[key])
		rep.Results[i].Metrics = medians(rows[key])
	}
	return rep, nil
}

// parseRow parses "BenchmarkX/y-2  1000  45.3 ns/op  0 B/op  …".
func parseRow(line string) (name string, metrics map[string]float64, ok bool) {
	f := strings.Fields(line)
	if len(f) < 4 || len(f)%2 != 0 {
		return "", nil, false
	}
	if _, err := strconv.ParseInt(f[1], 10, 64); err != nil {
		return "", nil, false
	}
	metrics = map[string]float64{}
	for i := 2; i+1 < len(f); i += 2 {
		v, err := strconv.ParseFloat(f[i], 64)
		if err != nil {
			return "", nil, false
		}
		metrics[f[i+1]] = v
	}
	return procsSuffix.ReplaceAllString(f[0], ""), metrics, true
}

// stripFileLine drops the "file_test.go:42: " a test log line starts with.
func stripFileLine(s string) string {
	if i := strings.Index(s, ": "); i > 0 && strings.Contains(s[:i], ".go:") {
		return s[i+2:]
	}
	return s
}

// medians takes, for each unit, the median over the rows that have it.
func medians(rows []map[string]float64) map[string]float64 {
	byUnit := map[string][]float64{}
	for _, r := range rows {
		for unit, v := range r {
			byUnit[unit] = append(byUnit[unit], v)
		}
	}
	out := map[string]float64{}
	for unit, vs := range byUnit {
		slices.Sort(vs)
		n := len(vs)
		if n%2 == 1 {
			out[unit] = vs[n/2]
		} else {
			out[unit] = (vs[n/2-1] + vs[n/2]) / 2
		}
	}
	return out
}

// Target is one ratio the benchmarks are judged by:
// Num's metric ÷ Den's metric, compared with Bound.
type Target struct {
	Label  string
	Num    string // benchmark name
	Den    string
	Metric string  // unit, e.g. "ns/op"
	AtMost bool    // the ratio must be ≤ Bound (else ≥ Bound)
	Bound  float64 // e.g. 0.8
}

// Targets are the ratios the project aims for. For the same work, a ratio
// of ns/op is the inverse ratio of throughputs.
var Targets = []Target{
	{"shm ÷ mutexmap, serial", "BenchmarkCheck/shm", "BenchmarkCheck/mutexmap", "ns/op", true, 0.8},
	{"shm ÷ mutexmap, parallel", "BenchmarkCheckParallel/shm", "BenchmarkCheckParallel/mutexmap", "ns/op", true, 0.8},
	{"redis ÷ shm, serial", "BenchmarkCheck/redis", "BenchmarkCheck/shm", "ns/op", false, 300},
	{"redis ÷ shm, parallel", "BenchmarkCheckParallel/redis", "BenchmarkCheckParallel/shm", "ns/op", false, 300},
	{"sqlite ÷ shm, serial", "BenchmarkCheck/sqlite", "BenchmarkCheck/shm", "ns/op", false, 50},
	{"sqlite ÷ shm, parallel", "BenchmarkCheckParallel/sqlite", "BenchmarkCheckParallel/shm", "ns/op", false, 50},
	{"2 processes ÷ 1, throughput", "BenchmarkMultiProcess/procs=2", "BenchmarkMultiProcess/procs=1", "decisions/s", false, 1.6},
	// A dump while serving (persist.interval) does not stall the workers.
	{"decision p99, during dumps ÷ without", "BenchmarkDecideDuringDump/dump=continuous", "BenchmarkDecideDuringDump/dump=none", "p99-ns", true, 1.5},
}

// ZeroAlloc names the results whose metric must be 0: the shm hot path
// does not allocate. allocs/op is an integer (testing truncates it);
// child-allocs/op is exact, and a few one-time allocations of a child's
// runtime over millions of decisions (the timer of a goroutine's first
// time.Sleep) are not the hot path allocating: below zeroAllocBound per op
// counts as 0, and the table shows the value.
var ZeroAlloc = []struct{ Name, Metric string }{
	{"BenchmarkCheck/shm", "allocs/op"},
	{"BenchmarkCheckParallel/shm", "allocs/op"},
	{"BenchmarkMultiProcess/procs=1", "child-allocs/op"},
	{"BenchmarkMultiProcess/procs=2", "child-allocs/op"},
}

const zeroAllocBound = 0.01

// Verdict is a target judged against a report.
type Verdict struct {
	Target
	Value  float64
	Status string // "met", "MISSED", or why it could not be judged
}

// Judge evaluates every target that applies; a target whose rows are both
// absent is left out (another package's benchmarks were not run), one with
// a row missing says which and why.
func Judge(rep *Report) []Verdict {
	var out []Verdict
	for _, t := range Targets {
		num, okN := metric(rep, t.Num, t.Metric)
		den, okD := metric(rep, t.Den, t.Metric)
		v := Verdict{Target: t, Value: math.NaN()}
		switch {
		case !okN && !okD:
			continue
		case !okN:
			v.Status = rep.missing(t.Num)
		case !okD:
			v.Status = rep.missing(t.Den)
		case den == 0:
			v.Status = "n/a: " + t.Den + " is 0"
		default:
			v.Value = num / den
			if (t.AtMost && v.Value <= t.Bound) || (!t.AtMost && v.Value >= t.Bound) {
				v.Status = "met"
			} else {
				v.Status = "MISSED"
			}
		}
		out = append(out, v)
	}
	return out
}

func (r *Report) missing(name string) string {
	short := strings.TrimPrefix(name, "Benchmark")
	if why, ok := r.skipped(name); ok {
		if why == "" {
			return "n/a: " + short + " skipped"
		}
		return "n/a: " + short + " skipped: " + why
	}
	return "n/a: no " + short + " row"
}

func metric(rep *Report, name, unit string) (float64, bool) {
	res, ok := rep.Lookup(name)
	if !ok {
		return 0, false
	}
	v, ok := res.Metrics[unit]
	return v, ok
}

// Write prints the results table, the skips, and the verdicts.
func Write(w io.Writer, rep *Report) error {
	for _, c := range rep.Context {
		fmt.Fprintln(w, c)
	}
	if len(rep.Context) > 0 {
		fmt.Fprintln(w)
	}
	// Numbers are right-aligned by padding: tabwriter aligns every column alike.
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "benchmark\t%12s\t%9s\tother\n", "ns/op", "allocs/op")
	for _, res := range rep.Results {
		fmt.Fprintf(tw, "%s\t%12s\t%9s\t%s\n",
			strings.TrimPrefix(res.Name, "Benchmark"),
			number(res.Metrics, "ns/op"), number(res.Metrics, "allocs/op"), others(res.Metrics))
	}
	for _, s := range rep.Skips {
		if _, ran := rep.Lookup(s.Name); !ran {
			fmt.Fprintf(tw, "%s\t%12s\t%9s\t%s\n", strings.TrimPrefix(s.Name, "Benchmark"), "-", "-", "skipped: "+s.Reason)
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}

	verdicts := Judge(rep)
	zero := judgeZero(rep)
	if len(verdicts) == 0 && len(zero) == 0 {
		return nil
	}
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "target\tratio\twant\tverdict")
	for _, v := range verdicts {
		bound := strconv.FormatFloat(v.Bound, 'g', -1, 64) + "×"
		want := "≥ " + bound
		if v.AtMost {
			want = "≤ " + bound
		}
		got := "-"
		if !math.IsNaN(v.Value) {
			got = ratio(v.Value)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", v.Label, got, want, v.Status)
	}
	for _, z := range zero {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", z.label, z.got, "0 (< "+strconv.FormatFloat(zeroAllocBound, 'g', -1, 64)+")", z.status)
	}
	return tw.Flush()
}

type zeroVerdict struct{ label, got, status string }

func judgeZero(rep *Report) []zeroVerdict {
	var out []zeroVerdict
	for _, z := range ZeroAlloc {
		v, ok := metric(rep, z.Name, z.Metric)
		if !ok {
			continue
		}
		status := "met"
		if v >= zeroAllocBound {
			status = "MISSED"
		}
		label := strings.TrimPrefix(z.Name, "Benchmark") + " " + z.Metric
		out = append(out, zeroVerdict{label, strconv.FormatFloat(v, 'g', 4, 64), status})
	}
	return out
}

// number formats a metric: integers as they are, other values with at
// least three significant digits.
func number(m map[string]float64, unit string) string {
	v, ok := m[unit]
	if !ok {
		return "-"
	}
	switch a := math.Abs(v); {
	case v == math.Trunc(v) || a >= 1000:
		return strconv.FormatFloat(v, 'f', 0, 64)
	case a >= 100:
		return strconv.FormatFloat(v, 'f', 1, 64)
	case a >= 1:
		return strconv.FormatFloat(v, 'f', 2, 64)
	default:
		return strconv.FormatFloat(v, 'g', 3, 64)
	}
}

// others lists the metrics not in their own column, in a stable order.
func others(m map[string]float64) string {
	var units []string
	for u := range m {
		if u != "ns/op" && u != "allocs/op" {
			units = append(units, u)
		}
	}
	slices.Sort(units)
	parts := make([]string, len(units))
	for i, u := range units {
		parts[i] = number(m, u) + " " + u
	}
	return strings.Join(parts, "  ")
}

func ratio(v float64) string {
	switch {
	case v >= 100:
		return strconv.FormatFloat(v, 'f', 0, 64) + "×"
	case v >= 10:
		return strconv.FormatFloat(v, 'f', 1, 64) + "×"
	default:
		return strconv.FormatFloat(v, 'f', 2, 64) + "×"
	}
}
