package main

import (
	"bytes"
	"os"
	"strings"
	"testing"
)

func parseFile(t *testing.T, path string) *Report {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rep, err := Parse(f)
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

func verdict(t *testing.T, rep *Report, label string) Verdict {
	t.Helper()
	for _, v := range Judge(rep) {
		if v.Label == label {
			return v
		}
	}
	t.Fatalf("no verdict %q", label)
	return Verdict{}
}

// testdata/check.txt is a recorded `go test ./bench/ -bench . -benchmem`
// (on a machine loaded by other work, hence the odd numbers).
func TestParseRecordedRun(t *testing.T) {
	rep := parseFile(t, "testdata/check.txt")
	if got, want := len(rep.Results), 10; got != want {
		t.Fatalf("%d results, want %d", got, want)
	}
	cases := []struct {
		name, unit string
		want       float64
	}{
		{"BenchmarkCheck/shm", "ns/op", 5068},
		{"BenchmarkCheck/shm", "allocs/op", 0},
		{"BenchmarkCheck/redis", "allocs/op", 11},
		{"BenchmarkCheck/sqlite", "B/op", 712},
		{"BenchmarkCheckParallel/sqlite", "ns/op", 353915},
		{"BenchmarkMultiProcess/procs=2", "decisions/s", 392515},
		{"BenchmarkMultiProcess/procs=2", "child-allocs/op", 0},
		{"BenchmarkMultiProcess/procs=1", "ns/op", 8249},
	}
	for _, c := range cases {
		got, ok := metric(rep, c.name, c.unit)
		if !ok || got != c.want {
			t.Errorf("%s %s = %v (found %v), want %v", c.name, c.unit, got, ok, c.want)
		}
	}
	if res, _ := rep.Lookup("BenchmarkCheck/shm"); res.Pkg != "github.com/preforkd/preforkd/bench" || res.Runs != 1 {
		t.Errorf("Check/shm: pkg %q, runs %d", res.Pkg, res.Runs)
	}

	// The ratios, worked by hand from the file.
	if v := verdict(t, rep, "shm ÷ mutexmap, serial"); v.Status != "MISSED" || !near(v.Value, 5068.0/1175) {
		t.Errorf("shm ÷ mutexmap serial: %+v", v)
	}
	if v := verdict(t, rep, "sqlite ÷ shm, parallel"); v.Status != "met" || !near(v.Value, 353915.0/2166) {
		t.Errorf("sqlite ÷ shm parallel: %+v", v)
	}
	if v := verdict(t, rep, "redis ÷ shm, serial"); v.Status != "MISSED" || !near(v.Value, 224651.0/5068) {
		t.Errorf("redis ÷ shm serial: %+v", v)
	}
	if v := verdict(t, rep, "2 processes ÷ 1, throughput"); v.Status != "met" || !near(v.Value, 392515.0/121226) {
		t.Errorf("procs: %+v", v)
	}
}

func near(a, b float64) bool { return a > b*0.9999 && a < b*1.0001 }

// testdata/skip-verbose.txt is a recorded -v run without redis-server in
// PATH: -v is what prints a skipped benchmark's message, before its
// "--- SKIP" line.
func TestParseSkippedRedis(t *testing.T) {
	rep := parseFile(t, "testdata/skip-verbose.txt")
	if len(rep.Results) != 2 {
		t.Fatalf("results %+v, want Check/shm and CheckParallel/shm", rep.Results)
	}
	if why, ok := rep.skipped("BenchmarkCheck/redis"); !ok || !strings.HasPrefix(why, "no redis-server in PATH") {
		t.Errorf("Check/redis skip = %q, %v", why, ok)
	}
	v := verdict(t, rep, "redis ÷ shm, serial")
	if !strings.Contains(v.Status, "skipped: no redis-server in PATH") {
		t.Errorf("redis verdict %q, want it to say the row was skipped and why", v.Status)
	}
	if v := verdict(t, rep, "sqlite ÷ shm, serial"); v.Status != "n/a: no Check/sqlite row" {
		t.Errorf("sqlite verdict %q", v.Status)
	}
	for _, v := range Judge(rep) {
		if strings.HasPrefix(v.Label, "2 processes") {
			t.Errorf("a target with neither row is judged: %+v", v)
		}
	}
	var out bytes.Buffer
	if err := Write(&out, rep); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "Check/redis") || !strings.Contains(out.String(), "skipped") {
		t.Errorf("table does not list the skipped row:\n%s", out.String())
	}
}

// Output of several packages, -count 3, rows this tool has no target for
// (later benchmarks), a non-default GOMAXPROCS suffix, and a failure.
const mixed = `# nproc: 2
goos: linux
goarch: amd64
pkg: github.com/preforkd/preforkd/bench
cpu: AMD EPYC
BenchmarkCheck/shm-8         	20000000	        60.0 ns/op	       0 B/op	       0 allocs/op
BenchmarkCheck/shm-8         	20000000	        40.0 ns/op	       0 B/op	       0 allocs/op
BenchmarkCheck/shm-8         	20000000	        50.0 ns/op	       0 B/op	       1 allocs/op
BenchmarkCheck/mutexmap-8    	10000000	       100.0 ns/op	       0 B/op	       0 allocs/op
BenchmarkMultiProcess/procs=2-8 	 1000000	       30.0 ns/op	  33333333 decisions/s
    multiprocess_test.go:210: a log line
--- FAIL: BenchmarkMultiProcess/procs=1
PASS
ok  	github.com/preforkd/preforkd/bench	12.3s
pkg: github.com/preforkd/preforkd/persist
BenchmarkDump/slots=1048576/occupancy=1%-8   	     100	  10000000 ns/op	 104.86 MB/s	  512 B/op	       3 allocs/op
BenchmarkLoad/slots=1048576/occupancy=100%-8 	      10	 100000000 ns/op	   2 allocs/op
ok  	github.com/preforkd/preforkd/persist	5.0s
`

func TestParseMixed(t *testing.T) {
	rep, err := Parse(strings.NewReader(mixed))
	if err != nil {
		t.Fatal(err)
	}
	shm, ok := rep.Lookup("BenchmarkCheck/shm")
	if !ok || shm.Runs != 3 || shm.Metrics["ns/op"] != 50 || shm.Metrics["allocs/op"] != 0 {
		t.Errorf("Check/shm = %+v, want the medians of 3 runs: 50 ns/op, 0 allocs/op", shm)
	}
	dump, ok := rep.Lookup("BenchmarkDump/slots=1048576/occupancy=1%")
	if !ok || dump.Pkg != "github.com/preforkd/preforkd/persist" || dump.Metrics["MB/s"] != 104.86 {
		t.Errorf("Dump = %+v", dump)
	}
	if _, ok := rep.Lookup("BenchmarkLoad/slots=1048576/occupancy=100%"); !ok {
		t.Error("Load row missing")
	}
	if v := verdict(t, rep, "shm ÷ mutexmap, serial"); v.Status != "met" || v.Value != 0.5 {
		t.Errorf("shm ÷ mutexmap: %+v", v)
	}
	if v := verdict(t, rep, "2 processes ÷ 1, throughput"); v.Status != "n/a: no MultiProcess/procs=1 row" {
		t.Errorf("procs: %+v", v)
	}
	if len(rep.Context) == 0 || rep.Context[0] != "# nproc: 2" {
		t.Errorf("context = %q", rep.Context)
	}
	var out bytes.Buffer
	if err := Write(&out, rep); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"Dump/slots=1048576/occupancy=1%", "104.9 MB/s", "shm ÷ mutexmap, serial"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, out.String())
		}
	}
}

func TestParseRejectsNothing(t *testing.T) {
	rep, err := Parse(strings.NewReader("garbage\nBenchmarkX\nBenchmarkY 12 abc ns/op\n"))
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Results) != 0 || len(Judge(rep)) != 0 {
		t.Errorf("results from garbage: %+v", rep)
	}
}

func TestZeroAlloc(t *testing.T) {
	rep, err := Parse(strings.NewReader(`BenchmarkCheck/shm-2  100  50 ns/op  0 B/op  1 allocs/op
BenchmarkMultiProcess/procs=2-2  1000000  30 ns/op  0.0000022 child-allocs/op
BenchmarkMultiProcess/procs=1-2  1000000  60 ns/op  0.5 child-allocs/op
`))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"Check/shm allocs/op":                  "MISSED",
		"MultiProcess/procs=2 child-allocs/op": "met", // one-time runtime allocations
		"MultiProcess/procs=1 child-allocs/op": "MISSED",
	}
	got := judgeZero(rep)
	if len(got) != len(want) {
		t.Fatalf("verdicts %+v, want %d", got, len(want))
	}
	for _, z := range got {
		if want[z.label] != z.status {
			t.Errorf("%s: %s, want %s", z.label, z.status, want[z.label])
		}
	}
}
