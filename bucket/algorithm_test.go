package bucket

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/preforkd/preforkd/shm"
)

// step is one request at a fixed instant and what it must get.
type step struct {
	at        time.Duration
	allowed   bool
	remaining int64
	retry     time.Duration // checked when non-zero
	reset     time.Duration // checked when non-zero
}

func run(t *testing.T, r Rule, steps []step) {
	t.Helper()
	p, err := r.Compile()
	if err != nil {
		t.Fatal(err)
	}
	var payload uint64
	for i, s := range steps {
		next, d := p.Take(payload, s.at)
		if d.Allowed != s.allowed || d.Remaining != s.remaining {
			t.Fatalf("step %d at %v: allowed=%v remaining=%d, want %v %d (%+v)", i, s.at, d.Allowed, d.Remaining, s.allowed, s.remaining, d)
		}
		if s.retry != 0 && d.RetryAfter != s.retry {
			t.Fatalf("step %d at %v: retry after %v, want %v", i, s.at, d.RetryAfter, s.retry)
		}
		if s.reset != 0 && d.ResetAfter != s.reset {
			t.Fatalf("step %d at %v: reset after %v, want %v", i, s.at, d.ResetAfter, s.reset)
		}
		if !d.Allowed && next != payload {
			t.Fatalf("step %d: a refusal changed the state", i)
		}
		if d.Allowed && d.RetryAfter != 0 {
			t.Fatalf("step %d: allowed with a retry-after", i)
		}
		payload = next
	}
}

const s = time.Second

func TestFixedWindow(t *testing.T) {
	r := Rule{Name: "fw", Limit: 3, Window: 10 * s, Algorithm: FixedWindow}
	run(t, r, []step{
		{at: 100 * s, allowed: true, remaining: 2, reset: 10 * s},
		{at: 101 * s, allowed: true, remaining: 1, reset: 9 * s},
		{at: 109 * s, allowed: true, remaining: 0, reset: 1 * s},
		{at: 109*s + 500*time.Millisecond, allowed: false, remaining: 0, retry: 500 * time.Millisecond},
		// The window rolls at 110 s: a fresh count.
		{at: 110 * s, allowed: true, remaining: 2, reset: 10 * s},
		{at: 110 * s, allowed: true, remaining: 1},
		{at: 110 * s, allowed: true, remaining: 0},
		{at: 110 * s, allowed: false, remaining: 0, retry: 10 * s},
		// Several windows later: fresh again.
		{at: 200 * s, allowed: true, remaining: 2},
	})
}

func TestFixedWindowClockBackwards(t *testing.T) {
	r := Rule{Name: "fw", Limit: 2, Window: 10 * s, Algorithm: FixedWindow}
	run(t, r, []step{
		{at: 25 * s, allowed: true, remaining: 1},
		{at: 25 * s, allowed: true, remaining: 0},
		// The clock goes back into the previous window: that is no new
		// window, the later one still counts.
		{at: 15 * s, allowed: false, remaining: 0, retry: 15 * s},
		{at: 29 * s, allowed: false, remaining: 0, retry: 1 * s},
		{at: 30 * s, allowed: true, remaining: 1},
	})
}

func TestGCRA(t *testing.T) {
	// 5 per minute, burst 5: one token every 12 s.
	r := Rule{Name: "g", Limit: 5, Window: time.Minute}
	run(t, r, []step{
		{at: 1000 * s, allowed: true, remaining: 4, reset: 12 * s},
		{at: 1000 * s, allowed: true, remaining: 3},
		{at: 1000 * s, allowed: true, remaining: 2},
		{at: 1000 * s, allowed: true, remaining: 1},
		{at: 1000 * s, allowed: true, remaining: 0, reset: 60 * s},
		{at: 1000 * s, allowed: false, remaining: 0, retry: 12 * s, reset: 60 * s},
		{at: 1011 * s, allowed: false, remaining: 0, retry: 1 * s},
		// One token back after 12 s.
		{at: 1012 * s, allowed: true, remaining: 0},
		{at: 1012 * s, allowed: false, remaining: 0, retry: 12 * s},
		// Fully refilled after a window of quiet.
		{at: 1100 * s, allowed: true, remaining: 4},
	})
}

func TestGCRABurst(t *testing.T) {
	// 10 per second with a burst of 2: two at once, then one per 100 ms.
	r := Rule{Name: "g", Limit: 10, Window: s, Burst: 2}
	ms := time.Millisecond
	run(t, r, []step{
		{at: 5 * s, allowed: true, remaining: 1},
		{at: 5 * s, allowed: true, remaining: 0},
		{at: 5 * s, allowed: false, retry: 100 * ms},
		{at: 5*s + 50*ms, allowed: false, retry: 50 * ms},
		{at: 5*s + 100*ms, allowed: true, remaining: 0},
		{at: 5*s + 300*ms, allowed: true, remaining: 1},
	})
}

func TestGCRAClockBackwards(t *testing.T) {
	r := Rule{Name: "g", Limit: 2, Window: 10 * s}
	run(t, r, []step{
		{at: 100 * s, allowed: true, remaining: 1},
		{at: 100 * s, allowed: true, remaining: 0},
		// Going back a minute grants nothing.
		{at: 40 * s, allowed: false, retry: 65 * s},
		{at: 104 * s, allowed: false, retry: 1 * s},
		{at: 105 * s, allowed: true, remaining: 0},
	})
}

func TestGCRAExtremeRates(t *testing.T) {
	// 10,000 per second, burst 1: exactly one every 100 µs.
	us := time.Microsecond
	run(t, Rule{Name: "fast", Limit: 10000, Window: s, Burst: 1}, []step{
		{at: s, allowed: true},
		{at: s + 99*us, allowed: false, retry: 1 * us},
		{at: s + 100*us, allowed: true},
		{at: s + 150*us, allowed: false, retry: 50 * us},
		{at: s + 200*us, allowed: true},
	})
	// 1 per hour.
	run(t, Rule{Name: "slow", Limit: 1, Window: time.Hour}, []step{
		{at: s, allowed: true, reset: time.Hour},
		{at: s + 59*time.Minute, allowed: false, retry: time.Minute},
		{at: s + time.Hour, allowed: true},
	})
}

// The rounding-loss trap: a naive bucket that drops the fractional refill
// at every request starves a client that sends often. GCRA keeps the
// fraction in its arrival time: 5/min sent every 10 ms for 10 minutes
// allows 5 (the burst) + 10 min × 5/min = 55.
func TestGCRANoRoundingLoss(t *testing.T) {
	p, err := Rule{Name: "g", Limit: 5, Window: time.Minute}.Compile()
	if err != nil {
		t.Fatal(err)
	}
	var payload uint64
	allowed := 0
	start := 3 * s
	for at := start; at <= start+10*time.Minute; at += 10 * time.Millisecond {
		next, d := p.Take(payload, at)
		if d.Allowed {
			allowed++
			payload = next
		}
	}
	if allowed != 55 {
		t.Fatalf("allowed %d, want 55", allowed)
	}
}

// A fractional emission interval (3 per second) refills exactly one token
// per 333,334 µs (rounded up: never more than the rate).
func TestGCRAFractionalRefill(t *testing.T) {
	r := Rule{Name: "g", Limit: 3, Window: s, Burst: 1}
	us := time.Microsecond
	run(t, r, []step{
		{at: 10 * s, allowed: true},
		{at: 10*s + 333333*us, allowed: false, retry: us},
		{at: 10*s + 333334*us, allowed: true},
	})
	// A client that retries exactly when told gets 3/s over a long run:
	// no fraction lost, none gained.
	p, _ := r.Compile()
	var payload uint64
	n := 0
	for at := time.Duration(0); at < 1000*s; {
		next, d := p.Take(payload, at)
		if d.Allowed {
			n++
			payload = next
			continue
		}
		at += d.RetryAfter
	}
	if n != 3000 {
		t.Fatalf("allowed %d in 1000 s at 3/s, want 3000", n)
	}
}

func TestRefund(t *testing.T) {
	for _, algo := range []Algorithm{GCRA, FixedWindow} {
		p, _ := Rule{Name: "r", Limit: 2, Window: 10 * s, Algorithm: algo}.Compile()
		var payload uint64
		payload, _ = p.Take(payload, 5*s)
		payload, _ = p.Take(payload, 5*s)
		if _, d := p.Take(payload, 5*s); d.Allowed {
			t.Fatalf("%v: third allowed", algo)
		}
		back, ok := p.Refund(payload, 5*s)
		if !ok {
			t.Fatalf("%v: refund refused", algo)
		}
		if _, d := p.Take(back, 5*s); !d.Allowed || d.Remaining != 0 {
			t.Fatalf("%v: after a refund: %+v", algo, d)
		}
		// Nothing to refund on a fresh key.
		if _, ok := p.Refund(0, 5*s); ok {
			t.Fatalf("%v: refunded a fresh key", algo)
		}
	}
}

func TestFresh(t *testing.T) {
	for _, tc := range []struct {
		algo  Algorithm
		taken time.Duration // when the only request was taken
		at    time.Duration
		fresh bool
	}{
		{GCRA, 10 * s, 10 * s, false},
		{GCRA, 10 * s, 14 * s, false},
		{GCRA, 10 * s, 15 * s, true}, // limit 2 per 10 s: one token back after 5 s
		{FixedWindow, 10 * s, 19 * s, false},
		{FixedWindow, 10 * s, 20 * s, true},
		{FixedWindow, 25 * s, 15 * s, false}, // clock backwards: a later window is not over
	} {
		r := Rule{Name: "f", Limit: 2, Window: 10 * s, Algorithm: tc.algo}
		p, _ := r.Compile()
		payload, _ := p.Take(0, tc.taken)
		if got := p.Fresh(payload, tc.at); got != tc.fresh {
			t.Errorf("%v taken at %v, fresh at %v = %v, want %v", tc.algo, tc.taken, tc.at, got, tc.fresh)
		}
		// The table-wide judgement from the slot's meta agrees.
		if got := Fresh(r.Meta(), payload, tc.at); got != tc.fresh {
			t.Errorf("%v: Fresh(meta) = %v, want %v", tc.algo, got, tc.fresh)
		}
	}
}

func TestCompileErrors(t *testing.T) {
	for _, tc := range []struct {
		r          Rule
		field, msg string
	}{
		{Rule{Limit: 1, Window: s}, "Name", "name is empty"},
		{Rule{Name: "x", Limit: 0, Window: s}, "Limit", "limit must be between 1 and 1048575, got 0"},
		{Rule{Name: "x", Limit: MaxLimit + 1, Window: s}, "Limit", "got 1048576"},
		{Rule{Name: "x", Limit: 1, Window: time.Microsecond}, "Window", "window must be between 1ms and"},
		{Rule{Name: "x", Limit: 1, Window: MaxWindow + time.Microsecond}, "Window", "got 4886h43m6.044416s"},
		{Rule{Name: "x", Limit: 1, Window: time.Millisecond + time.Nanosecond}, "Window", "not a whole number of microseconds"},
		{Rule{Name: "x", Limit: 1, Window: s, Algorithm: 7}, "Algorithm", "unknown algorithm Algorithm(7)"},
		{Rule{Name: "x", Limit: 1, Window: s, Burst: -1}, "Burst", "burst must be between 0 and 1048575"},
		{Rule{Name: "x", Limit: 1, Window: s, Burst: MaxLimit + 1}, "Burst", "got 1048576"},
		{Rule{Name: "x", Limit: 1, Window: s, Burst: 2, Algorithm: FixedWindow}, "Burst", "gcra only"},
		{Rule{Name: "x", Limit: 1, Window: s, OnFull: 2}, "OnFull", "unknown on-full policy OnFull(2)"},
		// GCRA counts whole microseconds: one request must be worth one,
		// and refilling a full bucket must fit the largest window.
		{Rule{Name: "x", Limit: 2000, Window: time.Millisecond}, "Window", "gcra needs at least 1µs per request"},
		{Rule{Name: "x", Limit: 1, Window: 1000 * time.Hour, Burst: 10}, "Burst", "burst 10 takes longer than"},
		{Rule{Name: "x", Limit: 1, Window: MaxWindow, Burst: MaxLimit}, "Burst", "to refill"},   // would overflow int64
		{Rule{Name: "x", Limit: 7, Window: MaxWindow - time.Microsecond}, "Burst", "to refill"}, // by the rounding of 1µs per request
	} {
		_, err := tc.r.Compile()
		var e *RuleError
		if !errors.As(err, &e) || e.Field != tc.field || !strings.Contains(e.Msg, tc.msg) || e.Rule != tc.r.Name ||
			err.Error() != fmt.Sprintf("bucket: rule %q: %s", tc.r.Name, e.Msg) {
			t.Errorf("%+v: Compile = %v, want a *RuleError on %s saying %q", tc.r, err, tc.field, tc.msg)
		}
	}
	// What Compile accepts at the edges: the longest window (its
	// microseconds fill the 44 bits of a slot's meta word), one request
	// per microsecond, a full burst refilled in the longest window, and a
	// fixed window of any rate.
	for _, r := range []Rule{
		{Name: "x", Limit: 1, Window: MaxWindow},
		{Name: "x", Limit: MaxLimit, Window: MaxWindow, Algorithm: FixedWindow},
		{Name: "x", Limit: 1000, Window: time.Millisecond},
		{Name: "x", Limit: 1000, Window: time.Millisecond, Burst: MaxLimit},
		{Name: "x", Limit: 2, Window: MaxWindow - time.Microsecond, Burst: 2},
		{Name: "x", Limit: 2000, Window: time.Millisecond, Algorithm: FixedWindow},
		{Name: "x", Limit: 1, Window: s, OnFull: Closed},
	} {
		if _, err := r.Compile(); err != nil {
			t.Errorf("%+v: %v", r, err)
		}
	}
}

// TestText: the text forms that configuration files use, both ways.
func TestText(t *testing.T) {
	for _, a := range []Algorithm{GCRA, FixedWindow} {
		b, err := a.MarshalText()
		var back Algorithm = 9
		if err != nil || back.UnmarshalText(b) != nil || back != a {
			t.Errorf("%v: marshalled %q (%v), read back %v", a, b, err, back)
		}
	}
	for _, o := range []OnFull{Open, Closed} {
		b, err := o.MarshalText()
		var back OnFull = 9
		if err != nil || back.UnmarshalText(b) != nil || back != o {
			t.Errorf("%v: marshalled %q (%v), read back %v", o, b, err, back)
		}
	}
	if b, err := Algorithm(7).MarshalText(); err == nil {
		t.Errorf("Algorithm(7) marshalled as %q", b)
	}
	if b, err := OnFull(7).MarshalText(); err == nil {
		t.Errorf("OnFull(7) marshalled as %q", b)
	}
	var a Algorithm
	var o OnFull
	for _, bad := range []string{"", "GCRA", "leaky", "gcra "} {
		if err := a.UnmarshalText([]byte(bad)); err == nil || !strings.HasPrefix(err.Error(), "bucket: ") {
			t.Errorf("algorithm %q: %v", bad, err)
		}
	}
	for _, bad := range []string{"", "Open", "fail"} {
		if err := o.UnmarshalText([]byte(bad)); err == nil || !strings.HasPrefix(err.Error(), "bucket: ") {
			t.Errorf("on-full policy %q: %v", bad, err)
		}
	}
}

func TestNamespace(t *testing.T) {
	base := Rule{Name: "login", Limit: 5, Window: time.Minute}
	more := base
	more.Limit = 10
	if base.Namespace() != more.Namespace() {
		t.Error("a changed limit changed the namespace: counts would not survive a reload")
	}
	other := base
	other.Window = time.Hour
	if base.Namespace() == other.Namespace() {
		t.Error("a changed window kept the namespace: payloads would be misread")
	}
	fw := base
	fw.Algorithm = FixedWindow
	if base.Namespace() == fw.Namespace() {
		t.Error("a changed algorithm kept the namespace")
	}
}

func TestPeek(t *testing.T) {
	p, _ := Rule{Name: "p", Limit: 5, Window: time.Minute}.Compile()
	fresh := p.Peek(0, time.Hour)
	if !fresh.Allowed || fresh.Remaining != 5 || fresh.ResetAfter != 0 {
		t.Fatalf("peek of a fresh key: %+v", fresh)
	}
	payload, _ := p.Take(0, time.Hour)
	payload, _ = p.Take(payload, time.Hour)
	// Two taken: 3 left, full again in 24 s (two tokens of 12 s).
	if d := p.Peek(payload, time.Hour); !d.Allowed || d.Remaining != 3 || d.ResetAfter != 24*time.Second {
		t.Fatalf("peek after two: %+v", d)
	}
	fw, _ := Rule{Name: "f", Limit: 2, Window: time.Minute, Algorithm: FixedWindow}.Compile()
	fp, _ := fw.Take(0, time.Hour+10*time.Second)
	if d := fw.Peek(fp, time.Hour+10*time.Second); d.Remaining != 1 || d.ResetAfter != 50*time.Second {
		t.Fatalf("fixed-window peek: %+v", d)
	}
}

// cost = 3 with limit 10: three requests pass, the fourth is refused (9 of
// 10 units spent, 1 left); a refund gives the whole cost back.
func TestCost(t *testing.T) {
	for _, algo := range []Algorithm{GCRA, FixedWindow} {
		p, err := Rule{Name: "c", Limit: 10, Window: time.Minute, Algorithm: algo, Cost: 3}.Compile()
		if err != nil {
			t.Fatal(err)
		}
		var payload uint64
		now := time.Hour
		for i := 1; i <= 4; i++ {
			next, d := p.Take(payload, now)
			if want := i <= 3; d.Allowed != want {
				t.Fatalf("%v request %d: allowed %v", algo, i, d.Allowed)
			}
			if d.Allowed {
				payload = next
				if d.Remaining != int64(10-3*i) {
					t.Fatalf("%v request %d: remaining %d", algo, i, d.Remaining)
				}
			} else if d.Remaining != 1 || d.RetryAfter <= 0 {
				t.Fatalf("%v refusal: %+v", algo, d)
			}
		}
		if d := p.Peek(payload, now); d.Allowed || d.Remaining != 1 {
			t.Fatalf("%v peek: %+v", algo, d)
		}
		back, ok := p.Refund(payload, now)
		if !ok {
			t.Fatalf("%v: nothing refunded", algo)
		}
		if d := p.Peek(back, now); !d.Allowed || d.Remaining != 4 {
			t.Fatalf("%v after refund: %+v, want 4 units", algo, d)
		}
	}
	if _, err := (Rule{Name: "c", Limit: 10, Window: time.Minute, Cost: 11}).Compile(); err == nil {
		t.Error("cost over the limit accepted")
	}
	if _, err := (Rule{Name: "c", Limit: 10, Burst: 2, Window: time.Minute, Cost: 3}).Compile(); err == nil {
		t.Error("cost over the burst accepted")
	}
}

// A resumed region counts shm.MaxDowntime of downtime at most: enough
// for every time it keeps to run out, the longest a cached response's
// (four TTLs, each at most MaxWindow: see shm.MaxDowntime).
func TestMaxWindowWithinMaxDowntime(t *testing.T) {
	if 4*MaxWindow >= shm.MaxDowntime {
		t.Fatalf("4 × MaxWindow %v is not below shm.MaxDowntime %v", 4*MaxWindow, shm.MaxDowntime)
	}
}

// A fixed-window key left untouched for far longer than any clock step
// back, here 2^27+1 windows (37 hours at 1 ms), is in a new window: its
// stored window is long past, not one still to come. Within 2^20
// windows ahead, a stored window is still taken for a clock that reads
// behind: nothing is granted.
func TestFixedWindowLongIdleIsFresh(t *testing.T) {
	p, err := Rule{Name: "r", Limit: 1, Window: time.Millisecond, Algorithm: FixedWindow}.Compile()
	if err != nil {
		t.Fatal(err)
	}
	base := time.Duration(1<<21) * time.Millisecond
	payload, d := p.Take(0, base)
	if !d.Allowed {
		t.Fatal("the first request refused")
	}
	for _, idle := range []int64{1 << 27, 1<<27 + 1, 1<<28 - widxAhead - 1} {
		later := base + time.Duration(idle)*time.Millisecond
		if _, d := p.Take(payload, later); !d.Allowed {
			t.Errorf("untouched for %d windows: refused, RetryAfter %v", idle, d.RetryAfter)
		}
		if !p.Fresh(payload, later) {
			t.Errorf("untouched for %d windows: not fresh, so its slot is never reclaimed", idle)
		}
	}
	for _, back := range []int64{1, widxAhead} {
		earlier := base - time.Duration(back)*time.Millisecond
		if _, d := p.Take(payload, earlier); d.Allowed {
			t.Errorf("a clock %d windows behind the key's state: allowed", back)
		}
		if p.Fresh(payload, earlier) {
			t.Errorf("a clock %d windows behind the key's state: fresh", back)
		}
	}
}
