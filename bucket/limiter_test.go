package bucket

import (
	"testing"
	"time"

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
// window): a new key takes one over, and the rule's count of slots stays
// within MaxKeys. Another rule's slots, and entries kept beside the rule
// under a window no rule has (charged to its account), are left alone.
func TestReloadedRuleTakesOverItsEarlierSlots(t *testing.T) {
	for _, tc := range []struct {
		name string
		next Rule
	}{
		{"window", Rule{Name: "api", Limit: 2, Window: 2 * time.Hour, MaxKeys: 3}},
		{"algorithm", Rule{Name: "api", Limit: 2, Window: time.Hour, Algorithm: FixedWindow, MaxKeys: 3}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := joinedRegion(t)
			tab := r.Counters()
			before := Rule{Name: "api", Limit: 2, Window: time.Hour, MaxKeys: 3}
			old, err := NewLimiter(before, tab)
			if err != nil {
				t.Fatal(err)
			}
			login, err := NewLimiter(Rule{Name: "login", Limit: 2, Window: time.Hour, MaxKeys: 3}, tab)
			if err != nil {
				t.Fatal(err)
			}
			now := time.Hour
			for _, id := range []string{"a", "b"} {
				old.Allow(id, now)
			}
			for _, id := range []string{"a", "b", "c"} {
				login.Allow(id, now)
			}
			// An entry kept beside the rule (a deny cache's), charged to
			// its account: never superseded.
			beside := tab.KeyOf(99, []byte("deny"))
			if _, err := tab.Update(beside, shm.Quota{Account: before.Account()}, MetaOf(before.Tag(), GCRA, time.Microsecond), now,
				func(uint64, time.Duration) (uint64, bool) { return uint64(now/time.Microsecond) + 1e9, true }); err != nil {
				t.Fatal(err)
			}
			if got := old.Keys(); got != 3 {
				t.Fatalf("the rule's account holds %d slots, want its MaxKeys, 3", got)
			}

			next, err := NewLimiter(tc.next, tab)
			if err != nil {
				t.Fatal(err)
			}
			for _, id := range []string{"a", "b"} {
				if d := next.Allow(id, now); !d.Allowed || d.Full {
					t.Fatalf("key %q after the reload: %+v, want allowed with a slot", id, d)
				}
			}
			if d := next.Allow("x", now); !d.Capped {
				t.Errorf("a 3rd key after the reload: %+v, want capped (the entry beside is not the rule's to take)", d)
			}
			if got := next.Keys(); got != 3 {
				t.Errorf("the rule's account holds %d slots, want 3: its 2 keys and the entry beside them", got)
			}
			if d := next.Allow("a", now); d.Remaining != 0 {
				t.Errorf("key a's second request: remaining %d, want 0 (it is counted)", d.Remaining)
			}
			if _, ok := tab.Peek(beside, now); !ok {
				t.Error("the entry kept beside the rule was taken")
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
