package persist

import (
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/preforkd/preforkd/shm"
)

// TestDirectPlacement proves that placing entries directly in the slots
// gives the table shm.Counters.Insert would: if shm's slot layout changes,
// this fails (and loads fall back to Insert until slots.go is updated).
func TestDirectPlacement(t *testing.T) {
	src := region(t, 4096)
	lg, la := limiter(t, src, login), limiter(t, src, api)
	for i := 0; i < 300; i++ {
		lg.Allow(fmt.Sprint("client", i), t1)
		la.Allow(fmt.Sprint("client", i), t1)
	}
	var entries []shm.Entry
	src.Counters().Range(func(e shm.Entry) bool { entries = append(entries, e); return true })
	if len(entries) != 600 {
		t.Fatalf("only %d entries", len(entries))
	}
	memfd, err := shm.Create(shm.Options{Counters: 2048, MaxWorkers: 8})
	if err != nil {
		t.Fatal(err)
	}
	defer memfd.Close()
	for _, dst := range []*shm.Region{region(t, 2048), memfd, region(t, 8192)} {
		for _, direct := range []bool{true, false} {
			t.Run(fmt.Sprintf("%d slots, direct=%v", dst.Geometry().Counters, direct), func(t *testing.T) {
				fresh := dst
				if !direct {
					fresh = region(t, dst.Geometry().Counters)
				}
				s1, s2 := src.Seeds()
				if err := fresh.SetSeeds(s1, s2); err != nil {
					t.Fatal(err)
				}
				p := newPlacer(fresh, t1)
				if (p.direct != nil) != direct {
					if direct {
						t.Fatalf("direct placement unavailable for a region of layout %d: check slots.go against shm's slot layout and update directLayout", shm.LayoutVersion)
					}
					p.direct = nil
				}
				for _, e := range entries {
					if err := p.place(e); err != nil {
						t.Fatalf("place: %v", err)
					}
				}
				if err := p.place(entries[0]); !errors.Is(err, errDuplicate) {
					t.Fatalf("a key placed twice: %v", err)
				}
				p.done()
				st := fresh.Counters().Stats()
				if st.Live != len(entries) || st.Busy != 0 || st.Locked != 0 || st.MaxProbe > st.Probe {
					t.Fatalf("stats %+v for %d entries", st, len(entries))
				}
				got := map[shm.Entry]bool{}
				fresh.Counters().Range(func(e shm.Entry) bool { got[e] = true; return true })
				for _, e := range entries {
					if !got[e] {
						t.Fatalf("entry %+v not found by Range", e)
					}
				}
				fg, fa := limiter(t, fresh, login), limiter(t, fresh, api)
				for i := 0; i < 300; i += 7 {
					c := fmt.Sprint("client", i)
					if fg.Peek(c, t1) != lg.Peek(c, t1) || fa.Peek(c, t1) != la.Peek(c, t1) {
						t.Fatalf("%s: %+v/%+v, was %+v/%+v", c, fg.Peek(c, t1), fa.Peek(c, t1), lg.Peek(c, t1), la.Peek(c, t1))
					}
				}
				// The placed slots take part in the protocol: updated,
				// and reclaimed once fresh.
				if d := fg.Allow("client1", t1); d.Allowed {
					t.Fatal("a placed key was not limited")
				}
				if d := fg.Allow("client1", t1+2*time.Hour); !d.Allowed {
					t.Fatal("a placed key was not updated")
				}
			})
		}
	}
}

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

// TestPlaceIntoFullTable: placing into a table with no room ends after one
// probe window (a loader must never spin at boot).
func TestPlaceIntoFullTable(t *testing.T) {
	r, _ := shm.CreatePrivate(shm.Options{Counters: 16, MaxWorkers: 4})
	p := newPlacer(r, t1)
	for i := 0; i < 17; i++ {
		err := p.place(shm.Entry{Key: shm.Key{A: uint64(i), B: 1}, Meta: 1, Payload: 1})
		if (err != nil) != (i == 16) {
			t.Fatalf("entry %d: %v", i, err)
		}
	}
}
