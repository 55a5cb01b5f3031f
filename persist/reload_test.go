package persist

import (
	"fmt"
	"path/filepath"
	"testing"

	"github.com/preforkd/preforkd/shm"
)

// TestPlaceTableFull: a dump into a smaller table keeps what fits and
// counts the rest as "table full".
func TestPlaceTableFull(t *testing.T) {
	src := region(t, 1024)
	lg := limiter(t, src, login)
	for i := 0; i < 200; i++ {
		lg.Allow(fmt.Sprint("client", i), t1)
	}
	path := t.TempDir() + "/dump"
	if st := dumpTo(t, src, Options{Path: path, Rules: rules, Now: wallAt(wall0)}); st.Entries != 200 {
		t.Fatalf("dumped %+v", st)
	}
	small, err := shm.CreatePrivate(shm.Options{Counters: 64, Probe: 2, MaxWorkers: 8})
	if err != nil {
		t.Fatal(err)
	}
	rep, err := Load(small, Options{Path: path, Rules: rules, Now: wallAt(wall0)}, quiet)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Counters+rep.Dropped[DropTableFull] != 200 || rep.Dropped[DropTableFull] == 0 || rep.Counters != small.Counters().Stats().Live {
		t.Fatalf("%+v; %+v", rep, small.Counters().Stats())
	}
}

// TestReloadFullTableDropsNothing: a table filled as far as its probe
// window allows reloads into a table of the same size without losing an
// entry. (Dumped in slot order from slot 0, entries that wrapped around
// the end of the table take the slots of others, which then do not fit.)
func TestReloadFullTableDropsNothing(t *testing.T) {
	geo := shm.Options{Counters: 256, Probe: 4, MaxWorkers: 8}
	for round := 0; round < 50; round++ {
		src, _ := shm.CreatePrivate(geo)
		src.SetNow(t1)
		lg := limiter(t, src, login)
		for i := 0; i < geo.Counters-4; i++ { // keep an EMPTY slot or more
			lg.Allow(fmt.Sprint(round, "client", i), t1)
		}
		path := filepath.Join(t.TempDir(), "dump")
		st := dumpTo(t, src, Options{Path: path, Rules: rules, Now: wallAt(wall0)})
		dst, _ := shm.CreatePrivate(geo)
		rep, err := Load(dst, Options{Path: path, Rules: rules, Now: wallAt(wall0)}, quiet)
		if err != nil || rep.Counters != st.Entries || len(rep.Dropped) != 0 {
			t.Fatalf("round %d: %d entries dumped, %d restored, dropped %v (%v)", round, st.Entries, rep.Counters, rep.Dropped, err)
		}
		fg := limiter(t, dst, login)
		for i := 0; i < geo.Counters-4; i += 13 {
			c := fmt.Sprint(round, "client", i)
			if fg.Peek(c, t1) != lg.Peek(c, t1) {
				t.Fatalf("%s: %+v, was %+v", c, fg.Peek(c, t1), lg.Peek(c, t1))
			}
		}
	}
}
