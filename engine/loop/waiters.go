//go:build linux

package loop

import "sync"

// waiters finish the decisions that must wait (core.Exchange.NoWait: a
// Redis rule's round trip, a duplicate of a request in flight, a cache
// miss another request fetches), at most max at once, on goroutines
// started for them and gone once nothing waits; each hands its request
// back to the request's loop. A loop never waits for them. A pool is
// used by submit (the rest queue) or by trySubmit (the rest are
// refused), never both: the Server has one of each.
type waiters struct {
	max int

	mu      sync.Mutex
	queue   []*request
	head    int
	running int
	wg      sync.WaitGroup
}

func (w *waiters) init(max int) { w.max = max }

// submit hands r to a waiter (from r's loop), in turn when all are
// busy.
func (w *waiters) submit(r *request) {
	w.mu.Lock()
	w.add(r)
	w.mu.Unlock()
}

// trySubmit hands r to a waiter of its own (from r's loop), or reports
// false when all max are busy: a long wait never queues behind others.
// (A pool is used either way, never both.)
func (w *waiters) trySubmit(r *request) bool {
	w.mu.Lock()
	if w.running >= w.max {
		w.mu.Unlock()
		return false
	}
	w.running++
	w.wg.Add(1)
	w.mu.Unlock()
	r.waiting = true
	go func() {
		defer w.wg.Done()
		finish(r)
		w.mu.Lock()
		w.running--
		w.mu.Unlock()
	}()
	return true
}

// add queues r, and starts a waiter if fewer than max run (w.mu held).
func (w *waiters) add(r *request) {
	r.waiting = true
	w.queue = append(w.queue, r)
	if w.running < w.max {
		w.running++
		w.wg.Add(1)
		go w.work()
	}
}

func (w *waiters) work() {
	defer w.wg.Done()
	for {
		w.mu.Lock()
		if w.head == len(w.queue) {
			w.queue, w.head = w.queue[:0], 0
			w.running--
			w.mu.Unlock()
			return
		}
		r := w.queue[w.head]
		w.queue[w.head] = nil
		w.head++
		w.mu.Unlock()
		finish(r)
	}
}

// finish finishes r's decision and hands r back to its loop.
func finish(r *request) {
	r.waitDecision()
	l := r.l
	if l.s.queue(l, l.onResume, r) != nil {
		// The server stopped: nobody to answer, and the loop that
		// would is gone.
		r.ex.Finish(errServerClosed)
	}
}

// wait waits for the waiters to finish what they hold.
func (w *waiters) wait() { w.wg.Wait() }
