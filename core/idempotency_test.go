package core_test

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/preforkd/preforkd/clientip"
	"github.com/preforkd/preforkd/core"
	"github.com/preforkd/preforkd/shm"
)

// idemAnswer is what the core answered one keyed request: 200 when it ran
// (and was completed with 201, stored), else the core's own response.
type idemAnswer struct {
	status  int
	fields  map[string]string
	problem map[string]any
}

// runKeyed sends r through c; a request that passes runs and is completed
// (201, stored for replay).
func runKeyed(t *testing.T, c *core.Core, r *fakeReq) idemAnswer {
	t.Helper()
	ran := false
	got := serve(c, r, func(core.Forward) fakeResp {
		ran = true
		return fakeResp{status: 201, body: []byte("created")}
	})
	if ran {
		return idemAnswer{status: 200}
	}
	a := idemAnswer{status: got.status, fields: map[string]string{}}
	for _, f := range got.header {
		a.fields[f.Name] = string(f.Value)
	}
	if strings.HasPrefix(a.fields["Content-Type"], "application/problem+json") {
		if err := json.Unmarshal(got.body, &a.problem); err != nil {
			t.Fatalf("problem body %q: %v", got.body, err)
		}
	}
	return a
}

// One client address inventing a new Authorization value (the block's
// by) for each request fills only its own share: past max_records it gets
// 429 with Retry-After, whatever the value, and every other address (a
// peer, an IPv6 /64, a client that a trusted proxy names) still runs. Its
// stored responses still replay, and its share comes back once they
// expire.
func TestIdempotencyAddressCap(t *testing.T) {
	region := joinedRegion(t, shm.Options{Counters: 64, Responses: 1024, ResponseBytes: 256 << 10, BlockSize: 256})
	by, err := clientip.ParseBy("header:Authorization|ip")
	if err != nil {
		t.Fatal(err)
	}
	now := time.Hour
	const max = 5
	c, err := core.New(region, core.Options{
		Resolver: clientip.Resolver{Trusted: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}, IPv6Prefix: 64},
		Now:      func() time.Duration { return now },
		Idempotency: core.IdempotencyBlocks(core.Idempotency{Route: mustRoute(t, "/orders", "POST"), TTL: time.Minute, MaxBody: 1 << 10,
			By: by, MaxRecords: max}),
	})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	order := func(peer string, kv ...string) *fakeReq {
		n++
		return newReq("POST", "/orders", peer, append([]string{"Idempotency-Key", fmt.Sprint("k-", n),
			"Authorization", fmt.Sprint("Bearer junk-", n)}, kv...)...)
	}
	flood := func(name, peer string, kv ...string) {
		t.Helper()
		for i := range max {
			if a := runKeyed(t, c, order(peer, kv...)); a.status != 200 {
				t.Fatalf("%s: request %d: %d %v, want it to run", name, i+1, a.status, a.problem)
			}
		}
		for i := range 3 {
			a := runKeyed(t, c, order(peer, kv...))
			if a.status != 429 || a.fields["Retry-After"] != "60" || a.fields["Cache-Control"] != "no-store" ||
				a.problem["type"] != "https://iana.org/assignments/http-problem-types#quota-exceeded" ||
				!strings.Contains(fmt.Sprint(a.problem["detail"]), "your address has 5 requests") {
				t.Fatalf("%s: request %d past the cap: %d %v %v", name, max+i+1, a.status, a.fields, a.problem)
			}
		}
	}
	others := func(name string, peers ...[]string) {
		t.Helper()
		for _, p := range peers {
			if a := runKeyed(t, c, order(p[0], p[1:]...)); a.status != 200 {
				t.Fatalf("%s: another client %v got %d %v", name, p, a.status, a.problem)
			}
		}
	}

	flood("peer", "192.0.2.1")
	others("peer", []string{"192.0.2.2"}, []string{"2001:db8::1"})

	// IPv6 by its /64: another address of the same network shares it.
	flood("ipv6", "2001:db8:0:7::1")
	if a := runKeyed(t, c, order("2001:db8:0:7::ffff")); a.status != 429 {
		t.Fatalf("another address of the capped /64: %d, want 429", a.status)
	}
	others("ipv6", []string{"2001:db8:0:8::1"})

	// Behind a trusted proxy: the client it names, not the proxy.
	flood("proxied", "10.0.0.1", "X-Forwarded-For", "198.51.100.7")
	if a := runKeyed(t, c, order("10.0.0.2", "X-Forwarded-For", "198.51.100.7")); a.status != 429 {
		t.Fatalf("the capped client through another proxy: %d, want 429", a.status)
	}
	others("proxied", []string{"10.0.0.1", "X-Forwarded-For", "198.51.100.8"}, []string{"10.0.0.1"})
	// A client cannot pose as another through an untrusted peer.
	flood("spoofer", "203.0.113.9", "X-Forwarded-For", "198.51.100.77")
	others("spoofer", []string{"10.0.0.1", "X-Forwarded-For", "198.51.100.77"})

	// A capped client's retry of a stored key is replayed, not refused.
	retry := newReq("POST", "/orders", "192.0.2.1", "Idempotency-Key", "k-1", "Authorization", "Bearer junk-1")
	if a := runKeyed(t, c, retry); a.status != 201 || a.fields["Idempotent-Replayed"] != "true" {
		t.Fatalf("a capped client's retry: %d %v, want its stored 201 replayed", a.status, a.fields)
	}
	// Once its records expire, the address has its share again: its next
	// new key takes an expired record, found by a sweep of the address's
	// records (paced at one a millisecond, real time, per account).
	now += time.Minute + time.Second
	deadline := time.Now().Add(time.Second)
	for a := runKeyed(t, c, order("192.0.2.1")); a.status != 200; a = runKeyed(t, c, order("192.0.2.1")) {
		if a.status != 429 || time.Now().After(deadline) {
			t.Fatalf("after its records expired: %d %v", a.status, a.problem)
		}
		time.Sleep(time.Millisecond)
	}
	if err := region.Responses().VerifyAccounts(); err != nil {
		t.Fatal(err)
	}
}

// A replay carries the stored body's Content-Encoding, without which its
// bytes (gzip, say, to a client that sent Accept-Encoding) cannot be read;
// a coding sent in two lines is replayed as one list.
func TestIdempotencyReplayKeepsContentEncoding(t *testing.T) {
	region := joinedRegion(t, shm.Options{Counters: 64, Responses: 64, ResponseBytes: 64 << 10})
	c, err := core.New(region, core.Options{
		Idempotency: core.IdempotencyBlocks(core.Idempotency{Route: mustRoute(t, "/orders", "POST"), TTL: time.Minute, MaxBody: 1 << 10,
			By: clientip.MustParseBy("ip")}),
	})
	if err != nil {
		t.Fatal(err)
	}
	gz := []byte{0x1f, 0x8b, 8, 0, 1, 2, 3}
	app := func(core.Forward) fakeResp {
		return fakeResp{status: 201, body: gz, header: hdr("Content-Type", "application/json", "Content-Encoding", "gzip", "Content-Encoding", "br")}
	}
	for i, want := range []string{"", "true"} {
		got := serve(c, newReq("POST", "/orders", "192.0.2.1", "Idempotency-Key", `"k"`, "Accept-Encoding", "gzip, br"), app)
		fields := map[string]string{}
		for _, f := range got.header {
			fields[f.Name] = string(f.Value)
		}
		if got.status != 201 || string(got.body) != string(gz) || fields["Idempotent-Replayed"] != want {
			t.Fatalf("request %d: %d %q %v", i+1, got.status, got.body, fields)
		}
		if want != "" && (fields["Content-Encoding"] != "gzip, br" || fields["Content-Type"] != "application/json") {
			t.Errorf("replay: %v, want Content-Encoding: gzip, br and the Content-Type", fields)
		}
	}
}

// The fingerprint reads the path the application gets (SPEC "One view of
// a request"): a retry that spells the same path otherwise (a doubled
// slash, a dot segment) is the same request to the application, and is
// answered with the stored response, never a 422 nor a second run.
func TestIdempotencyFingerprintsForwardedPath(t *testing.T) {
	region := joinedRegion(t, shm.Options{Counters: 64, Responses: 64, ResponseBytes: 64 << 10})
	c, err := core.New(region, core.Options{
		Idempotency: core.IdempotencyBlocks(core.Idempotency{Route: mustRoute(t, "/orders", "POST"), TTL: time.Minute, MaxBody: 1 << 10,
			By: clientip.MustParseBy("ip")}),
	})
	if err != nil {
		t.Fatal(err)
	}
	runs := 0
	app := func(f core.Forward) fakeResp {
		runs++
		if f.Path != "/orders" {
			t.Errorf("forwarded %q, want /orders", f.Path)
		}
		return fakeResp{status: 201, body: []byte("order 1")}
	}
	for i, path := range []string{"/orders", "//orders", "/./orders", "/x/../orders"} {
		got := serve(c, newReq("POST", path, "192.0.2.1", "Idempotency-Key", `"k"`), app)
		replayed := ""
		for _, f := range got.header {
			if f.Name == "Idempotent-Replayed" {
				replayed = string(f.Value)
			}
		}
		if want := map[bool]string{false: "", true: "true"}[i > 0]; got.status != 201 || string(got.body) != "order 1" || replayed != want {
			t.Errorf("POST %s: %d %q replayed=%q, want 201 %q replayed=%q", path, got.status, got.body, replayed, "order 1", want)
		}
	}
	if runs != 1 {
		t.Errorf("the application ran %d times, want once", runs)
	}
}

// A reload keeps a block's records while its path (as matched) and by
// stay: a retry that reaches a worker of the new configuration gets the
// stored response, whatever its methods, ttl, wait or max_body became.
// One that changes the path looks the keys up afresh, and so does one
// that changes by for each client whose by key changes: a retry of a
// request made before it runs again (README "Idempotent replay").
func TestIdempotencyRecordsAcrossReload(t *testing.T) {
	base := core.Idempotency{Route: mustRoute(t, "/orders", "POST"), TTL: time.Minute, MaxBody: 1 << 10, By: clientip.MustParseBy("ip")}
	for _, tc := range []struct {
		name   string
		change func(*core.Idempotency)
		kept   bool
	}{
		{"methods", func(d *core.Idempotency) { d.Route = mustRoute(t, "/orders", "POST", "PATCH") }, true},
		{"ttl, wait and max_body", func(d *core.Idempotency) { d.TTL, d.Wait, d.MaxBody = time.Hour, time.Second, 1<<9 }, true},
		{"path", func(d *core.Idempotency) { d.Route = mustRoute(t, "/orders/*", "POST") }, false},
		{"by", func(d *core.Idempotency) { d.By = clientip.MustParseBy("header:X-Client|ip") }, false},
		// A client keyed alike under both (by its address: it sends no
		// X-Other) is the same client: its records stay.
		{"by, the client keyed alike", func(d *core.Idempotency) { d.By = clientip.MustParseBy("header:X-Other|ip") }, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			region := joinedRegion(t, shm.Options{Counters: 64, Responses: 64, ResponseBytes: 64 << 10})
			coreOf := func(d core.Idempotency) *core.Core {
				c, err := core.New(region, core.Options{Idempotency: core.IdempotencyBlocks(d)})
				if err != nil {
					t.Fatal(err)
				}
				return c
			}
			req := func() *fakeReq {
				return newReq("POST", "/orders", "192.0.2.1", "Idempotency-Key", `"k"`, "X-Client", "c1")
			}
			if a := runKeyed(t, coreOf(base), req()); a.status != 200 {
				t.Fatalf("the original: %+v", a)
			}
			next := base
			tc.change(&next)
			a := runKeyed(t, coreOf(next), req())
			if replayed := a.status == 201 && a.fields["Idempotent-Replayed"] == "true"; replayed != tc.kept || !tc.kept && a.status != 200 {
				t.Fatalf("the retry after the reload: %+v, want replayed %v (else run again)", a, tc.kept)
			}
		})
	}
}

// The fingerprint has the Host, case aside: the same key and body sent
// to another host (one application serving its tenants by name) is
// another request, 422, never the first host's response. A record stored
// by a build whose fingerprint had no Host (in the region a binary
// upgrade keeps, or in a dump) still replays to its retry, and only to
// it: a retry with another body is still 422.
func TestIdempotencyFingerprintsHost(t *testing.T) {
	region := joinedRegion(t, shm.Options{Counters: 64, Responses: 64, ResponseBytes: 64 << 10})
	c, err := core.New(region, core.Options{
		Idempotency: core.IdempotencyBlocks(core.Idempotency{Route: mustRoute(t, "/orders", "POST"), TTL: time.Hour, MaxBody: 1 << 10,
			By: clientip.MustParseBy("ip")}),
	})
	if err != nil {
		t.Fatal(err)
	}
	post := func(host, key, body string) *fakeReq {
		r := newReq("POST", "/orders", "192.0.2.1", "Host", host, "Idempotency-Key", key)
		r.body = []byte(body)
		return r
	}
	if a := runKeyed(t, c, post("a.example", "k", "x")); a.status != 200 {
		t.Fatalf("the original: %+v", a)
	}
	if a := runKeyed(t, c, post("b.example", "k", "x")); a.status != 422 {
		t.Errorf("the same key and body to another host: %+v, want 422", a)
	}
	for _, host := range []string{"A.Example", "a.example:8443"} {
		if a := runKeyed(t, c, post(host, "k", "x")); a.status != 201 || a.fields["Idempotent-Replayed"] != "true" {
			t.Errorf("a retry to the same host, as %s: %+v, want the replay", host, a)
		}
	}
	if a := runKeyed(t, c, post("[2001:db8::1]:443", "k6", "x")); a.status != 200 {
		t.Errorf("another key, to an IPv6 host: %+v, want it run", a)
	}
	if a := runKeyed(t, c, post("[2001:db8::2]:443", "k6", "x")); a.status != 422 {
		t.Errorf("that key to another IPv6 host: %+v, want 422", a)
	}
	if a := runKeyed(t, c, post("[2001:db8::1]", "k6", "x")); a.status != 201 || a.fields["Idempotent-Replayed"] != "true" {
		t.Errorf("its retry without the port: %+v, want the replay", a)
	}

	// A record as the earlier build stored it: its key, and the SHA-256 of
	// the method, path, query, Content-Type and body, each after its length.
	var pre []byte
	for _, f := range []string{"POST", "/orders", "", ""} {
		pre = binary.BigEndian.AppendUint64(pre, uint64(len(f)))
		pre = append(pre, f...)
	}
	pre = binary.BigEndian.AppendUint64(pre, 1)
	tab := region.Responses()
	key := region.Counters().KeyOf(xxhash.Sum64String("idempotency\x00/orders"), []byte("ip:192.0.2.1\x00old"))
	var got shm.Response
	out, tk, err := tab.Begin(key, shm.Quota{Max: 16}, shm.Quota{}, sha256.Sum256(append(pre, 'x')), time.Hour, &got)
	if err != nil || out != shm.Reserved {
		t.Fatalf("storing the old record: %v %v", out, err)
	}
	if _, err := tab.Complete(tk, &shm.Response{Status: 201, Body: []byte("old order")}, time.Hour, time.Hour); err != nil {
		t.Fatal(err)
	}
	for _, host := range []string{"a.example", "b.example"} {
		if a := runKeyed(t, c, post(host, "old", "x")); a.status != 201 || a.fields["Idempotent-Replayed"] != "true" {
			t.Errorf("the retry of a request stored without its host (to %s): %+v, want the replay", host, a)
		}
	}
	if a := runKeyed(t, c, post("a.example", "old", "y")); a.status != 422 {
		t.Errorf("the old key with another body: %+v, want 422", a)
	}
}
