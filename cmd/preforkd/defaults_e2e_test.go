package main

// End-to-end tests of the safer defaults (README "Rate limiting",
// "Idempotent replay", "Persistence"; SPEC §22): the warnings that save a
// site, the periodic dump, the reset an application asks for, the
// duplicate that waits for its original, and windows written as bare
// seconds. Each runs the built binary (harness_test.go).

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/preforkd/preforkd/internal/proctest"
	"github.com/preforkd/preforkd/metrics"
)

// writeConfig writes text to a new file and returns its path.
func writeConfig(t *testing.T, text string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "preforkd.toml")
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// A window written as a bare integer is that many seconds: check prints
// it as a duration, and the running rule counts over it (its policy
// header says w=300), in a rule and in an override alike.
func TestWindowInSeconds(t *testing.T) {
	t.Parallel()
	cfg := baseServer(2, "") + `
[[ratelimit]]
name = "login"
path = "/login"
limit = 2
window = 300

[[ratelimit.override]]
key = "10.9.9.9"
limit = 7
window = 60
`
	code, stdout, stderr := runBinary(t, "check", "-config", writeConfig(t, cfg))
	if code != 0 {
		t.Fatalf("check: exit %d, %s", code, stderr)
	}
	for _, want := range []string{"limit=2 window=5m0s", "limit=7 window=1m0s"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("check does not print %q:\n%s", want, stdout)
		}
	}
	d := startDaemon(t, daemonOptions{config: cfg})
	c := newClient(t, freshClientIP(), false)
	var got []int
	for range 3 {
		r := get(c, d.url("/login"))
		got = append(got, r.status)
		if r.status == http.StatusOK && r.header.Get("RateLimit-Policy") != `"login";q=2;w=300` {
			t.Errorf("RateLimit-Policy %q, want \"login\";q=2;w=300", r.header.Get("RateLimit-Policy"))
		}
	}
	if got[0] != 200 || got[1] != 200 || got[2] != 429 {
		t.Errorf("three requests under 2 per 300 s: %v, want 200 200 429", got)
	}
	// A negative number of seconds is refused at its line.
	bad := strings.Replace(cfg, "window = 300", "window = -5", 1)
	if code, _, stderr := runBinary(t, "check", "-config", writeConfig(t, bad)); code != 2 || !strings.Contains(stderr, "window") {
		t.Errorf("window = -5: exit %d, %q; want 2 naming the window", code, stderr)
	}
}

// countLines counts the lines of d's log whose message contains s.
func countLines(d *daemon, s string) int {
	n := 0
	for _, l := range d.logs.snapshot() {
		if strings.Contains(l.msg(), s) {
			n++
		}
	}
	return n
}

// A rule keyed by ip with no trusted proxy is warned about at start, at
// each reload and by check; a configuration with trusted_proxies, or
// whose rules do not count by address, is not.
func TestTrustedProxyWarning(t *testing.T) {
	t.Parallel()
	const warning = "server.trusted_proxies is empty"
	byIP := baseServer(2, "") + rule("login", "/login", "gcra", 5, "5m") +
		"\n[[ratelimit]]\nname = \"api\"\npath = \"/api/*\"\nlimit = 9\nwindow = \"1m\"\nby = \"header:X-Api-Key|ip\"\n" +
		"\n[[ratelimit]]\nname = \"all\"\npath = \"/all\"\nlimit = 9\nwindow = \"1m\"\nby = \"global\"\n"
	trusted := strings.Replace(byIP, "[server]\n", "[server]\ntrusted_proxies = [\"10.0.0.0/8\"]\n", 1)
	notByIP := baseServer(2, "") + "\n[[ratelimit]]\nname = \"all\"\npath = \"/all\"\nlimit = 9\nwindow = \"1m\"\nby = \"global\"\n" +
		"\n[[ratelimit]]\nname = \"pages\"\npath = \"/p/*\"\nlimit = 9\nwindow = \"1m\"\nby = \"header:X-Key|path\"\n"

	code, _, stderr := runBinary(t, "check", "-config", writeConfig(t, byIP))
	if code != 0 || strings.Count(stderr, "preforkd check: warning: ") != 1 ||
		!strings.Contains(stderr, `rules "login", "api" count clients by their address`) || !strings.Contains(stderr, warning) {
		t.Errorf("check by ip: exit %d, stderr:\n%s\nwant exit 0 and one warning naming login and api (not all)", code, stderr)
	}
	for name, cfg := range map[string]string{"trusted_proxies set": trusted, "no rule by ip": notByIP} {
		if code, _, stderr := runBinary(t, "check", "-config", writeConfig(t, cfg)); code != 0 || strings.Contains(stderr, warning) {
			t.Errorf("check, %s: exit %d, stderr:\n%s\nwant no warning", name, code, stderr)
		}
	}

	d := startDaemon(t, daemonOptions{config: byIP})
	if n := countLines(d, warning); n != 1 {
		t.Errorf("%d warnings at start, want 1", n)
	}
	from := reloadTo(d, byIP)
	waitReloaded(t, d, from, 20*time.Second)
	if n := countLines(d, warning); n != 2 {
		t.Errorf("%d warnings after a reload, want 2 (one at start, one at the reload)", n)
	}
	from = reloadTo(d, trusted)
	waitReloaded(t, d, from, 20*time.Second)
	if n := countLines(d, warning); n != 2 {
		t.Errorf("%d warnings after a reload with trusted_proxies, want still 2", n)
	}
	d.stop()
	d = startDaemon(t, daemonOptions{config: trusted})
	if n := countLines(d, warning); n != 0 {
		t.Errorf("%d warnings at the start of a configuration with trusted_proxies, want 0", n)
	}
}

// Requests that carry X-Forwarded-For or Forwarded from a peer that is
// not a trusted proxy are warned about once per peer, however many of
// them arrive in however many workers; a peer in trusted_proxies, and
// requests without the fields, are not.
func TestUntrustedForwarding(t *testing.T) {
	t.Parallel()
	cfg := baseServer(4, `trusted_proxies = ["127.0.0.1"]`) + rule("login", "/login", "gcra", 1000, "1m")
	d := startDaemon(t, daemonOptions{config: cfg})
	lb, quiet := freshClientIP(), freshClientIP()
	// Two peers whose marks share a gate are each warned about again when
	// the other took it (core/forwarded.go): the second peer is one whose
	// gate is not the first's.
	other := freshClientIP()
	for peerGate(other) == peerGate(lb) {
		other = freshClientIP()
	}
	msg := func(ip net.IP, field string) string {
		return fmt.Sprintf("requests from %s carry %s, but %s is not in trusted_proxies: every client behind it shares one budget", ip, field, ip)
	}
	xff := http.Header{"X-Forwarded-For": {"203.0.113.9"}}
	fwd := http.Header{"Forwarded": {"for=203.0.113.10"}}
	send := func(ip net.IP, h http.Header, n int) {
		c := newClient(t, ip, false) // a connection each: every worker takes some
		for range n {
			if r := do(c, http.MethodGet, d.url("/login"), h); r.status != http.StatusOK {
				t.Fatalf("GET /login from %s: %d %v", ip, r.status, r.err)
			}
		}
	}
	send(lb, xff, 40)
	send(nil, xff, 40)   // 127.0.0.1, trusted
	send(quiet, nil, 40) // no forwarding field
	if _, _, ok := d.logs.waitFor(0, 10*time.Second, func(l logLine) bool { return l.msg() == msg(lb, "X-Forwarded-For") }); !ok {
		t.Fatalf("no warning about %s", lb)
	}
	// The second peer's line may wait for the second the first one took:
	// its requests go on until it comes.
	deadline := time.Now().Add(10 * time.Second)
	for countLines(d, msg(other, "Forwarded")) == 0 && time.Now().Before(deadline) {
		send(other, fwd, 5)
		time.Sleep(100 * time.Millisecond)
	}
	send(lb, xff, 40)
	send(other, fwd, 40)
	time.Sleep(1500 * time.Millisecond) // past the gate's second: a second line would now pass
	send(lb, xff, 20)
	send(other, fwd, 20)
	for _, ip := range []net.IP{lb, other} {
		n := countLines(d, "requests from "+ip.String()+" carry")
		if n != 1 {
			t.Errorf("%d warnings about %s, want exactly 1", n, ip)
		}
	}
	if n := countLines(d, "not in trusted_proxies"); n != 2 {
		t.Errorf("%d warnings in all, want 2 (none about 127.0.0.1, trusted, nor %s, which sends no field)", n, quiet)
	}
}

// check notes, once per rule, that a key a client sends (header:,
// cookie:, query:) is chosen by the client; not for a rule by ip, path
// or global.
func TestClientChosenKeysNote(t *testing.T) {
	t.Parallel()
	cfg := baseServer(2, `trusted_proxies = ["10.0.0.0/8"]`) + `
[[ratelimit]]
name = "api"
path = "/api/*"
limit = 9
window = "1m"
by = "header:X-Api-Key|ip"

[[ratelimit]]
name = "search"
path = "/search"
limit = 9
window = "1m"
by = "cookie:session|query:token|ip"

[[ratelimit]]
name = "login"
path = "/login"
limit = 9
window = "1m"

[[ratelimit]]
name = "pages"
path = "/p/*"
limit = 9
window = "1m"
by = "path"
`
	code, _, stderr := runBinary(t, "check", "-config", writeConfig(t, cfg))
	if code != 0 {
		t.Fatalf("check: exit %d, %s", code, stderr)
	}
	if n := strings.Count(stderr, "preforkd check: note: "); n != 2 {
		t.Errorf("%d notes, want 2 (api, search):\n%s", n, stderr)
	}
	for _, want := range []string{
		`note: rule "api" (by "header:X-Api-Key|ip"): header:X-Api-Key is chosen by the client`,
		`note: rule "search" (by "cookie:session|query:token|ip"): cookie:session, query:token are chosen by the client`,
	} {
		if !strings.Contains(stderr, want) {
			t.Errorf("check does not say %q:\n%s", want, stderr)
		}
	}
	if strings.Contains(stderr, "warning") {
		t.Errorf("check warns:\n%s", stderr)
	}
}

// With [[cache]] blocks and persist.path but no persist.key, start and
// check warn that another build's responses may be served;
// persist.key_file sets the key from a file: the cache a dump keeps is
// served again under the same key, and dropped under another.
func TestPersistKeyFile(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	dump := filepath.Join(dir, "table.dump")
	keyFile := filepath.Join(dir, "app-version")
	cache := "\n[[cache]]\npath = \"/cacheable/*\"\nmax_body = \"16KiB\"\n"
	noKey := baseServer(2, `trusted_proxies = ["10.0.0.0/8"]`) + fmt.Sprintf("\n[persist]\npath = %q\n", dump) + cache
	withFile := strings.Replace(noKey, "\n[persist]\n", fmt.Sprintf("\n[persist]\nkey_file = %q\n", keyFile), 1)
	const warning = "persist.key is empty"

	code, _, stderr := runBinary(t, "check", "-config", writeConfig(t, noKey))
	if code != 0 || !strings.Contains(stderr, "warning: [[cache]] blocks store responses, persist.path is set and persist.key is empty") ||
		!strings.Contains(stderr, "persist.key_file") {
		t.Errorf("check without a key: exit %d, stderr:\n%s", code, stderr)
	}
	d := startDaemon(t, daemonOptions{config: noKey})
	if n := countLines(d, warning); n != 1 {
		t.Errorf("%d warnings at start without a key, want 1", n)
	}
	d.stop()
	os.Remove(dump)

	// key_file: a missing file, and one beside a key, are configuration errors.
	if code, _, stderr := runBinary(t, "check", "-config", writeConfig(t, withFile)); code != 2 || !strings.Contains(stderr, "key_file") {
		t.Errorf("check with a missing key_file: exit %d, %q; want 2 naming key_file", code, stderr)
	}
	both := strings.Replace(withFile, "key_file", "key = \"v1\"\nkey_file", 1)
	if err := os.WriteFile(keyFile, []byte("build-1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if code, _, stderr := runBinary(t, "check", "-config", writeConfig(t, both)); code != 2 || !strings.Contains(stderr, "key_file: and persist.key are both set") {
		t.Errorf("check with key and key_file: exit %d, %q; want 2", code, stderr)
	}
	if code, _, stderr := runBinary(t, "check", "-config", writeConfig(t, withFile)); code != 0 || strings.Contains(stderr, warning) {
		t.Errorf("check with key_file: exit %d, stderr %q; want 0 and no warning", code, stderr)
	}

	// The key from the file stamps the dump: the same key restores the
	// cache, another one drops it.
	c := newClient(t, nil, false)
	fill := func(d *daemon) result { return getAs(c, d.url("/cacheable/a"), "app.example") }
	d = startDaemon(t, daemonOptions{config: withFile})
	if n := countLines(d, warning); n != 0 {
		t.Errorf("%d warnings at start with key_file, want 0", n)
	}
	first := fill(d)
	if first.status != 200 || first.header.Get("X-Cache") != "MISS" {
		t.Fatalf("first GET: %d %q", first.status, first.header.Get("X-Cache"))
	}
	d.stop()
	d = startDaemon(t, daemonOptions{config: withFile})
	if r := fill(d); r.header.Get("X-Cache") != "HIT" || string(r.body) != string(first.body) {
		t.Errorf("after a restart under the same key_file: X-Cache %q, body %q; want the HIT of %q", r.header.Get("X-Cache"), r.body, first.body)
	}
	d.stop()
	if err := os.WriteFile(keyFile, []byte("build-2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	d = startDaemon(t, daemonOptions{config: withFile})
	if n := countLines(d, "persist: cache refused: persist key changed"); n != 1 {
		t.Errorf("%d lines refusing the cache after the key file changed, want 1", n)
	}
	if r := fill(d); r.header.Get("X-Cache") != "MISS" {
		t.Errorf("after a deploy (another key in the file): X-Cache %q, want MISS", r.header.Get("X-Cache"))
	}

	// A reload does not make what is stored the new key's: it is said to
	// take effect at the next start, which drops the cache again.
	if err := os.WriteFile(keyFile, []byte("build-3\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	from := reloadTo(d, withFile)
	waitReloaded(t, d, from, 20*time.Second)
	if n := strings.Count(d.logs.text(), "persist.key (takes effect at the next start)"); n != 1 {
		t.Errorf("%d lines saying the reloaded key waits for a restart, want 1", n)
	}
	if strings.Contains(d.logs.text(), "build-3") {
		t.Error("the log shows the key's value")
	}
	if r := fill(d); r.header.Get("X-Cache") != "HIT" {
		t.Errorf("after the reload: X-Cache %q, want the HIT stored under build-2", r.header.Get("X-Cache"))
	}
	d.stop()
	d = startDaemon(t, daemonOptions{config: withFile})
	if n := countLines(d, "persist: cache refused: persist key changed"); n != 1 {
		t.Errorf("%d lines refusing the cache stored before the reload, want 1", n)
	}
}

// defaultsRoutes are the upstream process's routes of these tests
// (upstreamRole).
//
//   - /slow/...?ms=N answers 201 after N ms, with the number of its
//     executions so far: an original a duplicate waits for.
//   - /trickle?n=N&every=MS sends its head at once, then N bytes, one
//     every MS ms: an original that runs long after its head.
//   - /signin?reset=NAMES answers 200 with Preforkd-Reset: NAMES when
//     NAMES is set (an application that says a login succeeded), and
//     echoes the request's Preforkd-Reset in X-Seen-Reset.
func defaultsRoutes(mux *http.ServeMux) {
	var slow atomic.Int64
	mux.HandleFunc("/slow/", func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		ms, _ := strconv.Atoi(r.URL.Query().Get("ms"))
		time.Sleep(time.Duration(ms) * time.Millisecond)
		n := slow.Add(1)
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "execution %d", n)
	})
	mux.HandleFunc("/trickle", func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		n, _ := strconv.Atoi(r.URL.Query().Get("n"))
		every, _ := strconv.Atoi(r.URL.Query().Get("every"))
		w.Header().Set("Content-Length", strconv.Itoa(n))
		w.WriteHeader(http.StatusCreated)
		w.(http.Flusher).Flush()
		for range n {
			time.Sleep(time.Duration(every) * time.Millisecond)
			w.Write([]byte("."))
			w.(http.Flusher).Flush()
		}
	})
	mux.HandleFunc("/signin", func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		if names := r.URL.Query().Get("reset"); names != "" {
			w.Header().Set("Preforkd-Reset", names)
		}
		w.Header().Set("X-Seen-Reset", r.Header.Get("Preforkd-Reset"))
		fmt.Fprint(w, "signed in")
	})
}

// A duplicate of an [[idempotency]] request with wait = "until-done"
// waits for its original however long it runs within its timeouts, and
// gets its response, where one with wait = "1s" gets 409 after a second;
// and an original that runs past the bound (a body that trickles on)
// still gives the duplicate a 409 at the bound, never a wait without
// end.
func TestIdempotencyUntilDone(t *testing.T) {
	t.Parallel()
	up := startUpstreamProcess(t)
	cfg := baseServer(4, fmt.Sprintf("upstream = %q\nupstream_connect_timeout = \"1s\"\nupstream_timeout = \"2s\"\n", "http://"+up)) + `
[[idempotency]]
path = "/slow/long"
wait = "until-done"
max_body = "16KiB"

[[idempotency]]
path = "/slow/short"
wait = "1s"
max_body = "16KiB"

[[idempotency]]
path = "/trickle"
wait = "until-done"
max_body = "16KiB"
`
	code, stdout, stderr := runBinary(t, "check", "-config", writeConfig(t, cfg))
	if code != 0 || !strings.Contains(stdout, "wait=until-done") || !strings.Contains(stdout, "a duplicate waits for its original up to 3s") {
		t.Fatalf("check: exit %d, stdout:\n%s\nstderr: %s", code, stdout, stderr)
	}
	d := startDaemon(t, daemonOptions{config: cfg})

	// The original runs 1.8 s (within upstream_timeout); the duplicate
	// arrives 300 ms in. With wait = "1s" the same race ends in 409 at
	// 1.3 s; with "until-done" the duplicate gets the original's answer.
	c := newClient(t, nil, false)
	race := func(path string) (o, dup result) {
		orig := make(chan result, 1)
		go func() { orig <- idemPost(c, d.url(path), "order-1", "{}") }()
		time.Sleep(300 * time.Millisecond)
		dup = idemPost(c, d.url(path), "order-1", "{}")
		return <-orig, dup
	}
	o, dup := race("/slow/short?ms=1800")
	if o.status != http.StatusCreated || dup.status != http.StatusConflict {
		t.Errorf(`wait = "1s": original %d %q, duplicate %d %q; want 201 and 409`, o.status, o.body, dup.status, dup.body)
	}
	o, dup = race("/slow/long?ms=1800")
	if o.status != http.StatusCreated || string(o.body) != "execution 2" {
		t.Fatalf("original: %d %q %v", o.status, o.body, o.err)
	}
	if dup.status != http.StatusCreated || string(dup.body) != "execution 2" || dup.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("duplicate: %d %q replayed=%q %v; want the original's 201, replayed", dup.status, dup.body, dup.header.Get("Idempotent-Replayed"), dup.err)
	}
	if waited := dup.end.Sub(dup.start); waited < time.Second {
		t.Errorf("the duplicate was answered after %v: it cannot have waited for the original", waited)
	}
	if n := upstreamSeen(t, up)["POST /slow/long"]; n != 1 {
		t.Errorf("the upstream ran /slow/long %d times, want 1", n)
	}
	orig := make(chan result, 1)

	// The bound: an original whose head came at once and whose body
	// trickles for 4.5 s (a byte every 500 ms, within upstream_timeout)
	// runs past 3 s; the duplicate gets 409 at the bound.
	go func() { orig <- idemPost(c, d.url("/trickle?n=9&every=500"), "order-2", "{}") }()
	time.Sleep(300 * time.Millisecond)
	dup = idemPost(c, d.url("/trickle?n=9&every=500"), "order-2", "{}")
	if dup.status != http.StatusConflict {
		t.Errorf("duplicate of an original past the bound: %d %q, want 409", dup.status, dup.body)
	} else if waited := dup.end.Sub(dup.start); waited < 2500*time.Millisecond || waited > 4500*time.Millisecond {
		t.Errorf("the 409 came after %v, want about 3s (upstream_connect_timeout + upstream_timeout)", waited)
	}
	if o := <-orig; o.status != http.StatusCreated || string(o.body) != "........." {
		t.Errorf("original: %d %q %v", o.status, o.body, o.err)
	}
}

// [server] reset_header: an upstream response that carries it resets the
// rules it names for the request's key (in every worker at once), and
// the field reaches no client; a client's own field is neither forwarded
// nor honoured, and another client's count is not touched.
func TestResetHeader(t *testing.T) {
	t.Parallel()
	up := startUpstreamProcess(t)
	cfg := baseServer(4, fmt.Sprintf("upstream = %q\ntrusted_proxies = [\"10.0.0.0/8\"]\nreset_header = \"Preforkd-Reset\"\n", "http://"+up)) + `
[[ratelimit]]
name = "login"
path = "/signin"
methods = ["POST"]
limit = 3
window = "1h"

[[ratelimit]]
name = "signin-global"
path = "/signin"
limit = 1000
window = "1h"
by = "global"
`
	d := startDaemon(t, daemonOptions{config: cfg})
	alice, bob := freshClientIP(), freshClientIP()
	post := func(ip net.IP, query string, h http.Header) result {
		// A new connection each time: the requests spread over the workers.
		return do(newClient(t, ip, false), http.MethodPost, d.url("/signin"+query), h)
	}
	statusesOf := func(ip net.IP, n int) []int {
		var out []int
		for range n {
			out = append(out, post(ip, "", nil).status)
		}
		return out
	}
	// Two failed logins each, then Alice's third succeeds and the
	// application resets her "login" count.
	statusesOf(alice, 2)
	statusesOf(bob, 2)
	ok := post(alice, "?reset=login,no-such-rule", nil)
	if ok.status != 200 || ok.header.Get("Preforkd-Reset") != "" || len(ok.header.Values("Preforkd-Reset")) != 0 {
		t.Fatalf("the successful login: %d, Preforkd-Reset %q; want 200 and no such field", ok.status, ok.header.Values("Preforkd-Reset"))
	}
	if got := statusesOf(alice, 4); fmt.Sprint(got) != "[200 200 200 429]" {
		t.Errorf("Alice after her reset: %v, want [200 200 200 429] (the whole allowance again)", got)
	}
	if got := statusesOf(bob, 2); fmt.Sprint(got) != "[200 429]" {
		t.Errorf("Bob: %v, want [200 429]: Alice's reset is not his", got)
	}
	// A client's own field: not forwarded, and nothing reset.
	carol := freshClientIP()
	statusesOf(carol, 2)
	r := post(carol, "", http.Header{"Preforkd-Reset": {"login"}})
	if r.status != 200 || r.header.Get("X-Seen-Reset") != "" {
		t.Errorf("Carol's own Preforkd-Reset: %d, the upstream saw %q; want 200 and nothing", r.status, r.header.Get("X-Seen-Reset"))
	}
	if got := statusesOf(carol, 1); fmt.Sprint(got) != "[429]" {
		t.Errorf("Carol after sending the field herself: %v, want [429]", got)
	}
	// A name of no rule is logged, once a second at most.
	if _, _, ok := d.logs.waitFor(0, 5*time.Second, func(l logLine) bool {
		return l.msg() == "reset header names no rule: ignored" && l.get("rule") == "no-such-rule"
	}); !ok {
		t.Errorf("no line about the rule the application named that does not exist")
	}
	// check refuses a field that frames responses.
	bad := strings.Replace(cfg, `reset_header = "Preforkd-Reset"`, `reset_header = "Content-Length"`, 1)
	if code, _, stderr := runBinary(t, "check", "-config", writeConfig(t, bad)); code != 2 || !strings.Contains(stderr, "reset_header") {
		t.Errorf("reset_header = Content-Length: exit %d, %q; want 2 naming reset_header", code, stderr)
	}
}

// persist.interval: the supervisor dumps while it serves, so that a
// kill -9 of the whole process tree (as a power loss would) costs at most
// the requests of the last interval: counts made before the last dump
// are all there after a restart, and those made after it at most lost.
// A crash in the middle of a dump leaves the previous one whole.
func TestPeriodicDump(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	dump := filepath.Join(dir, "table.dump")
	cfg := baseServer(2, "") + fmt.Sprintf("\n[persist]\npath = %q\ninterval = \"1s\"\n\n[log]\nlevel = \"debug\"\n", dump) + `
[[ratelimit]]
name = "login"
path = "/login"
limit = 20
window = "1h"
`
	// check knows the key, and refuses an interval without a path or
	// below a second.
	if code, stdout, stderr := runBinary(t, "check", "-config", writeConfig(t, cfg)); code != 0 || !strings.Contains(stdout, "interval=1s") {
		t.Fatalf("check: exit %d, %s %s", code, stdout, stderr)
	}
	for _, bad := range []string{
		strings.Replace(cfg, `interval = "1s"`, `interval = "100ms"`, 1),
		strings.Replace(cfg, fmt.Sprintf("path = %q\n", dump), "", 1),
	} {
		if code, _, stderr := runBinary(t, "check", "-config", writeConfig(t, bad)); code != 2 || !strings.Contains(stderr, "persist.interval") {
			t.Errorf("check: exit %d, %q; want 2 naming persist.interval", code, stderr)
		}
	}

	d := startDaemon(t, daemonOptions{config: cfg})
	alice := freshClientIP()
	send := func(d *daemon, n int) (allowed int) {
		for range n {
			if r := get(newClient(t, alice, false), d.url("/login")); r.status == http.StatusOK {
				allowed++
			}
		}
		return allowed
	}
	// waitDumps waits for n periodic dumps begun after now, and returns
	// how long the last one took.
	waitDumps := func(d *daemon, n int) (took time.Duration) {
		t.Helper()
		from := d.logs.len()
		for range n {
			i, l, ok := d.logs.waitFor(from, 10*time.Second, msgIs("persist: periodic dump written"))
			if !ok {
				t.Fatalf("no periodic dump within 10s")
			}
			from = i + 1
			took, _ = time.ParseDuration(l.get("took"))
		}
		return took
	}
	if n := send(d, 8); n != 8 {
		t.Fatalf("%d of 8 allowed", n)
	}
	waitDumps(d, 2) // the second one surely began after the requests
	d.kill()        // kill -9 of the supervisor's process group: no dump at exit
	if _, err := os.Stat(dump); err != nil {
		t.Fatalf("no dump after kill -9: %v", err)
	}
	if code, out, _ := runBinary(t, "inspect", dump); code != 0 {
		t.Fatalf("inspect of the periodic dump: exit %d\n%s", code, out)
	}
	d = startDaemon(t, daemonOptions{config: cfg})
	if n := countLines(d, "persist: dump loaded"); n != 1 {
		t.Errorf("%d dump loaded lines after the restart, want 1", n)
	}
	// Counts within the interval: 3 more, then kill -9 at once, before
	// the next dump can be sure to have them; they may or may not be
	// kept, the 8 of before must be.
	if n := send(d, 3); n != 3 {
		t.Fatalf("%d of 3 allowed after the restart", n)
	}
	d.kill()
	d = startDaemon(t, daemonOptions{config: cfg})
	left := send(d, 20)
	if left < 9 || left > 12 {
		t.Errorf("after two kills: %d of 20 allowed, want 9 to 12 (20 - 8 - the 0 to 3 of the last interval)", left)
	}

	// Kills in the middle of dumps of a larger table: the dump found after
	// each is whole.
	big := strings.Replace(cfg, "counters = 1024", "counters = 1048576", 1)
	if err := os.WriteFile(d.cfgPath, []byte(big), 0o600); err != nil {
		t.Fatal(err)
	}
	d.stop()
	for round := range 3 {
		d = startDaemon(t, daemonOptions{config: big})
		// The dumps begin a second apart: kill in the middle of the next.
		took := waitDumps(d, 1)
		time.Sleep(time.Second - took/2)
		d.kill()
		if temps, _ := filepath.Glob(dump + ".tmp-*"); len(temps) > 0 {
			t.Logf("round %d: killed during a dump (%s left behind)", round, filepath.Base(temps[0]))
		}
		if code, out, _ := runBinary(t, "inspect", dump); code != 0 || !strings.Contains(out, "loadable") {
			t.Fatalf("round %d: the dump after a kill during dumps is not loadable: exit %d\n%s", round, code, out)
		}
	}
}

// tune reads memory: the workers' after a warm-up request, their growth
// per request, the upstream's when -upstream-pid names its process; it
// suggests max_rss at about twice the largest peak a worker reached
// (never below 32 MiB), and says why it times requests one at a time.
func TestTuneMemory(t *testing.T) {
	t.Parallel()
	upProc := proctest.Start(t, proctest.Options{Role: "upstream"})
	addr, err := upProc.Line(10 * time.Second)
	if err != nil {
		t.Fatalf("the upstream process did not start: %v", err)
	}
	d := startDaemon(t, daemonOptions{admin: true,
		config: baseServer(2, fmt.Sprintf("upstream = %q", "http://"+addr)) + adminSection})
	code, out, stderr := runBinary(t, "tune", "-admin", d.admin, "-path", "/sleep", "-requests", "20",
		"-upstream-pid", strconv.Itoa(upProc.Pid()))
	if code != 0 {
		t.Fatalf("tune: exit %d, %s", code, stderr)
	}
	t.Logf("tune:\n%s", out)
	for _, want := range []string{
		"\nmemory (server.max_rss)\n",
		"2 workers hold ", "resident on average after a warm-up request", "shared: the region's pages",
		"over the 20 timed requests they grew by ", " per request",
		fmt.Sprintf("the upstream's process (pid %d) holds ", upProc.Pid()),
		"why:      the requests are timed one after the other, without a load generator",
		"memory under load",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("the report lacks %q", want)
		}
	}
	if strings.Contains(out, "memory: the region's size and each worker's are not read") {
		t.Errorf("the report still says memory is not read")
	}
	m := regexp.MustCompile(`advice:   server\.max_rss = "(\d+)MiB"`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no max_rss advice in MiB:\n%s", out)
	}
	advised, _ := strconv.ParseInt(m[1], 10, 64)
	// The peak as this test reads it, after tune: the largest VmHWM of
	// the ready workers.
	var peak int64
	for _, pid := range d.workerPIDs() {
		if !d.alive(pid) {
			continue
		}
		status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
		if err != nil {
			continue
		}
		if hwm := regexp.MustCompile(`VmHWM:\s+(\d+) kB`).FindSubmatch(status); hwm != nil {
			kb, _ := strconv.ParseInt(string(hwm[1]), 10, 64)
			peak = max(peak, kb<<10)
		}
	}
	if peak == 0 {
		t.Fatal("no worker's VmHWM could be read")
	}
	want := max(float64(32), 2*float64(peak)/(1<<20))
	if float64(advised) < want-1.5 || float64(advised) > want+1.5 {
		t.Errorf("max_rss advised %d MiB; the workers' peak is %.1f MiB: want about %.1f MiB (twice, at least 32)", advised, float64(peak)/(1<<20), want)
	}
	if code, _, stderr := runBinary(t, "tune", "-admin", d.admin, "-upstream-pid", "-4"); code != 2 || !strings.Contains(stderr, "-upstream-pid") {
		t.Errorf("tune -upstream-pid -4: exit %d, %q; want 2", code, stderr)
	}
}

// peerGate is the gate whose mark remembers ip's warning
// (core/forwarded.go's peerMark and its choice of gate).
func peerGate(ip net.IP) uint64 {
	a := netip.AddrFrom4([4]byte(ip.To4())).As16()
	return (xxhash.Sum64(a[:]) | 1) % (metrics.PeerGates - 1)
}
