//go:build linux

package persist

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/preforkd/preforkd/bucket"
	"github.com/preforkd/preforkd/shm"
	"golang.org/x/sys/unix"
)

// The benchmarks dump and load a 1M-slot region at 1% and at "100%"
// occupancy, beside os.WriteFile / os.ReadFile of the same number of
// bytes. With a probe window of 16 slots a table never fills completely:
// "100%" is the fullest the table takes when offered 1.5M keys (≈95%;
// the exact figure is reported as the occupancy metric).

const benchSlots = 1 << 20

type benchRegion struct {
	r    *shm.Region
	o    Options
	dump []byte // a dump of r
	occ  float64
}

var (
	benchOnce    sync.Once
	benchRegions map[string]*benchRegion
	benchDir     string
	benchErr     error
)

// benchCleanups release what other benchmarks set up.
var benchCleanups []func()

// cleanupBench releases what the benchmarks set up (see TestMain).
func cleanupBench() {
	for _, f := range benchCleanups {
		f()
	}
	for _, br := range benchRegions {
		br.r.Close()
	}
	if benchDir != "" {
		os.RemoveAll(benchDir)
	}
}

func benchRegionsFor(b *testing.B) map[string]*benchRegion {
	benchOnce.Do(func() {
		benchRegions = map[string]*benchRegion{}
		dir, err := os.MkdirTemp("", "persist-bench-")
		if err != nil {
			benchErr = err
			return
		}
		benchDir = dir
		for _, occ := range []struct {
			name string
			keys int
		}{{"1%", benchSlots / 100}, {"100%", benchSlots * 3 / 2}} {
			br, err := fill(occ.keys, filepath.Join(dir, "dump-"+occ.name))
			if err != nil {
				benchErr = err
				return
			}
			benchRegions[occ.name] = br
		}
	})
	if benchErr != nil {
		b.Fatal(benchErr)
	}
	return benchRegions
}

// fill offers keys distinct keys to a new 1M-slot region and dumps it.
func fill(keys int, path string) (*benchRegion, error) {
	r, err := shm.Create(shm.Options{Counters: benchSlots})
	if err != nil {
		return nil, err
	}
	if err := r.Join(0); err != nil {
		return nil, err
	}
	rule := bucket.Rule{Name: "bench", Limit: 1, Window: 24 * time.Hour}
	lim, err := bucket.NewLimiter(rule, r.Counters())
	if err != nil {
		return nil, err
	}
	now := r.Now()
	var id [8]byte
	for i := 0; i < keys; i++ {
		binary.LittleEndian.PutUint64(id[:], uint64(i))
		lim.AllowKey(lim.Key(id[:]), now)
	}
	o := Options{Path: path, Rules: []bucket.Rule{rule}}
	if _, err := Dump(r, o); err != nil {
		return nil, err
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return &benchRegion{r: r, o: o, dump: data, occ: r.Counters().Stats().Occupancy()}, nil
}

var occupancies = []string{"1%", "100%"}

func BenchmarkDump(b *testing.B) {
	regions := benchRegionsFor(b)
	for _, occ := range occupancies {
		br := regions[occ]
		b.Run("occupancy="+occ, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(br.dump)))
			b.ReportMetric(100*br.occ, "%occupied")
			for b.Loop() {
				if _, err := Dump(br.r, br.o); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	for _, occ := range occupancies {
		br := regions[occ]
		path := filepath.Join(b.TempDir(), "same-bytes")
		b.Run("writefile-same-bytes="+occ, func(b *testing.B) {
			b.SetBytes(int64(len(br.dump)))
			for b.Loop() {
				if err := os.WriteFile(path, br.dump, 0o600); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run("writefile+fsync-same-bytes="+occ, func(b *testing.B) {
			b.SetBytes(int64(len(br.dump)))
			for b.Loop() {
				if err := writeSynced(path, br.dump); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkLoad(b *testing.B) {
	regions := benchRegionsFor(b)
	for _, occ := range occupancies {
		for _, cold := range []bool{false, true} {
			name := "occupancy=" + occ
			if cold {
				name += "/cold-region"
			}
			b.Run(name, func(b *testing.B) { benchLoad(b, regions[occ], cold) })
		}
	}
	for _, occ := range occupancies {
		br := regions[occ]
		path := filepath.Join(b.TempDir(), "same-bytes")
		if err := writeSynced(path, br.dump); err != nil {
			b.Fatal(err)
		}
		b.Run("readfile-same-bytes="+occ, func(b *testing.B) {
			b.SetBytes(int64(len(br.dump)))
			for b.Loop() {
				if _, err := os.ReadFile(path); err != nil {
					b.Fatal(err)
				}
			}
		})
		// The least any load can do: read the file and write one word
		// in as many 64-byte lines of a mapped memory file (as a region
		// is) as it has entries.
		b.Run("readfile+write-slots-same-count="+occ, func(b *testing.B) {
			lines, unmap, err := mappedLines(benchSlots)
			if err != nil {
				b.Fatal(err)
			}
			defer unmap()
			n := int(br.occ * benchSlots)
			b.SetBytes(int64(len(br.dump)))
			for b.Loop() {
				data, err := os.ReadFile(path)
				if err != nil {
					b.Fatal(err)
				}
				for i := 0; i < n; i++ {
					lines[i][3] = uint64(data[i%len(data)])
				}
			}
		})
	}
}

// mappedLines maps n 64-byte lines of a new memory file, as shm.Create
// maps a region's slots.
func mappedLines(n int) ([][8]uint64, func(), error) {
	fd, err := unix.MemfdCreate("bench", unix.MFD_CLOEXEC)
	if err != nil {
		return nil, nil, err
	}
	defer unix.Close(fd)
	size := n * 64
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		return nil, nil, err
	}
	m, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, nil, err
	}
	return unsafe.Slice((*[8]uint64)(unsafe.Pointer(&m[0])), n), func() { unix.Munmap(m) }, nil
}

// benchLoad loads br's dump into a fresh region. Unless cold, the region's
// pages are mapped first (as the supervisor's first sweep of the table
// would), so that the 60–100 ms it costs to fault in 64 MiB of a new
// mapping on this kind of machine is not counted as loading.
func benchLoad(b *testing.B, br *benchRegion, cold bool) {
	b.ReportAllocs()
	b.SetBytes(int64(len(br.dump)))
	b.ReportMetric(100*br.occ, "%occupied")
	var restored, full int
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		// Put the dump back as Dump leaves it: written and fsynced (an
		// unsynced file would make Load's directory fsync flush it).
		if err := writeSynced(br.o.Path, br.dump); err != nil {
			b.Fatal(err)
		}
		r, err := shm.Create(shm.Options{Counters: benchSlots})
		if err != nil {
			b.Fatal(err)
		}
		if !cold {
			r.Counters().Stats()
		}
		b.StartTimer()
		rep, err := Load(r, br.o, quiet)
		if err != nil || !rep.Loaded {
			b.Fatal(rep, err)
		}
		b.StopTimer()
		restored, full = rep.Counters, rep.Dropped[DropTableFull]
		r.Close()
		b.StartTimer()
	}
	b.ReportMetric(float64(restored), "entries")
	b.ReportMetric(float64(full), "dropped-full")
}

func writeSynced(path string, data []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
