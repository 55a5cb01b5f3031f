package shm

import "sync/atomic"

// Per-worker request counters: how many responses each worker index sent
// and how many of them were 5xx. A worker counts its own (CountRequest);
// the supervisor samples them (RequestCounts, TotalRequestCounts), e.g. to
// compare a reload's canary with the rest of the workers over one window.
//
// The two words live in the worker's own entry, which only that worker
// writes, so counting costs one uncontended atomic add (two for a 5xx).
// They are never reset, not even when the index is reaped and joined by
// another process: a count only grows, and a difference of two samples of
// one index is what its workers sent in between. They are a stopgap for
// the per-worker statistics block (counts per status code), which will
// serve these calls when it exists; the API stays.

// RequestCounts are responses sent, and the 5xx among them.
type RequestCounts struct {
	Requests uint64
	Errors   uint64 // status 500..599
}

// Sub returns c − earlier: what was counted between two samples.
func (c RequestCounts) Sub(earlier RequestCounts) RequestCounts {
	return RequestCounts{Requests: c.Requests - earlier.Requests, Errors: c.Errors - earlier.Errors}
}

// CountRequest counts one response with status under this process's
// worker index; nothing when it has not joined.
func (r *Region) CountRequest(status int) {
	o := r.owner.Load()
	if o == 0 {
		return
	}
	e := &r.workers[o>>32]
	atomic.AddUint64(&e.requests, 1)
	if status >= 500 && status <= 599 {
		atomic.AddUint64(&e.errors5xx, 1)
	}
}

// RequestCounts reports what worker index w counted since the region was
// created, over all the processes that joined as w; zero for an index
// outside the worker table.
func (r *Region) RequestCounts(w int) RequestCounts {
	if w < 0 || w >= len(r.workers) {
		return RequestCounts{}
	}
	return r.workers[w].requestCounts()
}

// TotalRequestCounts sums RequestCounts over every worker index.
func (r *Region) TotalRequestCounts() RequestCounts {
	var sum RequestCounts
	for w := range r.workers {
		c := r.workers[w].requestCounts()
		sum.Requests += c.Requests
		sum.Errors += c.Errors
	}
	return sum
}

// requestCounts loads the errors before the requests: a 5xx is counted
// after its request, so a sample never holds more errors than requests.
func (e *workerEntry) requestCounts() RequestCounts {
	errs := atomic.LoadUint64(&e.errors5xx)
	return RequestCounts{Requests: atomic.LoadUint64(&e.requests), Errors: errs}
}
