package nethttp

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/preforkd/preforkd/core"
	"github.com/preforkd/preforkd/engine"
	"github.com/preforkd/preforkd/internal/shmtest"
	"github.com/preforkd/preforkd/internal/wiretest"
	"github.com/preforkd/preforkd/metrics"
	"github.com/preforkd/preforkd/shm"
)

// The drain rule (package engine) on a Server serving a real listener,
// with the clock given: a keep-alive client is told before its connection
// goes, and only connections idle for their grace are closed.
func TestDrainTellsBeforeClosing(t *testing.T) {
	c, err := core.New(shmtest.Private(t, shm.Options{Counters: 64, MaxWorkers: 2}), core.Options{})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := NewServer(ServerOptions{
		Core:    c,
		Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, "ok") }),
	})
	if err != nil {
		t.Fatal(err)
	}
	conns := &srv.conns
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	defer func() {
		srv.srv.Close()
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	}()

	type client struct {
		conn net.Conn
		r    *bufio.Reader
	}
	dial := func() client {
		t.Helper()
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		c.SetDeadline(time.Now().Add(10 * time.Second))
		return client{c, bufio.NewReader(c)}
	}
	get := func(c client) *http.Response {
		t.Helper()
		if _, err := io.WriteString(c.conn, "GET / HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(c.r, nil)
		if err != nil {
			t.Fatalf("request on a kept-alive connection during the drain: %v", err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp
	}
	closed := func(c client) bool {
		c.conn.SetReadDeadline(time.Now().Add(2 * time.Second))
		_, err := c.r.ReadByte()
		return err == io.EOF
	}
	waitState := func(want map[http.ConnState]int) {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); ; {
			got := map[http.ConnState]int{}
			conns.mu.Lock()
			for _, ci := range conns.conns {
				if !ci.closed {
					got[ci.state]++
				}
			}
			conns.mu.Unlock()
			if fmt.Sprint(got) == fmt.Sprint(want) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("connection states %v, want %v", got, want)
			}
			time.Sleep(time.Millisecond)
		}
	}

	busy, quiet, fresh := dial(), dial(), dial()
	if r := get(busy); r.Close {
		t.Fatal("Connection: close before the drain")
	}
	get(quiet)
	waitState(map[http.ConnState]int{http.StateIdle: 2, http.StateNew: 1})

	conns.draining.Store(true)
	now := time.Now()
	if left, _, _ := conns.closeIdle(now, time.Second, 5*time.Second, false); left != 3 {
		t.Fatalf("%d connections left, want all 3 within their grace", left)
	}
	// The busy client sends its next request within the grace: it is
	// answered, told, and only then is its connection closed.
	if r := get(busy); !r.Close {
		t.Fatal("response during the drain without Connection: close")
	}
	if !closed(busy) {
		t.Fatal("the told connection stayed open")
	}
	// Past the idle grace, the quiet one goes; the fresh one (no request
	// yet) keeps its longer grace.
	left, next, _ := conns.closeIdle(now.Add(2*time.Second), time.Second, 5*time.Second, false)
	if !closed(quiet) {
		t.Fatal("a connection idle past the grace was not closed")
	}
	if left == 0 || next.IsZero() || next.Sub(now) > 5*time.Second {
		t.Fatalf("after the idle grace: %d left, next at %v; want the new connection due within 5s", left, next.Sub(now))
	}
	conns.closeIdle(now.Add(6*time.Second), time.Second, 5*time.Second, false)
	if !closed(fresh) {
		t.Fatal("a connection that never sent a request outlived its grace")
	}
	waitState(map[http.ConnState]int{})

	// drain itself returns once nothing is left.
	conns.draining.Store(false)
	late := dial()
	get(late)
	waitState(map[http.ConnState]int{http.StateIdle: 1})
	conns.draining.Store(true)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	began := time.Now()
	conns.drain(ctx, 50*time.Millisecond, 100*time.Millisecond)
	if ctx.Err() != nil || !closed(late) {
		t.Fatalf("drain: %v after %v, want the idle connection closed after its grace", ctx.Err(), time.Since(began))
	}
}

// An upgraded connection outlives net/http's view of it: Shutdown waits
// for its handler until ctx is done, then closes it under the handler,
// and returns only once the handler finished (the response counted), so
// that nothing of the server touches the core or its region afterwards.
func TestShutdownEndsTunnels(t *testing.T) {
	upLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer upLn.Close()
	wiretest.AcceptEach(upLn, func(c net.Conn) {
		br := bufio.NewReader(c)
		if _, err := http.ReadRequest(br); err != nil {
			return
		}
		io.WriteString(c, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
		io.Copy(c, br) // echo until the engine closes its side
	})
	var responded atomic.Int64
	c, err := core.New(shmtest.Private(t, shm.Options{Counters: 64, MaxWorkers: 2}), core.Options{
		OnResponse: func(status int) {
			if status == http.StatusSwitchingProtocols {
				responded.Add(1)
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	up, err := NewUpstream(c, "http://"+upLn.Addr().String(), engine.Upstream{})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := NewServer(ServerOptions{Core: c, Upstream: up})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	conn, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	io.WriteString(conn, "GET /ws HTTP/1.1\r\nHost: a\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade: %v %v", resp, err)
	}
	io.WriteString(conn, "ping\n")
	if line, err := br.ReadString('\n'); err != nil || line != "ping\n" {
		t.Fatalf("through the tunnel: %q %v", line, err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	srv.Shutdown(ctx)
	if took := time.Since(start); took < 250*time.Millisecond {
		t.Errorf("Shutdown returned after %v: it did not wait for the tunnel", took)
	}
	if n := responded.Load(); n != 1 {
		t.Errorf("Shutdown returned with the tunnel's handler still running (101s counted: %d)", n)
	}
	if srv.handlers.Load() != 0 {
		t.Errorf("%d handlers running after Shutdown", srv.handlers.Load())
	}
	if _, err := br.ReadByte(); err == nil {
		t.Error("the tunnel is still open after Shutdown")
	}
}

// An HTTP/2 connection awaiting its preface counts as reading, as an
// HTTP/1 connection awaiting its first request does; once the HTTP/2
// server runs streams on it, as writing.
func TestHTTP2ConnStates(t *testing.T) {
	c, err := core.New(shmtest.Private(t, shm.Options{Counters: 64, MaxWorkers: 2}), core.Options{})
	if err != nil {
		t.Fatal(err)
	}
	tr := connTracker{cm: c.Conns()}
	conn, other := net.Pipe()
	defer conn.Close()
	defer other.Close()
	for i, step := range []struct {
		st   http.ConnState
		want metrics.ConnState
	}{
		{http.StateNew, metrics.ConnReading},    // accepted (net/http)
		{http.StateActive, metrics.ConnReading}, // the edge, before the preface
		{http.StateActive, metrics.ConnWriting}, // the HTTP/2 server, once it has it
		{http.StateIdle, metrics.ConnIdle},
		{http.StateActive, metrics.ConnWriting}, // a stream
	} {
		tr.track(conn, step.st, step.st != http.StateNew)
		if got := tr.conns[conn].metric; got != step.want {
			t.Fatalf("step %d (%v): counted as %v, want %v", i, step.st, got, step.want)
		}
	}
}

// net/http's lines of a client's failed TLS handshake (one per connection
// a scanner opens), and x/net's of an HTTP/2 connection without its
// preface, reach the log at most once a second each; its others all.
func TestErrorLogIsRateLimited(t *testing.T) {
	c, err := core.New(shmtest.Private(t, shm.Options{Counters: 64, MaxWorkers: 2}), core.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	srv, err := NewServer(ServerOptions{Core: c, Handler: http.NotFoundHandler(), Logger: slog.New(slog.NewTextHandler(&out, nil))})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 50 {
		srv.srv.ErrorLog.Printf("http: TLS handshake error from 192.0.2.1:%d: EOF", 1000+i)
	}
	if n := strings.Count(out.String(), "\n"); n != 1 || !strings.Contains(out.String(), "level=WARN") {
		t.Errorf("%d lines for 50 handshake errors within a second, want 1 warning:\n%s", n, out.String())
	}
	// Nor does x/net's line for an HTTP/2 connection that sent no
	// preface, which a client also makes at will; its gate is its own.
	for i := range 50 {
		srv.srv.ErrorLog.Printf("http2: server: error reading preface from client 192.0.2.1:%d: bogus greeting \"GET / HTTP/1.1\"", 2000+i)
	}
	if n := strings.Count(out.String(), "\n"); n != 2 || strings.Count(out.String(), "error reading preface") != 1 {
		t.Errorf("%d lines for 50 handshake errors and 50 connections without a preface, want 2:\n%s", n, out.String())
	}
	// Any other line (a handler's panic, with its stack) is never held.
	srv.srv.ErrorLog.Printf("http: panic serving 192.0.2.1:1: boom")
	if !strings.Contains(out.String(), "panic serving") {
		t.Errorf("a panic's line was held back with the handshakes':\n%s", out.String())
	}
}
