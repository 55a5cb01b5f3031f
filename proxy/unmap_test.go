package proxy_test

import (
	"bufio"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/preforkd/preforkd/core"
	"github.com/preforkd/preforkd/internal/waitfor"
)

// envMidStream runs TestStoryEndsMidStream's stories in the child process
// it starts.
const envMidStream = "PROXY_TEST_STORY_ENDS_MID_STREAM"

// A story that ends (fails) while the upstream still holds a response
// open leaves the rest of the test binary running: the engine is stopped
// and what it still runs has ended before the core's region is unmapped,
// whatever the upstream does later. The stories run in a child process,
// whose death by a fault in unmapped memory this one sees.
func TestStoryEndsMidStream(t *testing.T) {
	if os.Getenv(envMidStream) != "" {
		// What outlives a story would run on while other tests do.
		t.Cleanup(func() { time.Sleep(500 * time.Millisecond) })
		for _, e := range withNetHTTP() {
			endsMidStream(t, e.name, func(t *testing.T, upstream string, c *core.Core) string {
				return e.serve(t, storyOptions{Upstream: upstream, Core: c}).Addr
			})
		}
		// The core behind net/http's ReverseProxy, as the decision-core
		// tables run it (the others are the stories' engines).
		for _, ce := range coreEngines {
			if ce.name != "nethttp" {
				continue
			}
			endsMidStream(t, "core-"+ce.name, func(t *testing.T, upstream string, c *core.Core) string {
				if c == nil {
					c = configCore(t, "", nil)
				}
				ln := listen(t)
				ce.start(t, ln, upstream, c)
				return ln.Addr().String()
			})
		}
		return
	}
	t.Parallel()
	cmd := exec.Command(os.Args[0], "-test.run=^TestStoryEndsMidStream$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), envMidStream+"=1")
	out, err := cmd.CombinedOutput()
	if err != nil || strings.Contains(string(out), "fatal error") {
		t.Fatalf("the stories' process: %v\n%s", err, out)
	}
}

// endsMidStream runs storyEndsMidStream on the engine serve starts: a
// stream only relayed, and a response the core keeps, which is read on
// after its client went away.
func endsMidStream(t *testing.T, name string, serve func(t *testing.T, upstream string, c *core.Core) string) {
	t.Run(name, func(t *testing.T) {
		t.Parallel()
		t.Run("relayed", func(t *testing.T) {
			t.Parallel()
			storyEndsMidStream(t, serve, nil, "GET /events HTTP/1.1\r\nHost: h\r\n\r\n")
		})
		t.Run("refreshing", func(t *testing.T) {
			t.Parallel()
			storyEndsMidRefresh(t, serve)
		})
		t.Run("kept", func(t *testing.T) {
			t.Parallel()
			c := configCore(t, "[[idempotency]]\npath = \"/orders\"\nmax_body = \"4KiB\"\n", nil)
			storyEndsMidStream(t, serve, c, "POST /orders HTTP/1.1\r\nHost: h\r\nIdempotency-Key: \"k\"\r\nContent-Length: 0\r\n\r\n")
		})
	})
}

// storyEndsMidStream ends with the upstream's response under way: its
// head and a first chunk relayed, the rest only once the upstream is
// closed, after the story's cleanups stopped the engine and closed the
// region.
func storyEndsMidStream(t *testing.T, serve func(t *testing.T, upstream string, c *core.Core) string, c *core.Core, req string) {
	up := startUpstream(t, func(_ *seenRequest, w *bufio.Writer, c net.Conn) {
		w.WriteString("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n6\r\ndata:\n\r\n")
		w.Flush()
		io.Copy(io.Discard, c) // until the upstream is closed
	})
	conn, br := dial(t, serve(t, up.URL(), c))
	conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	resp := roundTripHead(t, conn, br, req)
	if line, err := bufio.NewReader(resp.Body).ReadString('\n'); line != "data:\n" {
		t.Fatalf("first chunk: %q, %v", line, err)
	}
}

// storyEndsMidRefresh ends while a background refresh of a stale cached
// response (stale-while-revalidate) has the upstream's head and the
// start of its body, the rest only once the upstream is closed.
func storyEndsMidRefresh(t *testing.T, serve func(t *testing.T, upstream string, c *core.Core) string) {
	var calls atomic.Int32
	up := startUpstream(t, func(_ *seenRequest, w *bufio.Writer, c net.Conn) {
		if calls.Add(1) == 1 {
			w.WriteString("HTTP/1.1 200 OK\r\nCache-Control: max-age=10, stale-while-revalidate=60\r\nContent-Length: 3\r\n\r\nold")
			w.Flush()
			return
		}
		w.WriteString("HTTP/1.1 200 OK\r\nCache-Control: max-age=10, stale-while-revalidate=60\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nnew\r\n")
		w.Flush()
		io.Copy(io.Discard, c) // until the upstream is closed
	})
	var clock atomic.Int64
	addr := serve(t, up.URL(), cacheCore(t, &clock))
	for i, want := range []string{"MISS", "STALE"} {
		conn, br := dial(t, addr)
		resp, _ := roundTrip(t, conn, br, "GET /r HTTP/1.1\r\nHost: a\r\n\r\n")
		if x := resp.Header.Get("X-Cache"); x != want {
			t.Fatalf("answer %d: X-Cache %q, want %s", i, x, want)
		}
		clock.Add(int64(20 * time.Second))
	}
	if !waitfor.Cond(5*time.Second, func() bool { return calls.Load() == 2 }) {
		t.Fatal("no refresh")
	}
	time.Sleep(50 * time.Millisecond) // its head read
}
