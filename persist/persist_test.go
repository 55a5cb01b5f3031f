package persist

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/preforkd/preforkd/bucket"
	"github.com/preforkd/preforkd/shm"
)

// Fixed instants: region times and wall clocks.
var (
	t1    = 10 * time.Minute // region time of the decisions before the dump
	wall0 = time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
)

var (
	login = bucket.Rule{Name: "login", Limit: 1, Window: time.Hour}                                // GCRA
	api   = bucket.Rule{Name: "api", Limit: 2, Window: time.Minute, Algorithm: bucket.FixedWindow} // fixed window
	rules = []bucket.Rule{login, api}
)

func wallAt(t time.Time) func() time.Time { return func() time.Time { return t } }

// region makes a private region whose clock reads at least t1.
func region(t testing.TB, counters int) *shm.Region {
	t.Helper()
	r, err := shm.CreatePrivate(shm.Options{Counters: counters, MaxWorkers: 8})
	if err != nil {
		t.Fatal(err)
	}
	r.SetNow(t1)
	return r
}

func limiter(t testing.TB, r *shm.Region, rule bucket.Rule) *bucket.Limiter {
	t.Helper()
	if err := r.Join(1); err != nil {
		t.Fatal(err)
	}
	l, err := bucket.NewLimiter(rule, r.Counters())
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// exhaust makes client c reach its limit in both rules at t1 and returns
// the refusals.
func exhaust(t testing.TB, r *shm.Region, c string) (gcra, fixed bucket.Decision) {
	t.Helper()
	lg, la := limiter(t, r, login), limiter(t, r, api)
	if d := lg.Allow(c, t1); !d.Allowed {
		t.Fatalf("first login refused: %+v", d)
	}
	for i := 0; i < 2; i++ {
		if d := la.Allow(c, t1); !d.Allowed {
			t.Fatalf("api %d refused: %+v", i, d)
		}
	}
	gcra, fixed = lg.Allow(c, t1), la.Allow(c, t1)
	if gcra.Allowed || fixed.Allowed {
		t.Fatalf("not at the limit: %+v %+v", gcra, fixed)
	}
	return gcra, fixed
}

// logBuf is a logger whose lines a test reads back.
func logBuf() (*slog.Logger, *bytes.Buffer) {
	var b bytes.Buffer
	return slog.New(slog.NewTextHandler(&b, nil)), &b
}

func dumpTo(t testing.TB, r *shm.Region, o Options) DumpStats {
	t.Helper()
	st, err := Dump(r, o)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func TestRoundTrip(t *testing.T) {
	cases := []struct {
		name                  string
		down                  time.Duration // wall-clock time between dump and load
		credited              time.Duration // downtime the load may count
		gcraServed, winServed bool
	}{
		{"10s down", 10 * time.Second, 10 * time.Second, false, false},
		{"window rolled", 2 * time.Minute, 2 * time.Minute, false, true},
		{"bucket refilled", 2 * time.Hour, 2 * time.Hour, true, true},
		{"wall clock went back", -time.Hour, 0, false, false},
		// The wall clock was unset at the dump (1970): the downtime
		// counted is capped, so the region's times still fit its range
		// and the rules go on limiting (the new client below).
		{"56 years down", 56 * 365 * 24 * time.Hour, shm.MaxDowntime, true, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "dump")
			a := region(t, 64)
			gcra, fixed := exhaust(t, a, "10.0.0.1")
			st := dumpTo(t, a, Options{Path: path, Rules: rules, Now: wallAt(wall0), Build: "test"})
			if st.Entries != 2 {
				t.Fatalf("dumped %+v, want 2 entries", st)
			}

			b := region(t, 64)
			b.SetNow(0)
			log, lines := logBuf()
			rep, err := Load(b, Options{Path: path, Rules: rules, Now: wallAt(wall0.Add(tc.down))}, log)
			if err != nil {
				t.Fatal(err)
			}
			if !rep.Loaded || rep.Downtime != tc.credited || rep.RegionTime != st.RegionTime+tc.credited || rep.Build != "test" {
				t.Fatalf("report %+v, dump region time %v", rep, st.RegionTime)
			}
			if now := b.Now(); now < rep.RegionTime || now > rep.RegionTime+time.Second {
				t.Fatalf("region clock %v after a rebase to %v", now, rep.RegionTime)
			}
			if tc.down < 0 && !strings.Contains(lines.String(), "wall clock is behind") {
				t.Errorf("no log line for the backwards wall clock:\n%s", lines)
			}
			now := rep.RegionTime
			elapsed := now.Truncate(time.Microsecond) - t1
			lg, la := limiter(t, b, login), limiter(t, b, api)
			for _, c := range []struct {
				what   string
				d      bucket.Decision
				before bucket.Decision
				served bool
			}{
				{"gcra", lg.Allow("10.0.0.1", now), gcra, tc.gcraServed},
				{"fixed window", la.Allow("10.0.0.1", now), fixed, tc.winServed},
			} {
				if c.d.Allowed != c.served {
					t.Errorf("%s: allowed=%v after %v down, want %v (%+v)", c.what, c.d.Allowed, tc.down, c.served, c.d)
				}
				if !c.served && c.d.RetryAfter != c.before.RetryAfter-elapsed {
					t.Errorf("%s: RetryAfter %v, want %v − %v = %v", c.what, c.d.RetryAfter, c.before.RetryAfter, elapsed, c.before.RetryAfter-elapsed)
				}
			}
			if want := btoi(tc.gcraServed) + btoi(tc.winServed); rep.Dropped[DropExpired] != want || rep.Counters != 2-want {
				t.Errorf("restored %d, dropped %v; want %d expired", rep.Counters, rep.Dropped, want)
			}
			// Another client is untouched by any of it, and limited.
			if d := lg.Allow("10.0.0.2", now); !d.Allowed {
				t.Errorf("a new client was refused: %+v", d)
			}
			if d := lg.Allow("10.0.0.2", now); d.Allowed {
				t.Errorf("a new client's second request at once was allowed by a rule of 1 an hour: %+v", d)
			}
		})
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// goodDump writes a dump of a region where client c is limited by both
// rules, with extra clients, and returns its bytes.
func goodDump(t testing.TB, key string) []byte {
	t.Helper()
	a := region(t, 64)
	exhaust(t, a, "c")
	la := limiter(t, a, api)
	for i := 0; i < 5; i++ {
		la.Allow(fmt.Sprint("other", i), t1)
	}
	path := filepath.Join(t.TempDir(), "dump")
	dumpTo(t, a, Options{Path: path, Key: key, Rules: rules, Now: wallAt(wall0), Build: "v1"})
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func TestDumpConsumedAndMode(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "dump")
	a := region(t, 64)
	exhaust(t, a, "c")
	st := dumpTo(t, a, Options{Path: path, Rules: rules, Now: wallAt(wall0)})
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 || fi.Size() != st.Bytes {
		t.Fatalf("dump mode %v size %d, want 0600 and %d", fi.Mode().Perm(), fi.Size(), st.Bytes)
	}
	rep, err := Load(region(t, 64), Options{Path: path, Rules: rules, Now: wallAt(wall0)}, slog.New(slog.DiscardHandler))
	if err != nil || !rep.Loaded || rep.MovedTo != path+SuffixLoaded {
		t.Fatalf("load: %+v, %v", rep, err)
	}
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the dump is still there after a load: %v", err)
	}
	// A later boot (after a crash, say) finds nothing to restore.
	rep, err = Load(region(t, 64), Options{Path: path, Rules: rules}, slog.New(slog.DiscardHandler))
	if err != nil || rep.Found || rep.Loaded {
		t.Fatalf("second load: %+v, %v", rep, err)
	}
}

func TestCrashBeforeRename(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "dump")
	o := Options{Path: path, Rules: rules, Now: wallAt(wall0)}
	a := region(t, 64)
	exhaust(t, a, "first")
	dumpTo(t, a, o)
	old, _ := os.ReadFile(path)

	// The next shutdown crashes after writing its temporary file.
	exhaust(t, a, "second")
	tmp, _, err := writeTemp(a, o)
	if err != nil {
		t.Fatal(err)
	}
	if now, _ := os.ReadFile(path); !bytes.Equal(now, old) {
		t.Fatal("the previous dump changed before the rename")
	}
	b := region(t, 64)
	rep, err := Load(b, o, slog.New(slog.DiscardHandler))
	if err != nil || !rep.Loaded || rep.Counters != 2 {
		t.Fatalf("previous dump: %+v, %v", rep, err)
	}
	if d := limiter(t, b, login).Allow("second", rep.RegionTime); !d.Allowed {
		t.Fatal("state from the unrenamed temporary file was loaded")
	}
	if d := limiter(t, b, login).Allow("first", rep.RegionTime); d.Allowed {
		t.Fatal("state of the previous dump was lost")
	}
	// The next dump cleans up the stray temporary file of the process
	// that crashed, and leaves a living writer's alone (two supervisors
	// dump to one path during a binary upgrade).
	stray := filepath.Join(dir, fmt.Sprintf("dump.tmp-%d-1234", deadPID(t)))
	if err := os.Rename(tmp, stray); err != nil {
		t.Fatal(err)
	}
	legacy := filepath.Join(dir, "dump.tmp-5678") // named before writers' pids were
	os.WriteFile(legacy, nil, 0o600)
	living := filepath.Join(dir, fmt.Sprintf("dump.tmp-%d-99", os.Getppid()))
	os.WriteFile(living, nil, 0o600)
	dumpTo(t, a, o)
	for _, f := range []string{stray, legacy} {
		if _, err := os.Stat(f); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("stray temporary file %s left: %v", f, err)
		}
	}
	if err := os.Remove(living); err != nil {
		t.Fatalf("a living writer's temporary file was removed: %v", err)
	}
	left, _ := filepath.Glob(filepath.Join(dir, "*"))
	for _, f := range left {
		if b := filepath.Base(f); b != "dump" && b != "dump"+SuffixLoaded {
			t.Errorf("unexpected file %s", b)
		}
	}
}

// A temporary file named with this process's pid, and that no Dump of
// this process writes, was left by an earlier process that had the same
// pid (a container's pid 1, killed during a dump): the next dump removes
// it, rather than keeping one more file the size of a dump per crash.
func TestDumpRemovesTempOfEarlierProcessWithOwnPID(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "dump")
	stray := filepath.Join(dir, fmt.Sprintf("dump.tmp-%d-1234", os.Getpid()))
	if err := os.WriteFile(stray, []byte("torn"), 0o600); err != nil {
		t.Fatal(err)
	}
	a := region(t, 64)
	exhaust(t, a, "c")
	dumpTo(t, a, Options{Path: path, Rules: rules, Now: wallAt(wall0)})
	if _, err := os.Stat(stray); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("temporary file of an earlier process with this pid left: %v", err)
	}
}

// deadPID is the pid of a process that has exited.
func deadPID(t *testing.T) int {
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	return cmd.Process.Pid
}

// Two writers of one path (the old and the new supervisor of a binary
// upgrade, each with its periodic dumps) never spoil each other's dump.
func TestConcurrentDumpsToOnePath(t *testing.T) {
	path := filepath.Join(t.TempDir(), "dump")
	a := region(t, 4096)
	exhaust(t, a, "c")
	o := Options{Path: path, Rules: rules, Now: wallAt(wall0)}
	want := dumpTo(t, a, o).Entries
	errs := make(chan error, 2)
	for range 2 {
		go func() {
			for range 100 {
				if _, err := Dump(a, o); err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	b := region(t, 4096)
	if rep, err := Load(b, o, slog.New(slog.DiscardHandler)); err != nil || rep.Counters != want {
		t.Fatalf("the last dump: %+v, %v", rep, err)
	}
}

func TestSparse(t *testing.T) {
	r, err := shm.CreatePrivate(shm.Options{Counters: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	r.SetNow(t1)
	lg := limiter(t, r, login)
	for i := 0; i < 100; i++ {
		lg.Allow(fmt.Sprint("client", i), t1)
	}
	path := filepath.Join(t.TempDir(), "dump")
	st := dumpTo(t, r, Options{Path: path, Rules: rules})
	fi, _ := os.Stat(path)
	if st.Entries != 100 || fi.Size() > 100*entrySize+1024 {
		t.Fatalf("%d entries in %d bytes for a %d-slot table", st.Entries, fi.Size(), r.Counters().Len())
	}
}

func TestDumpSkipsExpiredAndUnowned(t *testing.T) {
	a := region(t, 64)
	a.SetNow(3 * time.Hour)
	lg := limiter(t, a, login)
	other := limiter(t, a, bucket.Rule{Name: "removed", Limit: 1, Window: time.Hour})
	other.Allow("x", 3*time.Hour)
	lg.Allow("new", 3*time.Hour)
	lg.Allow("old", time.Hour) // refilled by 2h; last, so that no slot is reclaimed for the others
	st := dumpTo(t, a, Options{Path: filepath.Join(t.TempDir(), "dump"), Rules: []bucket.Rule{login}})
	if st.Entries != 1 || st.Expired != 1 || st.Unowned != 1 {
		t.Fatalf("%+v, want 1 written, 1 expired, 1 unowned", st)
	}
}

func TestGeometryChange(t *testing.T) {
	for _, slots := range []int{16, 1024} {
		t.Run(fmt.Sprint(slots, " slots"), func(t *testing.T) {
			data := goodDump(t, "")
			path := filepath.Join(t.TempDir(), "dump")
			os.WriteFile(path, data, 0o600)
			b := region(t, slots)
			rep, err := Load(b, Options{Path: path, Rules: rules, Now: wallAt(wall0)}, slog.New(slog.DiscardHandler))
			if err != nil || !rep.Loaded || len(rep.Refused) != 0 || rep.Counters != 7 {
				t.Fatalf("%+v, %v", rep, err)
			}
			if d := limiter(t, b, login).Allow("c", rep.RegionTime); d.Allowed {
				t.Fatal("state lost across a geometry change")
			}
		})
	}
}

func TestRegionNotFresh(t *testing.T) {
	path := filepath.Join(t.TempDir(), "dump")
	os.WriteFile(path, goodDump(t, ""), 0o600)
	b := region(t, 64)
	limiter(t, b, login).Allow("busy", t1)
	_, err := Load(b, Options{Path: path, Rules: rules}, slog.New(slog.DiscardHandler))
	if !errors.Is(err, shm.ErrNotEmpty) {
		t.Fatalf("load into a used region: %v", err)
	}
	if _, err := os.Stat(path); err != nil {
		t.Fatal("a dump that was not loaded was consumed")
	}
}

func TestNoPath(t *testing.T) {
	r := region(t, 64)
	if st, err := Dump(r, Options{}); err != nil || st != (DumpStats{}) {
		t.Fatal(st, err)
	}
	if rep, err := Load(r, Options{}, nil); err != nil || rep.Found {
		t.Fatal(rep, err)
	}
}

func readFile(t testing.TB, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func writeFile(t testing.TB, path string, b []byte) {
	t.Helper()
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}
