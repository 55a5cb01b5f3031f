package proxy_test

import (
	"bufio"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/preforkd/preforkd/core"
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
		// The engines as the decision-core tables run them (core
		// behind net/http's ReverseProxy among them).
		for _, ce := range coreEngines {
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
