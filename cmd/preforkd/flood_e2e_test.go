package main

// End-to-end tests of a counters table filled on purpose (README, "A full
// table" and ipv6_prefix), against the built daemon: what a new client
// gets once an attacker's keys hold every slot, how soon those slots are
// taken back, what the metrics count, and an IPv6 client spread over its
// network.

import (
	"fmt"
	"net/http"
	"testing"
	"time"
)

func TestFloodE2E(t *testing.T) {
	t.Run("FullTable", parallel(floodFullTable))
	t.Run("IPv6Network", parallel(floodIPv6Network))
}

// 64 slots, one rule by ip (limit 1 per 4s) behind a trusted proxy: 200
// forwarded addresses fill the table with keys that used their allowance.
// A new client then gets 503 with Retry-After: 1 (on_full closed), counted
// as no_slot and full_closed; once the flood's keys are as fresh as new
// ones (4s on), a new client is counted again.
func floodFullTable(t *testing.T) {
	d, proxy, admin := floodDaemon(t, "", 1, "4s")
	from := func(addr string) result {
		return do(proxy, http.MethodGet, d.url("/x"), http.Header{"X-Forwarded-For": {addr}})
	}
	// A flood slower than the window (a loaded machine) leaves keys as
	// fresh as a new one: it goes again, from new addresses, whose keys
	// are fresh. Never skipped: three slow floods fail.
	var start time.Time
	full := 0
	for round := 0; ; round++ {
		start = time.Now()
		for i := range 200 {
			if r := from(fmt.Sprintf("198.%d.%d.%d", 51+round, i/250, 1+i%250)); r.err != nil {
				t.Fatal(r.err)
			} else if r.status == http.StatusServiceUnavailable {
				full++
			}
		}
		if took := time.Since(start); took <= 3500*time.Millisecond {
			break
		} else if round == 2 {
			t.Fatalf("three floods each took longer than their keys stay used (the last %v)", took)
		}
	}
	r := from("203.0.113.9")
	if r.status != http.StatusServiceUnavailable || r.header.Get("Retry-After") != "1" {
		t.Fatalf("new client of a full table: %d Retry-After %q, want 503 and 1", r.status, r.header.Get("Retry-After"))
	}
	p := scrapeMetrics(t, admin, d.admin)
	if got := p.samples[`preforkd_table_full_total{reason="no_slot"}`]; got < float64(full+1) {
		t.Errorf("preforkd_table_full_total{reason=\"no_slot\"} = %v, want at least %d", got, full+1)
	}
	if got := p.rule("r", "full_closed"); got != float64(full+1) {
		t.Errorf("full_closed = %v, want %d", got, full+1)
	}
	time.Sleep(time.Until(start.Add(4100 * time.Millisecond)))
	for i := range 3 {
		r := from(fmt.Sprintf("203.0.113.%d", 10+i))
		if r.status != http.StatusOK || r.header.Get("RateLimit") == "" {
			t.Fatalf("new client %d once the flood is fresh: %d RateLimit %q, want 200 and an item", i, r.status, r.header.Get("RateLimit"))
		}
		if r := from(fmt.Sprintf("203.0.113.%d", 10+i)); r.status != http.StatusTooManyRequests {
			t.Fatalf("its second request: %d, want 429", r.status)
		}
	}
}

// A client that spreads over its /48 with ipv6_prefix = 48 is one key:
// its second address is refused, and its requests take one slot.
func floodIPv6Network(t *testing.T) {
	d, proxy, admin := floodDaemon(t, "ipv6_prefix = 48\n", 2, "1h")
	seen := map[int]int{}
	for i := range 300 {
		r := do(proxy, http.MethodGet, d.url("/x"), http.Header{"X-Forwarded-For": {fmt.Sprintf("2001:db8:7:%x::%x", i, i+1)}})
		if r.err != nil {
			t.Fatal(r.err)
		}
		seen[r.status]++
	}
	if seen[200] != 2 || seen[429] != 298 {
		t.Fatalf("one /48 over 300 addresses: %v, want 2×200 and 298×429", seen)
	}
	if r := do(proxy, http.MethodGet, d.url("/x"), http.Header{"X-Forwarded-For": {"2001:db8:8::1"}}); r.status != http.StatusOK {
		t.Fatalf("another /48: %d, want 200", r.status)
	}
	if got := scrapeMetrics(t, admin, d.admin).samples["preforkd_table_slots_used"]; got != 2 {
		t.Errorf("preforkd_table_slots_used = %v, want 2", got)
	}
}

// floodDaemon starts two workers behind a trusted proxy (127.0.0.1), with
// server more of [server], a table of 64 counter slots and one rule "r"
// on every path of limit per window, on_full closed; proxy is a client
// through that proxy, admin one of the admin listener.
func floodDaemon(t *testing.T, server string, limit int, window string) (d *daemon, proxy, admin *http.Client) {
	cfg := fmt.Sprintf(`[server]
workers = 2
shutdown_timeout = "5s"
trusted_proxies = ["127.0.0.1/32"]
%s[table]
counters = 64
%s
[[ratelimit]]
name = "r"
path = "/*"
limit = %d
window = %q
on_full = "closed"
`, server, adminSection, limit, window)
	return startDaemon(t, daemonOptions{config: cfg, admin: true}), newClient(t, nil, true), newClient(t, nil, false)
}
