//go:build linux

package shm

import (
	"errors"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// attachAgain maps r again from a duplicate of its descriptor, as a
// worker process does (not joined).
func attachAgain(t *testing.T, r *Region) *Region {
	t.Helper()
	fd, err := unix.Dup(int(r.File().Fd()))
	if err != nil {
		t.Fatal(err)
	}
	a, err := Attach(os.NewFile(uintptr(fd), "region"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	return a
}

// oldBinaryJoin is Region.Join as a build before Counters.Use joins
// (what a worker of an older build does during a USR2 upgrade or
// rollback: the layout is unchanged, so it shares the region): it never
// writes the uses word.
func oldBinaryJoin(r *Region, w int) {
	inc := uint32(atomic.LoadUint64(&r.workers[w].incarnation))
	atomic.StoreUint64(&r.workers[w].pid, uint64(os.Getpid()))
	r.owner.Store(ownerID(w, inc))
}

// A worker of an older build never publishes its metas, which keeps every
// slot from being judged superseded while it lives: a reaped occupant's
// word must not be left in the entry it joins (retire clears it), or the
// older worker passes for one that writes the new set, and its live state
// is taken.
func TestOlderBuildWorkerIsNeverSettled(t *testing.T) {
	sup, err := Create(Options{Counters: 64})
	if err != nil {
		t.Fatal(err)
	}
	defer sup.Close()
	never := func(_, _ uint64, _ time.Duration) bool { return false } // nothing turns fresh in this test
	const mNew, mOld = 0x1111, 0x2222
	q := Quota{Account: 7, Max: 1}
	op := func(p uint64, _ time.Duration) (uint64, bool) { return p + 1, true }
	now := time.Second

	// Worker 0 (this build, the new definition).
	w0 := attachAgain(t, sup)
	w0.Counters().SetFresh(never)
	if err := w0.Join(0); err != nil {
		t.Fatal(err)
	}
	w0.Counters().Use(mNew)

	// Index 1 was held by a worker of this build (the new definition),
	// since reaped (recycled, or a failed upgrade's worker).
	w1 := attachAgain(t, sup)
	if err := w1.Join(1); err != nil {
		t.Fatal(err)
	}
	w1.Counters().Use(mNew)
	if _, err := sup.Reap(1); err != nil {
		t.Fatal(err)
	}

	// Key K of the old definition was written by a worker since gone.
	w2 := attachAgain(t, sup)
	w2.Counters().SetFresh(never)
	if err := w2.Join(2); err != nil {
		t.Fatal(err)
	}
	k := w2.Counters().KeyOf(1, []byte("K"))
	if _, err := w2.Counters().Update(k, q, mOld, now, op); err != nil {
		t.Fatal(err)
	}
	if _, err := sup.Reap(2); err != nil {
		t.Fatal(err)
	}

	// A worker of the older build (the old definition) joins index 1 and
	// serves key K: it counts on its state.
	old := attachAgain(t, sup)
	old.Counters().SetFresh(never)
	oldBinaryJoin(old, 1)
	if _, err := old.Counters().Update(k, q, mOld, now, op); err != nil {
		t.Fatal(err)
	}
	t.Logf("entry 1: pid %d uses %#x; worker 0 uses %#x",
		sup.workers[1].pid, sup.workers[1].uses, sup.workers[0].uses)

	// Worker 0, at its maximum, must not take K's slot: a live process
	// (that never published) writes it.
	k2 := w0.Counters().KeyOf(1, []byte("K2"))
	_, err = w0.Counters().Update(k2, q, mNew, now, op)
	if err == nil {
		if _, ok := old.Counters().Peek(k, now); !ok {
			t.Fatalf("worker 0 took the slot of key K, which a live worker of the older build uses")
		}
	}
	if !errors.Is(err, ErrQuota) {
		t.Fatalf("new key on worker 0: %v, want ErrQuota", err)
	}
}
