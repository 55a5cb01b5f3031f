package persist

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/preforkd/preforkd/internal/proctest"
	"github.com/preforkd/preforkd/shm"
)

var quiet = slog.New(slog.DiscardHandler)

func liveOptions(t *testing.T) Options {
	dir := t.TempDir()
	return Options{Live: filepath.Join(dir, "region"), Path: filepath.Join(dir, "dump"), Rules: rules}
}

// crashMidClaim leaves what a worker killed in the middle of installing a
// key leaves: a BUSY slot and the key's insert lock, owned by r's worker
// identity. A claim publishes BUSY, writes the key and only then runs the
// caller's op; an op that panics stops it there, as a kill would.
func crashMidClaim(t testing.TB, r *shm.Region) {
	t.Helper()
	defer func() {
		if recover() == nil {
			t.Fatal("the claim never ran its op")
		}
	}()
	tab := r.Counters()
	tab.Update(tab.KeyOfString(login.Namespace(), "crashed"), shm.Quota{Account: login.Account()}, login.Meta(), t1, func(uint64, time.Duration) (uint64, bool) {
		panic("killed")
	})
}

func TestLiveRegionSurvivesACrash(t *testing.T) {
	o := liveOptions(t)
	geo := shm.Options{Counters: 64, MaxWorkers: 8, Responses: 64, ResponseBytes: 64 << 10}
	r, lock, reattached, err := OpenRegion(o, geo, quiet)
	if err != nil || reattached || lock == nil {
		t.Fatalf("first open: reattached=%v lock=%v err=%v", reattached, lock, err)
	}
	r.SetNow(t1)
	gcra, _ := exhaust(t, r, "c")
	crashMidClaim(t, r) // as worker 1, incarnation 1
	if st := r.Counters().Stats(); st.Busy != 1 || st.Locked != 1 {
		t.Fatalf("crash state not set up: %+v", st)
	}
	// And a request in flight: a reservation of worker 1.
	var scratch shm.Response
	if out, _, err := r.Responses().Begin(kFlight, shm.Quota{}, shm.Quota{}, fp1, t1, &scratch); err != nil || out != shm.Reserved {
		t.Fatalf("reserve: %v %v", out, err)
	}

	// While the first supervisor holds the region, a second one is refused.
	_, _, _, err = OpenRegion(o, geo, quiet)
	if !errors.Is(err, ErrInUse) || !strings.Contains(err.Error(), o.Live) {
		t.Fatalf("second supervisor: %v", err)
	}

	// kill -9 of everything: no dump, the lock goes with the process.
	r.Close()
	lock.Unlock()
	// A dump older than the live region is there too; it must not win.
	os.WriteFile(o.Path, goodDump(t, ""), 0o600)

	log, lines := logBuf()
	r2, lock2, reattached, err := OpenRegion(o, geo, log)
	if err != nil || !reattached {
		t.Fatalf("re-open: reattached=%v err=%v", reattached, err)
	}
	defer lock2.Unlock()
	defer r2.Close()
	if st := r2.Counters().Stats(); st.Busy != 0 || st.Locked != 0 || st.Live != 2 {
		t.Fatalf("after re-attach: %+v", st)
	}
	if st := r2.Responses().Stats(); st.Reserved != 0 {
		t.Fatalf("reservation of a dead worker kept: %+v", st)
	}
	// The crashed claim's charge went with its slot: counts equal the table.
	if err := r2.Counters().VerifyAccounts(); err != nil {
		t.Fatal(err)
	}
	if err := r2.Responses().VerifyAccounts(); err != nil {
		t.Fatal(err)
	}
	if n := r2.Counters().Held(login.Account()); n != 1 {
		t.Fatalf("login holds %d slots after the crash, want 1", n)
	}
	if !strings.Contains(lines.String(), "released=3") {
		t.Errorf("release not logged:\n%s", lines)
	}
	if d := limiter(t, r2, login).Allow("c", t1); d.Allowed || d.RetryAfter != gcra.RetryAfter {
		t.Fatalf("count lost across the crash: %+v, want RetryAfter %v", d, gcra.RetryAfter)
	}
	if _, err := os.Stat(o.Path + SuffixSuperseded); err != nil {
		t.Fatalf("the older dump was not set aside: %v", err)
	}
	// So the Prepare hook's Load finds nothing to restore over it.
	if rep, err := Load(r2, o, quiet); err != nil || rep.Found {
		t.Fatalf("load after re-attach: %+v %v", rep, err)
	}
}

func TestLiveRegionBadHeader(t *testing.T) {
	o := liveOptions(t)
	os.WriteFile(o.Live, []byte(strings.Repeat("garbage!", 1024)), 0o600)
	stray := o.Live + ".new-12345" // left by a supervisor that died inside shm.CreateFile
	os.WriteFile(stray, nil, 0o600)
	log, lines := logBuf()
	r, lock, reattached, err := OpenRegion(o, shm.Options{Counters: 64, MaxWorkers: 8}, log)
	if err != nil || reattached {
		t.Fatalf("reattached=%v err=%v", reattached, err)
	}
	defer lock.Unlock()
	defer r.Close()
	if !strings.Contains(lines.String(), "live region refused") {
		t.Errorf("no log line for the refused region:\n%s", lines)
	}
	if st := r.Counters().Stats(); st.Empty != 64 {
		t.Fatalf("fresh region not empty: %+v", st)
	}
	if _, err := os.Stat(stray); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("stray temporary region left: %v", err)
	}
}

func TestLiveRegionMigrates(t *testing.T) {
	o := liveOptions(t)
	r, lock, _, err := OpenRegion(o, shm.Options{Counters: 64, MaxWorkers: 8, Responses: 64, ResponseBytes: 64 << 10}, quiet)
	if err != nil {
		t.Fatal(err)
	}
	r.SetNow(t1)
	exhaust(t, r, "c")
	storedResponses(t, r)
	cachedResponses(t, r)
	r.Close()
	lock.Unlock()

	r2, lock2, reattached, err := OpenRegion(o, shm.Options{Counters: 1024, MaxWorkers: 8, Responses: 128, ResponseBytes: 64 << 10}, quiet)
	if err != nil || !reattached {
		t.Fatal(reattached, err)
	}
	defer lock2.Unlock()
	defer r2.Close()
	if g := r2.Geometry(); g.Counters != 1024 {
		t.Fatalf("geometry %+v after migration", g)
	}
	if d := limiter(t, r2, login).Allow("c", r2.Now()); d.Allowed {
		t.Fatal("count lost in the migration")
	}
	if err := r2.Counters().VerifyAccounts(); err != nil {
		t.Fatal(err)
	}
	if err := r2.Responses().VerifyAccounts(); err != nil {
		t.Fatal(err)
	}
	if r2.Counters().Held(login.Account()) != 1 || r2.Counters().Held(api.Account()) != 1 {
		t.Fatalf("accounts after the migration: login %d, api %d", r2.Counters().Held(login.Account()), r2.Counters().Held(api.Account()))
	}
	var got shm.Response
	if out, _, err := r2.Responses().Begin(kDone, shm.Quota{}, shm.Quota{}, fp1, t1, &got); err != nil || out != shm.Replay {
		t.Fatalf("stored response lost in the migration: %v %v", out, err)
	}
	if f, _ := r2.Responses().CacheLookup(kPage, t1, nil); !bytes.Equal(f.Data, page) || r2.Tags().Gen(5) != 2 {
		t.Fatalf("cache lost in the migration: %d bytes, generation %d", len(f.Data), r2.Tags().Gen(5))
	}
	// The migrated region is the one at the path now.
	r3, err := shm.OpenFile(o.Live)
	if err != nil {
		t.Fatal(err)
	}
	defer r3.Close()
	if r3.Geometry().Counters != 1024 || r3.Counters().Stats().Live != 2 {
		t.Fatalf("file at the live path: %+v %+v", r3.Geometry(), r3.Counters().Stats())
	}
}

// A live region left by a build whose statistics rows are laid out
// otherwise (other metrics) is migrated even at the same size: the state
// is kept, the rows start afresh rather than being misread.
// A live region re-attached under another persist.key (a restart after
// a deploy) drops the stored responses and the cache the old version of
// the application made, as a load of a dump does; the counters are kept.
func TestLiveRegionDropsResponsesOfAnotherKey(t *testing.T) {
	o := liveOptions(t)
	o.Key = "app-v1"
	geo := shm.Options{Counters: 64, MaxWorkers: 8, Responses: 64, ResponseBytes: 64 << 10}
	open := func(o Options) (*shm.Region, func()) {
		r, lock, _, err := OpenRegion(o, geo, quiet)
		if err != nil {
			t.Fatal(err)
		}
		return r, func() { r.Close(); lock.Unlock() }
	}
	r, done := open(o)
	r.SetNow(t1)
	exhaust(t, r, "c")
	storedResponses(t, r)
	cachedResponses(t, r)
	done()

	for _, tc := range []struct {
		key  string
		kept bool
	}{{"app-v1", true}, {"app-v2", false}, {"app-v2", false}} {
		o.Key = tc.key
		r, done := open(o)
		if d := limiter(t, r, login).Allow("c", t1); d.Allowed {
			t.Fatalf("under %s: the count was lost", tc.key)
		}
		var got shm.Response
		out, tk, err := r.Responses().Begin(kDone, shm.Quota{}, shm.Quota{}, fp1, t1, &got)
		if err != nil || (out == shm.Replay) != tc.kept {
			t.Fatalf("under %s: stored response %v %v, want kept=%v", tc.key, out, err, tc.kept)
		}
		if out == shm.Reserved {
			r.Responses().Release(tk)
		}
		if f, _ := r.Responses().CacheLookup(kPage, t1, nil); bytes.Equal(f.Data, page) != tc.kept {
			t.Fatalf("under %s: cache entry found=%v, want kept=%v", tc.key, f.Data != nil, tc.kept)
		}
		if r.ResponsesKey() != keyHash(tc.key) {
			t.Fatalf("under %s: the region records key %#x", tc.key, r.ResponsesKey())
		}
		if err := r.Responses().VerifyAccounts(); err != nil {
			t.Fatal(err)
		}
		done()
	}
}

// A reload that changes persist.key does not make the responses already
// stored the new version's: the dump carries the key they were made
// under, and the next start under the new key drops them.
func TestDumpKeepsTheKeyResponsesWereMadeUnder(t *testing.T) {
	o := liveOptions(t)
	o.Live, o.Key = "", "app-v1"
	r, lock, _, err := OpenRegion(o, shm.Options{Counters: 64, MaxWorkers: 8, Responses: 64, ResponseBytes: 64 << 10}, quiet)
	if err != nil {
		t.Fatal(err)
	}
	r.SetNow(t1)
	if err := r.Join(1); err != nil {
		t.Fatal(err)
	}
	storedResponses(t, r)
	o.Key = "app-v2" // HUP with the new version's key
	dumpTo(t, r, o)
	r.Close()
	lock.Unlock()
	b := responseRegion(t)
	rep, err := Load(b, o, quiet)
	if err != nil || rep.Responses != 0 || len(rep.Refused) != 1 || rep.Refused[0].Reason != ReasonKeyChanged {
		t.Fatalf("load under the new key: %+v, %v", rep, err)
	}
}

func TestLiveRegionMigratesAnotherStatLayout(t *testing.T) {
	o := liveOptions(t)
	geo := shm.Options{Counters: 64, MaxWorkers: 8, StatWords: 16, StatLayout: 1}
	r, lock, _, err := OpenRegion(o, geo, quiet)
	if err != nil {
		t.Fatal(err)
	}
	r.SetNow(t1)
	exhaust(t, r, "c")
	if err := r.Join(0); err != nil {
		t.Fatal(err)
	}
	r.StatRow()[3] = 7 // a count as the old build laid it out
	if r.StatTotal(3) != 7 {
		t.Fatal("the count is not in the rows")
	}
	r.Close()
	lock.Unlock()

	geo.StatLayout = 2
	log, lines := logBuf()
	r2, lock2, reattached, err := OpenRegion(o, geo, log)
	if err != nil || !reattached {
		t.Fatal(reattached, err)
	}
	defer lock2.Unlock()
	defer r2.Close()
	if !strings.Contains(lines.String(), "migrated") || r2.Geometry().StatLayout != 2 {
		t.Fatalf("not migrated (layout %d):\n%s", r2.Geometry().StatLayout, lines)
	}
	if d := limiter(t, r2, login).Allow("c", r2.Now()); d.Allowed {
		t.Fatal("count lost in the migration")
	}
	if got := r2.StatTotal(3); got != 0 {
		t.Fatalf("the old build's row word read by the new one: %d", got)
	}
}

func TestOpenRegionWithoutLive(t *testing.T) {
	r, lock, reattached, err := OpenRegion(Options{}, shm.Options{Counters: 64, MaxWorkers: 8}, nil)
	if err != nil || lock != nil || reattached || r.File() == nil {
		t.Fatal(r, lock, reattached, err)
	}
	r.Close()
}

// TestReattachKillsOrphans: a worker that outlived its supervisor, still
// mapping the live region, is killed before the region is re-attached.
func TestReattachKillsOrphans(t *testing.T) {
	o := liveOptions(t)
	geo := shm.Options{Counters: 64, MaxWorkers: 8}
	r, lock, _, err := OpenRegion(o, geo, quiet)
	if err != nil {
		t.Fatal(err)
	}
	orphan := proctest.Start(t, proctest.Options{Role: "orphan", Spec: o.Live})
	orphan.WaitReady(10 * time.Second)
	r.Close()
	lock.Unlock() // the supervisor dies; its worker does not
	// proctest reaps the orphan once it exits, as init reaps the orphans
	// of a dead supervisor.

	log, lines := logBuf()
	r2, lock2, reattached, err := OpenRegion(o, geo, log)
	if err != nil || !reattached {
		t.Fatal(reattached, err)
	}
	defer lock2.Unlock()
	defer r2.Close()
	select {
	case <-orphan.Done():
		if ws, ok := orphan.State().Sys().(syscall.WaitStatus); !ok || ws.Signal() != syscall.SIGKILL {
			t.Fatalf("orphan ended with %v", orphan.State())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the orphan still runs after the re-attach")
	}
	if !strings.Contains(lines.String(), fmt.Sprintf("pids=[%d]", orphan.Pid())) {
		t.Errorf("no log line for the killed orphan:\n%s", lines)
	}
}

// A dump at persist.live (the two files' names swapped, or live set to
// the dump's when moving to a live region) is no region to replace with
// a fresh one: OpenRegion refuses it, and leaves it as it was.
func TestOpenRegionRefusesADumpAsLive(t *testing.T) {
	o := liveOptions(t)
	good := goodDump(t, "")
	os.WriteFile(o.Live, good, 0o600)
	r, lock, _, err := OpenRegion(o, shm.Options{Counters: 64, MaxWorkers: 8}, quiet)
	if err == nil {
		lock.Unlock()
		r.Close()
		t.Fatal("a dump at persist.live was taken")
	}
	if !strings.Contains(err.Error(), o.Live) || !strings.Contains(err.Error(), "is a dump") {
		t.Errorf("the error: %v; want it to name the file and say it is a dump", err)
	}
	if now, _ := os.ReadFile(o.Live); !bytes.Equal(now, good) {
		t.Errorf("the dump at persist.live was changed: %d bytes, had %d", len(now), len(good))
	}
	// CheckDirs, which check and the start run first, says so too.
	if err := CheckDirs(Options{Live: o.Live}); err == nil || !strings.Contains(err.Error(), "is a dump") {
		t.Errorf("CheckDirs: %v", err)
	}
}
