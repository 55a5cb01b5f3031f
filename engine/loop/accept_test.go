//go:build linux

package loop_test

import (
	"io"
	"testing"

	"golang.org/x/sys/unix"

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
