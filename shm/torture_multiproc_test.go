package shm_test

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/preforkd/preforkd/bucket"
	"github.com/preforkd/preforkd/internal/proctest"
	"github.com/preforkd/preforkd/internal/shmtest"
	"github.com/preforkd/preforkd/shm"
)

// The torture test's workload: rate-limit decisions on a few hot keys,
// idempotent requests whose responses span several blocks, and cache
// fills, lookups and evictions, in every child at once, while the parent
// kills children at moments it does not choose.
var (
	tortureRule = bucket.Rule{Name: "torture", Limit: 100000, Window: time.Hour, Algorithm: bucket.FixedWindow}
	tortureHot  = []string{"hot-a", "hot-b", "hot-c"}
)

const (
	tortureKeys  = 12  // idempotency keys, and as many cache keys
	tortureBlock = 256 // block size: a body of 300 to 1,500 bytes takes 2 to 6 blocks
)

// tortureBody is what key k stores: n bytes that name it, so that a
// replay or a cache hit of another key's bytes, or of torn ones, shows.
func tortureBody(kind string, k, n int) []byte {
	return bytes.Repeat([]byte(fmt.Sprintf("%s-%02d|", kind, k)), n/8+1)[:n]
}

// tortureChild runs the workload until it is killed. It says "a KEY"
// after each allowed decision, and "bad ..." for a replay or an entry
// whose bytes are not its key's.
func tortureChild(c *proctest.Child) error {
	r, lim, spec, err := joinChild(c)
	if err != nil {
		return err
	}
	tab := r.Responses()
	bad := func(format string, args ...any) { c.Say("bad "+format, args...) }
	var wg sync.WaitGroup
	for g := range spec.Goroutines {
		wg.Add(3)
		go func() { // rate-limit decisions
			defer wg.Done()
			for i := g; ; i++ {
				key := tortureHot[i%len(tortureHot)]
				if d := lim.Allow(key, spec.Frozen); d.Allowed {
					c.Say("a %s", key)
				}
			}
		}()
		go func() { // idempotent requests
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(os.Getpid()), uint64(g)))
			var got shm.Response
			for {
				ki := rng.IntN(tortureKeys)
				k := r.Counters().KeyOf(7, []byte(fmt.Sprint("idem-", ki)))
				fp := shm.Fingerprint(sha256.Sum256([]byte(fmt.Sprint("POST /", ki))))
				out, tk, err := tab.Begin(k, shm.Quota{}, shm.Quota{}, fp, r.Now(), &got)
				if err != nil {
					continue // no record or lock to be had now
				}
				switch out {
				case shm.Reserved:
					if rng.IntN(4) == 0 {
						tab.Release(tk)
						continue
					}
					body := tortureBody("idem", ki, 300+rng.IntN(1200))
					tab.Complete(tk, &shm.Response{Status: 201, Body: body}, r.Now(), time.Duration(1+rng.IntN(20))*time.Millisecond)
				case shm.InFlight:
					tab.Wait(tk, 20*time.Millisecond)
				case shm.Replay:
					if want := tortureBody("idem", ki, len(got.Body)); !bytes.Equal(got.Body, want) {
						bad("replay of idem-%d: %.40q", ki, got.Body)
					}
				}
			}
		}()
		go func() { // the response cache
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(os.Getpid()), uint64(g)+100))
			var buf []byte
			for {
				ki := rng.IntN(tortureKeys)
				k := r.Counters().KeyOf(9, []byte(fmt.Sprint("cache-", ki)))
				now := r.Now()
				f, err := tab.CacheLookup(k, now, buf)
				if err != nil {
					continue
				}
				if f.Data != nil {
					buf = f.Data[:0]
					if want := tortureBody("cache", ki, len(f.Data)); !bytes.Equal(f.Data, want) {
						bad("entry of cache-%d: %.40q", ki, f.Data)
					}
					if rng.IntN(4) == 0 {
						tab.CacheEvict(f.Entry)
					}
					continue
				}
				tk, held, err := tab.CacheLock(k, now)
				switch {
				case err != nil:
				case !held:
					tab.Wait(tk, 20*time.Millisecond)
				case rng.IntN(8) == 0:
					tab.CacheUnlock(tk)
				default:
					data := tortureBody("cache", ki, 300+rng.IntN(1200))
					tab.CacheFill(tk, data, now+time.Duration(1+rng.IntN(20))*time.Millisecond, now)
				}
			}
		}()
	}
	wg.Wait()
	return nil
}

// Children hammer counters, idempotency records and cache entries while
// the parent SIGKILLs one at a random moment, reaps it as the supervisor
// does and starts another as the same worker. At the end, once every
// child is killed and reaped: every block is free or in one completed
// record's chain, nothing is held by the dead, and each hot key counted
// every decision its children reported allowed, at most one more per
// kill (a decision whose report died with it), and never over the limit.
func TestTortureKills(t *testing.T) {
	r := shmtest.Joined(t, shm.Options{Counters: 1024, Responses: 64, ResponseBytes: 48 * tortureBlock, BlockSize: tortureBlock})
	const workers, goroutines = 3, 2
	const frozen = 42 * time.Second
	start := func(w int) *proctest.Proc {
		p := proctest.Start(t, proctest.Options{Role: "torture", Files: []*os.File{r.File()},
			Spec: childSpec{Worker: w, Rule: tortureRule, Goroutines: goroutines, Frozen: frozen}})
		p.WaitReady(10 * time.Second)
		return p
	}
	allowed := map[string]int{}
	var bad []string
	// drain reads what a child said until its end.
	drain := func(p *proctest.Proc) {
		for {
			line, err := p.Line(5 * time.Second)
			if err != nil {
				return
			}
			switch {
			case strings.HasPrefix(line, "a "):
				allowed[line[2:]]++
			case strings.HasPrefix(line, "bad "):
				bad = append(bad, line)
			}
		}
	}
	procs := make([]*proctest.Proc, workers+1)
	for w := 1; w <= workers; w++ {
		procs[w] = start(w)
	}
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1))
	kills := 0
	kill := func(w int) {
		procs[w].Kill()
		if _, err := r.Reap(w); err != nil {
			t.Fatal(err)
		}
		drain(procs[w])
		kills++
	}
	for deadline := time.Now().Add(2500 * time.Millisecond); time.Now().Before(deadline); {
		time.Sleep(time.Duration(rng.IntN(40_000)) * time.Microsecond)
		w := 1 + rng.IntN(workers)
		kill(w)
		procs[w] = start(w)
	}
	for w := 1; w <= workers; w++ {
		kill(w)
	}
	t.Logf("%d kills; allowed as reported: %v", kills, allowed)
	if len(bad) > 0 {
		t.Errorf("%d wrong reads, the first: %s", len(bad), bad[0])
	}
	// Every child was reaped as the supervisor reaps, the others running:
	// no block is left taken that no completed record holds, whatever
	// the moment of each kill (building a chain, completing a record or
	// freeing a record's chain).
	if leaked, msg := r.Responses().CheckPool(); leaked != 0 || msg != "" {
		t.Errorf("response pool after the reaps: %d blocks in use that no completed record holds; %s", leaked, msg)
	}
	checkTableKilled(t, r, kills*goroutines)
	lim, err := bucket.NewLimiter(tortureRule, r.Counters())
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range tortureHot {
		d := lim.Peek(key, frozen)
		counted := int(tortureRule.Limit - d.Remaining)
		if counted < allowed[key] || counted > allowed[key]+kills*goroutines {
			t.Errorf("%s: counted %d allowed, the children reported %d, with %d kills of %d goroutines", key, counted, allowed[key], kills, goroutines)
		}
	}
	// ReapAll, for a region re-attached with every process gone, keeps
	// the pool exact too.
	r.ReapAll()
	if leaked, msg := r.Responses().CheckPool(); leaked > 0 || msg != "" {
		t.Errorf("after ReapAll: %d blocks leaked; %s", leaked, msg)
	}
}
