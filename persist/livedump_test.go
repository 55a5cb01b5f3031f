//go:build linux

package persist

import (
	"encoding/binary"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/preforkd/preforkd/bucket"
	"github.com/preforkd/preforkd/shm"
)

// A dump made while workers write the table (persist.interval) is
// consistent slot by slot: every key that lived throughout is in it,
// exactly once, and loads with a count it really had during the dump
// (between the one before the dump and the one after: never torn, never
// a mix of two keys). The writers hammer a few keys, so that they change
// while the dump reads them (shm's TestSnapshotWhileWritten makes that
// race a thousand times more often).
func TestDumpWhileServing(t *testing.T) {
	r, err := shm.Create(shm.Options{Counters: 1 << 12})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if err := r.Join(0); err != nil {
		t.Fatal(err)
	}
	lim, err := bucket.NewLimiter(liveRule, r.Counters())
	if err != nil {
		t.Fatal(err)
	}
	const nkeys = 16
	keys := make([]shm.Key, nkeys)
	var id [8]byte
	for i := range keys {
		binary.LittleEndian.PutUint64(id[:], uint64(i))
		keys[i] = lim.Key(id[:])
		lim.AllowKey(keys[i], r.Now())
	}
	payloads := func() []uint64 {
		out := make([]uint64, nkeys)
		for i, k := range keys {
			p, ok := r.Counters().Peek(k, r.Now())
			if !ok {
				t.Fatalf("key %d has no slot", i)
			}
			out[i] = p
		}
		return out
	}

	var stop atomic.Bool
	var wg sync.WaitGroup
	var decisions atomic.Int64
	for w := range 2 {
		wg.Go(func() {
			for i := w; !stop.Load(); i++ {
				lim.AllowKey(keys[i%nkeys], r.Now())
				decisions.Add(1)
			}
		})
	}
	defer func() { stop.Store(true); wg.Wait() }()
	for decisions.Load() < 1000 {
		time.Sleep(time.Millisecond) // the writers are running
	}

	dir := t.TempDir()
	o := Options{Path: filepath.Join(dir, "dump"), Rules: []bucket.Rule{liveRule}}
	for round := range 30 {
		before := payloads()
		st, err := Dump(r, o)
		after := payloads()
		if err != nil {
			t.Fatal(err)
		}
		if st.Entries != nkeys {
			t.Fatalf("round %d: %d entries dumped, want %d", round, st.Entries, nkeys)
		}
		fresh, err := shm.Create(shm.Options{Counters: 1 << 12})
		if err != nil {
			t.Fatal(err)
		}
		rep, err := Load(fresh, o, quiet)
		if err != nil || rep.Counters != nkeys {
			fresh.Close()
			t.Fatalf("round %d: load restored %d counters (%v), want %d; dropped %v", round, rep.Counters, err, nkeys, rep.Dropped)
		}
		for i, k := range keys {
			p, ok := fresh.Counters().Peek(k, fresh.Now())
			if !ok || p < before[i] || p > after[i] {
				fresh.Close()
				t.Fatalf("round %d: key %d restored as %d (present %v), want between %d and %d", round, i, p, ok, before[i], after[i])
			}
		}
		fresh.Close()
	}
	t.Logf("%d decisions during the dumps", decisions.Load())
}
