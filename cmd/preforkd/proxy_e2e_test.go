package main

// End-to-end tests of the data plane (README, "Proxying"): the built daemon in
// front of a real application process (upstream_e2e_test.go).

import (
	"bufio"
	"crypto/sha1"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/preforkd/preforkd/internal/wiretest"
)

func TestProxyE2E(t *testing.T) {
	t.Parallel()
	up := startUpstreamProcess(t)
	d := startDaemon(t, daemonOptions{config: baseServer(1, fmt.Sprintf("upstream = %q", "http://"+up))})

	t.Run("server-sent events arrive one by one", func(t *testing.T) {
		t.Parallel()
		resp, err := newClient(t, nil, false).Get(d.url("/sse?n=4"))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
			t.Errorf("Content-Type %q", ct)
		}
		br := bufio.NewReader(resp.Body)
		var at []time.Time
		for i := range 4 {
			line, err := br.ReadString('\n')
			if err != nil || line != fmt.Sprintf("data: %d\n", i) {
				t.Fatalf("event %d: %q, %v", i, line, err)
			}
			at = append(at, time.Now())
			br.ReadString('\n')
		}
		// The upstream sends one every 300ms: had the proxy held them
		// back, they would arrive together.
		if spread := at[3].Sub(at[0]); spread < 600*time.Millisecond {
			t.Errorf("4 events 300ms apart arrived within %v of each other: buffered", spread)
		}
	})

	t.Run("a WebSocket is tunnelled", func(t *testing.T) {
		t.Parallel()
		c, br := dialRaw(t, d.addr)
		const key = "dGhlIHNhbXBsZSBub25jZQ=="
		fmt.Fprintf(c, "GET /ws HTTP/1.1\r\nHost: app\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"+
			"Sec-WebSocket-Key: %s\r\nSec-WebSocket-Version: 13\r\n\r\n", key)
		resp, err := http.ReadResponse(br, &http.Request{Method: "GET"})
		if err != nil {
			t.Fatal(err)
		}
		sum := sha1.Sum([]byte(key + websocketGUID))
		if resp.StatusCode != 101 || resp.Header.Get("Sec-Websocket-Accept") != base64.StdEncoding.EncodeToString(sum[:]) {
			t.Fatalf("handshake: %d %v", resp.StatusCode, resp.Header)
		}
		for _, msg := range []string{"hello", strings.Repeat("x", 300)} {
			if err := writeFrame(c, 0x1, []byte(msg), true); err != nil {
				t.Fatal(err)
			}
			op, payload, err := readFrame(br)
			if err != nil || op != 0x1 || string(payload) != "echo: "+msg {
				t.Fatalf("echo of %d bytes: op %d %q %v", len(msg), op, payload, err)
			}
		}
		writeFrame(c, 0x8, nil, true)
		if op, _, err := readFrame(br); err != nil || op != 0x8 {
			t.Errorf("close: op %d, %v", op, err)
		}
	})

	t.Run("ambiguous framing never reaches the upstream", func(t *testing.T) {
		t.Parallel()
		cases := []struct{ name, send string }{
			{"Content-Length and Transfer-Encoding",
				"POST /framing-clte HTTP/1.1\r\nHost: app\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: app\r\n\r\n"},
			{"HTTP/1.0 with Transfer-Encoding",
				"POST /framing-10te HTTP/1.0\r\nHost: app\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: app\r\n\r\n"},
			{"two Content-Lengths",
				"POST /framing-2cl HTTP/1.1\r\nHost: app\r\nContent-Length: 5\r\nContent-Length: 39\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: app\r\n\r\n"},
			{"obs-fold",
				"GET /framing-fold HTTP/1.1\r\nHost: app\r\nX-A: b\r\n c\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: app\r\n\r\n"},
			{"a bad chunk size",
				"POST /framing-chunk HTTP/1.1\r\nHost: app\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: app\r\n\r\n"},
		}
		for _, tc := range cases {
			c, br := dialRaw(t, d.addr)
			io.WriteString(c, tc.send)
			resp, err := http.ReadResponse(br, &http.Request{Method: "POST"})
			if err != nil {
				t.Fatalf("%s: %v", tc.name, err)
			}
			io.Copy(io.Discard, resp.Body)
			if resp.StatusCode != 400 || resp.Header.Get("Content-Type") != "application/problem+json" {
				t.Errorf("%s: %d %s, want 400 problem+json", tc.name, resp.StatusCode, resp.Header.Get("Content-Type"))
			}
			// The connection is closed: the bytes after the request are
			// never read as one.
			if rest, err := io.ReadAll(br); err != nil || len(rest) != 0 {
				t.Errorf("%s: after the 400: %q, %v; want the connection closed", tc.name, rest, err)
			}
			c.Close()
		}
		for k, n := range upstreamSeen(t, up) {
			if strings.Contains(k, "/framing") || strings.Contains(k, "/smuggled") {
				t.Errorf("the upstream saw %d× %s", n, k)
			}
		}
	})
}

// TestProxyUpstreamDownE2E: an upstream that refuses connections is a
// 502 problem+json at once, logged at warn at most once a second with a
// count of the lines suppressed.
func TestProxyUpstreamDownE2E(t *testing.T) {
	t.Parallel()
	d := startDaemon(t, daemonOptions{config: baseServer(1, fmt.Sprintf("upstream = %q", "http://"+freeAddr(t)))})
	c := newClient(t, nil, true)
	for i := range 20 {
		r := get(c, d.url("/x"))
		if r.err != nil || r.status != 502 || r.header.Get("Content-Type") != "application/problem+json" {
			t.Fatalf("request %d: %d %v %v", i, r.status, r.header, r.err)
		}
		if took := r.end.Sub(r.start); took > time.Second {
			t.Errorf("request %d: 502 after %v", i, took)
		}
	}
	unreachable := func(l logLine) bool { return l.msg() == "upstream unreachable" && l.get("level") == "WARN" }
	first, _, ok := d.logs.waitFor(d.readyAt, 5*time.Second, unreachable)
	if !ok {
		t.Fatalf("no warning about the upstream; log:\n%s", d.logs.text())
	}
	time.Sleep(1100 * time.Millisecond)
	get(c, d.url("/x"))
	_, second, ok := d.logs.waitFor(first+1, 5*time.Second, unreachable)
	if !ok {
		t.Fatalf("no second warning a second later; log:\n%s", d.logs.text())
	}
	if n := second.int("suppressed"); n != 19 {
		t.Errorf("the second warning counts %d suppressed lines, want 19: %s", n, second.raw)
	}
}

// dialRaw connects to addr for requests written by hand, with 10s for
// the whole exchange; the connection is closed when the test ends.
func dialRaw(t *testing.T, addr string) (net.Conn, *bufio.Reader) {
	t.Helper()
	return wiretest.Dial(t, addr, 10*time.Second)
}

// TestProxyLargeTransferE2E sends 100 MB each way through one worker and
// measures how much its resident memory grows: at most 16 MiB.
func TestProxyLargeTransferE2E(t *testing.T) {
	t.Parallel()
	const size = 100 << 20
	up := startUpstreamProcess(t)
	d := startDaemon(t, daemonOptions{config: baseServer(1, fmt.Sprintf("upstream = %q", "http://"+up))})
	pids := d.workerPIDs()
	if len(pids) != 1 {
		t.Fatalf("workers %v", pids)
	}
	pid := pids[0]
	c := newClient(t, nil, true)
	if r := get(c, d.url("/warm")); r.status != 200 {
		t.Fatalf("warm-up: %d %v", r.status, r.err)
	}
	before := procMemKiB(t, pid, "VmRSS")

	want := sha256.New()
	io.Copy(want, wiretest.Pattern(size))
	wantSum := fmt.Sprintf("%x", want.Sum(nil))
	for _, chunked := range []bool{false, true} {
		q := ""
		if chunked {
			q = "&chunked=1"
		}
		resp, err := c.Get(d.url("/bytes?n=" + strconv.Itoa(size) + q))
		if err != nil {
			t.Fatal(err)
		}
		h := sha256.New()
		n, err := io.Copy(h, resp.Body)
		resp.Body.Close()
		if err != nil || n != size || fmt.Sprintf("%x", h.Sum(nil)) != wantSum {
			t.Fatalf("download (chunked %v): %d bytes, %v", chunked, n, err)
		}

		body := io.Reader(wiretest.Pattern(size))
		if chunked {
			body = io.MultiReader(body) // no length known: sent chunked
		}
		req, err := http.NewRequest("POST", d.url("/upload"), body)
		if err != nil {
			t.Fatal(err)
		}
		if !chunked {
			req.ContentLength = size
		}
		resp, err = c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		got, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if string(got) != fmt.Sprintf("%d %s", size, wantSum) {
			t.Fatalf("upload (chunked %v): the upstream got %q", chunked, got)
		}
	}
	peak := procMemKiB(t, pid, "VmHWM")
	t.Logf("worker RSS %d KiB before, peak %d KiB after 4×100 MB", before, peak)
	if growth := peak - before; growth > 16<<10 {
		t.Errorf("the worker's resident memory grew by %d KiB moving 100 MB bodies, over 16 MiB", growth)
	}
}

// procMemKiB reads a memory field (VmRSS, VmHWM) of /proc/PID/status.
func procMemKiB(t *testing.T, pid int, field string) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			n, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatalf("no %s in /proc/%d/status", field, pid)
	return 0
}

// TestProxyTimeoutsE2E: the [server] timeouts, shortened, through the
// binary: an upstream that does not answer is a 504 at upstream_timeout;
// a body at 1 byte/s is cut at client_body_timeout with 408 and never
// reaches the application.
func TestProxyTimeoutsE2E(t *testing.T) {
	t.Parallel()
	up := startUpstreamProcess(t)
	silent := silentUpstream(t)
	d := startDaemon(t, daemonOptions{config: baseServer(1, fmt.Sprintf(`upstream = %q
upstream_timeout = "500ms"
client_body_timeout = "500ms"`, "http://"+up))})
	slow := startDaemon(t, daemonOptions{config: baseServer(1, fmt.Sprintf(`upstream = %q
upstream_timeout = "500ms"`, "http://"+silent))})

	t.Run("no response header: 504", func(t *testing.T) {
		t.Parallel()
		r := get(newClient(t, nil, false), slow.url("/x"))
		took := r.end.Sub(r.start)
		if r.err != nil || r.status != 504 || r.header.Get("Content-Type") != "application/problem+json" {
			t.Fatalf("%d %v %v", r.status, r.header, r.err)
		}
		if took < 400*time.Millisecond || took > 3*time.Second {
			t.Errorf("504 after %v, want about 500ms", took)
		}
		if _, _, ok := slow.logs.waitFor(slow.readyAt, 5*time.Second, msgIs("upstream timed out")); !ok {
			t.Errorf("no warning; log:\n%s", slow.logs.text())
		}
	})

	t.Run("a body at 1 byte/s is cut", func(t *testing.T) {
		t.Parallel()
		c, br := dialRaw(t, d.addr)
		start := time.Now()
		io.WriteString(c, "POST /slow-body HTTP/1.1\r\nHost: app\r\nContent-Length: 20\r\n\r\n")
		go wiretest.Trickle(c, strings.Repeat("x", 20), time.Second)
		resp, err := http.ReadResponse(br, &http.Request{Method: "POST"})
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		if resp.StatusCode != 408 {
			t.Errorf("status %d, want 408", resp.StatusCode)
		}
		if took := time.Since(start); took > 3*time.Second {
			t.Errorf("cut after %v, want about 500ms after the first byte", took)
		}
		if seen := upstreamSeen(t, up); seen["POST /slow-body"] != 0 {
			t.Errorf("the application saw the slow request: %v", seen)
		}
	})
}

// silentUpstream accepts connections, reads what comes and never answers.
func silentUpstream(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	wiretest.AcceptEach(ln, func(c net.Conn) { io.Copy(io.Discard, c) })
	return ln.Addr().String()
}

// TestSlowlorisE2E: connections that never finish their header are cut at
// read_header_timeout, a worker never holds more than max_connections of
// them, and a real client is served once they are gone.
func TestSlowlorisE2E(t *testing.T) {
	t.Parallel()
	const n, maxConns = 60, 10
	d := startDaemon(t, daemonOptions{config: baseServer(1, `read_header_timeout = "500ms"
max_connections = 10`)})
	pid := d.workerPIDs()[0]
	// A request served first: the engine serves, with whatever
	// descriptors it holds for that (the event loop polls a duplicate of
	// the listener), before the count starts.
	if r := get(newClient(t, nil, false), d.url("/before")); r.status != 200 {
		t.Fatalf("a first request: %d %v", r.status, r.err)
	}
	base := socketCount(t, pid)
	stopSampling := wiretest.SamplePeak(20*time.Millisecond, func() int64 { return int64(socketCount(t, pid) - base) })
	start := time.Now()
	wiretest.Slowloris(d.addr, n, "GET / HTTP/1.1\r\nHost: app\r\nX-Never: ends", 20*time.Second)
	peak := stopSampling()
	took := time.Since(start)
	if peak > maxConns {
		t.Errorf("the worker held %d client connections at once, max_connections is %d", peak, maxConns)
	}
	// n/max rounds of the header timeout, with room for a loaded machine.
	if limit := time.Duration(n/maxConns) * 500 * time.Millisecond * 3; took > limit {
		t.Errorf("%d slow connections took %v to be cut, want under %v", n, took, limit)
	}
	if r := get(newClient(t, nil, false), d.url("/after")); r.status != 200 {
		t.Errorf("a client after the slow ones: %d %v", r.status, r.err)
	}
}

// socketCount is the number of sockets process pid has open. It fails the
// test with t.Error, not t.Fatal, because the sampler calls it from its own
// goroutine.
func socketCount(t *testing.T, pid int) int {
	t.Helper()
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Error(err)
		return 0
	}
	n := 0
	for _, e := range ents {
		if l, err := os.Readlink(dir + "/" + e.Name()); err == nil && strings.HasPrefix(l, "socket:") {
			n++
		}
	}
	return n
}

// server.engine = "fasthttp" serves with the engine before the event loop
// (a fallback): the application and the demo are served as by the loop,
// with the rules in front. The engines tell apart by their pollers: an
// event loop's worker has one poller a loop beside the Go runtime's.
func TestEngineFallbackE2E(t *testing.T) {
	t.Parallel()
	up := startUpstreamProcess(t)
	for _, tc := range []struct {
		engine string
		loop   bool
	}{{"", true}, {`engine = "loop"`, true}, {`engine = "fasthttp"`, false}} {
		for _, upstream := range []string{"http://" + up, "builtin:demo"} {
			d := startDaemon(t, daemonOptions{config: baseServer(1, fmt.Sprintf("upstream = %q\n%s", upstream, tc.engine)) +
				"[[ratelimit]]\nname = \"one\"\npath = \"/limited\"\nlimit = 1\nwindow = \"1m\"\n"})
			c := newClient(t, nil, false)
			if r := get(c, d.url("/hello")); r.status != 200 {
				t.Errorf("%q, %s: GET /hello: %d %v", tc.engine, upstream, r.status, r.err)
			}
			if a, b := get(c, d.url("/limited")), get(c, d.url("/limited")); a.status != 200 || b.status != 429 {
				t.Errorf("%q, %s: a rule of limit 1: %d then %d", tc.engine, upstream, a.status, b.status)
			}
			if n := pollers(t, d.workerPIDs()[0]); (n > 1) != tc.loop {
				t.Errorf("%q, %s: the worker has %d epoll instances (the runtime's, and a loop's each), want a loop: %v", tc.engine, upstream, n, tc.loop)
			}
			d.stop()
		}
	}
}

// pollers counts the epoll instances process pid has open.
func pollers(t *testing.T, pid int) int {
	t.Helper()
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range ents {
		if l, err := os.Readlink(dir + "/" + e.Name()); err == nil && l == "anon_inode:[eventpoll]" {
			n++
		}
	}
	return n
}
