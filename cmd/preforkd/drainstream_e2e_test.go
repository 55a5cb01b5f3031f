//go:build linux

package main

import (
	"bufio"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/preforkd/preforkd/internal/tlstest"
	"github.com/preforkd/preforkd/internal/wiretest"
)

// foreverStream is an upstream whose every response is a stream that
// never ends: a chunk each 100 ms, until the client goes.
func foreverStream(t *testing.T) *httptest.Server {
	t.Helper()
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/events" {
			w.Write([]byte("ok"))
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		for i := 0; ; i++ {
			if _, err := fmt.Fprintf(w, "data: %d\n\n", i); err != nil {
				return
			}
			w.(http.Flusher).Flush()
			select {
			case <-r.Context().Done():
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
	}))
	t.Cleanup(up.CloseClientConnections)
	t.Cleanup(up.Close)
	return up
}

// A worker whose drain times out with a response still streaming exits
// cleanly (status 0, no crash trace, not counted as a crash) on every
// engine, told by TERM or recycled past max_requests: the goroutines
// still relaying when the engine gives up never find the shared region
// unmapped under them (a worker leaves its unmapping to the kernel).
func TestDrainTimeoutMidStreamE2E(t *testing.T) {
	for _, e := range []struct{ name, extra string }{
		{"loop", ""},
		{"fasthttp", "engine = \"fasthttp\"\n"},
		{"tls", "tls"},
		{"loop-recycled", "max_requests = 1\n"},
		{"fasthttp-recycled", "engine = \"fasthttp\"\nmax_requests = 1\n"},
	} {
		t.Run(e.name, parallel(func(t *testing.T) {
			up := foreverStream(t)
			server := fmt.Sprintf("upstream = %q\n", up.URL)
			var d *daemon
			var conn net.Conn
			cfg := strings.Replace(noCanary(baseServer(1, server)), `shutdown_timeout = "10s"`, `shutdown_timeout = "1s"`, 1)
			if e.extra == "tls" {
				ca, dir := tlstest.NewCA(t), t.TempDir()
				cert, key := ca.Files(t, dir, "a", "a.example")
				d = startDaemon(t, daemonOptions{config: cfg + fmt.Sprintf("\n[tls]\n[[tls.certificate]]\ncert = %q\nkey = %q\n", cert, key)})
				c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", d.addr,
					&tls.Config{ServerName: "a.example", RootCAs: ca.Pool, NextProtos: []string{"http/1.1"}})
				if err != nil {
					t.Fatal(err)
				}
				conn = c
			} else {
				d = startDaemon(t, daemonOptions{config: strings.Replace(cfg, "[table]", e.extra+"[table]", 1)})
				c, err := net.DialTimeout("tcp", d.addr, 5*time.Second)
				if err != nil {
					t.Fatal(err)
				}
				conn = c
			}
			defer conn.Close()
			conn.SetDeadline(time.Now().Add(30 * time.Second))
			fmt.Fprintf(conn, "GET /events HTTP/1.1\r\nHost: h\r\n\r\n")
			br := bufio.NewReader(conn)
			for {
				line, err := br.ReadString('\n')
				if err != nil {
					t.Fatalf("reading the stream: %v", err)
				}
				if strings.HasPrefix(line, "data: 2") {
					break
				}
			}
			// The drain waits 1 s: the stream outlives it.
			held := d.workerPIDs()[0]
			if strings.Contains(e.extra, "max_requests") {
				first := held
				get(newClient(t, nil, false), d.url("/"))
				waitExited(t, d, 0, first)
			}
			d.signal(syscall.SIGTERM)
			go func() {
				for {
					if _, err := br.ReadString('\n'); err != nil {
						return
					}
				}
			}()
			code, ok := d.wait(25 * time.Second)
			d.logs.waitEOF(5 * time.Second)
			text := d.logs.text()
			if !ok || code != 0 {
				t.Errorf("supervisor after TERM: exited=%v code=%d", ok, code)
			}
			for _, bad := range []string{"fatal error", "panic", "goroutine ", "worker crashed", "SIGSEGV"} {
				if strings.Contains(text, bad) {
					t.Errorf("the log has %q", bad)
				}
			}
			for _, l := range d.logs.snapshot() {
				if l.msg() == "worker exited" && l.get("status") != "exit status 0" {
					t.Errorf("worker %s exited with %q", l.get("pid"), l.get("status"))
				}
			}
			checkDrainOutcomes(t, d.logs.snapshot(), held)
			if t.Failed() {
				t.Logf("log:\n%s", text)
			}
		}))
	}
}

// checkDrainOutcomes checks that every worker that drained logged its
// drain's outcome in one line: the one holding the stream (pid held) cut
// after shutdown_timeout with its one connection, any other drained, and
// none with a context's error, which tells the operator nothing.
func checkDrainOutcomes(t *testing.T, lines []logLine, held int) {
	t.Helper()
	outcomes := map[int][]logLine{}
	for _, l := range lines {
		if l.msg() == "worker draining" {
			outcomes[l.int("pid")] = outcomes[l.int("pid")][:0:0]
		}
	}
	for _, l := range lines {
		if m := l.msg(); strings.HasPrefix(m, "worker drain") && m != "worker draining" {
			outcomes[l.int("pid")] = append(outcomes[l.int("pid")], l)
		}
		if strings.Contains(l.get("err"), "context ") {
			t.Errorf("a line with a context's error: %s %q", l.msg(), l.get("err"))
		}
	}
	if _, ok := outcomes[held]; !ok {
		t.Errorf("worker %d did not log that it drains", held)
	}
	for pid, ls := range outcomes {
		if len(ls) != 1 {
			t.Errorf("worker %d logged %d lines on its drain's outcome, want 1", pid, len(ls))
			continue
		}
		l := ls[0]
		switch {
		case pid == held && (l.msg() != "worker drain cut at shutdown_timeout" || l.get("connections") != "1" || l.get("timeout") != "1s"):
			t.Errorf("worker %d holding a stream: %q connections=%q timeout=%q, want the drain cut at shutdown_timeout, 1 connection, 1s",
				pid, l.msg(), l.get("connections"), l.get("timeout"))
		case pid != held && l.msg() != "worker drained":
			t.Errorf("worker %d with nothing open: %q, want \"worker drained\"", pid, l.msg())
		}
	}
}

// tunnelUpstream answers 101 to an upgrade request and echoes the
// tunnel's bytes until the engine closes its side; any other request
// gets 200.
func tunnelUpstream(t *testing.T) string {
	t.Helper()
	return wiretest.StartUpstream(t, func(req *wiretest.Seen, w *bufio.Writer, c net.Conn) {
		if len(req.Field("Upgrade")) == 0 {
			w.WriteString("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
			return
		}
		w.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: echo\r\nConnection: Upgrade\r\n\r\n")
		w.Flush()
		io.Copy(c, c)
		c.Close()
	}).URL()
}

// openTunnel asks tunnelUpstream, through the daemon on conn, for its
// echo, and fails the test unless the answer is 101: what follows on the
// reader returned is the tunnel's.
func openTunnel(t *testing.T, conn net.Conn) *bufio.Reader {
	t.Helper()
	io.WriteString(conn, "GET /ws HTTP/1.1\r\nHost: h\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
	br := bufio.NewReader(conn)
	if resp, err := http.ReadResponse(br, nil); err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade: %v %v", resp, err)
	}
	return br
}

// A drain with a tunnel open (a WebSocket nobody ends) is cut at
// shutdown_timeout on every engine, and its line counts the tunnel among
// the connections it cut: the TLS listeners once dropped an upgraded
// connection from the counts and logged connections=0.
func TestDrainTimeoutWithTunnelE2E(t *testing.T) {
	for _, e := range []string{"loop", "fasthttp", "tls"} {
		t.Run(e, parallel(func(t *testing.T) {
			cfg := strings.Replace(noCanary(baseServer(1, fmt.Sprintf("upstream = %q\n", tunnelUpstream(t)))),
				`shutdown_timeout = "10s"`, `shutdown_timeout = "1s"`, 1)
			var d *daemon
			var conn net.Conn
			var err error
			switch e {
			case "tls":
				ca, dir := tlstest.NewCA(t), t.TempDir()
				cert, key := ca.Files(t, dir, "a", "a.example")
				d = startDaemon(t, daemonOptions{config: cfg + fmt.Sprintf("\n[tls]\n[[tls.certificate]]\ncert = %q\nkey = %q\n", cert, key)})
				conn, err = tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", d.addr,
					&tls.Config{ServerName: "a.example", RootCAs: ca.Pool, NextProtos: []string{"http/1.1"}})
			case "fasthttp":
				d = startDaemon(t, daemonOptions{config: strings.Replace(cfg, "[table]", "engine = \"fasthttp\"\n[table]", 1)})
				conn, err = net.DialTimeout("tcp", d.addr, 5*time.Second)
			default:
				d = startDaemon(t, daemonOptions{config: cfg})
				conn, err = net.DialTimeout("tcp", d.addr, 5*time.Second)
			}
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			conn.SetDeadline(time.Now().Add(30 * time.Second))
			br := openTunnel(t, conn)
			io.WriteString(conn, "ping")
			if _, err := io.ReadFull(br, make([]byte, 4)); err != nil {
				t.Fatalf("through the tunnel: %v", err)
			}
			held := d.workerPIDs()[0]
			d.signal(syscall.SIGTERM)
			go io.Copy(io.Discard, br)
			code, ok := d.wait(25 * time.Second)
			d.logs.waitEOF(5 * time.Second)
			if !ok || code != 0 {
				t.Errorf("supervisor after TERM: exited=%v code=%d", ok, code)
			}
			checkDrainOutcomes(t, d.logs.snapshot(), held)
			if t.Failed() {
				t.Logf("log:\n%s", d.logs.text())
			}
		}))
	}
}

// On a TLS listener an upgraded connection is counted as writing while
// its tunnel is open and leaves the counts when it ends, as on the
// cleartext engines: the /metrics page says so.
func TestTunnelCountedOnTLSE2E(t *testing.T) {
	t.Parallel()
	ca, dir := tlstest.NewCA(t), t.TempDir()
	cert, key := ca.Files(t, dir, "a", "a.example")
	cfg := noCanary(baseServer(1, fmt.Sprintf("upstream = %q\n", tunnelUpstream(t)))) + adminSection +
		fmt.Sprintf("\n[tls]\n[[tls.certificate]]\ncert = %q\nkey = %q\n", cert, key)
	d := startDaemon(t, daemonOptions{config: cfg, admin: true})
	admin := newClient(t, nil, true)
	writing := func(want float64) {
		t.Helper()
		var got float64
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			if got = scrapeMetrics(t, admin, d.admin).samples[`preforkd_connections{state="writing"}`]; got == want {
				return
			}
		}
		t.Fatalf("connections writing: %v, want %v", got, want)
	}
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", d.addr,
		&tls.Config{ServerName: "a.example", RootCAs: ca.Pool, NextProtos: []string{"http/1.1"}})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(20 * time.Second))
	openTunnel(t, conn)
	writing(1)
	conn.Close()
	writing(0)
}
