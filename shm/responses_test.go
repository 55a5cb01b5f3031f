package shm_test

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/preforkd/preforkd/internal/shmtest"
	"github.com/preforkd/preforkd/shm"
)

func respRegion(t testing.TB, records int, poolBytes int64) *shm.Region {
	t.Helper()
	return shmtest.Private(t, shm.Options{Counters: 8, Responses: records, ResponseBytes: poolBytes, BlockSize: 256})
}

func fpOf(s string) shm.Fingerprint { return sha256.Sum256([]byte(s)) }

// reservedOrder returns a fresh table of 64 records in which the key
// "order-1" was reserved with fingerprint "a" at now, that key, and the
// ticket of the reservation.
func reservedOrder(t *testing.T, now time.Duration) (*shm.Responses, shm.Key, shm.Ticket) {
	t.Helper()
	r := respRegion(t, 64, 64*256)
	k, tk := reserveOrder(t, r, now)
	return r.Responses(), k, tk
}

// reserveOrder reserves the key "order-1" in r with fingerprint "a" at
// now, and returns the key and the ticket.
func reserveOrder(t *testing.T, r *shm.Region, now time.Duration) (shm.Key, shm.Ticket) {
	t.Helper()
	k := r.Counters().KeyOf(1, []byte("order-1"))
	var got shm.Response
	out, tk, err := r.Responses().Begin(k, shm.Quota{}, shm.Quota{}, fpOf("a"), now, &got)
	if err != nil || out != shm.Reserved {
		t.Fatalf("first: %v %v", out, err)
	}
	return k, tk
}

// completedOrder is the region of reservedOrder with "order-1" completed:
// a 201 of 1000 bytes, stored for an hour.
func completedOrder(t *testing.T, now time.Duration) (*shm.Region, shm.Key) {
	t.Helper()
	r := respRegion(t, 64, 64*256)
	k, tk := reserveOrder(t, r, now)
	if _, err := r.Responses().Complete(tk, &shm.Response{Status: 201, Body: make([]byte, 1000)}, now, time.Hour); err != nil {
		t.Fatal(err)
	}
	return r, k
}

func TestResponseLifeCycle(t *testing.T) {
	now := time.Minute
	tab, k, tk := reservedOrder(t, now)
	var got shm.Response
	if out, _, _ := tab.Begin(k, shm.Quota{}, shm.Quota{}, fpOf("a"), now, &got); out != shm.InFlight {
		t.Fatalf("duplicate while in flight: %v", out)
	}
	if out, _, _ := tab.Begin(k, shm.Quota{}, shm.Quota{}, fpOf("b"), now, &got); out != shm.Mismatch {
		t.Fatalf("other fingerprint while in flight: %v", out)
	}
	body := bytes.Repeat([]byte{0, 1, 2, 0xff, 0}, 1000) // NULs, across many 256-byte blocks
	want := shm.Response{Status: 201, ContentType: "application/octet-stream", Location: "/orders/1", Body: body}
	if stored, err := tab.Complete(tk, &want, now, time.Hour); !stored || err != nil {
		t.Fatalf("complete: %v %v", stored, err)
	}
	out, _, _ := tab.Begin(k, shm.Quota{}, shm.Quota{}, fpOf("a"), now, &got)
	if out != shm.Replay || got.Status != 201 || got.ContentType != want.ContentType || got.Location != want.Location || !bytes.Equal(got.Body, body) {
		t.Fatalf("replay: %v %+v", out, got.Status)
	}
	if out, _, _ := tab.Begin(k, shm.Quota{}, shm.Quota{}, fpOf("b"), now, &got); out != shm.Mismatch {
		t.Fatalf("other fingerprint after completion: %v", out)
	}
	// After the ttl the key is free again, and its blocks went back.
	used := tab.Stats().BlocksUsed
	out, tk, _ = tab.Begin(k, shm.Quota{}, shm.Quota{}, fpOf("b"), now+time.Hour, &got)
	if out != shm.Reserved {
		t.Fatalf("after ttl: %v", out)
	}
	if st := tab.Stats(); st.BlocksUsed >= used || st.BlocksUsed != 0 {
		t.Fatalf("blocks of the expired record not freed: %d → %d", used, st.BlocksUsed)
	}
	// A released reservation frees the key.
	tab.Release(tk)
	if out, _, _ := tab.Begin(k, shm.Quota{}, shm.Quota{}, fpOf("c"), now+time.Hour, &got); out != shm.Reserved {
		t.Fatalf("after release: %v", out)
	}
}

func TestResponseEmptyAndUnreplayable(t *testing.T) {
	r := respRegion(t, 64, 4*256)
	tab := r.Responses()
	var got shm.Response
	k := r.Counters().KeyOf(1, []byte("empty"))
	_, tk, _ := tab.Begin(k, shm.Quota{}, shm.Quota{}, fpOf("x"), 0, &got)
	tab.Complete(tk, &shm.Response{Status: 204}, 0, time.Hour)
	if out, _, _ := tab.Begin(k, shm.Quota{}, shm.Quota{}, fpOf("x"), 0, &got); out != shm.Replay || got.Status != 204 || len(got.Body) != 0 || got.ContentType != "" {
		t.Fatalf("empty 204: %v %+v", out, got)
	}
	// Too large for the pool: completed, not replayable, never run again.
	k2 := r.Counters().KeyOf(1, []byte("big"))
	_, tk, _ = tab.Begin(k2, shm.Quota{}, shm.Quota{}, fpOf("x"), 0, &got)
	stored, err := tab.Complete(tk, &shm.Response{Status: 200, Body: make([]byte, 10*256)}, 0, time.Hour)
	if stored || err != nil {
		t.Fatalf("oversized stored=%v err=%v", stored, err)
	}
	if out, _, _ := tab.Begin(k2, shm.Quota{}, shm.Quota{}, fpOf("x"), 0, &got); out != shm.Unreplayable {
		t.Fatalf("oversized retry: %v", out)
	}
	if st := tab.Stats(); st.NoBlocks != 1 || st.BlocksUsed != 1 {
		t.Fatalf("stats %+v", st)
	}
}

func TestResponseTableFull(t *testing.T) {
	r := respRegion(t, 8, 8*256)
	tab := r.Responses()
	var got shm.Response
	full := 0
	for i := 0; i < 20; i++ {
		_, _, err := tab.Begin(r.Counters().KeyOf(1, []byte{byte(i)}), shm.Quota{}, shm.Quota{}, fpOf("x"), 0, &got)
		if errors.Is(err, shm.ErrFull) {
			full++
		} else if err != nil {
			t.Fatal(err)
		}
	}
	if full != 12 {
		t.Fatalf("%d refused, want 12 (8 records)", full)
	}
}

// A waiting duplicate is woken by the completion at once.
func TestResponseWaitWakes(t *testing.T) {
	r := respRegion(t, 64, 64*256)
	tab := r.Responses()
	k := r.Counters().KeyOf(1, []byte("w"))
	var got shm.Response
	_, owner, _ := tab.Begin(k, shm.Quota{}, shm.Quota{}, fpOf("a"), 0, &got)
	var wg sync.WaitGroup
	var replays atomic.Int32
	for range 4 {
		wg.Go(func() {
			var mine shm.Response
			for range 100 {
				out, tk, err := tab.Begin(k, shm.Quota{}, shm.Quota{}, fpOf("a"), 0, &mine)
				if err != nil {
					t.Error(err)
					return
				}
				if out == shm.Replay {
					replays.Add(1)
					return
				}
				tab.Wait(tk, 5*time.Second)
			}
		})
	}
	time.Sleep(20 * time.Millisecond)
	start := time.Now()
	tab.Complete(owner, &shm.Response{Status: 200, Body: []byte("done")}, 0, time.Hour)
	wg.Wait()
	if replays.Load() != 4 {
		t.Fatalf("%d replays", replays.Load())
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("waiters took %v to wake", d)
	}
}

// A snapshot holds the completed, unexpired records; placed into another
// region they replay as they did.
func TestResponseSnapshotPlace(t *testing.T) {
	a := respRegion(t, 64, 64*256)
	var got shm.Response
	keys := map[string]bool{"done": true, "big": false, "flight": false, "old": false}
	for name := range keys {
		k := a.Counters().KeyOf(3, []byte(name))
		_, tk, _ := a.Responses().Begin(k, shm.Quota{}, shm.Quota{}, fpOf(name), 0, &got)
		switch name {
		case "done":
			a.Responses().Complete(tk, &shm.Response{Status: 201, Location: "/x", Body: []byte("body")}, 0, time.Hour)
		case "big":
			a.Responses().Complete(tk, nil, 0, time.Hour)
		case "old":
			a.Responses().Complete(tk, &shm.Response{Status: 200}, 0, time.Second)
		}
	}
	saved := slices.Collect(a.Responses().Snapshot(time.Minute))
	if len(saved) != 2 {
		t.Fatalf("snapshot saw %d entries, want the completed unexpired two", len(saved))
	}
	b := respRegion(t, 64, 64*256)
	b.SetSeeds(a.Seeds())
	for _, e := range saved {
		if err := b.Responses().Place(e, time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Responses().Place(saved[0], time.Minute); !errors.Is(err, shm.ErrDuplicate) {
		t.Fatalf("a key placed twice: %v", err)
	}
	if out, _, _ := b.Responses().Begin(b.Counters().KeyOf(3, []byte("done")), shm.Quota{}, shm.Quota{}, fpOf("done"), time.Minute, &got); out != shm.Replay || string(got.Body) != "body" || got.Location != "/x" {
		t.Fatalf("restored replay: %v %+v", out, got)
	}
	if out, _, _ := b.Responses().Begin(b.Counters().KeyOf(3, []byte("big")), shm.Quota{}, shm.Quota{}, fpOf("big"), time.Minute, &got); out != shm.Unreplayable {
		t.Fatalf("restored unreplayable: %v", out)
	}
	if out, _, _ := b.Responses().Begin(b.Counters().KeyOf(3, []byte("flight")), shm.Quota{}, shm.Quota{}, fpOf("flight"), time.Minute, &got); out != shm.Reserved {
		t.Fatalf("a reservation was restored: %v", out)
	}

	// With every record of the probe window live, Place refuses; a record
	// expired by then is taken, and its blocks go back to the pool.
	c := respRegion(t, 2, 64*256)
	entry := func(name string, expiry time.Duration) shm.StoredEntry {
		return shm.StoredEntry{Key: c.Counters().KeyOf(3, []byte(name)), Fingerprint: fpOf(name), Expiry: expiry,
			Response: shm.Response{Status: 200, Body: bytes.Repeat([]byte(name), 100)}}
	}
	for _, e := range []shm.StoredEntry{entry("a", time.Hour), entry("b", 2*time.Minute)} {
		if err := c.Responses().Place(e, time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	used := c.Responses().Stats().BlocksUsed
	if err := c.Responses().Place(entry("c", time.Hour), time.Minute); !errors.Is(err, shm.ErrFull) {
		t.Fatalf("placed into a full window: %v", err)
	}
	if err := c.Responses().Place(entry("c", time.Hour), 3*time.Minute); err != nil {
		t.Fatalf("an expired record was not reused: %v", err)
	}
	if st := c.Responses().Stats(); st.Complete != 2 || st.BlocksUsed != used {
		t.Fatalf("after reusing an expired record: %+v, %d blocks used before", st, used)
	}
	if out, _, _ := c.Responses().Begin(entry("c", 0).Key, shm.Quota{}, shm.Quota{}, fpOf("c"), 3*time.Minute, &got); out != shm.Replay || !bytes.Equal(got.Body, entry("c", 0).Response.Body) {
		t.Fatalf("the record placed over an expired one: %v %q", out, got.Body)
	}
}

// A record Forget holds BUSY is the supervisor's, which is never stale: a
// worker that meets it meanwhile leaves it alone. The regression: the
// supervisor's id did not fit the record's 48 owner bits and read as
// owner 0, which is stale, so the worker released the record mid-Forget
// ("recovered" from a dead process), took it for a new reservation, and
// Forget then cleared the chain of the response completed in it.
func TestResponseForgetHoldsTheRecord(t *testing.T) {
	now := time.Minute
	r, k := completedOrder(t, now)
	tab := r.Responses()
	var got shm.Response
	blocks := tab.Stats().BlocksUsed // the retry's response is as long
	want := shm.Response{Status: 202, Body: bytes.Repeat([]byte("new "), 250)}
	var hooked int
	shm.SetTestHook(func(stage string) {
		if stage != "forgetting" {
			return
		}
		hooked++
		// Another worker, while the record is held: a retry with another
		// request, which runs and completes.
		out, tk, err := tab.Begin(k, shm.Quota{}, shm.Quota{}, fpOf("b"), now, &got)
		if err != nil || out != shm.Reserved {
			t.Errorf("a retry during Forget: %v %v, want Reserved", out, err)
			return
		}
		if _, err := tab.Complete(tk, &want, now, time.Hour); err != nil {
			t.Error(err)
		}
	})
	ok, err := tab.Forget(k, now)
	shm.SetTestHook(nil)
	if !ok || err != nil || hooked != 1 {
		t.Fatalf("Forget: %v, %v (hook ran %d times)", ok, err, hooked)
	}
	var sum shm.StatSum
	r.SumStats(&sum)
	if sum.Table.Recovered != 0 {
		t.Errorf("%d things recovered from dead processes; none died", sum.Table.Recovered)
	}
	if out, _, err := tab.Begin(k, shm.Quota{}, shm.Quota{}, fpOf("b"), now, &got); out != shm.Replay || err != nil {
		t.Fatalf("the response completed during Forget: %v %v, want Replay", out, err)
	}
	if got.Status != want.Status || !bytes.Equal(got.Body, want.Body) {
		t.Fatalf("replayed %d %q, want %d %q", got.Status, got.Body, want.Status, want.Body)
	}
	if st := tab.Stats(); st.BlocksUsed != blocks || st.Complete != 1 {
		t.Fatalf("after Forget and the retry: %+v; want the retry's %d blocks and 1 record", st, blocks)
	}
}

// A supervisor killed inside Forget (stopped here by a panic at the point
// where it holds the record) leaves the record held: no worker takes it
// for a dead worker's. ReapAll, for a region whose whole process tree
// died, ends that Forget: the record and its blocks are free again.
func TestReapAllEndsADeadForget(t *testing.T) {
	now := time.Minute
	r, k := completedOrder(t, now)
	tab := r.Responses()
	var got shm.Response
	shm.SetTestHook(func(stage string) {
		if stage == "forgetting" {
			panic("the supervisor is killed")
		}
	})
	func() {
		defer func() { recover() }()
		tab.Forget(k, now)
	}()
	shm.SetTestHook(nil)
	if st := tab.Stats(); st.BlocksUsed == 0 || st.Complete != 0 || st.Reserved != 1 {
		t.Fatalf("the dead Forget holds the record and its blocks: %+v", st)
	}

	if n := r.ReapAll(); n != 1 {
		t.Errorf("ReapAll released %d, want the one record", n)
	}
	if st := tab.Stats(); st.BlocksUsed != 0 || st.Reserved != 0 {
		t.Fatalf("after ReapAll: %+v; want no block or record in use", st)
	}
	if err := r.Join(0); err != nil {
		t.Fatal(err)
	}
	if out, _, err := tab.Begin(k, shm.Quota{}, shm.Quota{}, fpOf("b"), now, &got); out != shm.Reserved || err != nil {
		t.Fatalf("a retry after ReapAll: %v %v, want Reserved", out, err)
	}
}

// Forget drops a completed response (its blocks too), refuses one in
// flight, and a retry runs again.
func TestResponseForget(t *testing.T) {
	now := time.Minute
	tab, k, tk := reservedOrder(t, now)
	var got shm.Response
	if ok, err := tab.Forget(k, now); ok || !errors.Is(err, shm.ErrInFlight) {
		t.Fatalf("Forget in flight: %v, %v; want ErrInFlight", ok, err)
	}
	if _, err := tab.Complete(tk, &shm.Response{Status: 201, Body: make([]byte, 1000)}, now, time.Hour); err != nil {
		t.Fatal(err)
	}
	if tab.Stats().BlocksUsed == 0 {
		t.Fatal("the response took no block")
	}
	if ok, err := tab.Forget(k, now); !ok || err != nil {
		t.Fatalf("Forget: %v, %v", ok, err)
	}
	if st := tab.Stats(); st.BlocksUsed != 0 || st.Complete != 0 {
		t.Fatalf("after Forget: %+v", st)
	}
	if ok, err := tab.Forget(k, now); ok || err != nil {
		t.Fatalf("Forget again: %v, %v; want nothing to forget", ok, err)
	}
	if out, _, _ := tab.Begin(k, shm.Quota{}, shm.Quota{}, fpOf("a"), now, &got); out != shm.Reserved {
		t.Fatalf("a retry after Forget: %v, want Reserved (it runs again)", out)
	}
}
