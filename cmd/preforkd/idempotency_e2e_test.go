package main

// End-to-end tests of idempotent replay against the built daemon (the
// harness of harness_test.go): preforkd with 4 workers in front of an
// upstream that this test runs and that counts its executions.

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

func TestIdempotencyE2E(t *testing.T) {
	t.Run("ParallelDuplicatesRunOnce", parallel(idemTestParallel))
	t.Run("Mismatch", parallel(idemTestMismatch))
	t.Run("OtherHost", parallel(idemTestOtherHost))
	t.Run("ServerErrorThenCreated", parallel(idemTestServerError))
	t.Run("WorkerKilledMidRequest", parallel(idemTestWorkerKilled))
	t.Run("TableFull", parallel(idemTestTableFull))
	t.Run("AddressCap", parallel(idemTestAddressCap))
}

// (1) 20 identical keyed POSTs at once, spread over 4 workers: the upstream
// runs once and all 20 clients get the same bytes.
func idemTestParallel(t *testing.T) {
	up := idemStartUpstream(t, func(n int64, w http.ResponseWriter, r *http.Request) {
		time.Sleep(300 * time.Millisecond) // the duplicates arrive while it runs
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", "/orders/"+strconv.FormatInt(n, 10))
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"execution":%d,"at":%d}`, n, time.Now().UnixNano())
	})
	d := startDaemon(t, daemonOptions{config: idemConfig(up, 64)})
	c := newClient(t, nil, false)

	answers := make([]result, 20)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range answers {
		wg.Go(func() {
			<-start
			answers[i] = idemPost(c, d.url("/orders"), `"order-1"`, `{"item":42}`)
		})
	}
	close(start)
	wg.Wait()
	originals := 0
	for i, a := range answers {
		if a.err != nil || a.status != http.StatusCreated || !bytes.Equal(a.body, answers[0].body) {
			t.Fatalf("answer %d: %v %d %q; answer 0: %q", i, a.err, a.status, a.body, answers[0].body)
		}
		if a.header.Get("Idempotent-Replayed") != "true" {
			originals++
		}
	}
	if n := up.executions.Load(); n != 1 {
		t.Fatalf("the upstream ran %d times", n)
	}
	if originals != 1 {
		t.Fatalf("%d answers without Idempotent-Replayed: true, want 1", originals)
	}
}

// (2) The same key with another body: 422 problem+json, the upstream does
// not run, and the original still replays.
func idemTestMismatch(t *testing.T) {
	up := idemStartUpstream(t, nil)
	d := startDaemon(t, daemonOptions{config: idemConfig(up, 64)})
	c := newClient(t, nil, false)
	first := idemPost(c, d.url("/orders"), "k-mismatch", `{"item":1}`)
	if first.err != nil || first.status != http.StatusCreated {
		t.Fatalf("first: %v %d", first.err, first.status)
	}
	other := idemPost(c, d.url("/orders"), "k-mismatch", `{"item":2}`)
	idemWantProblem(t, other, http.StatusUnprocessableEntity)
	again := idemPost(c, d.url("/orders"), "k-mismatch", `{"item":1}`)
	if again.status != http.StatusCreated || again.header.Get("Idempotent-Replayed") != "true" || !bytes.Equal(again.body, first.body) {
		t.Fatalf("original again: %d %q", again.status, again.body)
	}
	if n := up.executions.Load(); n != 1 {
		t.Fatalf("the upstream ran %d times", n)
	}
}

// (2b) The same key and body sent to another Host (one application that
// serves several tenants by name): another request to the application,
// which must not be answered with the first host's response (its body,
// its Location) while its own never runs. 422, as for another path; the
// original still replays to its own host.
func idemTestOtherHost(t *testing.T) {
	up := idemStartUpstream(t, func(n int64, w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", "https://"+r.Host+"/orders/"+strconv.FormatInt(n, 10))
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"tenant":%q,"execution":%d}`, r.Host, n)
	})
	d := startDaemon(t, daemonOptions{config: idemConfig(up, 64)})
	c := newClient(t, nil, false)
	post := func(host string) result {
		req, err := http.NewRequest(http.MethodPost, d.url("/orders"), strings.NewReader(`{"item":1}`))
		if err != nil {
			t.Fatal(err)
		}
		req.Host = host
		req.Header = http.Header{"Content-Type": {"application/json"}, "Idempotency-Key": {`"order-1"`}}
		resp, err := c.Do(req)
		if err != nil {
			return result{err: err}
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		return result{status: resp.StatusCode, header: resp.Header, body: body, err: err}
	}
	first := post("a.example")
	if first.err != nil || first.status != http.StatusCreated || first.header.Get("Location") != "https://a.example/orders/1" {
		t.Fatalf("first: %v %d %v %q", first.err, first.status, first.header, first.body)
	}
	other := post("b.example")
	idemWantProblem(t, other, http.StatusUnprocessableEntity)
	again := post("a.example")
	if again.status != http.StatusCreated || again.header.Get("Idempotent-Replayed") != "true" || !bytes.Equal(again.body, first.body) {
		t.Fatalf("the original again: %d %q", again.status, again.body)
	}
	if n := up.executions.Load(); n != 1 {
		t.Fatalf("the upstream ran %d times, want once", n)
	}
}

// (4) The upstream answers 500, then 201: the retry runs again and gets
// the 201, which later retries replay with its Location.
func idemTestServerError(t *testing.T) {
	up := idemStartUpstream(t, func(n int64, w http.ResponseWriter, r *http.Request) {
		if n == 1 {
			http.Error(w, "database unavailable", http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", "/orders/42")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"order":42,"execution":%d}`, n)
	})
	d := startDaemon(t, daemonOptions{config: idemConfig(up, 64)})
	c := newClient(t, nil, false)
	if a := idemPost(c, d.url("/orders"), "k-retry", "x"); a.status != http.StatusInternalServerError {
		t.Fatalf("first: %v %d", a.err, a.status)
	}
	second := idemPost(c, d.url("/orders"), "k-retry", "x")
	if second.status != http.StatusCreated || second.header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("retry: %v %d %v", second.err, second.status, second.header)
	}
	for range 3 {
		a := idemPost(c, d.url("/orders"), "k-retry", "x")
		if a.status != http.StatusCreated || a.header.Get("Idempotent-Replayed") != "true" ||
			a.header.Get("Location") != "/orders/42" || !bytes.Equal(a.body, second.body) {
			t.Fatalf("later retry: %v %d %v %q", a.err, a.status, a.header, a.body)
		}
	}
	if n := up.executions.Load(); n != 2 {
		t.Fatalf("the upstream ran %d times, want 2", n)
	}
}

// (6) The worker running a request is killed (-9) while the upstream takes
// 2 s. Its duplicates, waiting in other workers, are not stuck: once the
// supervisor reaps the dead worker its reservation is released, one
// duplicate runs the request again (the upstream's second and last
// execution), and every duplicate gets that response.
func idemTestWorkerKilled(t *testing.T) {
	up := idemStartUpstream(t, func(n int64, w http.ResponseWriter, r *http.Request) {
		time.Sleep(2 * time.Second) // not cut short: the kill must not matter here
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "execution %d", n)
	})
	d := startDaemon(t, daemonOptions{config: idemConfig(up, 64)})
	c := newClient(t, nil, false)

	origDone := make(chan result, 1)
	go func() { origDone <- idemPost(c, d.url("/orders"), "k-crash", "x") }()
	var peer string
	select {
	case peer = <-up.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the original never reached the upstream")
	}
	victim, err := idemPIDOfConn(d.workerPIDs(), peer, up.addr)
	if err != nil {
		t.Fatalf("which worker holds the upstream connection from %s: %v", peer, err)
	}

	const dups = 5
	answers := make([]result, dups)
	var wg sync.WaitGroup
	for i := range answers {
		wg.Go(func() { answers[i] = idemPost(c, d.url("/orders"), "k-crash", "x") })
	}
	time.Sleep(300 * time.Millisecond) // let the duplicates reach their workers and wait
	if err := syscall.Kill(victim, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	wg.Wait()
	if a := <-origDone; a.err == nil && a.status == http.StatusCreated && string(a.body) == "execution 1" {
		t.Fatalf("the original was answered although its worker was killed")
	}
	// Duplicates that reached the killed worker died with it: a client
	// retries those, and gets the same answer as the others.
	for i, a := range answers {
		if a.err != nil {
			answers[i] = idemPost(c, d.url("/orders"), "k-crash", "x")
		}
	}
	for i, a := range answers {
		if a.err != nil || a.status != http.StatusCreated || string(a.body) != "execution 2" {
			t.Fatalf("duplicate %d: %v %d %q (after %v), want 201 \"execution 2\"", i, a.err, a.status, a.body, time.Since(start))
		}
	}
	if n := up.executions.Load(); n != 2 {
		t.Fatalf("the upstream ran %d times, want 2 (the killed one and one rerun)", n)
	}
}

// (7) With every record taken, a new key gets 503 with Retry-After and the
// upstream does not run for it.
func idemTestTableFull(t *testing.T) {
	up := idemStartUpstream(t, nil)
	d := startDaemon(t, daemonOptions{config: idemConfig(up, 8)})
	c := newClient(t, nil, false)
	for i := range 8 {
		if a := idemPost(c, d.url("/orders"), fmt.Sprint("k-full-", i), "x"); a.status != http.StatusCreated {
			t.Fatalf("key %d: %v %d %q", i, a.err, a.status, a.body)
		}
	}
	for i := 8; i < 12; i++ {
		a := idemPost(c, d.url("/orders"), fmt.Sprint("k-full-", i), "x")
		idemWantProblem(t, a, http.StatusServiceUnavailable)
		if s, err := strconv.Atoi(a.header.Get("Retry-After")); err != nil || s < 1 {
			t.Fatalf("Retry-After %q", a.header.Get("Retry-After"))
		}
	}
	if n := up.executions.Load(); n != 8 {
		t.Fatalf("the upstream ran %d times for 8 records", n)
	}
}

// (8) One client address sends POSTs each with a new Idempotency-Key and
// a new Authorization value (the default by, header:Authorization|ip):
// it gets max_records runs, then 429 with Retry-After, also through a
// trusted proxy that names it; other clients (another peer, a client a
// trusted proxy names) still run, and a graceful restart restores the
// records with their address, so that the cap still holds after it.
func idemTestAddressCap(t *testing.T) {
	const maxRecords = 20
	up := idemStartUpstream(t, nil)
	dump := filepath.Join(t.TempDir(), "dump")
	cfg := fmt.Sprintf(`[server]
workers = 4
upstream = "http://%s"
shutdown_timeout = "5s"
trusted_proxies = ["127.0.0.1/32"]

[table]
counters = 1024
responses = 1024
response_bytes = "1MiB"

[persist]
path = %q
key = "v1"

[[idempotency]]
path = "/orders"
methods = ["POST"]
max_records = %d
`, up.addr, dump, maxRecords)
	d := startDaemon(t, daemonOptions{config: cfg})
	attackerIP, victimIP := freshClientIP(), freshClientIP()
	attacker, victim := newClient(t, attackerIP, false), newClient(t, victimIP, false)
	proxy := newClient(t, nil, false) // 127.0.0.1: trusted
	n := 0
	post := func(c *http.Client, xff string) result {
		n++
		h := http.Header{"Content-Type": {"application/json"}, "Idempotency-Key": {fmt.Sprint("k-", n)},
			"Authorization": {fmt.Sprint("Bearer junk-", n)}}
		if xff != "" {
			h.Set("X-Forwarded-For", xff)
		}
		return send(c, http.MethodPost, d.url("/orders"), h, `{"item":1}`)
	}
	wantCapped := func(what string, a result) {
		t.Helper()
		idemWantProblem(t, a, http.StatusTooManyRequests)
		if s, err := strconv.Atoi(a.header.Get("Retry-After")); err != nil || s < 1 {
			t.Fatalf("%s: Retry-After %q", what, a.header.Get("Retry-After"))
		}
	}
	wantRun := func(what string, a result) {
		t.Helper()
		if a.err != nil || a.status != http.StatusCreated || a.header.Get("Idempotent-Replayed") != "" {
			t.Fatalf("%s: %v %d %q, want it to run", what, a.err, a.status, a.body)
		}
	}
	codes := map[int]int{}
	for range 3 * maxRecords {
		a := post(attacker, "")
		codes[a.status]++
		if a.status == http.StatusTooManyRequests {
			wantCapped("the attacker", a)
		}
	}
	if codes[http.StatusCreated] != maxRecords || codes[http.StatusTooManyRequests] != 2*maxRecords {
		t.Fatalf("the attacker's %d requests: %v, want %d × 201 and %d × 429", 3*maxRecords, codes, maxRecords, 2*maxRecords)
	}
	if got := up.executions.Load(); got != maxRecords {
		t.Fatalf("the upstream ran %d times, want %d", got, maxRecords)
	}
	wantCapped("the attacker through the trusted proxy", post(proxy, attackerIP.String()))
	wantRun("another peer", post(victim, ""))
	wantRun("a client the trusted proxy names", post(proxy, "203.0.113.5"))

	d.stop()
	d = startDaemon(t, daemonOptions{config: cfg})
	if !strings.Contains(d.logs.text(), `msg="persist: dump loaded"`) {
		t.Fatalf("dump not loaded:\n%s", d.logs.text())
	}
	wantCapped("the attacker after a restart", post(attacker, ""))
	wantRun("another peer after a restart", post(victim, ""))
	if got := up.executions.Load(); got != maxRecords+3 {
		t.Fatalf("the upstream ran %d times, want %d", got, maxRecords+3)
	}
}

// ---- helpers ----

// idemConfig is a daemon of 4 workers in front of up, with room for
// `records` stored responses and POST /orders keyed.
func idemConfig(up *idemUpstream, records int) string {
	return fmt.Sprintf(`[server]
workers = 4
upstream = "http://%s"
shutdown_timeout = "5s"

[table]
counters = 1024
responses = %d
response_bytes = "1MiB"

[[idempotency]]
path = "/orders"
methods = ["POST"]
wait = "8s"
`, up.addr, records)
}

// idemUpstream is the application behind the daemon; it counts the
// requests that reach it.
type idemUpstream struct {
	addr       string
	executions atomic.Int64
	entered    chan string // the peer address of each request, as it arrives
}

// idemStartUpstream serves answer(n, …) for the n-th request (1-based);
// nil answers 201 with the execution number.
func idemStartUpstream(t *testing.T, answer func(n int64, w http.ResponseWriter, r *http.Request)) *idemUpstream {
	up := &idemUpstream{entered: make(chan string, 64)}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		n := up.executions.Add(1)
		select {
		case up.entered <- r.RemoteAddr:
		default:
		}
		if answer != nil {
			answer(n, w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"execution":%d}`, n)
	}))
	t.Cleanup(srv.Close)
	up.addr = srv.Listener.Addr().String()
	return up
}

// idemPost sends one keyed POST.
func idemPost(c *http.Client, url, key, body string) result {
	return send(c, http.MethodPost, url, http.Header{"Content-Type": {"application/json"}, "Idempotency-Key": {key}}, body)
}

// idemWantProblem checks a complete problem+json answer of status.
func idemWantProblem(t *testing.T, a result, status int) {
	t.Helper()
	if a.err != nil || a.status != status {
		t.Fatalf("got %v %d %q, want %d", a.err, a.status, a.body, status)
	}
	if ct, cc := a.header.Get("Content-Type"), a.header.Get("Cache-Control"); ct != "application/problem+json" || cc != "no-store" {
		t.Fatalf("Content-Type %q, Cache-Control %q", ct, cc)
	}
	var p struct {
		Type, Title, Detail string
		Status              int
	}
	if err := json.Unmarshal(a.body, &p); err != nil || p.Status != status || p.Type == "" || p.Title == "" || p.Detail == "" {
		t.Fatalf("problem %q: %v", a.body, err)
	}
}

// idemPIDOfConn finds which of pids holds the TCP connection from local
// (as the upstream saw its peer) to remote: the socket's inode from
// /proc/net/tcp, then the process with a descriptor on it.
func idemPIDOfConn(pids []int, local, remote string) (int, error) {
	l, err := netip.ParseAddrPort(local)
	if err != nil {
		return 0, err
	}
	r, err := netip.ParseAddrPort(remote)
	if err != nil {
		return 0, err
	}
	table, err := os.ReadFile("/proc/net/tcp")
	if err != nil {
		return 0, err
	}
	inode := ""
	for _, line := range strings.Split(string(table), "\n")[1:] {
		f := strings.Fields(line)
		if len(f) < 10 {
			continue
		}
		if idemProcAddr(f[1]) == l && idemProcAddr(f[2]) == r {
			inode = f[9]
			break
		}
	}
	if inode == "" || inode == "0" {
		return 0, fmt.Errorf("no socket %s → %s in /proc/net/tcp", local, remote)
	}
	want := "socket:[" + inode + "]"
	for _, pid := range pids {
		fds, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
		for _, fd := range fds {
			if target, _ := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name())); target == want {
				return pid, nil
			}
		}
	}
	return 0, fmt.Errorf("no worker among %v holds %s", pids, want)
}

// idemProcAddr parses an IPv4 "0100007F:1F90" of /proc/net/tcp (the
// address in host byte order, little-endian here; the port big-endian).
func idemProcAddr(s string) netip.AddrPort {
	ip, port, ok := strings.Cut(s, ":")
	if !ok || len(ip) != 8 {
		return netip.AddrPort{}
	}
	b, err := hex.DecodeString(ip)
	if err != nil {
		return netip.AddrPort{}
	}
	p, err := strconv.ParseUint(port, 16, 16)
	if err != nil {
		return netip.AddrPort{}
	}
	return netip.AddrPortFrom(netip.AddrFrom4([4]byte{b[3], b[2], b[1], b[0]}), uint16(p))
}

// A block that keeps HEAD: the replay of a HEAD says nothing false about
// the length a GET would have. The original's answer carried the
// application's Content-Length; nothing of its body was stored (a HEAD
// has none), so the replay carries no length rather than "0", on every
// engine (RFC 9110 §8.6).
func TestIdempotencyHeadReplayLengthE2E(t *testing.T) {
	t.Parallel()
	up := idemStartUpstream(t, func(n int64, w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", "15")
		w.WriteHeader(http.StatusOK)
		if r.Method != http.MethodHead {
			fmt.Fprintf(w, `{"execution":%d}`, n)
		}
	})
	for _, engine := range []string{"loop", "fasthttp"} {
		cfg := strings.Replace(idemConfig(up, 64), "[server]\n", "[server]\nengine = \""+engine+"\"\n", 1)
		cfg = strings.Replace(cfg, `methods = ["POST"]`, `methods = ["POST", "HEAD"]`, 1)
		d := startDaemon(t, daemonOptions{config: cfg})
		head := func() (status, length string, replayed bool) {
			conn, err := net.DialTimeout("tcp", d.addr, 5*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			conn.SetDeadline(time.Now().Add(10 * time.Second))
			fmt.Fprintf(conn, "HEAD /orders HTTP/1.1\r\nHost: x\r\nIdempotency-Key: \"head-%s\"\r\nConnection: close\r\n\r\n", engine)
			raw, _ := io.ReadAll(conn)
			lines := strings.Split(string(raw), "\r\n")
			status = lines[0]
			length = "(none)"
			for _, l := range lines[1:] {
				name, value, _ := strings.Cut(l, ":")
				switch strings.ToLower(name) {
				case "content-length":
					length = strings.TrimSpace(value)
				case "idempotent-replayed":
					replayed = true
				}
			}
			return status, length, replayed
		}
		s1, l1, r1 := head()
		s2, l2, r2 := head()
		if !strings.Contains(s1, " 200 ") || r1 || !strings.Contains(s2, " 200 ") || !r2 {
			t.Fatalf("%s: original %q (replayed %v), retry %q (replayed %v)", engine, s1, r1, s2, r2)
		}
		if l2 != "(none)" && l2 != l1 {
			t.Errorf("%s: the replayed HEAD says Content-Length %s; the original said %s", engine, l2, l1)
		}
		d.stop()
	}
}

// The client of a keyed request resets its connection while the upstream
// works on it, before any of the response came: the upstream is not cut
// off, its response is stored, and the client's retry gets it replayed
// instead of running the request a second time, on every engine.
func TestIdempotencyClientResetBeforeHeadE2E(t *testing.T) {
	t.Parallel()
	up := idemStartUpstream(t, func(n int64, w http.ResponseWriter, r *http.Request) {
		time.Sleep(time.Second) // the client resets meanwhile
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"execution":%d}`, n)
	})
	for _, engine := range []string{"loop", "fasthttp"} {
		cfg := strings.Replace(idemConfig(up, 64), "[server]\n", "[server]\nengine = \""+engine+"\"\n", 1)
		d := startDaemon(t, daemonOptions{config: cfg})
		before := up.executions.Load()
		key := `"reset-` + engine + `"`
		conn, err := net.DialTimeout("tcp", d.addr, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		// The Host its retry sends: the fingerprint has it.
		fmt.Fprintf(conn, "POST /orders HTTP/1.1\r\nHost: %s\r\nIdempotency-Key: %s\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}", d.addr, key)
		select {
		case <-up.entered:
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: the request never reached the upstream", engine)
		}
		conn.(*net.TCPConn).SetLinger(0) // a reset, not a FIN
		conn.Close()
		time.Sleep(1500 * time.Millisecond) // the upstream answered meanwhile
		c := newClient(t, nil, false)
		a := idemPost(c, d.url("/orders"), key, `{}`)
		if n := up.executions.Load() - before; n != 1 || a.status != http.StatusCreated || a.header.Get("Idempotent-Replayed") != "true" {
			t.Errorf("%s: the upstream ran %d times; the retry got %v %d %v %q", engine, n, a.err, a.status, a.header, a.body)
		}
		d.stop()
	}
}
