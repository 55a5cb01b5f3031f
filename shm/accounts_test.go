package shm_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/preforkd/preforkd/bucket"
	"github.com/preforkd/preforkd/internal/shmtest"
	"github.com/preforkd/preforkd/shm"
)

func newLimiter(t testing.TB, r *shm.Region, rule bucket.Rule) *bucket.Limiter {
	t.Helper()
	l, err := bucket.NewLimiter(rule, r.Counters())
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func checkAccounts(t testing.TB, r *shm.Region) {
	t.Helper()
	if err := r.Counters().VerifyAccounts(); err != nil {
		t.Fatal("counters:", err)
	}
	if r.Responses().Len() > 0 {
		if err := r.Responses().VerifyAccounts(); err != nil {
			t.Fatal("responses:", err)
		}
	}
}

// A flood of new keys on one rule takes at most its MaxKeys slots; the
// other rule keeps its room and decides exactly, and the flood's own keys
// that got a slot are still limited.
func TestQuotaKeepsOtherRulesRoom(t *testing.T) {
	r := shmtest.Private(t, shm.Options{Counters: 1024})
	flood := newLimiter(t, r, bucket.Rule{Name: "flood", Limit: 1, Window: time.Hour, MaxKeys: 300})
	login := newLimiter(t, r, bucket.Rule{Name: "login", Limit: 2, Window: time.Hour, MaxKeys: 512})
	now := time.Minute
	capped := 0
	for i := range 3000 {
		d := flood.Allow(fmt.Sprint("flood-", i), now)
		switch {
		case d.Capped && d.Full && d.Allowed:
			capped++
		case d.Full:
			t.Fatalf("key %d: %+v: the table itself was full", i, d)
		}
	}
	if flood.Keys() != 300 {
		t.Fatalf("the flood holds %d slots, want 300", flood.Keys())
	}
	if capped != 2700 {
		t.Fatalf("%d flood keys capped, want 2700", capped)
	}
	if d := flood.Allow("flood-7", now); d.Allowed || d.Full {
		t.Fatalf("a flood key with a slot is no longer limited: %+v", d)
	}
	for i := range 100 {
		id := fmt.Sprint("client-", i)
		for n := range 3 {
			d := login.Allow(id, now)
			if d.Full || d.Allowed != (n < 2) {
				t.Fatalf("client %d request %d: %+v", i, n, d)
			}
		}
	}
	if login.Keys() != 100 {
		t.Fatalf("login holds %d slots, want 100", login.Keys())
	}
	if st := r.Counters().Stats(); st.Quota != 2700 || st.Full != 0 {
		t.Fatalf("stats: %+v", st)
	}
	checkAccounts(t, r)
}

// A rule at its maximum takes the slots of its own keys once they are as
// fresh as new ones: in the key's probe window, or found by the account's
// sweep, at most one a millisecond.
func TestQuotaReusesFreshSlots(t *testing.T) {
	r := shmtest.Private(t, shm.Options{Counters: 1 << 14})
	rule := bucket.Rule{Name: "short", Limit: 1, Window: time.Second, Algorithm: bucket.FixedWindow, MaxKeys: 50}
	lim := newLimiter(t, r, rule)
	now := 10 * time.Second
	for i := range 50 {
		if d := lim.Allow(fmt.Sprint("a", i), now); d.Full {
			t.Fatalf("key %d: %+v", i, d)
		}
	}
	if d := lim.Allow("one-too-many", now); !d.Capped {
		t.Fatalf("51st key: %+v", d)
	}
	// Two seconds on every key is fresh. In a table of 16,384 slots a
	// sweep visits 4,096: four sweeps find all 50.
	now += 2 * time.Second
	served := 0
	for i := range 50 {
		for attempt := 0; ; attempt++ {
			d := lim.Allow(fmt.Sprint("b", i), now)
			if !d.Full {
				served++
				break
			}
			if !d.Capped || attempt > 8 {
				t.Fatalf("key b%d: %+v after %d sweeps", i, d, attempt)
			}
			r.Counters().AllowSweep(rule.Account())
		}
	}
	if served != 50 || lim.Keys() != 50 {
		t.Fatalf("served %d, the rule holds %d", served, lim.Keys())
	}
	st := r.Counters().Stats()
	if st.Swept == 0 && st.Reclaims == 0 {
		t.Fatalf("no slot was taken over: %+v", st)
	}
	t.Logf("stats %+v", st)
	checkAccounts(t, r)
	// The new keys are counted, not fresh: the rule is capped again.
	if d := lim.Allow("c", now); !d.Capped {
		t.Fatalf("a key past the maximum: %+v", d)
	}
}

// The sweep of an account is paced: at most one starts per millisecond,
// whoever asks, so a flood of capped claims costs a bounded walk.
func TestQuotaSweepPaced(t *testing.T) {
	r := shmtest.Private(t, shm.Options{Counters: 1 << 16})
	c := r.Counters()
	for attempt := 0; ; attempt++ {
		c.AllowSweep(3)
		start := time.Now()
		first, second := c.StartSweep(3), c.StartSweep(3)
		if time.Since(start) >= time.Millisecond {
			if attempt == 20 {
				t.Skip("two calls never took under 1ms")
			}
			continue
		}
		if !first || second {
			t.Fatalf("first sweep started: %v, second within a millisecond: %v", first, second)
		}
		break
	}
	if !c.StartSweep(4) {
		t.Fatal("another account's sweep is held back")
	}
	time.Sleep(2 * time.Millisecond)
	if !c.StartSweep(3) {
		t.Fatal("no sweep 2ms later")
	}
}

// Another limit for some keys of a rule (an override) counts against the
// rule's room: its rule is in the rule's group.
func TestQuotaGroup(t *testing.T) {
	r := shmtest.Private(t, shm.Options{Counters: 256})
	base := bucket.Rule{Name: "api", Limit: 1, Window: time.Hour, MaxKeys: 10}
	tier := base
	tier.Name, tier.Group, tier.Limit = "api\x00key\x00gold", "api", 100
	lb, lt := newLimiter(t, r, base), newLimiter(t, r, tier)
	for i := range 6 {
		lb.Allow(fmt.Sprint("b", i), time.Minute)
		lt.Allow(fmt.Sprint("t", i), time.Minute)
	}
	if lb.Keys() != 10 || lt.Keys() != 10 {
		t.Fatalf("the group holds %d/%d slots, want 10", lb.Keys(), lt.Keys())
	}
	if d := lt.Allow("t-new", time.Minute); !d.Capped {
		t.Fatalf("a tier key past the rule's maximum: %+v", d)
	}
	checkAccounts(t, r)
}

// Goroutines claiming and reclaiming under several quotas on a running
// clock: no account ever holds more than its maximum, and every count
// equals a walk of the table at the end. Under -race it also checks the
// accounts' synchronisation.
func TestQuotaGoroutines(t *testing.T) {
	r := shmtest.Private(t, shm.Options{Counters: 512})
	rules := []bucket.Rule{
		{Name: "a", Limit: 2, Window: 2 * time.Millisecond, Algorithm: bucket.FixedWindow, MaxKeys: 40},
		{Name: "b", Limit: 1, Window: 3 * time.Millisecond, MaxKeys: 100},
		{Name: "c", Limit: 3, Window: time.Millisecond, Algorithm: bucket.FixedWindow},
	}
	lims := make([]*bucket.Limiter, len(rules))
	for i, rule := range rules {
		lims[i] = newLimiter(t, r, rule)
	}
	var now atomic.Int64
	var stop atomic.Bool
	var over atomic.Value
	watcher := make(chan struct{})
	go func() {
		defer close(watcher)
		for !stop.Load() {
			for i, l := range lims {
				if m := rules[i].MaxKeys; m > 0 && l.Keys() > m {
					over.Store(fmt.Sprintf("rule %s holds %d slots, max %d", rules[i].Name, l.Keys(), m))
				}
			}
		}
	}()
	var wg sync.WaitGroup
	for g := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 1))
			for n := range 4000 {
				if n%64 == 0 {
					now.Add(int64(100 * time.Microsecond))
				}
				l := lims[rng.IntN(len(lims))]
				l.Allow(fmt.Sprint("k", rng.IntN(300)), time.Duration(now.Load()))
				if n%512 == 0 {
					for _, rule := range rules {
						r.Counters().AllowSweep(rule.Account())
					}
				}
			}
		}()
	}
	wg.Wait()
	stop.Store(true)
	<-watcher
	if o := over.Load(); o != nil {
		t.Fatal(o)
	}
	st := r.Counters().Stats()
	t.Logf("stats %+v", st)
	if st.Quota == 0 || st.Reclaims+st.Swept == 0 {
		t.Fatalf("the test did not exercise quotas and reclaims: %+v", st)
	}
	checkAccounts(t, r)
	checkTable(t, r)
}

// A snapshot placed into another table keeps each entry's account, and
// ReapAll recounts accounts that went wrong.
func TestQuotaPlaceAndRebuild(t *testing.T) {
	src := shmtest.Private(t, shm.Options{Counters: 1024})
	a := newLimiter(t, src, bucket.Rule{Name: "a", Limit: 1, Window: time.Hour, MaxKeys: 30})
	b := newLimiter(t, src, bucket.Rule{Name: "b", Limit: 1, Window: time.Hour})
	for i := range 50 {
		a.Allow(fmt.Sprint(i), time.Minute)
		b.Allow(fmt.Sprint(i), time.Minute)
	}
	dst := shmtest.Private(t, shm.Options{Counters: 2048})
	placeInto(t, dst, src, slices.Collect(src.Counters().Snapshot()))
	acc := func(rule string) uint16 { return bucket.Rule{Name: rule}.Account() }
	if dst.Counters().Held(acc("a")) != 30 || dst.Counters().Held(acc("b")) != 50 {
		t.Fatalf("placed: a %d, b %d", dst.Counters().Held(acc("a")), dst.Counters().Held(acc("b")))
	}
	checkAccounts(t, dst)
	dst.Counters().SetHeld(acc("a"), 7)
	if dst.Counters().VerifyAccounts() == nil {
		t.Fatal("CheckAccounts missed a wrong count")
	}
	dst.ReapAll()
	checkAccounts(t, dst)
}

// Records: a namespace at its maximum gets ErrQuota while others reserve;
// a released reservation, and an expired record of its own, give room
// back.
func TestResponsesQuota(t *testing.T) {
	r := shmtest.Private(t, shm.Options{Counters: 8, Responses: 256, ResponseBytes: 64 << 10})
	tab := r.Responses()
	q := shm.Quota{Account: 7, Max: 3}
	var got shm.Response
	key := func(s string) shm.Key { return r.Counters().KeyOf(9, []byte(s)) }
	var tks []shm.Ticket
	for i := range 3 {
		out, tk, err := tab.Begin(key(fmt.Sprint("k", i)), q, shm.Quota{}, fpOf("x"), 0, &got)
		if err != nil || out != shm.Reserved {
			t.Fatalf("key %d: %v %v", i, out, err)
		}
		tks = append(tks, tk)
	}
	if _, _, err := tab.Begin(key("k3"), q, shm.Quota{}, fpOf("x"), 0, &got); !errors.Is(err, shm.ErrQuota) {
		t.Fatalf("4th key: %v", err)
	}
	if out, _, err := tab.Begin(key("other"), shm.Quota{Account: 8, Max: 3}, shm.Quota{}, fpOf("x"), 0, &got); err != nil || out != shm.Reserved {
		t.Fatalf("another namespace: %v %v", out, err)
	}
	// A known key of the full namespace is still answered.
	if out, _, err := tab.Begin(key("k0"), q, shm.Quota{}, fpOf("x"), 0, &got); err != nil || out != shm.InFlight {
		t.Fatalf("known key: %v %v", out, err)
	}
	tab.Release(tks[0])
	if tab.Held(7) != 2 {
		t.Fatalf("held %d after a release", tab.Held(7))
	}
	out, tk, err := tab.Begin(key("k3"), q, shm.Quota{}, fpOf("x"), 0, &got)
	if err != nil || out != shm.Reserved {
		t.Fatalf("after a release: %v %v", out, err)
	}
	tks[0] = tk
	for _, tk := range tks {
		if _, err := tab.Complete(tk, &shm.Response{Status: 201, Body: []byte("done")}, 0, time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	checkAccounts(t, r)
	if _, _, err := tab.Begin(key("k4"), q, shm.Quota{}, fpOf("x"), 30*time.Second, &got); !errors.Is(err, shm.ErrQuota) {
		t.Fatalf("before the records expire: %v", err)
	}
	tab.AllowSweep(7)
	if out, _, err := tab.Begin(key("k4"), q, shm.Quota{}, fpOf("x"), 2*time.Minute, &got); err != nil || out != shm.Reserved {
		t.Fatalf("after the records expired: %v %v", out, err)
	}
	if n := tab.Held(7); n > 3 || n < 1 {
		t.Fatalf("held %d", n)
	}
	if st := tab.Stats(); st.Quota != 2 {
		t.Fatalf("stats %+v", st)
	}
	checkAccounts(t, r)
}

// Records of one client address: every key account under its maximum,
// the address at its own gets ErrAddrQuota (a key account at its maximum
// is named first), other addresses reserve; a release, and an expired
// record of the address, give room back; a refusal charges nothing.
// A client whose records are its address's too (no Authorization header:
// the by key is the address) and have all expired takes a new key at
// once: the sweep of its own account freed them on both, and the
// address's was once judged from before it (a false ErrAddrQuota).
func TestResponsesQuotaBothAccountsExpired(t *testing.T) {
	r := shmtest.Private(t, shm.Options{Counters: 8, Responses: 4096, ResponseBytes: 1 << 20})
	tab := r.Responses()
	q, addr := shm.Quota{Account: 7, Max: 3}, shm.Quota{Account: 5, Max: 3}
	key := func(s string) shm.Key { return r.Counters().KeyOf(9, []byte(s)) }
	var got shm.Response
	for i := range 3 {
		out, tk, err := tab.Begin(key(fmt.Sprint("k", i)), q, addr, fpOf("x"), 0, &got)
		if err != nil || out != shm.Reserved {
			t.Fatalf("key %d: %v %v", i, out, err)
		}
		if _, err := tab.Complete(tk, &shm.Response{Status: 201, Body: []byte("ok")}, 0, time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	if out, _, err := tab.Begin(key("new"), q, addr, fpOf("x"), 2*time.Minute, &got); err != nil || out != shm.Reserved {
		t.Fatalf("a new key once every record expired: %v %v (held %d, the address %d)", out, err, tab.Held(7), tab.AddrHeld(5))
	}
}

// Expired records whose blocks another response's store takes back (the
// pool is short) take their charges with them, as a sweep's do: their
// client and its address count no record that is gone, and a new key of
// theirs reserves without waiting for a sweep.
func TestResponsesEvictedRecordsUncharged(t *testing.T) {
	r := shmtest.Private(t, shm.Options{Counters: 8, Responses: 64, ResponseBytes: 8 * 256, BlockSize: 256})
	tab := r.Responses()
	q, addr := shm.Quota{Account: 7, Max: 4}, shm.Quota{Account: 5, Max: 4}
	key := func(s string) shm.Key { return r.Counters().KeyOf(9, []byte(s)) }
	var got shm.Response
	for i := range 4 {
		_, tk, err := tab.Begin(key(fmt.Sprint("k", i)), q, addr, fpOf("x"), 0, &got)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tab.Complete(tk, &shm.Response{Status: 201, Body: make([]byte, 300)}, 0, time.Second); err != nil {
			t.Fatal(err)
		}
	}
	// Another client's response needs every block: the expired records
	// are evicted for it.
	_, tk, err := tab.Begin(key("big"), shm.Quota{Account: 8, Max: 4}, shm.Quota{}, fpOf("x"), 2*time.Second, &got)
	if err != nil {
		t.Fatal(err)
	}
	if stored, err := tab.Complete(tk, &shm.Response{Status: 200, Body: make([]byte, 7*240)}, 2*time.Second, time.Hour); !stored || err != nil {
		t.Fatalf("the large response: stored %v, %v", stored, err)
	}
	if tab.Held(7) != 0 || tab.AddrHeld(5) != 0 {
		t.Fatalf("after their records were evicted the client holds %d, its address %d; want 0", tab.Held(7), tab.AddrHeld(5))
	}
	checkAccounts(t, r)
}

func TestResponsesAddrQuota(t *testing.T) {
	r := shmtest.Private(t, shm.Options{Counters: 8, Responses: 256, ResponseBytes: 64 << 10})
	tab := r.Responses()
	addr := shm.Quota{Account: 5, Max: 3}
	var got shm.Response
	key := func(s string) shm.Key { return r.Counters().KeyOf(9, []byte(s)) }
	// Each key comes with a by key of its own, as invented header values do.
	by := func(i int) shm.Quota { return shm.Quota{Account: uint16(100 + i), Max: 3} }
	var tks []shm.Ticket
	for i := range 3 {
		out, tk, err := tab.Begin(key(fmt.Sprint("k", i)), by(i), addr, fpOf("x"), 0, &got)
		if err != nil || out != shm.Reserved {
			t.Fatalf("key %d: %v %v", i, out, err)
		}
		tks = append(tks, tk)
	}
	for i := 3; i < 10; i++ {
		if _, _, err := tab.Begin(key(fmt.Sprint("k", i)), by(i), addr, fpOf("x"), 0, &got); !errors.Is(err, shm.ErrAddrQuota) {
			t.Fatalf("key %d of the address at its maximum: %v", i, err)
		}
	}
	checkAccounts(t, r)
	if tab.AddrHeld(5) != 3 || tab.Held(103) != 0 {
		t.Fatalf("address holds %d, a refused by key %d", tab.AddrHeld(5), tab.Held(103))
	}
	// A by key at its maximum is named first.
	full := shm.Quota{Account: 200, Max: 1}
	if _, _, err := tab.Begin(key("other-0"), full, shm.Quota{Account: 6, Max: 3}, fpOf("x"), 0, &got); err != nil {
		t.Fatal(err)
	}
	if _, _, err := tab.Begin(key("k-both"), full, addr, fpOf("x"), 0, &got); !errors.Is(err, shm.ErrQuota) {
		t.Fatalf("both at their maximum: %v", err)
	}
	// Another address, and a request with no address, are unaffected.
	if out, _, err := tab.Begin(key("other-1"), by(1), shm.Quota{Account: 6, Max: 3}, fpOf("x"), 0, &got); err != nil || out != shm.Reserved {
		t.Fatalf("another address: %v %v", out, err)
	}
	if out, _, err := tab.Begin(key("no-address"), by(1), shm.Quota{}, fpOf("x"), 0, &got); err != nil || out != shm.Reserved {
		t.Fatalf("no address: %v %v", out, err)
	}
	// A known key of the capped address is still answered.
	if out, _, err := tab.Begin(key("k0"), by(0), addr, fpOf("x"), 0, &got); err != nil || out != shm.InFlight {
		t.Fatalf("known key: %v %v", out, err)
	}
	tab.Release(tks[0])
	if tab.AddrHeld(5) != 2 || tab.Held(100) != 0 {
		t.Fatalf("after a release: address holds %d, its by key %d", tab.AddrHeld(5), tab.Held(100))
	}
	out, tk, err := tab.Begin(key("k3"), by(3), addr, fpOf("x"), 0, &got)
	if err != nil || out != shm.Reserved {
		t.Fatalf("after a release: %v %v", out, err)
	}
	tks[0] = tk
	for _, tk := range tks {
		if _, err := tab.Complete(tk, &shm.Response{Status: 201, Body: []byte("done")}, 0, time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	checkAccounts(t, r)
	if _, _, err := tab.Begin(key("k4"), by(4), addr, fpOf("x"), 30*time.Second, &got); !errors.Is(err, shm.ErrAddrQuota) {
		t.Fatalf("before the records expire: %v", err)
	}
	tab.AllowAddrSweep(5)
	if out, _, err := tab.Begin(key("k4"), by(4), addr, fpOf("x"), 2*time.Minute, &got); err != nil || out != shm.Reserved {
		t.Fatalf("after the records expired: %v %v", out, err)
	}
	if n := tab.AddrHeld(5); n > 3 || n < 1 {
		t.Fatalf("address holds %d", n)
	}
	checkAccounts(t, r)
}

// Goroutines of one address, each request with a by key of its own,
// racing to reserve, complete and release: the address never holds more
// than its maximum, and both sets of counts equal a walk of the table.
func TestResponsesAddrQuotaGoroutines(t *testing.T) {
	r := shmtest.Private(t, shm.Options{Counters: 8, Responses: 1024, ResponseBytes: 256 << 10})
	tab := r.Responses()
	addr := shm.Quota{Account: 9, Max: 20}
	var now atomic.Int64
	var stop atomic.Bool
	var over atomic.Value
	watcher := make(chan struct{})
	go func() {
		defer close(watcher)
		for !stop.Load() {
			if n := tab.AddrHeld(addr.Account); n > addr.Max {
				over.Store(fmt.Sprintf("the address held %d records, max %d", n, addr.Max))
			}
		}
	}()
	var refused atomic.Int64
	var wg sync.WaitGroup
	for g := range 6 {
		wg.Go(func() {
			var got shm.Response
			for i := range 3000 {
				if i%64 == 0 {
					now.Add(int64(time.Millisecond))
				}
				at := time.Duration(now.Load())
				q := shm.Quota{Account: uint16(1000 + (g*3000+i)%500), Max: 2}
				out, tk, err := tab.Begin(r.Counters().KeyOf(3, fmt.Appendf(nil, "%d-%d", g, i)), q, addr, fpOf("x"), at, &got)
				if err != nil || out != shm.Reserved {
					refused.Add(1)
					continue
				}
				if i%3 == 0 {
					tab.Release(tk)
				} else {
					tab.Complete(tk, &shm.Response{Status: 201}, at, 2*time.Millisecond)
				}
				if i%256 == 0 {
					tab.AllowAddrSweep(addr.Account)
				}
			}
		})
	}
	wg.Wait()
	stop.Store(true)
	<-watcher
	if o := over.Load(); o != nil {
		t.Fatal(o)
	}
	st := tab.Stats()
	t.Logf("stats %+v, refused %d, held %d", st, refused.Load(), tab.AddrHeld(addr.Account))
	if st.Quota == 0 || st.Swept == 0 {
		t.Fatalf("the test did not exercise the address's maximum and its sweep: %+v", st)
	}
	checkAccounts(t, r)
}

// A claim whose second charge is refused (its account reached its
// maximum after the check before the claim) takes back the first: the
// refused record is charged to nobody.
func TestResponsesRefusedClaimUncharged(t *testing.T) {
	r := shmtest.Private(t, shm.Options{Counters: 8, Responses: 256, ResponseBytes: 64 << 10})
	tab := r.Responses()
	q, addr := shm.Quota{Account: 50, Max: 1}, shm.Quota{Account: 5, Max: 10}
	// Another process takes the by account's last record between the
	// check and the claim: the address is charged first, then the by
	// account is found full.
	shm.SetTestHook(func(stage string) {
		if stage == "charged" && tab.AddrHeld(5) == 1 {
			tab.SetHeld(50, 1)
		}
	})
	var got shm.Response
	_, _, err := tab.Begin(r.Counters().KeyOf(9, []byte("k")), q, addr, fpOf("x"), 0, &got)
	shm.SetTestHook(nil)
	if !errors.Is(err, shm.ErrQuota) {
		t.Fatalf("Begin: %v, want ErrQuota", err)
	}
	tab.SetHeld(50, 0) // the other process's record, which this region does not hold
	if n := tab.AddrHeld(5); n != 0 {
		t.Fatalf("the address holds %d records after a refused claim", n)
	}
	checkAccounts(t, r)
}
