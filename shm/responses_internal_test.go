package shm

import (
	"crypto/sha256"
	"sync/atomic"
	"testing"
	"time"
)

// A completed record whose stored bytes are damaged (its checksum fails
// while its state stays put) is Unreplayable at once, and in a snapshot:
// the regressions spun in Begin for ever, taking it for a copy torn by a
// change, and left it out of a dump, so that a retry ran it again.
func TestDamagedRecordIsUnreplayable(t *testing.T) {
	r, err := CreatePrivate(Options{Counters: 8, Responses: 16, ResponseBytes: 16 * 256, BlockSize: 256})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if err := r.Join(0); err != nil {
		t.Fatal(err)
	}
	tab, now := r.Responses(), time.Minute
	k, fp := r.Counters().KeyOf(1, []byte("order-1")), Fingerprint(sha256.Sum256([]byte("a")))
	var got Response
	out, tk, err := tab.Begin(k, Quota{}, Quota{}, fp, now, &got)
	if err != nil || out != Reserved {
		t.Fatalf("first: %v %v", out, err)
	}
	if _, err := tab.Complete(tk, &Response{Status: 201, Body: []byte("created")}, now, time.Hour); err != nil {
		t.Fatal(err)
	}
	atomic.AddUint64(&tab.recs[tk.idx].sum, 1)

	done := make(chan Outcome, 1)
	go func() {
		out, _, err := tab.Begin(k, Quota{}, Quota{}, fp, now, &got)
		if err != nil {
			t.Error(err)
		}
		done <- out
	}()
	select {
	case out := <-done:
		if out != Unreplayable {
			t.Fatalf("a damaged record: %v, want Unreplayable", out)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Begin still looking at a damaged record after 10 s")
	}

	// A dump keeps it so: a retry after a restart must not run it again.
	var entries []StoredEntry
	for e := range tab.Snapshot(now) {
		entries = append(entries, e)
	}
	if len(entries) != 1 || !entries[0].Unreplayable || entries[0].Key != k {
		t.Fatalf("the snapshot of a damaged record: %+v, want it, unreplayable", entries)
	}
}
