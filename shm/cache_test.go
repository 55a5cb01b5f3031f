package shm_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/preforkd/preforkd/shm"
)

// A key's life in the cache: a miss, one fill lock, the entry, a refresh
// under a second lock while the old entry stays readable, the swap.
func TestCacheLifeCycle(t *testing.T) {
	r := respRegion(t, 64, 64*256)
	tab := r.Responses()
	k := r.Counters().KeyOf(2, []byte("GET example.com /a"))
	now := time.Minute

	f, err := tab.CacheLookup(k, now, nil)
	if err != nil || f.Data != nil || f.Filling {
		t.Fatalf("empty table: %+v %v", f, err)
	}
	lock, held, err := tab.CacheLock(k, now)
	if err != nil || !held {
		t.Fatalf("first lock: %v %v", held, err)
	}
	if other, held, _ := tab.CacheLock(k, now); held || other != lock {
		t.Fatalf("second lock: held %v, ticket %v want %v", held, other, lock)
	}
	if f, _ := tab.CacheLookup(k, now, nil); f.Data != nil || !f.Filling || f.Fill != lock {
		t.Fatalf("lookup while filling: %+v", f)
	}
	v1 := bytes.Repeat([]byte("version one "), 100) // several 256-byte blocks
	if ok, err := tab.CacheFill(lock, v1, now+time.Hour, now); !ok || err != nil {
		t.Fatalf("fill: %v %v", ok, err)
	}
	buf := make([]byte, 0, 16)
	f, _ = tab.CacheLookup(k, now, buf)
	if !bytes.Equal(f.Data, v1) || f.Filling || f.Expiry != now+time.Hour {
		t.Fatalf("hit: %q filling %v expiry %v", f.Data, f.Filling, f.Expiry)
	}
	// An idempotency key with the same identity never sees the entry.
	var got shm.Response
	if out, tk, _ := tab.Begin(k, shm.Quota{}, shm.Quota{}, fpOf("x"), now, &got); out != shm.Reserved {
		t.Fatalf("idempotency Begin on a cache key: %v", out)
	} else {
		tab.Release(tk)
	}

	// A refresh: the old entry is served while the new one is fetched.
	lock2, held, _ := tab.CacheLock(k, now)
	if !held {
		t.Fatal("refresh lock not held")
	}
	f, _ = tab.CacheLookup(k, now, nil)
	if !bytes.Equal(f.Data, v1) || !f.Filling || f.Fill != lock2 {
		t.Fatalf("lookup while refreshing: %q %+v", f.Data, f)
	}
	v2 := []byte("version two")
	if ok, _ := tab.CacheFill(lock2, v2, now+2*time.Hour, now); !ok {
		t.Fatal("refresh fill")
	}
	if f, _ = tab.CacheLookup(k, now, nil); !bytes.Equal(f.Data, v2) {
		t.Fatalf("after refresh: %q", f.Data)
	}
	if st := tab.Stats(); st.Cached != 1 || st.Filling != 0 || st.CacheBytes != len(v2) || st.BlocksUsed != 1 {
		t.Fatalf("stats after refresh (old entry dropped, its blocks freed): %+v", st)
	}

	// A lock given up leaves the entry; an evicted entry is gone.
	lock3, _, _ := tab.CacheLock(k, now)
	tab.CacheUnlock(lock3)
	f, _ = tab.CacheLookup(k, now, nil)
	if !bytes.Equal(f.Data, v2) || f.Filling {
		t.Fatalf("after unlock: %q %v", f.Data, f.Filling)
	}
	if !tab.CacheEvict(f.Entry) || tab.CacheEvict(f.Entry) {
		t.Fatal("evict: want true once")
	}
	if f, _ = tab.CacheLookup(k, now, nil); f.Data != nil {
		t.Fatalf("after evict: %q", f.Data)
	}
	// Expired entries are misses; CacheDrop drops what lives.
	lock4, _, _ := tab.CacheLock(k, now)
	tab.CacheFill(lock4, v1, now+time.Second, now)
	if f, _ = tab.CacheLookup(k, now+time.Second, nil); f.Data != nil {
		t.Fatal("an expired entry was found")
	}
	if n := tab.CacheDrop(k); n != 1 {
		t.Fatalf("drop: %d", n)
	}
	if st := tab.Stats(); st.Cached != 0 || st.BlocksUsed != 0 {
		t.Fatalf("after drop: %+v", st)
	}
}

// A full probe window gives a cache fill the entry that expires first,
// and an idempotency reservation too; idempotency records are never
// evicted.
func TestCacheEvictsInTheWindow(t *testing.T) {
	r := respRegion(t, 8, 64*256) // 8 records: one probe window
	tab := r.Responses()
	now := time.Minute
	key := func(i int) shm.Key { return r.Counters().KeyOf(2, fmt.Appendf(nil, "k%d", i)) }
	for i := range 8 {
		lock, held, err := tab.CacheLock(key(i), now)
		if !held || err != nil {
			t.Fatalf("lock %d: %v %v", i, held, err)
		}
		tab.CacheFill(lock, []byte{byte(i)}, now+time.Duration(10+i)*time.Second, now)
	}
	lock, held, err := tab.CacheLock(key(8), now)
	if !held || err != nil {
		t.Fatalf("lock in a full window: %v %v", held, err)
	}
	tab.CacheFill(lock, []byte{8}, now+time.Hour, now)
	if f, _ := tab.CacheLookup(key(0), now, nil); f.Data != nil {
		t.Fatal("the entry that expires first was not the one evicted")
	}
	if f, _ := tab.CacheLookup(key(1), now, nil); f.Data == nil {
		t.Fatal("another entry was evicted")
	}
	var got shm.Response
	if out, tk, err := tab.Begin(key(100), shm.Quota{}, shm.Quota{}, fpOf("x"), now, &got); out != shm.Reserved || err != nil {
		t.Fatalf("idempotency Begin in a window of cache entries: %v %v", out, err)
	} else {
		tab.Complete(tk, &shm.Response{Status: 201}, now, time.Hour)
	}
	if f, _ := tab.CacheLookup(key(1), now, nil); f.Data != nil {
		t.Fatal("idempotency did not take the entry that expires first")
	}
	if st := tab.Stats(); st.Evicted != 2 {
		t.Fatalf("evicted %d, want 2", st.Evicted)
	}

	// A window of idempotency records only: no room for the cache.
	r2 := respRegion(t, 8, 64*256)
	tab2 := r2.Responses()
	for i := range 8 {
		_, tk, _ := tab2.Begin(r2.Counters().KeyOf(1, fmt.Appendf(nil, "o%d", i)), shm.Quota{}, shm.Quota{}, fpOf("x"), now, &got)
		tab2.Complete(tk, &shm.Response{Status: 201}, now, time.Hour)
	}
	if _, _, err := tab2.CacheLock(key(0), now); !errors.Is(err, shm.ErrFull) {
		t.Fatalf("cache lock among idempotency records: %v, want ErrFull", err)
	}
}

// When the block pool is short, a fill evicts cache entries (and records
// that expired) to make room; so does an idempotency completion; a
// completed idempotency record keeps its blocks.
func TestCacheEvictsBlocks(t *testing.T) {
	r := respRegion(t, 64, 4*256) // 4 blocks of 248 data bytes
	tab := r.Responses()
	now := time.Minute
	key := func(i int) shm.Key { return r.Counters().KeyOf(2, fmt.Appendf(nil, "b%d", i)) }
	big := bytes.Repeat([]byte{'x'}, 300) // 2 blocks
	fill := func(k shm.Key, data []byte) bool {
		t.Helper()
		lock, held, err := tab.CacheLock(k, now)
		if !held || err != nil {
			t.Fatalf("lock: %v %v", held, err)
		}
		ok, err := tab.CacheFill(lock, data, now+time.Hour, now)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	if !fill(key(0), big) || !fill(key(1), big) {
		t.Fatal("first two fills")
	}
	if !fill(key(2), big) {
		t.Fatal("a fill with the pool full did not evict")
	}
	if st := tab.Stats(); st.Cached != 2 || st.Evicted != 1 || st.BlocksUsed != 4 {
		t.Fatalf("after eviction: %+v", st)
	}
	var got shm.Response
	_, tk, _ := tab.Begin(r.Counters().KeyOf(1, []byte("order")), shm.Quota{}, shm.Quota{}, fpOf("x"), now, &got)
	if stored, _ := tab.Complete(tk, &shm.Response{Status: 201, Body: big}, now, time.Hour); !stored {
		t.Fatal("an idempotency response was not stored over cache entries")
	}
	// Now 2 blocks hold the idempotency response: a 4-block entry cannot fit.
	if fill(key(3), bytes.Repeat([]byte{'y'}, 900)) {
		t.Fatal("a fill took the blocks of an idempotency record")
	}
	if out, _, _ := tab.Begin(r.Counters().KeyOf(1, []byte("order")), shm.Quota{}, shm.Quota{}, fpOf("x"), now, &got); out != shm.Replay || !bytes.Equal(got.Body, big) {
		t.Fatalf("the idempotency record after the failed fill: %v", out)
	}
	if f, _ := tab.CacheLookup(key(3), now, nil); f.Data != nil || f.Filling {
		t.Fatalf("a fill without room left a trace: %+v", f)
	}
}

// A fill lock of a dead worker is released by whoever meets it.
func TestCacheLockOfDeadOwner(t *testing.T) {
	r := respRegion(t, 64, 64*256)
	tab := r.Responses()
	k := r.Counters().KeyOf(2, []byte("k"))
	if _, held, _ := tab.CacheLock(k, 0); !held {
		t.Fatal("lock")
	}
	r.Join(1)
	r.Retire(0)
	if f, _ := tab.CacheLookup(k, 0, nil); f.Filling {
		t.Fatal("a dead worker's lock is still seen")
	}
	if _, held, _ := tab.CacheLock(k, 0); !held {
		t.Fatal("the key stayed locked")
	}
}

// Goroutines fill and read a few keys at once: every read is one whole
// value that was written, and a key never has two locks.
func TestCacheConcurrent(t *testing.T) {
	r := respRegion(t, 64, 128*256)
	tab := r.Responses()
	keys := []shm.Key{r.Counters().KeyOf(2, []byte("x")), r.Counters().KeyOf(2, []byte("y"))}
	var holders [2]atomic.Int32
	var wg sync.WaitGroup
	var bad atomic.Value
	for g := range 8 {
		wg.Go(func() {
			for i := range 2000 {
				ki := (g + i) % 2
				k := keys[ki]
				f, err := tab.CacheLookup(k, 0, nil)
				if err != nil {
					bad.Store(err.Error())
					return
				}
				if f.Data != nil {
					if n := len(f.Data); n < 8 || !bytes.Equal(f.Data, bytes.Repeat(f.Data[:8], n/8)) {
						bad.Store(fmt.Sprintf("torn entry %q", f.Data))
						return
					}
				}
				if i%4 != 0 {
					continue
				}
				lock, held, err := tab.CacheLock(k, 0)
				if err != nil || !held {
					continue
				}
				if holders[ki].Add(1) != 1 {
					bad.Store("two locks on one key")
				}
				v := bytes.Repeat(fmt.Appendf(nil, "g%02di%04d", g, i)[:8], 1+i%60)
				holders[ki].Add(-1)
				tab.CacheFill(lock, v, time.Hour, 0)
			}
		})
	}
	wg.Wait()
	if v := bad.Load(); v != nil {
		t.Fatal(v)
	}
	if st := tab.Stats(); st.Cached != 2 || st.Filling != 0 {
		t.Fatalf("after the storm: %+v", st)
	}
}

// Tag generations: a purge advances the epoch before the generation;
// Snapshot and Place carry them over.
func TestTags(t *testing.T) {
	r := respRegion(t, 8, 8*256)
	g := r.Tags()
	if g.Len() != 1<<16 {
		t.Fatalf("slots: %d", g.Len())
	}
	h := uint64(0xdead_beef_0000_0005)
	if g.Gen(h) != 0 || g.Epoch() != 0 {
		t.Fatal("not zero at start")
	}
	g.Purge(h)
	g.Bump(h + 1)
	if g.Gen(h) != 1 || g.Gen(h+1) != 1 || g.Epoch() != 1 || g.Gen(h+2) != 0 {
		t.Fatalf("after a purge and a bump: %d %d %d", g.Gen(h), g.Gen(h+1), g.Epoch())
	}
	if g.Gen(h+uint64(g.Len())) != 1 {
		t.Fatal("hashes that share a slot do not share its generation")
	}
	if st := g.Stats(); st.Used != 2 || st.TagPurges != 1 || st.URLPurges != 1 {
		t.Fatalf("stats: %+v", st)
	}
	snap := slices.Collect(g.Snapshot())
	r2 := respRegion(t, 8, 8*256)
	for _, e := range snap {
		if err := r2.Tags().Place(e); err != nil {
			t.Fatal(err)
		}
	}
	if r2.Tags().Gen(h) != 1 || r2.Tags().Gen(h+1) != 1 || len(snap) != 2 {
		t.Fatalf("placed: %v", snap)
	}
	if err := r2.Tags().Place(shm.TagGen{Slot: 1 << 16, Gen: 1}); !errors.Is(err, shm.ErrTagSlot) {
		t.Fatalf("a slot outside: %v", err)
	}
	noTable := respRegion(t, 0, 0)
	if noTable.Tags().Len() != 0 || noTable.Tags().Purge(h) || noTable.Tags().Gen(h) != 0 {
		t.Fatal("a region without a response table has tags")
	}
}

// Snapshot yields cache entries with their bytes and kind; Place puts
// them back beside idempotency records of the same key.
func TestCacheSnapshotPlace(t *testing.T) {
	r := respRegion(t, 64, 64*256)
	tab := r.Responses()
	k := r.Counters().KeyOf(2, []byte("k"))
	lock, _, _ := tab.CacheLock(k, 0)
	tab.CacheFill(lock, []byte("entry"), time.Hour, 0)
	var got shm.Response
	_, tk, _ := tab.Begin(k, shm.Quota{}, shm.Quota{}, fpOf("x"), 0, &got)
	tab.Complete(tk, &shm.Response{Status: 201, Body: []byte("order")}, 0, time.Hour)
	lock2, _, _ := tab.CacheLock(r.Counters().KeyOf(2, []byte("in flight")), 0)
	_ = lock2
	snap := slices.Collect(tab.Snapshot(0))
	if len(snap) != 2 {
		t.Fatalf("snapshot: %d entries, want 2 (no lock)", len(snap))
	}
	r2 := respRegion(t, 64, 64*256)
	for _, e := range snap {
		if err := r2.Responses().Place(e, 0); err != nil {
			t.Fatal(err)
		}
		if err := r2.Responses().Place(e, 0); !errors.Is(err, shm.ErrDuplicate) {
			t.Fatalf("placed twice: %v", err)
		}
	}
	if f, _ := r2.Responses().CacheLookup(k, 0, nil); string(f.Data) != "entry" {
		t.Fatalf("placed entry: %q", f.Data)
	}
	if out, _, _ := r2.Responses().Begin(k, shm.Quota{}, shm.Quota{}, fpOf("x"), 0, &got); out != shm.Replay || string(got.Body) != "order" {
		t.Fatalf("placed record: %v %q", out, got.Body)
	}
}

// cacheChild: goroutines miss one key at once; whoever takes the fill lock
// "fetches" (a pause) and fills; the others wait on the lock and read.
func cacheChild(r *shm.Region, spec childSpec) error {
	tab := r.Responses()
	k := r.Counters().KeyOf(2, []byte(spec.Keys[0]))
	var res onceResult
	var mu sync.Mutex
	var wg sync.WaitGroup
	for range spec.Goroutines {
		wg.Go(func() {
			for range 1000 {
				f, err := tab.CacheLookup(k, r.Now(), nil)
				if err != nil {
					fmt.Fprintln(os.Stderr, "lookup:", err)
					return
				}
				if f.Data != nil {
					mu.Lock()
					res.Ended = append(res.Ended, string(f.Data))
					mu.Unlock()
					return
				}
				lock, held, err := tab.CacheLock(k, r.Now())
				if err != nil {
					fmt.Fprintln(os.Stderr, "lock:", err)
					return
				}
				if !held {
					tab.Wait(lock, 10*time.Second)
					continue
				}
				mu.Lock()
				res.Runs++
				mu.Unlock()
				time.Sleep(spec.Pause)
				tab.CacheFill(lock, fmt.Appendf(nil, "fetched by pid %d", os.Getpid()), r.Now()+time.Hour, r.Now())
			}
		})
	}
	wg.Wait()
	return json.NewEncoder(os.Stdout).Encode(res)
}

// 4 processes × 8 goroutines miss one key: one fetch, and all 32 read
// what it stored.
func TestCacheOneFillAcrossProcesses(t *testing.T) {
	checkRunsOnce(t, "cache", "GET /hot", 4, 8, "fetched by pid")
}

// An entry looked up in part, from any prefix, is copied whole by its
// ticket; one dropped (its blocks taken by another entry) since is not
// copied at all, never with the other's bytes.
func TestCacheCopyOfAnEntryFoundInPart(t *testing.T) {
	r := respRegion(t, 64, 64*256)
	tab := r.Responses()
	now := time.Minute
	put := func(name string, data []byte) shm.Key {
		k := r.Counters().KeyOf(2, []byte(name))
		lock, held, err := tab.CacheLock(k, now)
		if err != nil || !held {
			t.Fatalf("lock %s: %v %v", name, held, err)
		}
		if ok, err := tab.CacheFill(lock, data, now+time.Hour, now); !ok || err != nil {
			t.Fatalf("fill %s: %v %v", name, ok, err)
		}
		return k
	}
	data := make([]byte, 10000) // 40 blocks of 248 bytes, and more
	for i := range data {
		data[i] = byte(i*7 + i>>8)
	}
	k := put("a", data)
	for _, prefix := range []int{0, 1, 7, 8, 247, 248, 249, 600, 9999, 10000} {
		f, err := tab.CacheLookupPart(k, now, nil, 100, prefix)
		if err != nil || f.Size != len(data) || !bytes.Equal(f.Data, data[:prefix]) {
			t.Fatalf("lookup in part %d: size %d, %d bytes, %v", prefix, f.Size, len(f.Data), err)
		}
		if got, ok := tab.CacheCopy(f.Entry, nil); !ok || !bytes.Equal(got, data) {
			t.Fatalf("prefix %d: copied %v, %d bytes, not the entry's", prefix, ok, len(got))
		}
	}
	// Small enough: copied whole, as CacheLookup does.
	if f, _ := tab.CacheLookupPart(k, now, nil, len(data), 10); !bytes.Equal(f.Data, data) {
		t.Fatalf("whole: %d bytes", len(f.Data))
	}

	// Dropped after the lookup, its blocks filled with another entry's
	// bytes.
	f, _ := tab.CacheLookupPart(k, now, nil, 100, 16)
	if n := tab.CacheDrop(k); n != 1 {
		t.Fatalf("dropped %d", n)
	}
	put("b", bytes.Repeat([]byte{0xee}, len(data)))
	if got, ok := tab.CacheCopy(f.Entry, nil); ok || got != nil {
		t.Fatalf("after the drop: copied %v, %d bytes", ok, len(got))
	}
	if _, ok := tab.CacheCopy(shm.Ticket{}, nil); ok {
		t.Fatal("the zero ticket copied")
	}
}
