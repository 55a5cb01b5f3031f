package redisstore

import (
	"testing"
	"time"
)

// The breaker's story, with fixed instants: closed, failures up to the
// threshold, open for the backoff, one probe, a probe that dies and is
// taken over, a failed probe, a successful one.
func TestBreakerStory(t *testing.T) {
	b := Breaker{Failures: 3, Backoff: time.Second, ProbeTimeout: 100 * time.Millisecond}
	t0 := 10 * time.Hour
	var w uint64
	step := func(name string, next uint64, tr, want Transition) uint64 {
		t.Helper()
		if tr != want {
			t.Fatalf("%s: transition %v, want %v", name, tr, want)
		}
		return next
	}
	admit := func(name string, at time.Duration, self int, want Admission) {
		t.Helper()
		next, a, tr, write := b.Admit(w, at, self)
		if a != want {
			t.Fatalf("%s: admission %d, want %d (state %+v)", name, a, want, DecodeBreaker(w, at))
		}
		if write {
			w = next
			if tr != Probing {
				t.Fatalf("%s: a write with transition %v", name, tr)
			}
		}
	}
	admit("fresh", t0, 1, Call)
	for i := 1; i <= 2; i++ {
		next, tr, _ := b.Failure(w, t0, 1, false)
		w = step("failure", next, tr, NoTransition)
	}
	if s := DecodeBreaker(w, t0); s.Phase != Closed || s.Failures != 2 {
		t.Fatalf("after 2 failures: %+v", s)
	}
	// A success resets the count: failures must be consecutive.
	next, tr, write := b.Success(w, t0, 2, false)
	if !write || next != 0 || tr != NoTransition {
		t.Fatalf("success after failures: %#x %v %v", next, tr, write)
	}
	w = next
	if _, _, write := b.Success(w, t0, 2, false); write {
		t.Fatal("a success on a clean breaker writes: the hot path must not")
	}
	for i := 1; i <= 3; i++ {
		want := NoTransition
		if i == 3 {
			want = Opened
		}
		next, tr, _ := b.Failure(w, t0, 1, false)
		w = step("failure", next, tr, want)
	}
	admit("open", t0+999*time.Millisecond, 2, Refuse)
	// Failures reported by calls that began before it opened change nothing.
	if _, _, write := b.Failure(w, t0, 2, false); write {
		t.Fatal("a late failure moved an open breaker")
	}
	if _, _, write := b.Success(w, t0, 2, false); write {
		t.Fatal("a late success closed an open breaker: only a probe may")
	}
	t1 := t0 + time.Second
	admit("backoff over: worker 7 probes", t1, 7, Probe)
	admit("others wait for the probe", t1+time.Millisecond, 8, Refuse)
	admit("the prober itself sends nothing else", t1+time.Millisecond, 7, Refuse)
	// Worker 7 dies: past the deadline, worker 8 takes over.
	t2 := t1 + 101*time.Millisecond
	admit("probe past its deadline", t2, 8, Probe)
	if s := DecodeBreaker(w, t2); s.Phase != HalfOpen || s.Prober != 8 {
		t.Fatalf("after the takeover: %+v", s)
	}
	// The dead prober's late answer changes nothing.
	if _, _, write := b.Success(w, t2, 7, true); write {
		t.Fatal("a taken-over probe's success closed the breaker")
	}
	next, tr, _ = b.Failure(w, t2, 8, true)
	w = step("failed probe", next, tr, Opened)
	admit("open again", t2+500*time.Millisecond, 9, Refuse)
	t3 := t2 + time.Second
	admit("second probe", t3, 9, Probe)
	next, tr, _ = b.Success(w, t3, 9, true)
	w = step("successful probe", next, tr, Recovered)
	if w != 0 {
		t.Fatalf("a recovered breaker is %#x, want 0 (fresh: its slot may be reclaimed)", w)
	}
}

// Stored times are modulo 2^30 ms: the breaker reads them right across
// the wrap, and a time far in the past never reads as a future one.
func TestBreakerTimeWraps(t *testing.T) {
	b := Breaker{Failures: 1, Backoff: 2 * time.Second, ProbeTimeout: time.Second}
	wrap := time.Duration(1<<30) * time.Millisecond
	for _, t0 := range []time.Duration{0, wrap - time.Second, wrap, 3*wrap + 5*time.Millisecond} {
		w, tr, _ := b.Failure(0, t0, 1, false)
		if tr != Opened {
			t.Fatalf("at %v: %v", t0, tr)
		}
		if s := DecodeBreaker(w, t0+time.Second); s.Phase != Open || s.Until != time.Second {
			t.Fatalf("at %v+1s: %+v, want open for 1s more", t0, s)
		}
		if _, a, _, _ := b.Admit(w, t0+2*time.Second, 2); a != Probe {
			t.Fatalf("at %v+2s: admission %d, want a probe", t0, a)
		}
		// Untouched for days: still over, not a future time.
		if _, a, _, _ := b.Admit(w, t0+5*24*time.Hour, 2); a != Probe {
			t.Fatalf("at %v+5 days: admission %d, want a probe", t0, a)
		}
	}
}

// TestTransitionString: a transition logs under its name, and one out of
// range prints its number instead of panicking.
func TestTransitionString(t *testing.T) {
	for tr, want := range map[Transition]string{
		NoTransition: "none", Opened: "opened", Probing: "probing", Recovered: "recovered", 9: "Transition(9)",
	} {
		if got := tr.String(); got != want {
			t.Errorf("Transition(%d).String() = %q, want %q", uint8(tr), got, want)
		}
	}
}

// Successes probes in a row close the breaker, one probe at a time: the
// next request probes as soon as one succeeds, a failed probe opens it
// again and forgets the successes, and a probe taken over keeps those
// before it.
func TestBreakerSuccessThreshold(t *testing.T) {
	b := Breaker{Failures: 1, Backoff: time.Second, ProbeTimeout: 100 * time.Millisecond, Successes: 3}
	t0 := 10 * time.Hour
	w, tr, _ := b.Failure(0, t0, 1, false)
	if tr != Opened {
		t.Fatalf("first failure: %v", tr)
	}
	// probe admits worker self at now and reports ok for its probe.
	probe := func(name string, now time.Duration, self int, ok bool) Transition {
		t.Helper()
		next, a, tr, write := b.Admit(w, now, self)
		if a != Probe || !write || tr != Probing {
			t.Fatalf("%s: admission %d %v %v, want a probe (state %+v)", name, a, tr, write, DecodeBreaker(w, now))
		}
		w = next
		if _, a, _, _ := b.Admit(w, now, self+1); a != Refuse {
			t.Fatalf("%s: another worker was let in beside the probe", name)
		}
		if ok {
			next, tr, write = b.Success(w, now, self, true)
		} else {
			next, tr, write = b.Failure(w, now, self, true)
		}
		if !write {
			t.Fatalf("%s: the probe's answer wrote nothing", name)
		}
		w = next
		return tr
	}
	t1 := t0 + time.Second
	if tr := probe("first", t1, 7, true); tr != NoTransition {
		t.Fatalf("one success of 3: %v", tr)
	}
	if s := DecodeBreaker(w, t1); s.Phase != HalfOpen || s.Successes != 1 || s.Prober != -1 {
		t.Fatalf("after one success: %+v, want half-open between probes", s)
	}
	// A late answer of a call from before the breaker opened changes
	// nothing between probes.
	if _, _, write := b.Success(w, t1, 2, false); write {
		t.Fatal("a late success moved a half-open breaker")
	}
	if _, _, write := b.Failure(w, t1, 2, false); write {
		t.Fatal("a late failure moved a half-open breaker")
	}
	if tr := probe("second", t1, 8, true); tr != NoTransition {
		t.Fatalf("two successes of 3: %v", tr)
	}
	// The third prober dies: the one that takes it over keeps the two.
	next, a, _, _ := b.Admit(w, t1, 9)
	if a != Probe {
		t.Fatal("third probe not admitted")
	}
	w = next
	t2 := t1 + 101*time.Millisecond
	if tr := probe("takeover", t2, 10, true); tr != Recovered {
		t.Fatalf("a taken-over third probe's success: %v, want recovered", tr)
	}
	if w != 0 {
		t.Fatalf("recovered to %#x, want 0", w)
	}

	// A failure after two successes opens it again, with none kept.
	w, _, _ = b.Failure(0, t2, 1, false)
	t3 := t2 + time.Second
	probe("a", t3, 1, true)
	probe("b", t3, 2, true)
	if tr := probe("c", t3, 3, false); tr != Opened {
		t.Fatalf("a failed third probe: %v, want opened", tr)
	}
	if s := DecodeBreaker(w, t3); s.Phase != Open || s.Successes != 0 {
		t.Fatalf("after a failed probe: %+v", s)
	}
	t4 := t3 + time.Second
	probe("d", t4, 1, true)
	probe("e", t4, 1, true)
	if tr := probe("f", t4, 1, true); tr != Recovered {
		t.Fatalf("three more successes: %v", tr)
	}
}

// A Redis that answers one probe in two never closes a breaker that
// wants 2 or more successes in a row; with 1 the first success closes it.
func TestBreakerOneInTwoStaysOpen(t *testing.T) {
	for _, successes := range []int{1, 2, 3, MaxBreakerSuccesses} {
		b := Breaker{Failures: 1, Backoff: time.Second, ProbeTimeout: 100 * time.Millisecond, Successes: successes}
		now := time.Hour
		w, _, _ := b.Failure(0, now, 1, false)
		closed := false
		for i := range 1000 {
			now += time.Second
			next, a, _, _ := b.Admit(w, now, i)
			if a != Probe {
				t.Fatalf("successes %d, probe %d: admission %d (state %+v)", successes, i, a, DecodeBreaker(w, now))
			}
			w = next
			var tr Transition
			if i%2 == 0 {
				w, tr, _ = b.Success(w, now, i, true)
			} else {
				w, tr, _ = b.Failure(w, now, i, true)
			}
			if tr == Recovered {
				closed = true
				break
			}
			if i%2 == 0 && phaseOf(w) == betweenProbes {
				// The next request probes at once: answer it with a failure.
				now += time.Millisecond
				continue
			}
		}
		if closed != (successes == 1) {
			t.Errorf("successes %d: closed %v", successes, closed)
		}
	}
}

// The success threshold is 1..16: the count before the closing probe has
// 4 bits.
func TestBreakerSuccessesValidate(t *testing.T) {
	for n, ok := range map[int]bool{0: false, 1: true, 3: true, 16: true, 17: false} {
		b := Breaker{Failures: 1, Backoff: time.Second, ProbeTimeout: time.Second, Successes: n}
		if err := b.validate(); (err == nil) != ok {
			t.Errorf("successes %d: %v", n, err)
		}
	}
	// 16 in a row close it; the 15 before fit the word.
	b := Breaker{Failures: 1, Backoff: time.Second, ProbeTimeout: time.Second, Successes: 16}
	now := time.Hour
	w, _, _ := b.Failure(0, now, 1, false)
	now += time.Second
	for i := 1; i <= 16; i++ {
		w, _, _, _ = b.Admit(w, now, 4095)
		var tr Transition
		w, tr, _ = b.Success(w, now, 4095, true)
		if (tr == Recovered) != (i == 16) {
			t.Fatalf("success %d of 16: %v", i, tr)
		}
		if i < 16 && DecodeBreaker(w, now).Successes != i {
			t.Fatalf("success %d: state %+v", i, DecodeBreaker(w, now))
		}
	}
}
