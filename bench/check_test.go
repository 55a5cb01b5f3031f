package bench

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/preforkd/preforkd/bucket"
)

// Geometry shared by every benchmark in the package.
const (
	numKeys  = 10000  // distinct keys, cycled i % numKeys
	numSlots = 262144 // counter slots of the shm region (the config default)
)

// benchRule is the rule every backend applies. Its rate (1M per second per
// key, burst 1M) is far above what one key sees while 10,000 keys are
// cycled, so every decision is an allowed one: the path that writes, in
// every backend (a refusal writes nothing in shm and x/time/rate). The
// "allowed/op" metric shows it.
var benchRule = bucket.Rule{Name: "bench", Limit: 1_000_000, Window: time.Second, Algorithm: bucket.GCRA}

// makeKeys returns n client-address-like keys; every process builds the
// same list.
func makeKeys(n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("10.%d.%d.%d", i>>16&0xff, i>>8&0xff, i&0xff)
	}
	return keys
}

// visitOrder returns keys in a fixed pseudo-random order, the order the
// benchmarks visit them in (cycled). It is deliberately not the order the
// keys were first seen in (the warm-up's): the map-based contender
// allocates one rate.Limiter per key in first-seen order, and visiting them
// in that same order again walks its memory sequentially, which the
// hardware prefetcher hides; real clients do not arrive in the order their
// state was allocated. Measured here, that artefact alone made mutexmap
// about 2.7× faster (README.md, "Key order").
func visitOrder(keys []string) []string {
	out := slices.Clone(keys)
	rand.New(rand.NewPCG(1, 2)).Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
	return out
}

// decider makes one rate-limit decision for key, reading its own clock (the
// clock is part of the cost being compared). Implementations are safe for
// concurrent use.
type decider interface {
	decide(key string) (allowed bool, err error)
}

// backend opens a decider for rule whose resources live as long as tb.
type backend struct {
	name string
	open func(tb testing.TB, rule bucket.Rule) (decider, error)
}

// backends are the contenders, in the order they are reported.
var backends = []backend{
	{"shm", openShm},
	{"mutexmap", openMutexMap},
	{"redis", openRedis},
	{"sqlite", openSQLite},
}

// fixtures opens each backend once per top-level benchmark and warms it (one
// decision for each key), so that sub-benchmarks run again with a larger
// b.N (RunParallel does) neither pay for nor measure the set-up and the
// first insertion of the keys: the steady state is measured.
type fixtures struct {
	parent testing.TB // owns the backends' resources
	keys   []string   // in first-seen (warm-up) order
	visit  []string   // the same keys in the order the benchmarks cycle through
	open   map[string]decider
}

func newFixtures(parent testing.TB) *fixtures {
	keys := makeKeys(numKeys)
	return &fixtures{parent: parent, keys: keys, visit: visitOrder(keys), open: map[string]decider{}}
}

// get returns the warmed backend; sub-benchmarks run one at a time.
func (f *fixtures) get(b *testing.B, be backend) decider {
	if d, ok := f.open[be.name]; ok {
		return d
	}
	d, err := be.open(f.parent, benchRule)
	if err != nil {
		if skip := (skipError{}); errors.As(err, &skip) {
			b.Skip(skip.reason)
		}
		b.Fatal(err)
	}
	for _, k := range f.keys {
		if _, err := d.decide(k); err != nil {
			b.Fatalf("warming %s: %v", be.name, err)
		}
	}
	f.open[be.name] = d
	return d
}

// benchBackends runs measure as a sub-benchmark of each backend, with the
// warmed decider and the keys in visit order; measure returns how many of
// its b.N decisions were allowed, reported as allowed/op.
func benchBackends(b *testing.B, measure func(b *testing.B, d decider, keys []string) (allowed int64)) {
	f := newFixtures(b)
	for _, be := range backends {
		b.Run(be.name, func(b *testing.B) {
			d := f.get(b, be)
			b.ReportAllocs()
			allowed := measure(b, d, f.visit)
			b.ReportMetric(float64(allowed)/float64(b.N), "allowed/op")
		})
	}
}

// BenchmarkCheck is one decision per op, reading the clock included.
func BenchmarkCheck(b *testing.B) {
	benchBackends(b, func(b *testing.B, d decider, keys []string) int64 {
		var allowed int64
		for i := 0; b.Loop(); i++ {
			ok, err := d.decide(keys[i%len(keys)])
			if err != nil {
				b.Fatal(err)
			}
			if ok {
				allowed++
			}
		}
		return allowed
	})
}

// BenchmarkCheckParallel is BenchmarkCheck from GOMAXPROCS goroutines at
// once, each cycling the keys from its own starting point.
func BenchmarkCheckParallel(b *testing.B) {
	benchBackends(b, func(b *testing.B, d decider, keys []string) int64 {
		b.ResetTimer()
		var goroutines, allowed atomic.Int64
		b.RunParallel(func(pb *testing.PB) {
			// 7919 is prime: goroutines start far apart in the key space.
			i := int(goroutines.Add(1)) * 7919
			var n int64
			for pb.Next() {
				ok, err := d.decide(keys[i%len(keys)])
				if err != nil {
					b.Error(err)
					return
				}
				if ok {
					n++
				}
				i++
			}
			allowed.Add(n)
		})
		return allowed.Load()
	})
}

// TestBackendsDecide checks each backend against a rule tight enough to
// refuse: 5 per minute lets exactly 5 of 8 quick requests for one key
// through, and does not touch another key.
func TestBackendsDecide(t *testing.T) {
	rule := bucket.Rule{Name: "tight", Limit: 5, Window: time.Minute, Algorithm: bucket.GCRA}
	for _, be := range backends {
		t.Run(be.name, func(t *testing.T) {
			d, err := be.open(t, rule)
			if err != nil {
				if skip := (skipError{}); errors.As(err, &skip) {
					t.Skip(skip.reason)
				}
				t.Fatal(err)
			}
			var got []bool
			for range 8 {
				ok, err := d.decide("192.0.2.1")
				if err != nil {
					t.Fatal(err)
				}
				got = append(got, ok)
			}
			want := []bool{true, true, true, true, true, false, false, false}
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Errorf("decisions for one key = %v, want %v", got, want)
			}
			if ok, err := d.decide("192.0.2.2"); err != nil || !ok {
				t.Errorf("another key: allowed = %v, err = %v; want allowed", ok, err)
			}
		})
	}
}

// TestShmDecisionDoesNotAllocate guards the claim of BenchmarkCheck/shm.
func TestShmDecisionDoesNotAllocate(t *testing.T) {
	d, err := openShm(t, benchRule)
	if err != nil {
		t.Fatal(err)
	}
	keys := makeKeys(numKeys)
	i := 0
	allocs := testing.AllocsPerRun(3*numKeys, func() {
		if _, err := d.decide(keys[i%len(keys)]); err != nil {
			t.Fatal(err)
		}
		i++
	})
	if allocs != 0 {
		t.Errorf("an shm decision allocates %v times, want 0", allocs)
	}
}
