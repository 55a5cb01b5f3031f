package shm_test

import (
	"fmt"
	"os"
	"testing"

	"github.com/preforkd/preforkd/shm"
)

// Two mappings of one region, joined as two workers, count their own
// responses; the counts survive a reap of the index and only grow, so that
// the difference of two samples is what was sent in between.
func TestRequestCounts(t *testing.T) {
	region, err := shm.Create(shm.Options{Counters: 64, MaxWorkers: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer region.Close()
	attach := func(w int) *shm.Region {
		t.Helper()
		f, err := os.OpenFile(fmt.Sprintf("/proc/self/fd/%d", region.File().Fd()), os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		r, err := shm.Attach(f)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { r.Close() })
		if err := r.Join(w); err != nil {
			t.Fatal(err)
		}
		return r
	}
	a, b := attach(1), attach(2)
	region.CountRequest(500) // the supervisor has not joined: not counted
	for _, s := range []int{200, 204, 301, 404, 429, 499, 500, 503, 599} {
		a.CountRequest(s)
	}
	b.CountRequest(502)
	b.CountRequest(600) // not a 5xx
	if got := region.RequestCounts(1); got != (shm.RequestCounts{Requests: 9, Errors: 3}) {
		t.Errorf("index 1: %+v, want 9 requests, 3 errors", got)
	}
	if got := region.RequestCounts(2); got != (shm.RequestCounts{Requests: 2, Errors: 1}) {
		t.Errorf("index 2: %+v, want 2 requests, 1 error", got)
	}
	if got := region.RequestCounts(0); got != (shm.RequestCounts{}) {
		t.Errorf("index 0 (unused): %+v", got)
	}
	if got := region.RequestCounts(-1); got != (shm.RequestCounts{}) {
		t.Errorf("index -1: %+v", got)
	}
	if got := region.RequestCounts(4); got != (shm.RequestCounts{}) {
		t.Errorf("index 4 (outside the table): %+v", got)
	}
	before := region.TotalRequestCounts()
	if before != (shm.RequestCounts{Requests: 11, Errors: 4}) {
		t.Fatalf("total %+v, want 11 requests, 4 errors", before)
	}

	// Index 1 is reaped and joined by another process: its count goes on.
	if _, err := region.Reap(1); err != nil {
		t.Fatal(err)
	}
	c := attach(1)
	c.CountRequest(200)
	if got := region.RequestCounts(1); got != (shm.RequestCounts{Requests: 10, Errors: 3}) {
		t.Errorf("index 1 after a reap: %+v, want 10 requests, 3 errors", got)
	}
	if d := region.TotalRequestCounts().Sub(before); d != (shm.RequestCounts{Requests: 1}) {
		t.Errorf("total difference %+v, want 1 request", d)
	}
}

func TestCountRequestDoesNotAllocate(t *testing.T) {
	r := privateRegion(t, shm.Options{Counters: 64, MaxWorkers: 2})
	if err := r.Join(0); err != nil {
		t.Fatal(err)
	}
	if n := testing.AllocsPerRun(100, func() { r.CountRequest(503) }); n != 0 {
		t.Errorf("%v allocations per CountRequest", n)
	}
}
