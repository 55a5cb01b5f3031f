//go:build linux

package loop_test

import (
	"io"
	"net/http"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/preforkd/preforkd/engine"
	"github.com/preforkd/preforkd/engine/loop"
)

// An accept that fails for the connection it took (Linux passes a new
// connection's pending network error on, accept(2)) or for a moment (out
// of descriptors) leaves the listener polled: the connections that come
// next are served.
func TestAcceptErrorsKeepListening(t *testing.T) {
	t.Parallel()
	up := pipelineUpstream(t)
	for _, errno := range []unix.Errno{unix.EMFILE, unix.ENOBUFS, unix.EPROTO, unix.ENETUNREACH, unix.EHOSTUNREACH, unix.EPERM} {
		t.Run(errno.Error(), func(t *testing.T) {
			t.Parallel()
			ln := listen(t)
			s, err := loop.New(loop.Options{Upstream: up.URL(), Loops: 1, Core: configCore(t, ""), Logger: quietLog})
			if err != nil {
				t.Fatal(err)
			}
			loop.FailAccepts(s, 1, errno)
			served := make(chan error, 1)
			go func() { served <- s.Serve(ln) }()
			t.Cleanup(func() {
				s.Close()
				<-served
			})
			for i := range 2 {
				c, br := dial(t, ln.Addr().String())
				io.WriteString(c, "GET /x HTTP/1.1\r\nHost: a\r\n\r\n")
				if resp, _ := readResponse(t, br, "GET"); resp.StatusCode != 200 {
					t.Fatalf("connection %d after an accept failed with %v: %d", i, errno, resp.StatusCode)
				}
				c.Close()
			}
		})
	}
}

// A listener the server begins to serve while it holds MaxConnections
// is polled once a connection closes, and the connections that wait on
// it are accepted (not left waiting while the loop spins on their
// events, with nobody in its table to take them).
func TestListenerAddedAtCapacityAccepts(t *testing.T) {
	t.Parallel()
	up := pipelineUpstream(t)
	ln1 := listen(t)
	s, served := start(t, ln1, loop.Options{Upstream: up.URL(), Loops: 1,
		Limits: engine.Limits{MaxConnections: 1}})
	defer func() {
		s.Close()
		<-served
	}()
	const req = "GET / HTTP/1.1\r\nHost: a\r\n\r\n"
	c1, br1 := dial(t, ln1.Addr().String())
	roundTrip(t, c1, br1, req) // the one connection allowed is in
	ln2 := listen(t)
	go s.Serve(ln2)
	time.Sleep(100 * time.Millisecond) // the loop took ln2 on, at the bound
	c1.Close()
	c2, br2 := dial(t, ln2.Addr().String())
	c2.SetDeadline(time.Now().Add(3 * time.Second))
	if _, err := io.WriteString(c2, req); err != nil {
		t.Fatal(err)
	}
	if _, err := http.ReadResponse(br2, nil); err != nil {
		t.Fatalf("the listener added at the bound: %v", err)
	}
}
