package persist

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"io"
	"os"
	"runtime"
	"testing"

	"github.com/preforkd/preforkd/shm"
)

// FuzzLoad feeds the loader arbitrary bytes, as they are and with their
// checksums repaired (so that the guards behind them are reached too): it
// must not panic or hang, and must leave a usable region.
func FuzzLoad(f *testing.F) {
	good := goodDump(f, "k")
	at := offsetsOf(good)
	f.Add(good)
	f.Add(good[:at.responses])
	f.Add(good[:at.countersPayload+countersFix])
	f.Add([]byte{})
	f.Add([]byte(Magic))
	x, y := collidingNames()
	f.Add(dumpWithRules(f, x, y))
	withResponses := responseRegion(f)
	storedResponses(f, withResponses)
	path := f.TempDir() + "/dump"
	dumpTo(f, withResponses, Options{Path: path, Key: "k", Rules: rules, Now: wallAt(wall0)})
	f.Add(readFile(f, path))
	withCache := responseRegion(f)
	cachedResponses(f, withCache)
	dumpTo(f, withCache, Options{Path: path, Key: "k", Rules: rules, Now: wallAt(wall0)})
	f.Add(readFile(f, path))
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, d := range [][]byte{data, fixChecksums(data)} {
			r, err := shm.CreatePrivate(shm.Options{Counters: 16, MaxWorkers: 4, Responses: 4, ResponseBytes: 1024, BlockSize: 256})
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close() // a fuzz worker runs many inputs: do not keep their regions mapped
			rep := newReport()
			l := &loader{r: r, o: Options{Key: "k", Rules: rules, Now: wallAt(wall0)}, log: quiet, rep: &rep}
			if err := l.load(d); err != nil {
				t.Fatalf("load into a fresh region: %v", err)
			}
			if rep.Counters > 16 || rep.Counters != r.Counters().Stats().Live {
				t.Fatalf("restored %d, table holds %d", rep.Counters, r.Counters().Stats().Live)
			}
			if rs := r.Responses().Stats(); rep.Responses != rs.Complete || rs.Reserved != 0 || rep.Cached != rs.Cached || rs.Filling != 0 {
				t.Fatalf("restored %d responses and %d cache entries, table holds %+v", rep.Responses, rep.Cached, rs)
			}
			limiter(t, r, login).Allow("x", rep.RegionTime)
		}
	})
}

// TestLoadAllocation: counts in a dump are checked against the bytes left
// before anything is allocated for them.
func TestLoadAllocation(t *testing.T) {
	good := goodDump(t, "k")
	at := offsetsOf(good)
	huge := func(f func(d []byte)) []byte {
		d := bytes.Clone(good)
		f(d)
		return fixChecksums(d)
	}
	for name, d := range map[string][]byte{
		"rules":    huge(func(d []byte) { binary.LittleEndian.PutUint32(d[at.countersPayload+16:], 1<<32-1) }),
		"sections": huge(func(d []byte) { binary.LittleEndian.PutUint32(d[88:], 1<<32-1) }),
		"length": huge(func(d []byte) {
			binary.LittleEndian.PutUint64(d[at.counters+8:], 1<<62)
			binary.LittleEndian.PutUint32(d[at.counters+20:], crc32.Checksum(d[at.counters:at.counters+20], crcTable))
		}),
	} {
		r, _ := shm.CreatePrivate(shm.Options{Counters: 16, MaxWorkers: 4})
		rep := newReport()
		l := &loader{r: r, o: Options{Rules: rules}, log: quiet, rep: &rep}
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		l.load(d)
		runtime.ReadMemStats(&after)
		if n := after.TotalAlloc - before.TotalAlloc; n > 1<<20 || len(rep.Refused) == 0 {
			t.Errorf("%s: %d bytes allocated, refused %v", name, n, rep.Refused)
		}
	}
}

// judged is what Inspect judges of a load's refusals: not those that
// depend on the configuration it is loaded with (a rule's definition,
// persist.key), which Inspect shows and leaves to the load.
func judged(refused []Refusal) []Refusal {
	var out []Refusal
	for _, f := range refused {
		if f.Reason != ReasonKeyChanged && f.Reason != ReasonRuleChanged {
			out = append(out, f)
		}
	}
	return out
}

// FuzzReadDump feeds arbitrary files to the file reader behind Load and
// Inspect (readDump, which decides how much of a file to read from its
// header and frames): neither may panic, a load from the file must judge
// it as a load of all its bytes does, and Inspect must call it loadable
// only when that load refused nothing.
func FuzzReadDump(f *testing.F) {
	good := goodDump(f, "k")
	at := offsetsOf(good)
	f.Add(good)
	f.Add(good[:at.countersPayload])
	f.Add(good[:at.responses+3])
	f.Add(append(bytes.Clone(good), make([]byte, 100)...))
	f.Add([]byte(Magic + "\x01\x00\x00\x00\xff\xff\xff\xff"))
	f.Add([]byte(shm.Magic))
	f.Add(goodDump(f, "other")) // no stored response: another persist.key refuses nothing
	path := f.TempDir() + "/dump"
	withResponses := responseRegion(f)
	storedResponses(f, withResponses)
	dumpTo(f, withResponses, Options{Path: path, Key: "other", Rules: rules, Now: wallAt(wall0)})
	f.Add(readFile(f, path))
	judge := func(t *testing.T, d []byte, all bool) Report {
		r, err := shm.CreatePrivate(shm.Options{Counters: 16, MaxWorkers: 4, Responses: 4, ResponseBytes: 1024, BlockSize: 256})
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		o := Options{Path: path, Key: "k", Rules: rules, Now: wallAt(wall0)}
		if all {
			rep := newReport()
			l := &loader{r: r, o: o, log: quiet, rep: &rep}
			if err := l.load(d); err != nil {
				t.Fatal(err)
			}
			return rep
		}
		if err := os.WriteFile(path, d, 0o600); err != nil {
			t.Fatal(err)
		}
		rep, err := Load(r, o, quiet)
		if err != nil {
			t.Fatalf("load: %v", err)
		}
		return rep
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) > 1<<16 || bytes.HasPrefix(data, []byte(shm.Magic)) {
			return // a live region's reader is shm's
		}
		for _, d := range [][]byte{data, fixChecksums(data)} {
			if err := os.WriteFile(path, d, 0o600); err != nil {
				t.Fatal(err)
			}
			ierr := Inspect(path, io.Discard)
			if ierr != nil && !errors.Is(ierr, ErrRefused) {
				t.Fatalf("inspect: %v", ierr)
			}
			whole, file := judge(t, d, true), judge(t, d, false)
			if whole.Loaded != file.Loaded || whole.Counters != file.Counters || whole.Responses != file.Responses ||
				whole.Cached != file.Cached || len(whole.Refused) != len(file.Refused) {
				t.Fatalf("the file was judged otherwise than its bytes:\n file  %+v\n bytes %+v", file, whole)
			}
			if ierr == nil && len(judged(file.Refused)) > 0 {
				t.Fatalf("inspect called it loadable; the load refused %v", file.Refused)
			}
		}
	})
}
