package persist

import (
	"bytes"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/preforkd/preforkd/shm"
)

var (
	kPage  = shm.Key{A: 21, B: 1} // cached for an hour
	kBrief = shm.Key{A: 22, B: 2} // cached for a minute
	kFill  = shm.Key{A: 23, B: 3} // being filled: a lock, not an entry
	page   = bytes.Repeat([]byte("<p>page</p>"), 500)
)

// cachedResponses fills r with cache entries, a fill in flight and two
// purged tags.
func cachedResponses(t testing.TB, r *shm.Region) {
	t.Helper()
	tab := r.Responses()
	for _, c := range []struct {
		k   shm.Key
		ttl time.Duration
	}{{kPage, time.Hour}, {kBrief, time.Minute}, {kFill, 0}} {
		lock, held, err := tab.CacheLock(c.k, t1)
		if err != nil || !held {
			t.Fatalf("lock %v: %v %v", c.k, held, err)
		}
		if c.ttl > 0 {
			if ok, err := tab.CacheFill(lock, page, t1+c.ttl, t1); !ok || err != nil {
				t.Fatalf("fill: %v %v", ok, err)
			}
		}
	}
	r.Tags().Purge(5)
	r.Tags().Purge(5)
	r.Tags().Bump(1 << 40)
}

// Cache entries and tag generations survive a restart together; an entry
// that expired during the downtime does not; a fill in flight is not
// dumped.
func TestCacheRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), "dump")
	a := responseRegion(t)
	exhaust(t, a, "c")
	storedResponses(t, a)
	cachedResponses(t, a)
	st := dumpTo(t, a, Options{Path: path, Key: "v1", Rules: rules, Now: wallAt(wall0)})
	if st.Cached != 2 || st.TagGens != 2 || st.Responses != 3 {
		t.Fatalf("dumped %+v, want 2 cache entries, 2 tag generations, 3 responses", st)
	}
	b := responseRegion(t)
	b.SetNow(0)
	rep, err := Load(b, Options{Path: path, Key: "v1", Rules: rules, Now: wallAt(wall0.Add(10 * time.Minute))}, quiet)
	if err != nil || rep.Cached != 1 || rep.TagGens != 2 || rep.DroppedCache[DropExpired] != 1 || rep.Responses != 2 {
		t.Fatalf("%+v, %v", rep, err)
	}
	b.Join(1)
	now := rep.RegionTime
	if f, _ := b.Responses().CacheLookup(kPage, now, nil); !bytes.Equal(f.Data, page) || f.Expiry != t1+time.Hour {
		t.Fatalf("restored entry: %d bytes, expiry %v", len(f.Data), f.Expiry)
	}
	for _, k := range []shm.Key{kBrief, kFill} {
		if f, _ := b.Responses().CacheLookup(k, now, nil); f.Data != nil || f.Filling {
			t.Fatalf("%v after the restart: %+v", k, f)
		}
	}
	if g := b.Tags(); g.Gen(5) != 2 || g.Gen(1<<40) != 1 || g.Gen(6) != 0 {
		t.Fatalf("generations after the restart: %d %d", g.Gen(5), g.Gen(1<<40))
	}
	// Idempotency records and cache entries of one key stay apart.
	var got shm.Response
	if out, _, _ := b.Responses().Begin(kPage, shm.Quota{}, shm.Quota{}, fp1, now, &got); out != shm.Reserved {
		t.Fatalf("an idempotency Begin on a cache key after the restart: %v", out)
	}
}

func TestCacheGuards(t *testing.T) {
	_, dump := redumper(t, cachedResponses)
	t.Run("persist key changed", func(t *testing.T) {
		log, lines := logBuf()
		b := responseRegion(t)
		rep, err := Load(b, Options{Path: dump(), Key: "v2", Rules: rules, Now: wallAt(wall0)}, log)
		if err != nil || rep.Cached != 0 || rep.Counters != 2 || !refused(rep, "cache", ReasonKeyChanged) {
			t.Fatalf("%+v, %v", rep, err)
		}
		if !strings.Contains(lines.String(), "2 cached responses dropped; counters are kept") {
			t.Errorf("log:\n%s", lines)
		}
		if b.Tags().Gen(5) != 0 || b.Responses().Stats().Cached != 0 {
			t.Fatal("something of a refused cache was restored")
		}
	})
	t.Run("tag table of another size", func(t *testing.T) {
		b, err := shm.CreatePrivate(shm.Options{Counters: 64, MaxWorkers: 8, Responses: 64, ResponseBytes: 64 << 10, Tags: 1 << 10})
		if err != nil {
			t.Fatal(err)
		}
		rep, err := Load(b, Options{Path: dump(), Key: "v1", Rules: rules, Now: wallAt(wall0)}, quiet)
		if err != nil || rep.Cached != 0 || rep.Counters != 2 || !refused(rep, "cache", ReasonTagSlots) {
			t.Fatalf("%+v, %v", rep, err)
		}
	})
	t.Run("inspect", func(t *testing.T) {
		var out strings.Builder
		if err := Inspect(dump(), &out); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(out.String(), "cache, ") || !strings.Contains(out.String(), "2 cached responses (0 expired at dump), 11000 bytes; 2 tag generations of 65536 slots") {
			t.Fatalf("inspect:\n%s", out.String())
		}
	})
}

// refused reports whether rep refused what for why.
func refused(rep Report, what string, why Reason) bool {
	for _, f := range rep.Refused {
		if f.What == what && f.Reason == why {
			return true
		}
	}
	return false
}
