package shm

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"
)

// TestAccountLockWaitsForALiveHolder: an account lock that a live process
// holds is not taken over; the taker waits up to its wait (not at all when
// it is 0) and gets the lock if the holder lets go meanwhile. The sweeper's
// id stands for the live holder: it never goes stale.
func TestAccountLockWaitsForALiveHolder(t *testing.T) {
	r, err := CreatePrivate(Options{Counters: 64})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if err := r.Join(0); err != nil {
		t.Fatal(err)
	}
	as, owner := &r.Counters().acc, r.owner.Load()
	const a = 7
	w := &as.a[a].lock
	atomic.StoreUint64(w, sweeperID)

	if err := as.lock(a, owner, 0); !errors.Is(err, ErrLockTimeout) {
		t.Fatalf("no wait: %v, want ErrLockTimeout", err)
	}
	const wait = 30 * time.Millisecond
	start := time.Now()
	if err := as.lock(a, owner, wait); !errors.Is(err, ErrLockTimeout) {
		t.Fatalf("held throughout: %v, want ErrLockTimeout", err)
	}
	if d := time.Since(start); d < wait {
		t.Fatalf("gave up after %v, before its wait of %v", d, wait)
	}
	if got := atomic.LoadUint64(w); got != sweeperID {
		t.Fatalf("the live holder's lock was taken over: %#x", got)
	}

	go func() {
		time.Sleep(20 * time.Millisecond)
		atomic.StoreUint64(w, 0)
	}()
	if err := as.lock(a, owner, 10*time.Second); err != nil {
		t.Fatalf("released during the wait: %v", err)
	}
	if got := atomic.LoadUint64(w); got != owner {
		t.Fatalf("lock word %#x, want this process's %#x", got, owner)
	}
	as.unlock(a, owner)
}
