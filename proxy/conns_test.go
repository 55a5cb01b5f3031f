package proxy_test

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/preforkd/preforkd/core"
	"github.com/preforkd/preforkd/engine"
	"github.com/preforkd/preforkd/internal/shmtest"
	"github.com/preforkd/preforkd/internal/wiretest"
	"github.com/preforkd/preforkd/metrics"
	"github.com/preforkd/preforkd/proxy"
	"github.com/preforkd/preforkd/shm"
)

// connCounts is what a region says of the connections: reading, writing,
// idle, accepted, max_connections reached.
type connCounts [5]uint64

// Every engine counts its connections by state in the worker's row, as
// the event loop does (engine/loop's TestConnectionStates): a new one
// reading, one whose request is at the upstream writing, one kept alive
// idle, the accepted ones and the bound reached; a closed one in none.
func TestConnectionStatesBlockingEngines(t *testing.T) {
	t.Parallel()
	engines := []struct {
		name  string
		serve func(t *testing.T, ln net.Listener, upstream string, c *core.Core)
	}{
		{"fasthttp", func(t *testing.T, ln net.Listener, upstream string, c *core.Core) {
			s, served := start(t, ln, proxy.Options{Upstream: upstream, Core: c, Limits: engine.Limits{MaxConnections: 5}})
			stopAtCleanup(t, s, served)
		}},
		{"nethttp", func(t *testing.T, ln net.Listener, upstream string, c *core.Core) {
			s := netHTTPForwarder(t, c, upstream, engine.Limits{MaxConnections: 5})
			served := make(chan error, 1)
			go func() { served <- s.Serve(ln) }()
			stopAtCleanup(t, s, served)
		}},
	}
	for _, e := range engines {
		t.Run(e.name, func(t *testing.T) {
			t.Parallel()
			release := make(chan struct{})
			var once sync.Once
			up := wiretest.StartUpstream(t, func(req *wiretest.Seen, w *bufio.Writer, _ net.Conn) {
				if req.Req.URL.Path == "/hold" {
					<-release
				}
				w.WriteString("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
			})
			t.Cleanup(func() { once.Do(func() { close(release) }) })
			o := shm.Options{Counters: 64, MaxWorkers: 2}
			metrics.Geometry(&o, 0)
			region := shmtest.Joined(t, o)
			c, err := core.New(region, core.Options{Logger: quietLog})
			if err != nil {
				t.Fatal(err)
			}
			ln := listen(t)
			e.serve(t, ln, up.URL(), c)
			wait := func(when string, want connCounts) {
				t.Helper()
				deadline := time.Now().Add(5 * time.Second)
				for {
					var s metrics.Snapshot
					metrics.Read(region, &s)
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
			dial := func() (net.Conn, *bufio.Reader) {
				nc, err := net.Dial("tcp", ln.Addr().String())
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { nc.Close() })
				return nc, bufio.NewReader(nc)
			}
			get := func(nc net.Conn, br *bufio.Reader) {
				t.Helper()
				io.WriteString(nc, "GET / HTTP/1.1\r\nHost: a\r\n\r\n")
				resp, err := http.ReadResponse(br, nil)
				if err != nil {
					t.Fatal(err)
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}

			fresh, _ := dial() // no byte yet: reading, as it awaits its header
			held, heldBr := dial()
			io.WriteString(held, "GET /hold HTTP/1.1\r\nHost: a\r\n\r\n")
			idle1, br1 := dial()
			idle2, br2 := dial()
			get(idle1, br1)
			get(idle2, br2)
			up.WaitRequests(3, 5*time.Second) // /hold is at the upstream
			wait("four open", connCounts{1, 1, 2, 4, 0})

			fifth, _ := dial()
			wait("five open: the bound", connCounts{2, 1, 2, 5, 1})

			once.Do(func() { close(release) })
			if resp, err := http.ReadResponse(heldBr, nil); err != nil || resp.StatusCode != 200 {
				t.Fatalf("/hold: %v %v", resp, err)
			}
			wait("/hold answered", connCounts{2, 0, 3, 5, 1})
			for _, c := range []net.Conn{fresh, held, idle1, idle2, fifth} {
				c.Close()
			}
			wait("all closed", connCounts{0, 0, 0, 5, 1})
		})
	}
}
