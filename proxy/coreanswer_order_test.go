package proxy_test

import (
	"bufio"
	"errors"
	"net"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/preforkd/preforkd/core"
)

// An answer of the core's own (here a cache hit) is counted and logged
// before its bytes reach the client, on every engine, as a forwarded
// response is: a client that has it finds it in the access log and the
// metrics. The access log holds the hit's entry, and nothing of the
// answer may arrive meanwhile (the loop once sent it first).
func TestCoreAnswerLoggedBeforeSent(t *testing.T) {
	t.Parallel()
	eachEngine(t, withNetHTTP(), func(t *testing.T, e storyEngine) {
		up := startUpstream(t, func(req *seenRequest, w *bufio.Writer, c net.Conn) {
			w.WriteString("HTTP/1.1 200 OK\r\nCache-Control: max-age=600\r\nContent-Length: 2\r\n\r\nok")
		})
		entered, release := make(chan struct{}), make(chan struct{})
		var hold atomic.Bool // set before the hit is asked for
		c := configCoreWith(t, "[table]\ncounters = 64\nresponses = 64\nresponse_bytes = \"256KiB\"\n[[cache]]\npath = \"/*\"\nmax_body = \"64KiB\"\n",
			func(o *core.Options) {
				o.AccessLog = accessFunc(func(e *core.AccessEntry) {
					if hold.Load() {
						close(entered)
						select {
						case <-release:
						case <-time.After(10 * time.Second):
						}
					}
				})
			})
		r := e.serve(t, storyOptions{Upstream: up.URL(), Core: c})
		conn, br := dial(t, r.Addr)
		defer conn.Close()
		if resp, _ := roundTrip(t, conn, br, "GET /h HTTP/1.1\r\nHost: a\r\n\r\n"); resp.Header.Get("X-Cache") != "MISS" {
			t.Fatalf("first: X-Cache %q", resp.Header.Get("X-Cache"))
		}
		hold.Store(true)
		if _, err := conn.Write([]byte("GET /h HTTP/1.1\r\nHost: a\r\n\r\n")); err != nil {
			t.Fatal(err)
		}
		select {
		case <-entered:
		case <-time.After(10 * time.Second):
			t.Fatal("the hit was never logged")
		}
		conn.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
		_, err := br.Peek(1)
		close(release)
		var ne net.Error
		if err == nil || !errors.As(err, &ne) || !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("the hit reached the client before its access entry was written (%v)", err)
		}
		conn.SetReadDeadline(time.Now().Add(20 * time.Second))
		if resp, _ := readResponse(t, br, "GET"); resp.Header.Get("X-Cache") != "HIT" {
			t.Fatalf("second: X-Cache %q", resp.Header.Get("X-Cache"))
		}
	})
}
