package proxy_test

import (
	"bufio"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/preforkd/preforkd/core"
	"github.com/preforkd/preforkd/engine"
	"github.com/preforkd/preforkd/internal/shmtest"
	"github.com/preforkd/preforkd/metrics"
	"github.com/preforkd/preforkd/shm"
)

// connCounts is what a region says of the connections: reading, writing,
// idle, accepted, max_connections reached.
type connCounts [5]uint64

// waitConns waits until the region's counts are want: an engine counts
// a change when it sees it, a moment after the client made it.
func waitConns(t *testing.T, r *shm.Region, when string, want connCounts) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		var s metrics.Snapshot
		metrics.Read(r, &s)
		got := connCounts{s.Conns(metrics.ConnReading), s.Conns(metrics.ConnWriting), s.Conns(metrics.ConnIdle),
			s.Value(metrics.ConnectionsAccepted, 0), s.Value(metrics.ConnectionsMaxReached, 0)}
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: reading, writing, idle, accepted, max reached = %v, want %v", when, got, want)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// countedCore is a core without rules over a region of its own, with
// the statistics rows that count connections.
func countedCore(t *testing.T) (*shm.Region, *core.Core) {
	t.Helper()
	o := shm.Options{Counters: 64, MaxWorkers: 2}
	metrics.Geometry(&o, 0)
	region := shmtest.Joined(t, o)
	c, err := core.New(region, core.Options{Logger: quietLog})
	if err != nil {
		t.Fatal(err)
	}
	return region, c
}

// Every connection is counted in the state it is in, as nginx's
// stub_status counts them: a new one and one sending its header reading,
// one whose request is at the upstream writing, one kept alive idle; the
// bound of max_connections is counted when it is reached, and a
// connection that waits meanwhile is not accepted, so not counted.
func TestConnectionStates(t *testing.T) {
	t.Parallel()
	eachEngine(t, withNetHTTP(), func(t *testing.T, e storyEngine) {
		release := make(chan struct{})
		var once sync.Once
		up := startUpstream(t, func(req *seenRequest, w *bufio.Writer, _ net.Conn) {
			if req.Req.URL.Path == "/hold" {
				<-release
			}
			w.WriteString("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		})
		t.Cleanup(func() { once.Do(func() { close(release) }) })
		region, c := countedCore(t)
		addr := e.serve(t, storyOptions{Core: c, Upstream: up.URL(), Limits: engine.Limits{MaxConnections: 6}}).Addr

		fresh, _ := dial(t, addr) // no byte yet: reading, as it awaits its header
		partial, _ := dial(t, addr)
		io.WriteString(partial, "GET / HTTP/1.1\r\nHost: a\r\n")
		held, heldBr := dial(t, addr)
		io.WriteString(held, "GET /hold HTTP/1.1\r\nHost: a\r\n\r\n")
		idle1, br1 := dial(t, addr)
		idle2, br2 := dial(t, addr)
		roundTrip(t, idle1, br1, "GET / HTTP/1.1\r\nHost: a\r\n\r\n")
		roundTrip(t, idle2, br2, "GET / HTTP/1.1\r\nHost: a\r\n\r\n")
		up.WaitRequests(3, 5*time.Second) // /hold is at the upstream
		waitConns(t, region, "five open", connCounts{2, 1, 2, 5, 0})

		sixth, _ := dial(t, addr)
		waitConns(t, region, "six open: the bound", connCounts{3, 1, 2, 6, 1})
		seventh, br7 := dial(t, addr) // the kernel holds it: the worker is at its bound
		io.WriteString(seventh, "GET / HTTP/1.1\r\nHost: a\r\n\r\n")
		time.Sleep(100 * time.Millisecond)
		waitConns(t, region, "a seventh waits unaccepted", connCounts{3, 1, 2, 6, 1})

		fresh.Close() // room for the seventh, which fills it again
		if resp, _ := readResponse(t, br7, "GET"); resp.StatusCode != 200 {
			t.Fatalf("the seventh: %d", resp.StatusCode)
		}
		waitConns(t, region, "the seventh served, kept alive", connCounts{2, 1, 3, 7, 2})

		once.Do(func() { close(release) })
		if resp, _ := readResponse(t, heldBr, "GET"); resp.StatusCode != 200 {
			t.Fatalf("/hold: %d", resp.StatusCode)
		}
		waitConns(t, region, "/hold answered", connCounts{2, 0, 4, 7, 2})
		io.WriteString(idle1, "GET / HTTP/1.1\r\nHost: a\r\n") // the next request's header, half sent
		if e.name == netHTTPStory.name {
			// net/http tells its ConnState hook of a kept connection's
			// next request only once the whole header is read: until
			// then it is idle.
			waitConns(t, region, "an idle one sends a header", connCounts{2, 0, 4, 7, 2})
		} else {
			waitConns(t, region, "an idle one sends a header", connCounts{3, 0, 3, 7, 2})
		}

		for _, c := range []net.Conn{partial, held, idle1, idle2, sixth, seventh} {
			c.Close()
		}
		waitConns(t, region, "all closed", connCounts{0, 0, 0, 7, 2})
	})
}

// A connection whose request awaits its body after 100 Continue is
// writing (a request in progress), on every engine.
func TestConnectionAwaitingItsBodyIsWriting(t *testing.T) {
	t.Parallel()
	eachEngine(t, withNetHTTP(), func(t *testing.T, e storyEngine) {
		up := startUpstream(t, nil)
		region, c := countedCore(t)
		addr := e.serve(t, storyOptions{Core: c, Upstream: up.URL()}).Addr
		conn, br := dial(t, addr)
		io.WriteString(conn, "POST /u HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\n")
		if line, err := br.ReadString('\n'); err != nil || !strings.HasPrefix(line, "HTTP/1.1 100") {
			t.Fatalf("%q, %v; want 100 Continue", line, err)
		}
		waitConns(t, region, "its body awaited", connCounts{0, 1, 0, 1, 0})
		conn.Close()
		waitConns(t, region, "closed", connCounts{0, 0, 0, 1, 0})
	})
}

// An upgraded connection is counted as writing while its tunnel is open,
// on every engine, TLS listeners included, as nginx's stub_status counts
// it; it leaves the counts when its tunnel ends. (The net/http engine
// once dropped it from the counts at the hijack: a drain cut with
// tunnels open then logged that it cut no connection.)
func TestConnectionStatesOfATunnel(t *testing.T) {
	t.Parallel()
	for _, reset := range []bool{false, true} {
		testConnectionStatesOfATunnel(t, reset)
	}
}

// testConnectionStatesOfATunnel ends the tunnel by the client's close, or
// its reset.
func testConnectionStatesOfATunnel(t *testing.T, reset bool) {
	eachEngine(t, withNetHTTP(), func(t *testing.T, e storyEngine) {
		up := startEchoUpstream(t)
		region, c := countedCore(t)
		addr := e.serve(t, storyOptions{Core: c, Upstream: up.URL()}).Addr
		conn, br := dial(t, addr)
		openTunnel(t, conn, br)
		io.WriteString(conn, "ping")
		if b := make([]byte, 4); func() error { _, err := io.ReadFull(br, b); return err }() != nil {
			t.Fatal("nothing came through the tunnel")
		}
		waitConns(t, region, "a tunnel open", connCounts{0, 1, 0, 1, 0})
		if reset {
			conn.(*net.TCPConn).SetLinger(0)
		}
		conn.Close()
		waitConns(t, region, "the tunnel ended", connCounts{0, 0, 0, 1, 0})
	})
}
