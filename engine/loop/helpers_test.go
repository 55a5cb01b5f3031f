//go:build linux

package loop_test

import (
	"bufio"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/preforkd/preforkd/config"
	"github.com/preforkd/preforkd/core"
	"github.com/preforkd/preforkd/engine/loop"
	"github.com/preforkd/preforkd/internal/wiretest"
	"github.com/preforkd/preforkd/shm"
)

var quietLog = slog.New(slog.DiscardHandler)

// configCore is the decision core a worker builds from the configuration
// text toml, over a region of its own, its options changed by set.
func configCore(t testing.TB, toml string, set ...func(*core.Options)) *core.Core {
	t.Helper()
	cfg, err := config.Parse([]byte(toml), "test.toml")
	if err != nil {
		t.Fatal(err)
	}
	o, err := cfg.CoreOptions()
	if err != nil {
		t.Fatal(err)
	}
	region, err := shm.Create(cfg.RegionOptions())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { region.Close() })
	if err := region.Join(0); err != nil {
		t.Fatal(err)
	}
	o.Logger = quietLog
	for _, f := range set {
		f(&o)
	}
	c, err := core.New(region, o)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// listen returns a loopback listener, closed when the test ends.
func listen(t testing.TB) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

// start serves ln with a Server for o (a core without rules when o has
// none), logging to quietLog; served gets what Serve returns. Stopping it
// is the caller's.
func start(t testing.TB, ln net.Listener, o loop.Options) (*loop.Server, <-chan error) {
	t.Helper()
	if o.Core == nil {
		o.Core = configCore(t, "")
	}
	if o.Logger == nil {
		o.Logger = quietLog
	}
	s, err := loop.New(o)
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- s.Serve(ln) }()
	return s, served
}

// serve starts a Server for o on a loopback listener and returns its
// address; it is closed when the test ends, which fails if Serve then
// returns an error.
func serve(t testing.TB, o loop.Options) (string, *loop.Server) {
	t.Helper()
	ln := listen(t)
	s, served := start(t, ln, o)
	t.Cleanup(func() {
		s.Close()
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return ln.Addr().String(), s
}

func dial(t *testing.T, addr string) (net.Conn, *bufio.Reader) {
	t.Helper()
	return wiretest.Dial(t, addr, 20*time.Second)
}

// roundTrip writes the raw request req on c and reads its response.
func roundTrip(t *testing.T, c io.Writer, br *bufio.Reader, req string) (*http.Response, []byte) {
	t.Helper()
	resp := roundTripHead(t, c, br, req)
	return resp, readBody(t, resp)
}

func roundTripHead(t *testing.T, c io.Writer, br *bufio.Reader, req string) *http.Response {
	t.Helper()
	if _, err := io.WriteString(c, req); err != nil {
		t.Fatalf("writing a request: %v", err)
	}
	method, _, _ := strings.Cut(req, " ")
	return readHead(t, br, method)
}

func readResponse(t *testing.T, br *bufio.Reader, method string) (*http.Response, []byte) {
	t.Helper()
	resp := readHead(t, br, method)
	return resp, readBody(t, resp)
}

func readHead(t *testing.T, br *bufio.Reader, method string) *http.Response {
	t.Helper()
	resp, err := http.ReadResponse(br, &http.Request{Method: method})
	if err != nil {
		t.Fatalf("reading a response: %v", err)
	}
	return resp
}

func readBody(t *testing.T, resp *http.Response) []byte {
	t.Helper()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("reading a response body: %v", err)
	}
	return body
}

// isClosed reports whether the server closed c (after what br read).
func isClosed(t *testing.T, c net.Conn, br *bufio.Reader) bool {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	_, err := br.Peek(1)
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		return false
	}
	if err == nil {
		rest, _ := br.Peek(br.Buffered())
		t.Errorf("bytes after the response: %q", rest)
		return false
	}
	return true
}
