package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/preforkd/preforkd/internal/redistest"
)

// A real Redis Cluster of 3 masters with a replica each, and preforkd with
// 4 workers: limits are exact across the workers on keys spread over the
// masters; a master killed under load is replaced by the Cluster, and
// within 10 s of the Cluster being whole again (cluster_state:ok, every
// slot on a live master) every decision is Redis's again: with
// on_unavailable = "closed", no 503 after that, and each 200 carries the
// rule's RateLimit item, which only a decision by Redis has.
func TestRedisClusterFailover(t *testing.T) {
	t.Parallel()
	cl := redistest.StartCluster(t, redistest.ClusterOptions{Masters: 3, Replicas: 1, NodeTimeout: time.Second})
	seeds := make([]string, len(cl.Nodes))
	for i, a := range cl.Seeds() {
		seeds[i] = fmt.Sprintf("%q", a)
	}
	d := startDaemon(t, daemonOptions{admin: true, config: fmt.Sprintf(`[server]
workers = 4
[admin]
listen = "ADMIN_ADDR"
[redis]
cluster = [%s]
timeout = "1s"
[[ratelimit]]
name = "exact"
path = "/exact"
limit = 10
window = "1m"
by = "header:X-Key"
store = "redis"
[[ratelimit]]
name = "load"
path = "/load"
limit = 1000000
window = "1m"
by = "header:X-Key"
store = "redis"
on_unavailable = "closed"
`, strings.Join(seeds, ", "))})

	// Exact: 40 requests at once for each of 6 keys (on new connections,
	// so spread over the 4 workers) let exactly 10 through per key.
	c := newClient(t, nil, false)
	var wg sync.WaitGroup
	out := make([][]result, 6)
	for k := range out {
		out[k] = make([]result, 40)
		for i := range out[k] {
			wg.Go(func() {
				out[k][i] = do(c, http.MethodGet, d.url("/exact"), http.Header{"X-Key": {fmt.Sprint("exact-", k)}})
			})
		}
	}
	wg.Wait()
	workers := map[int]bool{}
	for k, rs := range out {
		if st := statuses(rs); st[200] != 10 || st[429] != 30 {
			t.Fatalf("key %d: %v (transport error: %s), want exactly 10 × 200 and 30 × 429", k, st, firstErr(rs))
		}
		for _, r := range rs {
			if b, ok := r.demo(); ok {
				workers[b.Worker] = true
			}
		}
	}
	t.Logf("the allowed requests were served by %d workers", len(workers))

	// Load on 60 keys (spread over the 3 masters) from 8 clients.
	var (
		stop            = make(chan struct{})
		lastBad         atomic.Int64 // UnixNano of the end of the last request Redis did not decide
		served, refused atomic.Int64
		unexpected      atomic.Value
		loaders         sync.WaitGroup
	)
	for g := range 8 {
		loaders.Go(func() {
			lc := newClient(t, nil, true)
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				r := do(lc, http.MethodGet, d.url("/load"), http.Header{"X-Key": {fmt.Sprint("load-", (g*7+i)%60)}})
				switch {
				case r.err == nil && r.status == 200 && strings.Contains(r.header.Get("RateLimit"), `"load"`):
					served.Add(1)
				case r.err == nil && r.status == 503:
					refused.Add(1)
					lastBad.Store(r.end.UnixNano())
				default:
					unexpected.CompareAndSwap(nil, fmt.Sprintf("%d %v RateLimit=%q", r.status, r.err, r.header.Get("RateLimit")))
					lastBad.Store(r.end.UnixNano())
				}
			}
		})
	}
	defer func() { close(stop); loaders.Wait() }()
	for start := time.Now(); served.Load() < 200; time.Sleep(10 * time.Millisecond) {
		if time.Since(start) > 10*time.Second {
			t.Fatalf("the load did not get going: %d served", served.Load())
		}
	}
	if refused.Load() != 0 || unexpected.Load() != nil {
		t.Fatalf("before the kill: %d served, %d refused, unexpected %v", served.Load(), refused.Load(), unexpected.Load())
	}

	master := cl.Masters()[0]
	from := d.logs.len()
	master.Kill()
	killed := time.Now()
	for !cl.OK() {
		if time.Since(killed) > 20*time.Second {
			t.Fatal("the Cluster did not fail over within 20s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	ok := time.Now()
	t.Logf("the Cluster failed over in %v; %d served and %d refused meanwhile", ok.Sub(killed), served.Load(), refused.Load())

	// Back on Redis: a second and a half with every request decided by
	// Redis, within 10 s of the Cluster's failover.
	const quiet = 1500 * time.Millisecond
	for {
		if time.Since(time.Unix(0, max(lastBad.Load(), ok.UnixNano()))) >= quiet {
			break
		}
		if time.Since(ok) > 10*time.Second+quiet {
			t.Fatalf("requests still not decided by Redis 10s after the Cluster failed over (last at %v after it): %d served, %d refused",
				time.Unix(0, lastBad.Load()).Sub(ok), served.Load(), refused.Load())
		}
		time.Sleep(50 * time.Millisecond)
	}
	back := time.Unix(0, lastBad.Load()).Sub(ok)
	t.Logf("the last request not decided by Redis ended %v after the Cluster failed over; %d served, %d refused", back, served.Load(), refused.Load())
	if back > 10*time.Second {
		t.Errorf("decisions back on Redis %v after the Cluster failed over, want within 10s", back)
	}
	if refused.Load() == 0 {
		t.Error("no request was refused while a master was dead: the test saw no outage")
	}
	if u := unexpected.Load(); u != nil {
		t.Errorf("an answer neither decided by Redis nor refused by on_unavailable: %v", u)
	}
	var st struct {
		Redis struct {
			Target  map[string]any `json:"target"`
			Breaker map[string]any `json:"breaker"`
		} `json:"redis"`
	}
	r := get(newClient(t, nil, false), "http://"+d.admin+"/status")
	if err := json.Unmarshal(r.body, &st); err != nil || st.Redis.Breaker["state"] != "closed" || st.Redis.Target["cluster"] == nil {
		t.Errorf("/status after the failover: %v %s", err, r.body)
	}
	for _, l := range d.logs.snapshot()[from:] {
		if strings.HasPrefix(l.msg(), "redis breaker") {
			t.Logf("%s %s pid=%s err=%q", l.get("time"), l.msg(), l.get("pid"), l.get("err"))
		}
	}
}
