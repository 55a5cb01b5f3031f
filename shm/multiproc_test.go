package shm_test

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/preforkd/preforkd/bucket"
	"github.com/preforkd/preforkd/internal/looptest"
	"github.com/preforkd/preforkd/internal/proctest"
	"github.com/preforkd/preforkd/internal/shmtest"
	"github.com/preforkd/preforkd/shm"
)

// Child processes are this test binary in a role (internal/proctest):
// the region arrives as fd 3, and every child waits at one barrier so
// that all start hammering at once.
func TestMain(m *testing.M) {
	proctest.Main(map[string]proctest.Role{
		"hammer": hammerChild, "torture": tortureChild, "stall": stallChild, "idem": idemChild,
		"records": regionRole(recordsChild), "cache": regionRole(cacheChild),
		"forgotten": regionRole(forgottenChild),
	})
	os.Exit(m.Run())
}

// childSpec is what the parent tells a child.
type childSpec struct {
	Worker     int
	Rule       bucket.Rule
	Keys       []string
	Goroutines int
	Attempts   int           // per goroutine
	Frozen     time.Duration // fixed region time; 0 = read the region clock
	Stage      string        // role "stall": the crash point to stop at
	Pause      time.Duration // role "hammer": pause inside every claim (widens races)
	For        time.Duration // role "hammer": stop early after this long (0 = run all attempts)
	Lag        time.Duration // role "hammer": every 16th decision sleeps this long after reading the clock
	Spread     bool          // role "hammer": each goroutine starts at its own share of the keys
	Quota      shm.Quota     // role "records": the account the records are charged to
	Addr       shm.Quota     // role "records": the address account too (Max 0: none)
	ByAccounts int           // role "records": the records' by accounts are Quota.Account + i%ByAccounts (0: one)
}

// childResult is what a hammer child reports: allowed decisions per key
// and window index (the window of the `now` the decision used), allowed
// decisions per Remaining they reported, and how many decisions the
// on_full policy answered.
type childResult struct {
	Allowed   map[string]map[int64]int
	Remaining map[int64]int
	Full      int
}

// joinChild attaches the inherited region as the spec's worker, builds
// the spec's limiter (if it has a rule), and returns once released.
func joinChild(c *proctest.Child) (r *shm.Region, lim *bucket.Limiter, spec childSpec, err error) {
	if err := c.Spec(&spec); err != nil {
		return nil, nil, spec, err
	}
	if r, err = shm.Attach(c.File(0)); err != nil {
		return nil, nil, spec, err
	}
	if err := r.Join(spec.Worker); err != nil {
		return nil, nil, spec, err
	}
	if spec.Rule.Name != "" {
		if lim, err = bucket.NewLimiter(spec.Rule, r.Counters()); err != nil {
			return nil, nil, spec, err
		}
	}
	return r, lim, spec, c.Ready()
}

// regionRole is a role that works on the joined region with its spec
// and reports on stdout itself.
func regionRole(run func(*shm.Region, childSpec) error) proctest.Role {
	return func(c *proctest.Child) error {
		r, _, spec, err := joinChild(c)
		if err != nil {
			return err
		}
		return run(r, spec)
	}
}

// stallChild stops at the crash point spec.Stage, says so, and waits
// there to be killed.
func stallChild(c *proctest.Child) error {
	r, lim, spec, err := joinChild(c)
	if err != nil {
		return err
	}
	shm.SetTestHook(func(stage string) {
		if stage == spec.Stage {
			c.Say("stopped %s", stage)
			time.Sleep(time.Hour) // held until the parent kills us
		}
	})
	now := spec.Frozen
	if now == 0 {
		now = r.Now()
	}
	lim.Allow(spec.Keys[0], now)
	return errors.New("the crash point was never reached")
}

func hammerChild(c *proctest.Child) error {
	r, lim, spec, err := joinChild(c)
	if err != nil {
		return err
	}
	if spec.Pause > 0 {
		shm.SetTestHook(func(stage string) {
			if stage == "busy" {
				time.Sleep(spec.Pause)
			}
		})
	}
	res := childResult{Allowed: map[string]map[int64]int{}, Remaining: map[int64]int{}}
	var mu sync.Mutex
	var wg sync.WaitGroup
	deadline := time.Now().Add(spec.For)
	for g := 0; g < spec.Goroutines; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < spec.Attempts; i++ {
				if spec.For > 0 && i%64 == 0 && time.Now().After(deadline) {
					return
				}
				at := g + i
				if spec.Spread {
					at = g*len(spec.Keys)/spec.Goroutines + i
				}
				key := spec.Keys[at%len(spec.Keys)]
				now := spec.Frozen
				if now == 0 {
					now = r.Now()
				}
				if spec.Lag > 0 && i%16 == 15 {
					time.Sleep(spec.Lag) // descheduled between the clock and the decision
				}
				d := lim.Allow(key, now)
				mu.Lock()
				switch {
				case d.Full:
					res.Full++
				case d.Allowed:
					if res.Allowed[key] == nil {
						res.Allowed[key] = map[int64]int{}
					}
					// The window the decision counted in: the one
					// that ends ResetAfter from now (not always the
					// window of now: a later one counts when the
					// clock reads behind the key's state).
					res.Allowed[key][int64((now+d.ResetAfter)/spec.Rule.Window)-1]++
					res.Remaining[d.Remaining]++
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return c.Report(res)
}

// spawn starts children of one role on r; they wait until release is
// called.
func spawn(t *testing.T, r *shm.Region, role string, specs []childSpec) (procs []*proctest.Proc, release func()) {
	t.Helper()
	b := proctest.NewBarrier(t)
	for _, spec := range specs {
		procs = append(procs, proctest.Start(t, proctest.Options{Role: role, Spec: spec, Files: []*os.File{r.File()}, Barrier: b}))
	}
	return procs, func() { b.Release(30 * time.Second) }
}

// hammer runs n processes × g goroutines over keys and merges their counts.
func hammer(t *testing.T, r *shm.Region, n int, spec childSpec) childResult {
	t.Helper()
	specs := make([]childSpec, n)
	for i := range specs {
		specs[i] = spec
		specs[i].Worker = i + 1
	}
	procs, release := spawn(t, r, "hammer", specs)
	release()
	total := childResult{Allowed: map[string]map[int64]int{}, Remaining: map[int64]int{}}
	for i, p := range procs {
		var res childResult
		p.Decode(&res, 60*time.Second)
		if err := p.Wait(10 * time.Second); err != nil {
			t.Fatalf("child %d: %v", i, err)
		}
		total.Full += res.Full
		for rem, c := range res.Remaining {
			total.Remaining[rem] += c
		}
		for k, wins := range res.Allowed {
			if total.Allowed[k] == nil {
				total.Allowed[k] = map[int64]int{}
			}
			for w, c := range wins {
				total.Allowed[k][w] += c
			}
		}
	}
	return total
}

// killFirstWhile calls check over and over while the children procs run:
// after d it kills the first (joined as worker 1) and reaps it, then
// waits for the others to exit, decoding what each reports into report
// unless it is nil. It fails the test with the first problem check
// reported.
func killFirstWhile(t *testing.T, r *shm.Region, procs []*proctest.Proc, d time.Duration, report any, check func() string) {
	t.Helper()
	var first string
	checks := looptest.Start(t, 0)
	checks.Go(func() {
		if msg := check(); msg != "" && first == "" {
			first = msg
		}
	})
	defer checks.Stop() // on a failure too: check reads the region, unmapped when the test ends
	time.Sleep(d)
	procs[0].Kill()
	if _, err := r.Reap(1); err != nil {
		t.Fatal(err)
	}
	for i, p := range procs[1:] {
		if report != nil {
			p.Decode(report, 60*time.Second)
		}
		if err := p.Wait(30 * time.Second); err != nil {
			t.Fatalf("child %d: %v", i+2, err)
		}
	}
	checks.Stop()
	if first != "" {
		t.Fatal(first)
	}
}

// checkTable asserts that no key is LIVE twice, nothing is left BUSY or
// locked, and the occupancy the processes counted (Region.SumStats) is the
// one a scan finds.
func checkTable(t *testing.T, r *shm.Region) {
	t.Helper()
	checkTableKilled(t, r, 0)
}

// checkTableKilled is checkTable after SIGKILLs at a moment the test did
// not choose, with lost updates in flight at most: each goroutine of a
// killed process may have died between a slot's change (a CAS) and its
// count in the process's statistics row, which leaves the occupancy
// counted off by one (README: the metric's bound).
func checkTableKilled(t *testing.T, r *shm.Region, lost int) {
	t.Helper()
	c := r.Counters()
	seen := map[shm.Key]bool{}
	for _, k := range c.LiveKeys() {
		if seen[k] {
			t.Fatalf("key %x is LIVE in two slots", k)
		}
		seen[k] = true
	}
	st := c.Stats()
	if st.Busy != 0 || st.Locked != 0 {
		t.Fatalf("left behind: %d BUSY slots, %d insert locks", st.Busy, st.Locked)
	}
	var sum shm.StatSum
	r.SumStats(&sum)
	if d := sum.Table.Live - st.Live; d < -lost || d > lost || !sum.Consistent {
		t.Fatalf("counted %d live slots (consistent %v), the scan finds %d (%d updates in flight killed at most)", sum.Table.Live, sum.Consistent, st.Live, lost)
	}
}

// One key, a frozen clock, 3 processes × 4 goroutines: exactly L allowed,
// for both algorithms.
func TestMultiProcessExact(t *testing.T) {
	const limit = 500
	for _, algo := range []bucket.Algorithm{bucket.FixedWindow, bucket.GCRA} {
		t.Run(algo.String(), func(t *testing.T) {
			r := shmtest.Joined(t, shm.Options{Counters: 1024})
			res := hammer(t, r, 3, childSpec{
				Rule:       bucket.Rule{Name: "exact", Limit: limit, Window: time.Hour, Algorithm: algo},
				Keys:       []string{"client"},
				Goroutines: 4,
				Attempts:   400, // 4,800 attempts in all
				Frozen:     42 * time.Second,
				Pause:      time.Millisecond,
			})
			got := 0
			for _, c := range res.Allowed["client"] {
				got += c
			}
			if got != limit || res.Full != 0 {
				t.Fatalf("allowed %d (full %d), want exactly %d", got, res.Full, limit)
			}
			checkTable(t, r)
		})
	}
}

// A table of 8 slots and 32 keys on a running clock: claims and reclaims
// all the time, and per key and window never more than the limit.
func TestMultiProcessTinyTable(t *testing.T) {
	r := shmtest.Joined(t, shm.Options{Counters: 8})
	keys := make([]string, 32)
	for i := range keys {
		keys[i] = "k" + strconv.Itoa(i)
	}
	const limit = 3
	rule := bucket.Rule{Name: "tiny", Limit: limit, Window: 2 * time.Millisecond, Algorithm: bucket.FixedWindow}
	res := hammer(t, r, 3, childSpec{Rule: rule, Keys: keys, Goroutines: 3, Attempts: 1 << 30, Pause: 20 * time.Microsecond, Lag: 3 * time.Millisecond, For: 1500 * time.Millisecond})
	total := 0
	for k, wins := range res.Allowed {
		for w, c := range wins {
			total += c
			if c > limit {
				t.Errorf("key %s window %d: %d allowed, limit %d", k, w, c, limit)
			}
		}
	}
	st := r.Counters().Stats()
	t.Logf("allowed %d, full %d, stats %+v", total, res.Full, st)
	if st.Reclaims == 0 || total == 0 {
		t.Fatalf("the test did not exercise reclaims: %+v", st)
	}
	// Every on_full answer of every process is in the statistics rows.
	if got := st.Full + st.LockTimeout; got != uint64(res.Full) {
		t.Errorf("the rows count %d on_full answers, the processes saw %d", got, res.Full)
	}
	checkTable(t, r)
}

// A process killed at each crash point leaves nothing stuck: after the
// supervisor's reap (or, without it, the lazy release by whoever meets the
// stale owner) every key is reachable, none is LIVE twice, limits hold.
func TestCrashInjection(t *testing.T) {
	for _, stage := range []string{"locked", "busy", "keyed", "published"} {
		for _, sweep := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/sweep=%v", stage, sweep), func(t *testing.T) {
				r := shmtest.Joined(t, shm.Options{Counters: 64})
				rule := bucket.Rule{Name: "crash", Limit: 2, Window: time.Hour, Algorithm: bucket.FixedWindow}
				procs, release := spawn(t, r, "stall", []childSpec{{Worker: 5, Rule: rule, Keys: []string{"victim"}, Stage: stage}})
				release()
				line, err := procs[0].Line(30 * time.Second)
				if err != nil || !strings.HasPrefix(line, "stopped "+stage) {
					t.Fatalf("child did not stop at %s: %q %v", stage, line, err)
				}
				// While the child lives, its insert lock is respected: a
				// claim of the same key waits, then gives up (bounded).
				lim, _ := bucket.NewLimiter(rule, r.Counters())
				if stage != "published" {
					r.Counters().SetLockWait(20 * time.Millisecond)
					if d := lim.Allow("victim", time.Second); !d.Full {
						t.Fatalf("claim under a live holder's lock did not wait: %+v", d)
					}
				}
				procs[0].Kill()
				if sweep {
					if n, err := r.Reap(5); err != nil || n == 0 {
						t.Fatalf("reap released %d (%v), want at least the lock", n, err)
					}
				} else {
					r.Retire(5)
				}
				r.Counters().SetLockWait(time.Second)
				allowed := 0
				for i := 0; i < 5; i++ {
					d := lim.Allow("victim", time.Second)
					if d.Full {
						t.Fatalf("attempt %d: key unreachable after recovery: %+v", i, d)
					}
					if d.Allowed {
						allowed++
					}
				}
				// Killed after publishing, the dead request was counted
				// (it may have been served); before, nothing was.
				want := 2
				if stage == "published" {
					want = 1
				}
				if allowed != want {
					t.Fatalf("allowed %d after the crash at %s, want %d", allowed, stage, want)
				}
				// Other keys homed anywhere are reachable too.
				for i := 0; i < 20; i++ {
					if d := lim.Allow("other"+strconv.Itoa(i), time.Second); !d.Allowed || d.Full {
						t.Fatalf("key %d: %+v", i, d)
					}
				}
				if !sweep {
					// Lazy release frees only what it meets: sweep the rest.
					r.Reap(5)
				}
				checkTable(t, r)
			})
		}
	}
}

// A re-attaching supervisor kills the orphans that still map a live
// region, and only them.
func TestKillOrphans(t *testing.T) {
	path := t.TempDir() + "/live"
	r, err := shm.CreateFile(path, shm.Options{Counters: 64})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	procs, release := spawn(t, r, "stall", []childSpec{{Worker: 4, Rule: bucket.Rule{Name: "o", Limit: 1, Window: time.Hour}, Keys: []string{"k"}, Stage: "published"}})
	release()
	if line, _ := procs[0].Line(30 * time.Second); !strings.HasPrefix(line, "stopped") {
		t.Fatalf("child: %q", line)
	}
	// A process that does not map the region, recorded under a stale
	// entry (a reused pid), is left alone.
	bystander := exec.Command("sleep", "10")
	bystander.Start()
	defer func() { bystander.Process.Kill(); bystander.Wait() }()
	r.Join(5)
	r.SetWorkerPID(5, bystander.Process.Pid)

	killed := r.KillOrphans(2 * time.Second)
	if len(killed) != 1 || killed[0] != procs[0].Pid() {
		t.Fatalf("killed %v, want only the orphan %d", killed, procs[0].Pid())
	}
	if err := bystander.Process.Signal(syscall.Signal(0)); err != nil {
		t.Fatalf("the bystander was killed: %v", err)
	}
}

// Processes claiming, reclaiming and sweeping under quotas on a running
// clock, one of them SIGKILLed mid-run and reaped: no account ever holds
// more than its maximum, and every count equals a walk of the table.
func TestMultiProcessQuota(t *testing.T) {
	r := shmtest.Joined(t, shm.Options{Counters: 512})
	keys := make([]string, 400)
	for i := range keys {
		keys[i] = "k" + strconv.Itoa(i)
	}
	capped := bucket.Rule{Name: "capped", Limit: 2, Window: 3 * time.Millisecond, Algorithm: bucket.FixedWindow, MaxKeys: 40}
	gcra := bucket.Rule{Name: "gcra", Limit: 1, Window: 5 * time.Millisecond, MaxKeys: 60}
	open := bucket.Rule{Name: "open", Limit: 3, Window: 2 * time.Millisecond, Algorithm: bucket.FixedWindow}
	spec := func(w int, rule bucket.Rule) childSpec {
		return childSpec{Worker: w, Rule: rule, Keys: keys, Goroutines: 2, Attempts: 1 << 30, For: 1500 * time.Millisecond}
	}
	procs, release := spawn(t, r, "hammer", []childSpec{spec(1, capped), spec(2, capped), spec(3, gcra), spec(4, open)})
	release()
	killFirstWhile(t, r, procs, 500*time.Millisecond, &childResult{}, func() string {
		for _, rule := range []bucket.Rule{capped, gcra} {
			if n := r.Counters().Held(rule.Account()); n > rule.MaxKeys {
				return fmt.Sprintf("rule %s holds %d slots, max %d", rule.Name, n, rule.MaxKeys)
			}
		}
		return ""
	})
	st := r.Counters().Stats()
	t.Logf("stats %+v; held: capped %d, gcra %d, open %d", st,
		r.Counters().Held(capped.Account()), r.Counters().Held(gcra.Account()), r.Counters().Held(open.Account()))
	if st.Quota == 0 || st.Reclaims == 0 || st.Swept == 0 {
		t.Fatalf("the test did not exercise quotas, reclaims and sweeps: %+v", st)
	}
	if err := r.Counters().VerifyAccounts(); err != nil {
		t.Fatal(err)
	}
	checkTableKilled(t, r, spec(1, capped).Goroutines) // the kill above came at any moment, in each goroutine
}

// Processes racing for the last slots of a quota, each claim paused
// between the check of the count and the charge: exactly the maximum of
// keys get a slot, however many passed the check together.
func TestMultiProcessQuotaExact(t *testing.T) {
	r := shmtest.Joined(t, shm.Options{Counters: 1024})
	rule := bucket.Rule{Name: "exact", Limit: 1, Window: time.Hour, MaxKeys: 40}
	specs := make([]childSpec, 3)
	for p := range specs {
		keys := make([]string, 400)
		for i := range keys {
			keys[i] = fmt.Sprintf("p%d-k%d", p, i)
		}
		specs[p] = childSpec{Worker: p + 1, Rule: rule, Keys: keys, Goroutines: 8, Attempts: 20, Frozen: time.Minute, Pause: time.Millisecond, Spread: true}
	}
	procs, release := spawn(t, r, "hammer", specs)
	release()
	served := 0
	for i, p := range procs {
		var res childResult
		p.Decode(&res, 60*time.Second)
		if err := p.Wait(30 * time.Second); err != nil {
			t.Fatalf("child %d: %v", i, err)
		}
		served += len(res.Allowed)
	}
	st := r.Counters().Stats()
	if served != 40 || r.Counters().Held(rule.Account()) != 40 {
		t.Fatalf("%d keys served, the rule holds %d slots: want 40 (%+v)", served, r.Counters().Held(rule.Account()), st)
	}
	if st.Quota == 0 {
		t.Fatalf("no claim was refused: %+v", st)
	}
	if err := r.Counters().VerifyAccounts(); err != nil {
		t.Fatal(err)
	}
	checkTable(t, r)
}

// A process killed while it changes an account (the count changed, the
// slot's charge not yet, or the other way round) leaves no drift: the
// account is counted again by whoever takes its lock from the dead
// process (the supervisor's reap, or the next claim of the account), and
// the cap holds.
func TestCrashInjectionAccounts(t *testing.T) {
	const frozen = 10 * time.Second
	// "old" fills the table and is fresh by the time "new" claims: a claim
	// of "new" takes a slot over from "old", clearing one charge (the stage
	// "uncharged") before it makes its own ("charged").
	old := bucket.Rule{Name: "old", Limit: 1, Window: time.Second, Algorithm: bucket.FixedWindow, MaxKeys: 8}
	nu := bucket.Rule{Name: "new", Limit: 1, Window: time.Hour, MaxKeys: 3}
	for _, stage := range []string{"charged", "uncharged"} {
		for _, sweep := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/sweep=%v", stage, sweep), func(t *testing.T) {
				r := shmtest.Joined(t, shm.Options{Counters: 8})
				lo, ln := newLimiter(t, r, old), newLimiter(t, r, nu)
				for i := range 8 {
					if d := lo.Allow("o"+strconv.Itoa(i), time.Second); d.Full {
						t.Fatalf("filling: %+v", d)
					}
				}
				procs, release := spawn(t, r, "stall", []childSpec{{Worker: 5, Rule: nu, Keys: []string{"victim"}, Stage: stage, Frozen: frozen}})
				release()
				line, err := procs[0].Line(30 * time.Second)
				if err != nil || !strings.HasPrefix(line, "stopped "+stage) {
					t.Fatalf("child did not stop at %s: %q %v", stage, line, err)
				}
				procs[0].Kill()
				if sweep {
					if _, err := r.Reap(5); err != nil {
						t.Fatal(err)
					}
				} else {
					r.Retire(5)
					// The next claims of both accounts meet the dead
					// holder's lock (and its BUSY slot) and recover them.
					r.Counters().SetLockWait(time.Second)
					if d := lo.Allow("o-again", frozen); d.Full {
						t.Fatalf("old after the crash: %+v", d)
					}
					if d := ln.Allow("n0", frozen); d.Full {
						t.Fatalf("new after the crash: %+v", d)
					}
					r.Reap(5) // what no claim met
				}
				if err := r.Counters().VerifyAccounts(); err != nil {
					t.Fatal(err)
				}
				// The cap of "new" holds exactly: 3 keys, not 2, not 4.
				before, served := ln.Keys(), 0
				for i := range 6 {
					if d := ln.Allow("n-"+strconv.Itoa(i), frozen); !d.Full {
						served++
					} else if !d.Capped {
						t.Fatalf("key %d: the table was full: %+v", i, d)
					}
				}
				if ln.Keys() != 3 || served != 3-before {
					t.Fatalf("new held %d slots, %d more were served, and it holds %d: want 3", before, served, ln.Keys())
				}
				if err := r.Counters().VerifyAccounts(); err != nil {
					t.Fatal(err)
				}
				checkTable(t, r)
			})
		}
	}
}
