package main

// End-to-end tests of store = "redis" rules: real preforkd process trees
// ("hosts") against a real redis-server started per test.

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/preforkd/preforkd/internal/redistest"
)

// redisConfig is a daemon's file: two workers, [redis] at srv, admin on,
// and rules. Tests of exactness set a timeout that a busy test machine
// cannot miss: a call that times out is a failure, which the rule's
// on_unavailable answers (the point of other tests).
func redisConfig(srv *redistest.Server, redisExtra, rules string) string {
	return fmt.Sprintf(`[server]
workers = 2
[admin]
listen = "ADMIN_ADDR"
[redis]
url = %q
%s
%s`, srv.URL(), redisExtra, rules)
}

// startRedisHosts starts a Redis and two daemons ("hosts") that share it,
// both with rules and a call timeout of 1s.
func startRedisHosts(t *testing.T, rules string) (*redistest.Server, []*daemon) {
	t.Helper()
	srv := redistest.Start(t)
	cfg := redisConfig(srv, `timeout = "1s"`, rules)
	return srv, []*daemon{startDaemon(t, daemonOptions{config: cfg, admin: true}), startDaemon(t, daemonOptions{config: cfg, admin: true})}
}

// Two hosts, one Redis: a limit of 10 a minute on one key lets exactly 10
// of 40 requests through, spread over both hosts and sent at once, in each
// of three runs, for both algorithms; a SCRIPT FLUSH between runs changes
// nothing (NOSCRIPT is handled).
func TestRedisTwoHostsExact(t *testing.T) {
	t.Parallel()
	srv, hosts := startRedisHosts(t, `
[[ratelimit]]
name = "gcra"
path = "/gcra"
limit = 10
window = "1m"
store = "redis"
[[ratelimit]]
name = "fixed"
path = "/fixed"
limit = 10
window = "1m"
algorithm = "fixed-window"
store = "redis"
`)
	for run := 1; run <= 3; run++ {
		for _, path := range []string{"/gcra", "/fixed"} {
			c := newClient(t, freshClientIP(), false)
			out := make([]result, 40)
			var wg sync.WaitGroup
			for i := range out {
				wg.Go(func() { out[i] = get(c, hosts[i%2].url(path)) })
			}
			wg.Wait()
			if st := statuses(out); st[200] != 10 || st[429] != 30 {
				t.Fatalf("run %d %s: %v (transport error: %s), want exactly 10 × 200 and 30 × 429", run, path, st, firstErr(out))
			}
		}
		if err := srv.Client().ScriptFlush(t.Context()).Err(); err != nil {
			t.Fatal(err)
		}
	}
	// Each host says where its counts are.
	for _, d := range hosts {
		var st struct {
			Redis struct {
				Target  map[string]any   `json:"target"`
				Rules   []map[string]any `json:"rules"`
				Breaker map[string]any   `json:"breaker"`
			} `json:"redis"`
		}
		r := get(newClient(t, nil, false), "http://"+d.admin+"/status")
		if err := json.Unmarshal(r.body, &st); err != nil {
			t.Fatalf("/status: %v: %s", err, r.body)
		}
		if st.Redis.Breaker["state"] != "closed" || len(st.Redis.Rules) != 2 || st.Redis.Target["url"] == nil {
			t.Fatalf("/status redis: %s", r.body)
		}
	}
}

// Several Redis rules on one request cost one round trip; a limited
// client sending 1,000 requests within its retry time costs each host at
// most one call.
func TestRedisRoundTripsAndDenyCache(t *testing.T) {
	t.Parallel()
	srv, hosts := startRedisHosts(t, `
[[ratelimit]]
name = "minute"
path = "/api/*"
limit = 5
window = "1m"
store = "redis"
[[ratelimit]]
name = "hour"
path = "/api/*"
limit = 100
window = "1h"
store = "redis"
[[ratelimit]]
name = "everyone"
path = "/api/*"
limit = 1000
window = "1m"
algorithm = "fixed-window"
by = "global"
store = "redis"
`)
	ip := freshClientIP()
	c := newClient(t, ip, true)
	before := srv.Calls("evalsha")
	for i := range 5 {
		if r := get(c, hosts[i%2].url("/api/x")); r.status != 200 {
			t.Fatalf("request %d: %d", i+1, r.status)
		}
	}
	if n := srv.Calls("evalsha") - before; n != 5 {
		t.Fatalf("5 requests of 3 Redis rules made %d EVALSHA, want 5", n)
	}
	// The 6th is refused by "minute": "hour" and "everyone" are not
	// charged for it (another client sees everyone at 1000 - 5 - 1).
	if r := get(c, hosts[0].url("/api/x")); r.status != 429 {
		t.Fatalf("6th: %d", r.status)
	}
	other := get(newClient(t, freshClientIP(), false), hosts[1].url("/api/x"))
	if got := other.header.Get("RateLimit"); !strings.Contains(got, `"everyone";r=994;`) {
		t.Fatalf("another client: RateLimit %q: the refused request was charged to another rule", got)
	}

	before = srv.Calls("evalsha")
	var sent atomic.Int64
	var wg sync.WaitGroup
	for _, d := range hosts {
		// One first refusal per host fills its deny cache (the 6th above
		// did it for host 0), then the flood.
		get(c, d.url("/api/x"))
		for range 4 {
			wg.Go(func() {
				cc := newClient(t, ip, true)
				for sent.Add(1) <= 1000 {
					if r := get(cc, d.url("/api/x")); r.status != 429 || r.header.Get("Retry-After") == "" {
						t.Errorf("flood: %d %v", r.status, r.err)
						return
					}
				}
			})
		}
	}
	wg.Wait()
	if n := srv.Calls("evalsha") - before; n > 1 {
		t.Fatalf("1,000 requests of a limited client within its retry time made %d calls over 2 hosts, want at most 1 per host (the first refusal on host 1)", n)
	}
}

// Redis killed under load: no request waits longer than the timeout plus
// 10ms; on_unavailable open passes, closed answers 503, local enforces the
// local share; the breaker opens and calls drop to the probes. Redis
// restarted: the breaker closes and the limits are exact again.
func TestRedisKilledUnderLoad(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	d := startDaemon(t, daemonOptions{admin: true, config: redisConfig(srv, "breaker_failures = 3\nbreaker_backoff = \"300ms\"\nsuccess_threshold = 2", `
[[ratelimit]]
name = "open"
path = "/open"
limit = 1000
window = "1m"
store = "redis"
on_unavailable = "open"
[[ratelimit]]
name = "closed"
path = "/closed"
limit = 1000
window = "1m"
store = "redis"
on_unavailable = "closed"
[[ratelimit]]
name = "local"
path = "/local"
limit = 10
window = "1m"
store = "redis"
on_unavailable = "local"
local_share = 2
`)})
	const timeout = 25 * time.Millisecond
	stop := make(chan struct{})
	var slowest atomic.Int64
	var mu sync.Mutex
	codes := map[string]map[int]int{"/open": {}, "/closed": {}, "/plain": {}}
	var plainSlowest atomic.Int64
	var wg sync.WaitGroup
	for _, path := range []string{"/open", "/closed", "/plain"} {
		wg.Go(func() {
			c := newClient(t, freshClientIP(), true)
			for {
				select {
				case <-stop:
					return
				default:
				}
				r := get(c, d.url(path))
				sl := &slowest
				if path == "/plain" {
					sl = &plainSlowest
				}
				if el := r.end.Sub(r.start); el > time.Duration(sl.Load()) {
					sl.Store(int64(el))
				}
				mu.Lock()
				codes[path][r.status]++
				mu.Unlock()
			}
		})
	}
	time.Sleep(100 * time.Millisecond)
	from := d.logs.len()
	srv.Kill()
	if _, _, ok := d.logs.waitFor(from, 10*time.Second, msgIs("redis breaker opened: rules answer by on_unavailable")); !ok {
		t.Fatal("the breaker never opened")
	}
	// The local share: 10 ÷ 2 for a fresh client.
	lc := newClient(t, freshClientIP(), false)
	served := 0
	for range 8 {
		if r := get(lc, d.url("/local")); r.status == 200 {
			served++
		}
	}
	time.Sleep(time.Second) // three backoffs: the probes, and the load goes on
	close(stop)
	wg.Wait()
	// A request to a path no rule matches (/plain) never waits on Redis:
	// its slowest is what this machine's scheduling alone costs (a busy
	// test machine can stall a process for tens of milliseconds, once
	// 168 ms where a Redis-rule request met 251 ms), and is not counted
	// as waiting on Redis. Twice it is allowed: two loops request the
	// Redis rules where one requests /plain, and the worst of more
	// requests meets a longer stall. What this guards against waits
	// seconds (a dial or a pool wait on a Redis that is gone).
	el, stall := time.Duration(slowest.Load()), time.Duration(plainSlowest.Load())
	t.Logf("slowest Redis-rule request %v; slowest request without a rule %v", el, stall)
	if el > timeout+10*time.Millisecond+2*stall {
		t.Errorf("the slowest request took %v, want at most the timeout %v + 10ms (+ twice the %v that a request without a rule took)", el, timeout, stall)
	}
	if served != 5 {
		t.Errorf("on_unavailable local: %d of 8 served, want 10 ÷ 2 = 5", served)
	}
	mu.Lock()
	if codes["/open"][200] == 0 || codes["/open"][503] != 0 || codes["/closed"][503] == 0 {
		t.Errorf("with Redis dead: %v", codes)
	}
	requests := codes["/open"][200] + codes["/closed"][503]
	mu.Unlock()
	probes, opened := 0, 0
	for _, l := range d.logs.snapshot()[from:] {
		switch l.msg() {
		case "redis breaker half-open: this worker probes", "redis breaker half-open: this worker takes over a probe past its deadline":
			probes++
		case "redis breaker opened: rules answer by on_unavailable":
			opened++
		}
	}
	// Two workers share one breaker: it opened once, and then only the
	// probes (one per backoff) went to Redis.
	if opened != 1 || probes == 0 || probes > 5 || requests < 20*probes {
		t.Errorf("breaker: opened %d, %d probes for %d requests", opened, probes, requests)
	}

	// Restarted: the breaker closes after success_threshold (2) probes in
	// a row, which requests make, one at a time across the workers.
	from = d.logs.len()
	srv.Restart()
	c := newClient(t, nil, false)
	deadline := time.Now().Add(10 * time.Second)
	var closed logLine
	for {
		get(c, d.url("/closed"))
		_, l, ok := d.logs.waitFor(from, 50*time.Millisecond, msgIs("redis breaker closed: the probes succeeded"))
		if ok {
			closed = l
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the breaker never closed after Redis came back")
		}
	}
	if closed.get("successes") != "2" {
		t.Errorf("the breaker closed after %q probes, want success_threshold = 2", closed.get("successes"))
	}
	// The workers' Redis clients may still hold connections of the Redis
	// that was killed: a call on one fails, and its request is decided by
	// on_unavailable, as it should be. The count below is exact once Redis
	// decides every request: ten in a row on "open" carry its RateLimit
	// item (a request on_unavailable "open" let through has none).
	settle := time.Now().Add(10 * time.Second)
	for inRow := 0; inRow < 10; {
		if strings.Contains(get(c, d.url("/open")).header.Get("RateLimit"), `"open"`) {
			inRow++
		} else {
			inRow = 0
		}
		if time.Now().After(settle) {
			t.Fatal("Redis did not decide ten requests in a row after the breaker closed")
		}
	}
	c = newClient(t, freshClientIP(), false)
	rs := make([]result, 20)
	for i := range rs {
		rs[i] = get(c, d.url("/local"))
	}
	if st := statuses(rs); st[200] != 10 || st[429] != 10 {
		t.Fatalf("after recovery, a fresh client on local: %v, want exactly 10 served", st)
	}
	if r := get(newClient(t, nil, false), "http://"+d.admin+"/status"); !strings.Contains(string(r.body), `"state":"closed"`) {
		t.Fatalf("/status after recovery: %s", r.body)
	}
}

// check prints each rule's store and the [redis] table, without the
// password.
func TestRedisCheckPrintsStore(t *testing.T) {
	t.Parallel()
	path := t.TempDir() + "/preforkd.toml"
	cfg := `[redis]
url = "redis://:hunter2@10.0.0.5:6379/0"
[[ratelimit]]
name = "shared"
path = "/s"
limit = 10
window = "1m"
algorithm = "fixed-window"
store = "redis"
on_unavailable = "closed"
sync = "100ms"
[[ratelimit]]
name = "mine"
path = "/m"
limit = 10
window = "1m"
`
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := runBinary(t, "check", "-config", path)
	if code != 0 {
		t.Fatalf("check: %d %s", code, errOut)
	}
	for _, want := range []string{
		"redis: url=redis://:xxxxx@10.0.0.5:6379/0 ",
		`store=redis on_unavailable=closed local_share=1 sync=100ms`,
		`rule "mine":`, "store=local",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("check output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out+errOut, "hunter2") {
		t.Errorf("check printed the password:\n%s", out)
	}
	// A redis rule without [redis] is a configuration error (exit 2).
	os.WriteFile(path, []byte(cfg[strings.Index(cfg, "[[ratelimit]]"):]), 0o600)
	if code, _, errOut := runBinary(t, "check", "-config", path); code != 2 || !strings.Contains(errOut, `store: is "redis" but [redis]`) {
		t.Errorf("check without [redis]: %d %s", code, errOut)
	}
}

// The admin actions with a Redis rule and a local rule configured: the
// state of a client under either (the Redis rule's read from Redis), its
// reset (the Redis rule's deletes its key in Redis and the host's deny
// cache: the client's next request passes), and DELETE /idempotency all
// work. With Redis down the local rule's actions still do, and the Redis
// rule's answer 503; no answer names anything internal.
func TestRedisAdminActions(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	const token = "0123456789abcdef-redis-admin"
	cfg := fmt.Sprintf(`[server]
workers = 2
[admin]
listen = "ADMIN_ADDR"
token_file = %q
[redis]
url = %q
timeout = "1s"
[[ratelimit]]
name = "shared"
path = "/shared"
limit = 2
window = "1h"
store = "redis"
[[ratelimit]]
name = "local"
path = "/local"
limit = 2
window = "1h"
[[idempotency]]
path = "/orders"
by = "ip"
`, writeToken(t, 0o600, token), srv.URL())
	d := startDaemon(t, daemonOptions{config: cfg, admin: true})
	admin := newClient(t, nil, false)
	action := func(method, path string) result {
		t.Helper()
		r := do(admin, method, "http://"+d.admin+path, http.Header{"Authorization": {"Bearer " + token}})
		for _, internal := range []string{"Options", "core:", "redisstore", "nil"} {
			if strings.Contains(string(r.body), internal) {
				t.Errorf("%s %s: the answer names %q: %s", method, path, internal, r.body)
			}
		}
		return r
	}
	type keyState struct {
		Rule, Element    string
		Stored, Limited  bool
		Limit, Remaining int64
		RetryAfter       int64 `json:"retry_after_seconds"`
	}
	state := func(rule, ip string) keyState {
		t.Helper()
		r := action(http.MethodGet, "/ratelimit/"+rule+"?key="+ip)
		var st keyState
		if err := json.Unmarshal(r.body, &st); r.status != 200 || err != nil {
			t.Fatalf("GET /ratelimit/%s: %d %s %v", rule, r.status, r.body, err)
		}
		return st
	}
	ip := freshClientIP()
	client := newClient(t, ip, false)
	for _, rule := range []string{"shared", "local"} {
		for i := range 3 {
			want := 200
			if i == 2 {
				want = 429
			}
			if r := do(client, http.MethodPost, d.url("/"+rule), nil); r.status != want {
				t.Fatalf("%s: request %d: %d %v, want %d", rule, i+1, r.status, r.err, want)
			}
		}
		if st := state(rule, ip.String()); st.Rule != rule || st.Element != "ip" || !st.Stored || !st.Limited ||
			st.Limit != 2 || st.Remaining != 0 || st.RetryAfter < 1 {
			t.Fatalf("%s: the limited client: %+v", rule, st)
		}
		if st := state(rule, "192.0.2.99"); st.Stored || st.Limited || st.Remaining != 2 {
			t.Fatalf("%s: a client never seen: %+v", rule, st)
		}
	}
	keys, err := srv.Client().Keys(t.Context(), "*").Result()
	if err != nil || len(keys) != 1 {
		t.Fatalf("Redis holds %q (%v), want the shared rule's one key", keys, err)
	}
	for _, rule := range []string{"shared", "local"} {
		r := action(http.MethodPost, "/ratelimit/"+rule+"/reset?key=ip:"+ip.String())
		if r.status != 200 || !strings.Contains(string(r.body), `"reset":true`) || !strings.Contains(string(r.body), `"limited":true`) {
			t.Fatalf("reset %s: %d %s", rule, r.status, r.body)
		}
		if r := do(client, http.MethodPost, d.url("/"+rule), nil); r.status != 200 {
			t.Fatalf("%s: the client after the reset: %d, want 200", rule, r.status)
		}
		if st := state(rule, ip.String()); !st.Stored || st.Limited || st.Remaining != 1 {
			t.Fatalf("%s: the client after the reset and one request: %+v", rule, st)
		}
	}
	if n, err := srv.Client().Exists(t.Context(), keys[0]).Result(); err != nil || n != 1 {
		t.Fatalf("the shared rule's key after the reset and a request: exists %d, %v", n, err)
	}

	order := func() result {
		return do(client, http.MethodPost, d.url("/orders"), http.Header{"Idempotency-Key": {`"order-9"`}})
	}
	if r := order(); r.status != 200 || r.header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("first order: %d %v", r.status, r.header)
	}
	if r := order(); r.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry: not replayed: %d %v", r.status, r.header)
	}
	if r := action(http.MethodDelete, "/idempotency?key=%22order-9%22&by=ip:"+ip.String()); r.status != 200 || !strings.Contains(string(r.body), `"deleted":1`) {
		t.Fatalf("DELETE /idempotency: %d %s", r.status, r.body)
	}
	if r := order(); r.status != 200 || r.header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("retry after the DELETE: %d %v, want it to run again", r.status, r.header)
	}

	srv.Kill()
	for _, path := range []string{"/ratelimit/shared?key=" + ip.String(), "/ratelimit/shared/reset?key=" + ip.String()} {
		method := http.MethodGet
		if strings.HasSuffix(path[:strings.Index(path, "?")], "/reset") {
			method = http.MethodPost
		}
		if r := action(method, path); r.status != http.StatusServiceUnavailable || !strings.Contains(string(r.body), "Redis") {
			t.Errorf("%s %s with Redis down: %d %s, want 503 saying Redis did not answer", method, path, r.status, r.body)
		}
	}
	if st := state("local", ip.String()); !st.Stored {
		t.Errorf("the local rule with Redis down: %+v", st)
	}
	if r := action(http.MethodPost, "/ratelimit/local/reset?key="+ip.String()); r.status != 200 {
		t.Errorf("reset of the local rule with Redis down: %d %s", r.status, r.body)
	}
}

// A host restarted with persistence keeps the region's hash seeds, but
// not its sync-mode counts (nothing of a Redis rule is dumped): what it
// admitted before the restart and added to Redis must count as another
// host's afterwards, or the restarted host admits the whole limit again
// in the same window.
func TestRedisSyncCountsSurviveARestart(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	dump := t.TempDir() + "/dump"
	cfg := redisConfig(srv, `timeout = "1s"`, fmt.Sprintf(`[persist]
path = %q
[[ratelimit]]
name = "sync"
path = "/s"
limit = 5
window = "1h"
algorithm = "fixed-window"
store = "redis"
sync = "20ms"
`, dump))
	c := newClient(t, freshClientIP(), false)
	d := startDaemon(t, daemonOptions{config: cfg, admin: true})
	for i := range 5 {
		if r := get(c, d.url("/s")); r.status != 200 {
			t.Fatalf("request %d: %d %s", i+1, r.status, firstErr([]result{r}))
		}
	}
	d.stop() // each worker's last flush adds its counts to Redis
	if !strings.Contains(d.logs.text(), `msg="dump written"`) {
		t.Fatalf("no dump written:\n%s", d.logs.text())
	}
	d = startDaemon(t, daemonOptions{config: cfg, admin: true})
	defer d.stop()
	if !strings.Contains(d.logs.text(), `msg="persist: dump loaded"`) {
		t.Fatalf("dump not loaded:\n%s", d.logs.text())
	}
	// A host reads a key's count over the other hosts back from Redis
	// once it has counted the key: its first request (one per worker, at
	// worst) has no view yet, as on a host that never saw the key.
	rs := make([]result, 5)
	for i := range rs {
		rs[i] = get(c, d.url("/s"))
		time.Sleep(50 * time.Millisecond)
	}
	if st := statuses(rs); st[200] > 2 {
		t.Fatalf("after a restart, in the window that admitted the limit: %v, want at most the first request of each worker served", st)
	}
}
