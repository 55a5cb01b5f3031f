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
		eachEngine(t, withNetHTTP(), func(t *testing.T, e storyEngine) {
			t.Run("relayed", func(t *testing.T) {
				t.Parallel()
				storyEndsMidStream(t, e, nil, "GET /events HTTP/1.1\r\nHost: h\r\n\r\n")
			})
			t.Run("kept", func(t *testing.T) {
				// A response the core keeps is read on after its client
				// went away.
				t.Parallel()
				c := configCore(t, "[[idempotency]]\npath = \"/orders\"\nmax_body = \"4KiB\"\n", nil)
				storyEndsMidStream(t, e, c, "POST /orders HTTP/1.1\r\nHost: h\r\nIdempotency-Key: \"k\"\r\nContent-Length: 0\r\n\r\n")
			})
		})
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

// storyEndsMidStream ends with the upstream's response under way: its
// head and a first chunk relayed, the rest only once the upstream is
// closed, after the story's cleanups stopped the engine and closed the
// region.
func storyEndsMidStream(t *testing.T, e storyEngine, c *core.Core, req string) {
	up := startUpstream(t, func(_ *seenRequest, w *bufio.Writer, c net.Conn) {
		w.WriteString("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n6\r\ndata:\n\r\n")
		w.Flush()
		io.Copy(io.Discard, c) // until the upstream is closed
	})
	r := e.serve(t, storyOptions{Upstream: up.URL(), Core: c})
	conn, br := dial(t, r.Addr)
	conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	resp := roundTripHead(t, conn, br, req)
	if line, err := bufio.NewReader(resp.Body).ReadString('\n'); line != "data:\n" {
		t.Fatalf("first chunk: %q, %v", line, err)
	}
}
