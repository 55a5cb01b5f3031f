package main

// End-to-end tests of what an attacker or an accident meets, against
// the built daemon.

import (
	"bytes"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/preforkd/preforkd/shm"
)

func TestHardeningE2E(t *testing.T) {
	t.Run("LongTokensNeverShareAKey", parallel(hardenLongTokens))
	t.Run("LiveRegionTimeBaseAhead", parallel(hardenLiveClockAhead))
	t.Run("RepeatedKeyHeader", parallel(hardenRepeatedKeyHeader))
}

// Two users behind one address, each with a JWT-sized token: neither is
// replayed the other's stored response under the same Idempotency-Key,
// and neither spends the other's rate-limit budget. (Values over 256
// bytes used to be dropped, and the chain fell back to the shared IP.)
func hardenLongTokens(t *testing.T) {
	up := idemStartUpstream(t, func(n int64, w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"execution":%d,"user":%q}`, n, r.Header.Get("Authorization")[:12])
	})
	cfg := idemConfig(up, 64) + `
[[ratelimit]]
name = "per-token"
path = "/limited"
limit = 1
window = "1h"
by = "header:Authorization|ip"
`
	d := startDaemon(t, daemonOptions{config: cfg})
	c := newClient(t, freshClientIP(), false) // both users share this address
	tokA := "Bearer A" + strings.Repeat("a", 1200)
	tokB := "Bearer B" + strings.Repeat("a", 1200)
	post := func(tok string) result {
		return send(c, http.MethodPost, d.url("/orders"), http.Header{
			"Authorization": {tok}, "Content-Type": {"application/json"}, "Idempotency-Key": {`"same-key"`},
		}, `{"item":1}`)
	}
	a, b := post(tokA), post(tokB)
	if a.status != http.StatusCreated || b.status != http.StatusCreated {
		t.Fatalf("A %d %v %q, B %d %v %q", a.status, a.err, a.body, b.status, b.err, b.body)
	}
	if b.header.Get("Idempotent-Replayed") != "" || bytes.Equal(a.body, b.body) {
		t.Fatalf("user B was replayed user A's response: %q", b.body)
	}
	if n := up.executions.Load(); n != 2 {
		t.Fatalf("the upstream ran %d times, want 2", n)
	}
	if again := post(tokA); again.header.Get("Idempotent-Replayed") != "true" || !bytes.Equal(again.body, a.body) {
		t.Fatalf("user A's retry: %d %q, want a replay of %q", again.status, again.body, a.body)
	}

	limited := func(tok string) int {
		return do(c, http.MethodGet, d.url("/limited"), http.Header{"Authorization": {tok}}).status
	}
	if s := limited(tokA); s != http.StatusBadGateway && s != http.StatusOK && s != http.StatusCreated {
		t.Fatalf("A's first request: %d", s)
	}
	if s := limited(tokB); s == http.StatusTooManyRequests {
		t.Fatalf("B's first request was refused: A's long token spent B's budget")
	}
	if s := limited(tokA); s != http.StatusTooManyRequests {
		t.Fatalf("A's second request: %d, want 429", s)
	}
}

// A live region whose time base is 60 s ahead of the clock (a region from
// another time namespace) is rebased: a limited client is told the rule's
// own retry time and served again on time, not 60 s later.
func hardenLiveClockAhead(t *testing.T) {
	live := liveRegionPath(t)
	cfg := fmt.Sprintf(`[server]
workers = 2
shutdown_timeout = "2s"

[table]
counters = 1024

[persist]
live = %q

[[ratelimit]]
name = "slow"
path = "/slow"
limit = 1
window = "3s"
`, live)
	d := startDaemon(t, daemonOptions{config: cfg})
	c := newClient(t, freshClientIP(), false)
	if r := get(c, d.url("/slow")); r.status != http.StatusOK {
		t.Fatalf("first request: %d %v", r.status, r.err)
	}
	if r := get(c, d.url("/slow")); r.status != http.StatusTooManyRequests {
		t.Fatalf("second request: %d %v", r.status, r.err)
	}
	d.kill()

	r, err := shm.OpenFile(live)
	if err != nil {
		t.Fatal(err)
	}
	r.SetNow(r.Now() - 60*time.Second) // the time base is now 60 s in the future
	r.Close()

	d = startDaemon(t, daemonOptions{config: cfg})
	if _, _, ok := d.logs.waitFor(0, time.Second, msgIs("persist: live region clock rebased")); !ok {
		t.Errorf("no log line about the rebase")
	}
	first := get(c, d.url("/slow"))
	if first.status == http.StatusTooManyRequests {
		if ra, _ := strconv.Atoi(first.header.Get("Retry-After")); ra > 3 {
			t.Fatalf("Retry-After %d after the restart, want at most the rule's 3 s", ra)
		}
	}
	deadline := time.Now().Add(4 * time.Second)
	for first.status != http.StatusOK {
		if time.Now().After(deadline) {
			t.Fatalf("still %d 4 s after the restart: the region serves negative time", first.status)
		}
		time.Sleep(250 * time.Millisecond)
		first = get(c, d.url("/slow"))
	}
}

// A key header sent twice (X-Api-Key: r123, X-Api-Key: k1) is refused with
// 400, never charged under one value and forwarded with both; the same for
// an idempotency namespace header.
func hardenRepeatedKeyHeader(t *testing.T) {
	up := idemStartUpstream(t, nil)
	cfg := idemConfig(up, 64) + `
[[ratelimit]]
name = "api"
path = "/api/*"
limit = 100
window = "1m"
by = "header:X-Api-Key|ip"
`
	d := startDaemon(t, daemonOptions{config: cfg})
	c := newClient(t, freshClientIP(), false)
	r := do(c, http.MethodGet, d.url("/api/things"), http.Header{"X-Api-Key": {"r123", "k1"}})
	if r.status != http.StatusBadRequest || r.header.Get("Content-Type") != "application/problem+json" {
		t.Fatalf("repeated X-Api-Key: %d %q %v", r.status, r.body, r.err)
	}
	r = send(c, http.MethodPost, d.url("/orders"), http.Header{
		"Authorization": {"Bearer a", "Bearer b"}, "Idempotency-Key": {"k"},
	}, "x")
	if r.status != http.StatusBadRequest {
		t.Fatalf("repeated Authorization on a keyed request: %d %q %v", r.status, r.body, r.err)
	}
	if n := up.executions.Load(); n != 0 {
		t.Fatalf("the upstream saw %d requests", n)
	}
	if r := do(c, http.MethodGet, d.url("/api/things"), http.Header{"X-Api-Key": {"k1"}}); r.status == http.StatusBadRequest {
		t.Fatalf("one X-Api-Key: %d", r.status)
	}
}
