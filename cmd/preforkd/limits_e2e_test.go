package main

// End-to-end tests that one client cannot fill a shared table for
// everyone (README, max_keys and max_records), against the built daemon: a flood of keys on one rule, and one
// client with many idempotency keys.

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestLimitsE2E(t *testing.T) {
	t.Run("FloodLeavesLoginExact", parallel(limitsFlood))
	t.Run("ClientWithManyKeys", parallel(limitsIdempotency))
	t.Run("CheckPrintsCaps", parallel(limitsCheck))
}

// 3,000 random X-Flood keys on one rule of a 2,048-slot table (it would
// fill the table: every new /login client then went unlimited): the flood
// takes its max_keys (512, a quarter of the table) and meets on_full, with
// a log line and no RateLimit item, and a new /login client gets exactly
// its limit. (At the default, half the table, a key's 32-slot probe window
// is full now and then, and the flood's own line is then "table full";
// this test is of the cap, not of the probing.)
func limitsFlood(t *testing.T) {
	cfg := `[server]
workers = 2
shutdown_timeout = "5s"

[table]
counters = 2048

[[ratelimit]]
name = "flood"
path = "/api/*"
limit = 1
window = "1h"
by = "header:X-Flood"
max_keys = 512

[[ratelimit]]
name = "login"
path = "/login"
limit = 3
window = "1h"
`
	d := startDaemon(t, daemonOptions{config: cfg})
	const keys, senders = 3000, 8
	var next, blind, failed atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	deadline := start.Add(60 * time.Second)
	for range senders {
		c := newClient(t, freshClientIP(), true)
		wg.Go(func() {
			for {
				i := next.Add(1)
				if i > keys || time.Now().After(deadline) {
					return
				}
				r := do(c, http.MethodGet, d.url("/api/x"), http.Header{"X-Flood": {fmt.Sprintf("%x", uint64(i)*0x9e3779b97f4a7c15)}})
				switch {
				case r.err != nil || r.status != http.StatusOK:
					failed.Add(1)
				case r.header.Get("RateLimit") == "":
					blind.Add(1) // on_full "open": the rule knows nothing of this key
				}
			}
		})
	}
	wg.Wait()
	took := time.Since(start)
	if next.Load() <= keys {
		t.Fatalf("only %d flood requests in %v", next.Load()-1, took)
	}
	t.Logf("3,000 flood keys in %v: %d without a flood item, %d failed", took, blind.Load(), failed.Load())
	if failed.Load() != 0 || blind.Load() < keys-512 || blind.Load() > keys-490 {
		t.Fatalf("flood: %d failed, %d past max_keys; want 0 and about %d", failed.Load(), blind.Load(), keys-512)
	}
	if _, l, ok := d.logs.waitFor(0, 5*time.Second, func(l logLine) bool {
		return l.msg() == "rule not enforced: its keys hold max_keys counter slots (on_full open)" && l.get("rule") == "flood"
	}); !ok || l.int("max_keys") != 512 {
		t.Fatalf("no log line for the capped rule (%v %q):\n%s", ok, l.raw, d.logs.text())
	}

	for n := range 5 {
		c := newClient(t, freshClientIP(), false)
		for i := range 4 {
			r := get(c, d.url("/login"))
			want := http.StatusOK
			if i == 3 {
				want = http.StatusTooManyRequests
			}
			if r.err != nil || r.status != want {
				t.Fatalf("new login client %d, request %d: %d %v, want %d", n, i+1, r.status, r.err, want)
			}
			if i < 3 && !strings.HasPrefix(r.header.Get("RateLimit"), fmt.Sprintf(`"login";r=%d;`, 2-i)) {
				t.Fatalf("new login client %d, request %d: RateLimit %q", n, i+1, r.header.Get("RateLimit"))
			}
		}
	}
}

// A client that sends 200 keyed requests holds 16 records (1% of a table
// of 128, at least 16) and gets 429 for the rest; it would otherwise take
// every record, and the next client would get 503. Another token from its
// address is capped too (its address holds 16); a client at another
// address runs exactly once (201), and its retry is a replay.
func limitsIdempotency(t *testing.T) {
	up := idemStartUpstream(t, nil)
	d := startDaemon(t, daemonOptions{config: idemConfig(up, 128)})
	c := newClient(t, freshClientIP(), true)
	elsewhere := newClient(t, freshClientIP(), true)
	postFrom := func(c *http.Client, auth, key string) result {
		return send(c, http.MethodPost, d.url("/orders"), http.Header{
			"Authorization": {auth}, "Content-Type": {"application/json"}, "Idempotency-Key": {key},
		}, `{"item":1}`)
	}
	post := func(auth, key string) result {
		return send(c, http.MethodPost, d.url("/orders"), http.Header{
			"Authorization": {auth}, "Content-Type": {"application/json"}, "Idempotency-Key": {key},
		}, `{"item":1}`)
	}
	created, capped := 0, 0
	for i := range 200 {
		r := post("Bearer heavy", fmt.Sprint("heavy-", i))
		switch r.status {
		case http.StatusCreated:
			created++
		case http.StatusTooManyRequests:
			idemWantProblem(t, r, http.StatusTooManyRequests)
			if ra, err := strconv.Atoi(r.header.Get("Retry-After")); err != nil || ra < 1 {
				t.Fatalf("key %d: Retry-After %q", i, r.header.Get("Retry-After"))
			}
			capped++
		default:
			t.Fatalf("heavy client's key %d: %d %v %q", i, r.status, r.err, r.body)
		}
	}
	if created != 16 || capped != 184 || up.executions.Load() != 16 {
		t.Fatalf("heavy client: %d created, %d refused, %d executions; want 16, 184, 16", created, capped, up.executions.Load())
	}
	idemWantProblem(t, post("Bearer light", "order-0"), http.StatusTooManyRequests)
	other := postFrom(elsewhere, "Bearer light", "order-1")
	if other.status != http.StatusCreated || other.header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("the other client: %d %v %q", other.status, other.err, other.body)
	}
	again := postFrom(elsewhere, "Bearer light", "order-1")
	if again.status != http.StatusCreated || again.header.Get("Idempotent-Replayed") != "true" || string(again.body) != string(other.body) {
		t.Fatalf("the other client's retry: %d %q, want a replay of %q", again.status, again.body, other.body)
	}
	if n := up.executions.Load(); n != 17 {
		t.Fatalf("the upstream ran %d times, want 17 (exactly once for the other client)", n)
	}
}

// preforkd check prints the caps in force: the defaults resolved.
func limitsCheck(t *testing.T) {
	path := filepath.Join(t.TempDir(), "preforkd.toml")
	cfg := `[table]
counters = 4096
responses = 10000

[[ratelimit]]
name = "a"
path = "/a"
limit = 1
window = "1s"

[[ratelimit]]
name = "b"
path = "/b"
limit = 1
window = "1s"
max_keys = 100

[[idempotency]]
path = "/orders"
`
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	code, out, stderr := runBinary(t, "check", "-config", path)
	if code != exitOK {
		t.Fatalf("check: exit %d: %s", code, stderr)
	}
	// responses = 10000 makes a table of 16384 records (a power of two),
	// whose 1% is the idempotency block's max_records in force.
	for _, want := range []string{`rule "a": `, ` max_keys=2048`, `rule "b": `, ` max_keys=100`, `responses=16384 `, ` max_records=163`} {
		if !strings.Contains(out, want) {
			t.Errorf("check does not print %q:\n%s", want, out)
		}
	}
}
