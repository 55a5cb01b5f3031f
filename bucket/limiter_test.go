package bucket

import (
	"testing"
	"time"

	"github.com/preforkd/preforkd/internal/shmtest"
	"github.com/preforkd/preforkd/shm"
)

// joinedRegion is a private region of 64 counter slots, joined as
// worker 0.
func joinedRegion(t *testing.T) *shm.Region {
	t.Helper()
	r, err := shm.CreatePrivate(shm.Options{Counters: 64})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Join(0); err != nil {
		t.Fatal(err)
	}
	return r
}

func TestLimiterLookupAndReset(t *testing.T) {
	r := joinedRegion(t)
	l, err := NewLimiter(Rule{Name: "login", Limit: 2, Window: time.Minute}, r.Counters())
	if err != nil {
		t.Fatal(err)
	}
	k := l.Key([]byte("ip:192.0.2.1"))
	now := time.Hour
	if d, ok := l.Lookup(k, now); ok || !d.Allowed || d.Remaining != 2 {
		t.Fatalf("unseen key: %+v stored=%v; want fresh, not stored", d, ok)
	}
	l.AllowKey(k, now)
	l.AllowKey(k, now)
	d, ok := l.Lookup(k, now)
	if !ok || d.Allowed || d.Remaining != 0 || d.RetryAfter <= 0 {
		t.Fatalf("after two requests: %+v stored=%v; want stored and limited", d, ok)
	}
	l.ResetKey(k, now)
	if d := l.AllowKey(k, now); !d.Allowed || d.Remaining != 1 {
		t.Fatalf("after ResetKey: %+v; want a fresh allowance", d)
	}
}

// A reload that changes a rule's window or algorithm moves its keys to
// another namespace. With the rule at its MaxKeys, the slots its earlier
// definition left must not cap it until they turn fresh (up to the old
// window): once no worker of the old definition is left, a new key takes
// one over, and the rule's count of slots stays within MaxKeys. While old
// and new workers both serve (a reload replaces them one at a time, a
// canary may be rolled back), neither takes the other's slots: those are
// counts in use. Another rule's slots are left alone.
func TestReloadedRuleTakesOverItsEarlierSlots(t *testing.T) {
	for _, tc := range []struct {
		name string
		next Rule
	}{
		{"window", Rule{Name: "api", Limit: 2, Window: 2 * time.Hour, MaxKeys: 3}},
		{"algorithm", Rule{Name: "api", Limit: 2, Window: time.Hour, Algorithm: FixedWindow, MaxKeys: 3}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// The supervisor's region, and two workers' mappings of it.
			sup := shmtest.Create(t, shm.Options{Counters: 64})
			w0, w1 := shmtest.Attach(t, sup, 0), shmtest.Attach(t, sup, 1)
			old, err := NewLimiter(Rule{Name: "api", Limit: 2, Window: time.Hour, MaxKeys: 3}, w0.Counters())
			if err != nil {
				t.Fatal(err)
			}
			login, err := NewLimiter(Rule{Name: "login", Limit: 2, Window: time.Hour, MaxKeys: 3}, w0.Counters())
			if err != nil {
				t.Fatal(err)
			}
			now := time.Hour
			for _, id := range []string{"a", "b", "c"} {
				old.Allow(id, now)
				login.Allow(id, now)
			}
			old.Allow("a", now) // a's limit used up

			// The reload's first new worker, beside the old one.
			next, err := NewLimiter(tc.next, w1.Counters())
			if err != nil {
				t.Fatal(err)
			}
			if d := next.Allow("x", now); !d.Capped {
				t.Fatalf("a new key while the old worker serves: %+v, want capped", d)
			}
			if d := old.Allow("a", now); d.Allowed {
				t.Fatalf("key a on the old worker after a new key on the new one: %+v, want its count kept (limited)", d)
			}
			if d := old.Allow("y", now); !d.Capped {
				t.Fatalf("a new key on the old worker: %+v, want capped (the new worker's slots are in use)", d)
			}

			// The old worker leaves: reaped by the supervisor.
			if _, err := sup.Reap(0); err != nil {
				t.Fatal(err)
			}
			time.Sleep(2 * time.Millisecond) // an account sweeps at most once a millisecond
			for _, id := range []string{"a", "b", "c"} {
				if d := next.Allow(id, now); !d.Allowed || d.Full {
					t.Fatalf("key %q once only the new definition serves: %+v, want allowed with a slot", id, d)
				}
			}
			if got := next.Keys(); got != 3 {
				t.Errorf("the rule holds %d slots, want its MaxKeys, 3", got)
			}
			if d := next.Allow("z", now); !d.Capped {
				t.Errorf("a 4th key: %+v, want capped (the rule's 3 slots are its own keys')", d)
			}
			if d := next.Allow("a", now); d.Remaining != 0 {
				t.Errorf("key a's second request: remaining %d, want 0 (it is counted)", d.Remaining)
			}
			for _, id := range []string{"a", "b", "c"} {
				if d, ok := login.Lookup(login.Key([]byte(id)), now); !ok || d.Remaining != 1 {
					t.Errorf("rule login's key %q: %+v stored=%v; want untouched", id, d, ok)
				}
			}
		})
	}
}

// A reload that changes only the limit keeps each key's state, read under
// the new rate (Rule.Namespace, README "What a reload does to the
// counts"): a fixed window's count as it is; GCRA's time to refill, so
// the share of the bucket used.
func TestReloadedLimitReadsTheStateAsItStands(t *testing.T) {
	for _, tc := range []struct {
		name             string
		algo             Algorithm
		before, used, to int64
		left             int64 // requests the key gets after the reload
	}{
		{"fixed window raised", FixedWindow, 5, 5, 10, 5},
		{"fixed window lowered", FixedWindow, 10, 3, 5, 2},
		{"gcra lowered", GCRA, 10, 5, 5, 2},
		{"gcra raised", GCRA, 10, 5, 20, 10},
		{"gcra raised from 5", GCRA, 5, 3, 10, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := joinedRegion(t)
			rule := Rule{Name: "api", Limit: tc.before, Window: time.Hour, Algorithm: tc.algo}
			old, err := NewLimiter(rule, r.Counters())
			if err != nil {
				t.Fatal(err)
			}
			now := time.Hour
			for range tc.used {
				if d := old.Allow("k", now); !d.Allowed {
					t.Fatalf("before the reload: %+v", d)
				}
			}
			rule.Limit = tc.to
			next, err := NewLimiter(rule, r.Counters())
			if err != nil {
				t.Fatal(err)
			}
			var got int64
			for next.Allow("k", now).Allowed {
				got++
			}
			if got != tc.left {
				t.Errorf("after the reload to %d: %d more requests, want %d", tc.to, got, tc.left)
			}
		})
	}
}

// A limiter over a region this process never joined cannot count: Allow
// panics rather than answer as a full table does (on_full "open" would
// let every request through), and Lookup still reads.
func TestAllowOnARegionNotJoined(t *testing.T) {
	r, err := shm.CreatePrivate(shm.Options{Counters: 64})
	if err != nil {
		t.Fatal(err)
	}
	l, err := NewLimiter(Rule{Name: "login", Limit: 1, Window: time.Minute}, r.Counters())
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := l.Lookup(l.Key([]byte("k")), time.Hour); ok {
		t.Fatal("a key never counted is stored")
	}
	defer func() {
		if recover() == nil {
			t.Error("Allow on a region not joined did not panic")
		}
	}()
	l.Allow("k", time.Hour)
}

// A worker reads the region clock, is descheduled, and decides after
// another worker decided for the same key at a later reading. With a limit
// of 2 in a fresh bucket both requests fit whatever their order: the late
// decision is taken at the limiter's clock as it reads once the key's
// state is loaded (SetClock), not at the stale reading (which finds the
// bucket fuller than it is by the gap, and refused the second request).
func TestStaleClockReadingDecidesAtTheStateItFinds(t *testing.T) {
	r := joinedRegion(t)
	l, err := NewLimiter(Rule{Name: "pages", Limit: 2, Window: time.Hour}, r.Counters())
	if err != nil {
		t.Fatal(err)
	}
	l.SetClock(r.Now)
	k := l.Key([]byte("/pages/a"))
	stale := r.Now()
	for r.Now() < stale+time.Millisecond {
		time.Sleep(100 * time.Microsecond)
	}
	if d := l.AllowKey(k, r.Now()); !d.Allowed {
		t.Fatalf("first request: %+v", d)
	}
	// A check before charging (core's, when several rules match) finds
	// it allowed too.
	if d := l.PeekKey(k, stale); !d.Allowed {
		t.Fatalf("peek before the second request, its clock read before the first's: %+v; want allowed", d)
	}
	if d := l.AllowKey(k, stale); !d.Allowed || d.Remaining != 0 {
		t.Fatalf("second request, its clock read before the first's: %+v; want allowed, 0 left", d)
	}
	if d := l.AllowKey(k, stale); d.Allowed {
		t.Fatalf("third request: %+v; want refused", d)
	}
}

// Two clock reads in one microsecond decide at the same payload time: a
// decision raised to a reading lands in the reading's microsecond, not
// the next one, or a later check (PeekKey, before charging) that read the
// clock in the same microsecond as the first decision would find itself
// before it and refuse what AllowKey then allows.
func TestClockReadingsInOneMicrosecondDecideAlike(t *testing.T) {
	r := joinedRegion(t)
	l, err := NewLimiter(Rule{Name: "pages", Limit: 2, Window: time.Hour}, r.Counters())
	if err != nil {
		t.Fatal(err)
	}
	base := r.Now().Truncate(time.Microsecond) + time.Second
	var reading time.Duration
	l.SetClock(func() time.Duration { return reading })
	k := l.Key([]byte("/pages/a"))
	// The first request read the clock at base+100ns; the clock reads
	// base+1.9µs once its state is loaded.
	reading = base + 1900*time.Nanosecond
	if d := l.AllowKey(k, base+100*time.Nanosecond); !d.Allowed {
		t.Fatalf("first request: %+v", d)
	}
	// The second request read the clock before the first's, at base-50ns
	// (a stale reading), and the clock now reads base+1.95µs.
	reading = base + 1950*time.Nanosecond
	if d := l.PeekKey(k, base-50*time.Nanosecond); !d.Allowed {
		t.Fatalf("peek with the clock in the first decision's microsecond: %+v; want allowed", d)
	}
	if d := l.AllowKey(k, base-50*time.Nanosecond); !d.Allowed || d.Remaining != 0 {
		t.Fatalf("second request: %+v; want allowed, 0 left", d)
	}
}

func TestAtReading(t *testing.T) {
	us := time.Microsecond
	for _, c := range []struct{ t, reading, want time.Duration }{
		{5*us + 900, 6*us + 100, 6*us + 900}, // raised into the reading's µs
		{5*us + 100, 6*us + 900, 6*us + 100}, // not past it
		{5*us + 100, 5*us + 900, 5*us + 100}, // same µs: as is
		{7*us + 100, 6*us + 900, 7*us + 100}, // later than the reading: as is
		{0, 3*us - 1, 2 * us},
	} {
		if got := AtReading(c.t, c.reading); got != c.want {
			t.Errorf("AtReading(%v, %v) = %v; want %v", c.t, c.reading, got, c.want)
		}
	}
}

// A key never seen is as fresh as it can be: its state resets in no time,
// whenever the clock is read. A check that read the clock a while before
// the limiter's own reading (PeekKey, as the admin endpoint's KeyState
// asks it) must not report the gap as time to wait: the endpoint rounds
// it up to a whole second, "reset_after_seconds":1 for a fresh client.
func TestFreshKeyResetsInNoTime(t *testing.T) {
	r := joinedRegion(t)
	l, err := NewLimiter(Rule{Name: "login", Limit: 5, Window: 5 * time.Minute}, r.Counters())
	if err != nil {
		t.Fatal(err)
	}
	now := r.Now()
	l.SetClock(func() time.Duration { return now + 3*time.Microsecond })
	if d := l.PeekKey(l.Key([]byte("never-seen")), now); !d.Allowed || d.Remaining != 5 || d.ResetAfter != 0 {
		t.Fatalf("fresh key: %+v; want allowed, 5 left, reset after 0", d)
	}
}
