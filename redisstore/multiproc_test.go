package redisstore

import (
	"errors"
	"io"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/preforkd/preforkd/bucket"
	"github.com/preforkd/preforkd/internal/proctest"
	"github.com/preforkd/preforkd/internal/shmtest"
	"github.com/preforkd/preforkd/shm"
)

// Child processes are this test binary in a role (internal/proctest): a
// worker of the region, which arrives as fd 3.
func TestMain(m *testing.M) {
	proctest.Main(map[string]proctest.Role{"breaker": breakerChild})
	os.Exit(m.Run())
}

// breakerSpec is what the test tells a breaker child.
type breakerSpec struct {
	Worker int
	Policy Breaker
	// OneInTwo: every second probe of all the processes' fails; else
	// every probe succeeds.
	OneInTwo bool
	For      time.Duration // how long to ask for admission
}

// breakerReport is what a breaker child did.
type breakerReport struct {
	Probes, Calls, Recovered, Overlaps int
}

// Keys of the test's own counts in the region, beside the breaker's:
// probes in flight (any process), and probes made.
const (
	inFlightNS = 0x74657374_00000001
	probesNS   = 0x74657374_00000002
)

// add adds d to the region-wide count ns and returns the new count.
func add(tab *shm.Counters, ns uint64, d int64, now time.Duration) int64 {
	var n int64
	_, err := tab.Update(tab.KeyOfString(ns, "count"), breakerQuota, bucket.MetaOf(0x7e57, bucket.GCRA, time.Hour), now,
		func(p uint64, _ time.Duration) (uint64, bool) {
			n = int64(p) + d
			return uint64(n), true
		})
	if err != nil {
		panic(err)
	}
	return n
}

// breakerChild asks the shared breaker for admission as fast as it can;
// when it wins a probe it marks it in flight (a second probe in flight,
// from any process, is an overlap), holds it a moment, and reports its
// answer: success, or with OneInTwo a failure for every second probe of
// all processes.
func breakerChild(c *proctest.Child) error {
	var spec breakerSpec
	if err := c.Spec(&spec); err != nil {
		return err
	}
	r, err := shm.Attach(c.File(0))
	if err != nil {
		return err
	}
	if err := r.Join(spec.Worker); err != nil {
		return err
	}
	tab := r.Counters()
	tab.SetFresh(bucket.Fresh)
	br := newSharedBreaker(tab, spec.Policy, "multiproc", spec.Worker, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err := c.Ready(); err != nil {
		return err
	}
	var rep breakerReport
	for end := r.Now() + spec.For; r.Now() < end; {
		now := r.Now()
		switch br.admit(now) {
		case Call:
			rep.Calls++
			br.success(now, false)
		case Probe:
			rep.Probes++
			if add(tab, inFlightNS, 1, now) != 1 {
				rep.Overlaps++
			}
			n := add(tab, probesNS, 1, now)
			time.Sleep(100 * time.Microsecond) // a round trip: widens the window for a second probe
			add(tab, inFlightNS, -1, r.Now())
			if spec.OneInTwo && n%2 == 0 {
				br.failure(r.Now(), true, errors.New("the second of two"))
			} else if br.success(r.Now(), true) == Recovered {
				rep.Recovered++
			}
		}
	}
	return c.Report(rep)
}

// Four processes share one breaker, open at the start: exactly one probe
// is in flight at a time across them. A Redis that answers one probe in
// two (across all processes) never closes it; one that answers every
// probe closes it after exactly Successes probes, once.
func TestBreakerAcrossProcesses(t *testing.T) {
	t.Parallel()
	pol := Breaker{Failures: 1, Backoff: time.Millisecond, ProbeTimeout: 5 * time.Second, Successes: 3}
	for _, oneInTwo := range []bool{true, false} {
		r := shmtest.Create(t, shm.Options{Counters: 1024})
		parent := shmtest.Attach(t, r, 0)
		parent.Counters().SetFresh(bucket.Fresh)
		br := newSharedBreaker(parent.Counters(), pol, "multiproc", 0, slog.New(slog.NewTextHandler(io.Discard, nil)))
		if tr := br.failure(parent.Now(), false, errors.New("down")); tr != Opened {
			t.Fatalf("the first failure: %v", tr)
		}
		b := proctest.NewBarrier(t)
		var procs []*proctest.Proc
		for w := 1; w <= 4; w++ {
			procs = append(procs, proctest.Start(t, proctest.Options{Role: "breaker", Files: []*os.File{r.File()}, Barrier: b,
				Spec: breakerSpec{Worker: w, Policy: pol, OneInTwo: oneInTwo, For: 700 * time.Millisecond}}))
		}
		b.Release(30 * time.Second)
		var sum breakerReport
		for _, p := range procs {
			var rep breakerReport
			p.Decode(&rep, 30*time.Second)
			sum.Probes += rep.Probes
			sum.Calls += rep.Calls
			sum.Recovered += rep.Recovered
			sum.Overlaps += rep.Overlaps
		}
		t.Logf("one in two %v: %+v", oneInTwo, sum)
		if sum.Overlaps != 0 {
			t.Errorf("one in two %v: %d probes began while another was in flight", oneInTwo, sum.Overlaps)
		}
		state := DecodeBreaker(br.word(parent.Now()), parent.Now())
		if oneInTwo {
			if sum.Recovered != 0 || sum.Calls != 0 || sum.Probes < 20 || state.Phase == Closed {
				t.Errorf("one probe in two answered: %+v, breaker %+v; want it never closed, over many probes", sum, state)
			}
		} else if sum.Recovered != 1 || sum.Probes != pol.Successes || sum.Calls == 0 || state.Phase != Closed {
			t.Errorf("every probe answered: %+v, breaker %+v; want closed once, after exactly %d probes", sum, state, pol.Successes)
		}
	}
}
