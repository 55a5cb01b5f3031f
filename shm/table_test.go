package shm_test

import (
	"errors"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/preforkd/preforkd/bucket"
	"github.com/preforkd/preforkd/internal/shmtest"
	"github.com/preforkd/preforkd/shm"
)

// A key being limited stays limited after more distinct keys than the
// table has slots were thrown at it: only slots equivalent to fresh keys
// are reclaimed.
func TestFlood(t *testing.T) {
	for _, algo := range []bucket.Algorithm{bucket.FixedWindow, bucket.GCRA} {
		t.Run(algo.String(), func(t *testing.T) {
			r := shmtest.Private(t, shm.Options{Counters: 64})
			lim, _ := bucket.NewLimiter(bucket.Rule{Name: "f", Limit: 3, Window: time.Minute, Algorithm: algo}, r.Counters())
			short, _ := bucket.NewLimiter(bucket.Rule{Name: "short", Limit: 1, Window: time.Second, Algorithm: algo}, r.Counters())
			now := 10 * time.Second
			for i := 0; i < 3; i++ {
				lim.Allow("attacker", now)
			}
			if d := lim.Allow("attacker", now); d.Allowed {
				t.Fatal("not limited to begin with")
			}
			full := 0
			for i := 0; i < 1000; i++ {
				// Keys of a short rule: each turns fresh a second later,
				// so the flood keeps reclaiming slots.
				now += 10 * time.Millisecond
				if d := short.Allow("flood"+strconv.Itoa(i), now); d.Full {
					full++
				}
			}
			if d := lim.Allow("attacker", now); d.Allowed || d.Full {
				t.Fatalf("attacker freed by a flood: %+v", d)
			}
			st := r.Counters().Stats()
			if st.Reclaims == 0 || full == 0 {
				t.Fatalf("flood did not fill the table: %d full, %+v", full, st)
			}
			// Once its own minute is over the attacker is served again.
			if d := lim.Allow("attacker", now+time.Minute); !d.Allowed {
				t.Fatalf("attacker still refused after its window: %+v", d)
			}
		})
	}
}

// Goroutines on a heap-backed region, so that -race sees the accesses.
// The 16 keys leave half the table free: in a window with no free slot
// at all, a request for a key whose install by another request is still
// BUSY is answered on_full (there is no slot for it at that instant), and
// the count would miss it.
func TestGoroutinesExact(t *testing.T) {
	r := shmtest.Private(t, shm.Options{Counters: 32})
	for _, algo := range []bucket.Algorithm{bucket.FixedWindow, bucket.GCRA} {
		lim, _ := bucket.NewLimiter(bucket.Rule{Name: "g" + algo.String(), Limit: 100, Window: time.Hour, Algorithm: algo}, r.Counters())
		var allowed atomic.Int64
		var wg sync.WaitGroup
		for g := range 8 {
			wg.Go(func() {
				for i := range 100 {
					// 8 keys, 100 attempts each per goroutine.
					key := "k" + strconv.Itoa((g+i)%8)
					if d := lim.Allow(key, time.Minute); d.Allowed && !d.Full {
						allowed.Add(1)
					}
				}
			})
		}
		wg.Wait()
		if got := allowed.Load(); got != 8*100 {
			t.Fatalf("%v: allowed %d, want 800 (8 keys × limit 100); %+v", algo, got, r.Counters().Stats())
		}
	}
	checkTable(t, r)
}

func TestPeekResetRefund(t *testing.T) {
	r := shmtest.Private(t, shm.Options{Counters: 64})
	lim, _ := bucket.NewLimiter(bucket.Rule{Name: "login", Limit: 2, Window: time.Minute}, r.Counters())
	now := time.Hour
	if d := lim.Peek("u", now); !d.Allowed || d.Remaining != 2 {
		t.Fatalf("peek of a fresh key: %+v", d)
	}
	lim.Allow("u", now)
	lim.Allow("u", now)
	if d := lim.Peek("u", now); d.Allowed || d.Remaining != 0 {
		t.Fatalf("peek at the limit: %+v", d)
	}
	lim.RefundKey(lim.Key([]byte("u")), now)
	if d := lim.Allow("u", now); !d.Allowed {
		t.Fatalf("refunded request not given back: %+v", d)
	}
	lim.Reset("u", now)
	if d := lim.Peek("u", now); d.Remaining != 2 {
		t.Fatalf("after reset: %+v", d)
	}
}

func TestNotJoined(t *testing.T) {
	r, err := shm.CreatePrivate(shm.Options{Counters: 8})
	if err != nil {
		t.Fatal(err)
	}
	_, err = r.Counters().Update(shm.Key{A: 1, B: 2}, shm.Quota{}, 0, 0, func(p uint64, _ time.Duration) (uint64, bool) { return p + 1, true })
	if !errors.Is(err, shm.ErrNotJoined) {
		t.Fatalf("update before join: %v", err)
	}
}

func TestAllowDoesNotAllocate(t *testing.T) {
	r := shmtest.Private(t, shm.Options{Counters: 1024})
	lim, _ := bucket.NewLimiter(bucket.Rule{Name: "a", Limit: 1000000, Window: time.Second}, r.Counters())
	n := testing.AllocsPerRun(1000, func() { lim.Allow("some-client-key", r.Now()) })
	if n != 0 {
		t.Fatalf("Allow allocates %v times per call", n)
	}
}

func TestGeometry(t *testing.T) {
	r := shmtest.Create(t, shm.Options{Counters: 1000})
	if g := r.Geometry(); g.Counters != 1024 || g.Probe != shm.DefaultProbe || g.MaxWorkers != shm.DefaultMaxWorkers {
		t.Fatalf("geometry %+v", g)
	}
	// An inherited descriptor attaches to the same table and clock.
	dup, err := os.OpenFile("/proc/self/fd/"+strconv.Itoa(int(r.File().Fd())), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	a, err := shm.Attach(dup)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if a.Geometry() != r.Geometry() {
		t.Fatalf("attached geometry %+v", a.Geometry())
	}
	s1, s2 := r.Seeds()
	if t1, t2 := a.Seeds(); t1 != s1 || t2 != s2 || s1 == s2 {
		t.Fatal("seeds differ between mappings or are equal")
	}
	before := r.Now()
	if d := a.Now() - before; d < 0 || d > time.Second {
		t.Fatalf("clocks of two mappings differ by %v", d)
	}
}

// A region larger than the machine can hold fails at creation, clearly.
func TestTooLarge(t *testing.T) {
	_, err := shm.Create(shm.Options{Counters: shm.MaxCounters})
	if err == nil {
		t.Skip("this machine holds a 64 GiB region")
	}
	if !strings.Contains(err.Error(), "does not fit in the memory available") {
		t.Fatalf("unclear error: %v", err)
	}
	if _, err := shm.Create(shm.Options{Counters: shm.MaxCounters * 2}); err == nil || !strings.Contains(err.Error(), "maximum") {
		t.Fatalf("over the maximum: %v", err)
	}
}

// Attach refuses a file that is not a region, or a damaged header.
func TestAttachRefuses(t *testing.T) {
	r := shmtest.Create(t, shm.Options{Counters: 8})
	good := append([]byte(nil), r.Bytes()...)
	for _, tc := range []struct {
		name   string
		mutate func([]byte) []byte
		want   string
	}{
		{"magic", func(b []byte) []byte { b[0] = 'X'; return b }, "magic"},
		{"version", func(b []byte) []byte { b[8] = 99; return b }, "layout version"},
		{"geometry", func(b []byte) []byte { b[24] = 3; return b }, "geometry"},
		{"truncated", func(b []byte) []byte { return b[:len(b)-4096] }, "size"},
		{"short", func(b []byte) []byte { return b[:100] }, "too small"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := t.TempDir() + "/region"
			if err := os.WriteFile(path, tc.mutate(append([]byte(nil), good...)), 0o600); err != nil {
				t.Fatal(err)
			}
			f, err := os.OpenFile(path, os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if _, err := shm.Attach(f); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("attach: %v, want an error about %s", err, tc.want)
			}
		})
	}
}

// A region in a file keeps its counts across a re-attach.
func TestLiveRegion(t *testing.T) {
	path := t.TempDir() + "/live"
	r, err := shm.CreateFile(path, shm.Options{Counters: 64})
	if err != nil {
		t.Fatal(err)
	}
	r.Join(3)
	lim, _ := bucket.NewLimiter(bucket.Rule{Name: "l", Limit: 2, Window: time.Hour}, r.Counters())
	lim.Allow("k", time.Minute)
	lim.Allow("k", time.Minute)
	r.Close()

	r2, err := shm.OpenFile(path)
	if err != nil {
		t.Fatal(err)
	}
	defer r2.Close()
	r2.ReapAll()
	r2.Join(3)
	lim2, _ := bucket.NewLimiter(bucket.Rule{Name: "l", Limit: 2, Window: time.Hour}, r2.Counters())
	if d := lim2.Allow("k", time.Minute); d.Allowed {
		t.Fatalf("counts lost across re-attach: %+v", d)
	}
	if n := len(slices.Collect(r2.Counters().Snapshot())); n != 1 {
		t.Fatalf("snapshot saw %d entries", n)
	}
}

// Entries of a snapshot placed into a reseeded region keep their state.
func TestReseedAndPlace(t *testing.T) {
	a := shmtest.Private(t, shm.Options{Counters: 64})
	lim, _ := bucket.NewLimiter(bucket.Rule{Name: "x", Limit: 1, Window: time.Hour}, a.Counters())
	lim.Allow("k", time.Minute)
	saved := slices.Collect(a.Counters().Snapshot())

	b := shmtest.Private(t, shm.Options{Counters: 128})
	placeInto(t, b, a, saved)
	if err := b.SetSeeds(1, 2); !errors.Is(err, shm.ErrNotEmpty) {
		t.Fatalf("reseed of a used table: %v", err)
	}
	limB, _ := bucket.NewLimiter(bucket.Rule{Name: "x", Limit: 1, Window: time.Hour}, b.Counters())
	if d := limB.Allow("k", time.Minute); d.Allowed {
		t.Fatalf("reinserted key forgot its state: %+v", d)
	}
}

// A process whose identity was retired while it runs claims nothing and
// does not spin: it gets ErrRetired for new keys, and existing keys still
// count exactly.
func TestRetiredWorker(t *testing.T) {
	r := shmtest.Private(t, shm.Options{Counters: 64})
	lim, _ := bucket.NewLimiter(bucket.Rule{Name: "r", Limit: 3, Window: time.Hour}, r.Counters())
	lim.Allow("old", time.Minute)
	r.ReapAll() // a new supervisor took the region over
	if d := lim.Allow("old", time.Minute); !d.Allowed || d.Full || d.Remaining != 1 {
		t.Fatalf("existing key after retirement: %+v", d)
	}
	_, err := r.Counters().Update(r.Counters().KeyOfString(1, "new"), shm.Quota{}, 0, time.Minute, func(p uint64, _ time.Duration) (uint64, bool) { return p + 1, true })
	if !errors.Is(err, shm.ErrRetired) {
		t.Fatalf("claim by a retired worker: %v", err)
	}
	if st := r.Counters().Stats(); st.Busy != 0 || st.Locked != 0 {
		t.Fatalf("retired worker left %+v", st)
	}
}

// Both key functions give one identity for the same bytes, short or long,
// and a different one in another namespace or region.
func TestKeyOf(t *testing.T) {
	r := shmtest.Private(t, shm.Options{Counters: 8})
	c := r.Counters()
	for _, n := range []int{0, 1, 7, 8, 119, 120, 121, 500} {
		id := strings.Repeat("k", n)
		a, b := c.KeyOf(5, []byte(id)), c.KeyOfString(5, id)
		if a != b {
			t.Fatalf("len %d: KeyOf %x, KeyOfString %x", n, a, b)
		}
		if c.KeyOfString(6, id) == a {
			t.Fatalf("len %d: the namespace does not change the key", n)
		}
	}
	other := shmtest.Private(t, shm.Options{Counters: 8})
	if other.Counters().KeyOfString(5, "x") == c.KeyOfString(5, "x") {
		t.Fatal("two regions with their own seeds give one key")
	}
	long := strings.Repeat("y", 300)
	if n := testing.AllocsPerRun(100, func() { c.KeyOfString(1, "10.0.0.1"); c.KeyOfString(1, long) }); n != 0 {
		t.Fatalf("KeyOfString allocates %v times", n)
	}
}
