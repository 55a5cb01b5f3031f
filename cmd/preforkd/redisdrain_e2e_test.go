package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/preforkd/preforkd/internal/redistest"
	"github.com/preforkd/preforkd/internal/tlstest"
)

// A request whose Redis decision is in flight when the drain is cut
// (shutdown_timeout) ends with the cut, on every engine, however long
// redis.timeout lets the call wait: the worker logs the cut, the request
// as 499 (nobody was answered), and exits by itself, its last sync-mode
// flush reaching Redis, rather than waiting for the call and being
// killed with its counts. So too when its client reset the connection
// first: the drain has no connection left, but the decision is still in
// flight.
func TestRedisCallCutAtShutdownTimeout(t *testing.T) {
	for _, e := range []struct {
		name, extra string
		reset       bool
	}{
		{"loop", "", false},
		{"fasthttp", "engine = \"fasthttp\"\n", false},
		{"tls", "tls", false},
		{"loop/reset", "", true},
		{"fasthttp/reset", "engine = \"fasthttp\"\n", true},
		{"tls/reset", "tls", true},
	} {
		t.Run(e.name, parallel(func(t *testing.T) {
			srv := redistest.Start(t)
			access := t.TempDir() + "/access.log"
			cfg := redisCutConfig(strings.TrimPrefix(e.extra, "tls"), access, srv.URL()) + `[[ratelimit]]
name = "synced"
path = "/s"
limit = 1000
window = "1h"
algorithm = "fixed-window"
store = "redis"
sync = "1h"
`
			dial := func(d *daemon) net.Conn {
				c, err := net.DialTimeout("tcp", d.addr, 5*time.Second)
				if err != nil {
					t.Fatal(err)
				}
				return c
			}
			if e.extra == "tls" {
				ca, dir := tlstest.NewCA(t), t.TempDir()
				cert, key := ca.Files(t, dir, "a", "a.example")
				cfg += fmt.Sprintf("\n[tls]\n[[tls.certificate]]\ncert = %q\nkey = %q\n", cert, key)
				dial = func(d *daemon) net.Conn {
					c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", d.addr,
						&tls.Config{ServerName: "a.example", RootCAs: ca.Pool, NextProtos: []string{"http/1.1"}})
					if err != nil {
						t.Fatal(err)
					}
					return c
				}
			}
			d := startDaemon(t, daemonOptions{config: cfg})
			conn := dial(d)
			defer conn.Close()
			conn.SetDeadline(time.Now().Add(30 * time.Second))
			br := bufio.NewReader(conn)
			// The worker reads Redis's clock once (TIME) before its
			// synced counts have a window to be flushed in.
			for deadline := time.Now().Add(10 * time.Second); !strings.Contains(srv.Client().Info(context.Background(), "commandstats").Val(), "cmdstat_time:"); {
				if time.Now().After(deadline) {
					t.Fatal("the worker never read Redis's clock")
				}
				time.Sleep(10 * time.Millisecond)
			}
			// One request of each rule: the exact one is decided in Redis
			// (its key made there), the synced one counted on the host,
			// for the worker's last flush (the interval is an hour).
			for _, path := range []string{"/r", "/s"} {
				fmt.Fprintf(conn, "GET %s HTTP/1.1\r\nHost: h\r\n\r\n", path)
				line, err := br.ReadString('\n')
				if err != nil || !strings.Contains(line, " 200 ") {
					t.Fatalf("GET %s: %q %v", path, line, err)
				}
				if err := drainResponse(br); err != nil {
					t.Fatal(err)
				}
			}
			// A synced count's key names its window (":w…").
			synced := func() []string { return srv.Client().Keys(context.Background(), "*:w*").Val() }
			if k := synced(); len(k) != 0 {
				t.Fatalf("synced keys before the last flush: %q", k)
			}
			thaw := srv.Freeze()
			// The next request's Redis call waits for a Redis that answers
			// nothing, past the drain's timeout.
			fmt.Fprintf(conn, "GET /r?inflight HTTP/1.1\r\nHost: h\r\n\r\n")
			// The worker has read it before the drain begins: else the
			// drain could close the kept connection as idle.
			waitConsumed(t, conn.RemoteAddr().String(), conn.LocalAddr().String())
			if e.reset {
				reset(t, conn)
			}
			d.signal(syscall.SIGTERM)
			if _, _, ok := d.logs.waitFor(0, 15*time.Second, msgIs("worker drain cut at shutdown_timeout")); !ok {
				t.Fatalf("no drain cut logged:\n%s", d.logs.text())
			}
			thaw() // the last flush may reach Redis now
			if b, _ := io.ReadAll(br); len(b) > 0 && !e.reset {
				t.Errorf("the request cut was sent %q, want nothing", b)
			}
			code, ok := d.wait(15 * time.Second)
			d.logs.waitEOF(5 * time.Second)
			text := d.logs.text()
			if !ok || code != 0 {
				t.Errorf("supervisor after TERM: exited=%v code=%d", ok, code)
			}
			for _, bad := range []string{"worker did not drain in time", "signal: killed", "last flush of sync counts failed"} {
				if strings.Contains(text, bad) {
					t.Errorf("the log has %q", bad)
				}
			}
			lines, _ := os.ReadFile(access)
			if !strings.Contains(string(lines), `"GET /r?inflight HTTP/1.1" 499 `) {
				t.Errorf("the request cut is not logged as 499:\n%s", lines)
			}
			if k := synced(); len(k) != 1 {
				t.Errorf("synced keys after the worker's last flush: %q, want its one", k)
			}
			if t.Failed() {
				t.Logf("log:\n%s", text)
			}
		}))
	}
}

// reset closes c with a reset (SO_LINGER 0), as a client that gives up.
func reset(t *testing.T, c net.Conn) {
	t.Helper()
	if tc, ok := c.(*tls.Conn); ok {
		c = tc.NetConn()
	}
	if err := c.(*net.TCPConn).SetLinger(0); err != nil {
		t.Fatal(err)
	}
	c.Close()
}

// drainResponse reads the rest of a response whose status line was read:
// its header, and a Content-Length body.
func drainResponse(br *bufio.Reader) error {
	n := 0
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			return err
		}
		if line == "\r\n" {
			break
		}
		if v, ok := strings.CutPrefix(strings.ToLower(line), "content-length:"); ok {
			fmt.Sscan(strings.TrimSpace(v), &n)
		}
	}
	_, err := io.CopyN(io.Discard, br, int64(n))
	return err
}

// waitConsumed waits until the server's end of the TCP connection from
// remote to local (its address) has nothing left unread in its receive
// queue (/proc/net/tcp's rx_queue): what the client wrote, the worker
// read.
func waitConsumed(t *testing.T, local, remote string) {
	t.Helper()
	l, r := netip.MustParseAddrPort(local), netip.MustParseAddrPort(remote)
	for deadline := time.Now().Add(10 * time.Second); ; {
		table, err := os.ReadFile("/proc/net/tcp")
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(table), "\n")[1:] {
			if f := strings.Fields(line); len(f) > 4 && idemProcAddr(f[1]) == l && idemProcAddr(f[2]) == r &&
				strings.HasSuffix(f[4], ":00000000") {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the server never read what was sent on %s → %s", remote, local)
		}
		time.Sleep(time.Millisecond)
	}
}

// The same over HTTP/2 when the client resets its connection with its
// request's Redis decision in flight: the drain has no connection left,
// the handler still waits on Redis, and the cut reaches it.
func TestRedisCallCutAtShutdownTimeoutH2Reset(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	access := t.TempDir() + "/access.log"
	ca, dir := tlstest.NewCA(t), t.TempDir()
	cert, key := ca.Files(t, dir, "a", "a.example")
	d := startDaemon(t, daemonOptions{config: redisCutConfig("", access, srv.URL()) +
		fmt.Sprintf("[tls]\n[[tls.certificate]]\ncert = %q\nkey = %q\n", cert, key)})
	var c *tls.Conn // the one connection, read once a response came on it
	var dialed atomic.Bool
	client := &http.Client{Transport: &http.Transport{ForceAttemptHTTP2: true,
		DialTLSContext: func(context.Context, string, string) (net.Conn, error) {
			if dialed.Swap(true) {
				return nil, errors.New("no second connection: the request is not sent again")
			}
			tc, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", d.addr,
				&tls.Config{ServerName: "a.example", RootCAs: ca.Pool, NextProtos: []string{"h2"}})
			c = tc
			return tc, err
		}}}
	defer client.CloseIdleConnections()
	get := func(path string) (*http.Response, error) { return client.Get("https://" + d.addr + path) }
	if resp, err := get("/r"); err != nil || resp.StatusCode != 200 || resp.ProtoMajor != 2 {
		t.Fatalf("GET /r: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}
	thaw := srv.Freeze()
	go get("/r?inflight")
	waitConsumed(t, c.RemoteAddr().String(), c.LocalAddr().String())
	time.Sleep(100 * time.Millisecond) // its handler waits on Redis
	reset(t, c)
	d.signal(syscall.SIGTERM)
	if _, _, ok := d.logs.waitFor(0, 10*time.Second, msgIs("worker drain cut at shutdown_timeout")); !ok {
		t.Errorf("no drain cut logged:\n%s", d.logs.text())
	}
	thaw()
	if _, ok := d.wait(15 * time.Second); !ok {
		t.Fatal("the supervisor did not exit")
	}
	lines, _ := os.ReadFile(access)
	if !strings.Contains(string(lines), `"GET /r?inflight HTTP/2.0" 499 `) {
		t.Errorf("the request cut is not logged as 499:\n%s", lines)
	}
}

// redisCutConfig is the Redis cut tests' configuration: one worker whose
// drain is cut at 500 ms, the access log, a Redis whose calls may wait
// 20 s, and an exact Redis rule on /r; server holds more [server] keys.
func redisCutConfig(server, access, url string) string {
	return fmt.Sprintf(`[server]
workers = 1
shutdown_timeout = "500ms"
%s
[log]
access = %q
[redis]
url = %q
timeout = "20s"
[[ratelimit]]
name = "exact"
path = "/r"
limit = 1000
window = "1m"
store = "redis"
`, server, access, url)
}
