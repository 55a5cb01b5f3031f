package proxy_test

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"testing"
	"time"
)

// A request with ambiguous framing is refused, and nothing of it
// forwarded, after empty lines before its request line too, on every
// engine: net/http drops those after a POST, and the request line after
// them is the one that says HTTP/1.0.
func TestAmbiguousFramingAfterEmptyLines(t *testing.T) {
	const smuggled = "GET /smuggled HTTP/1.1\r\nHost: a\r\n\r\n"
	for _, e := range engines {
		t.Run(e.name, func(t *testing.T) {
			t.Parallel()
			for _, next := range []string{
				"\r\nPOST /b HTTP/1.0\r\nHost: a\r\nConnection: keep-alive\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + smuggled,
				"\r\n\r\nPOST /b HTTP/1.0\r\nHost: a\r\nConnection: keep-alive\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + smuggled,
			} {
				up := startUpstream(t, nil)
				ln := listen(t)
				e.start(t, ln, up.URL())
				c, br := postThen(t, ln.Addr().String())
				io.WriteString(c, next)
				if resp, err := http.ReadResponse(br, nil); err != nil || resp.StatusCode != 400 {
					t.Errorf("%q after a POST: %v %v, want a 400", next, resp, err)
				}
				for _, s := range up.Requests() {
					if s.Line != "POST /a HTTP/1.1" {
						t.Errorf("%q after a POST: the upstream got %q", next, s.Line)
					}
				}
			}
		})
	}
}

// postThen dials addr and has a POST served on the connection.
func postThen(t *testing.T, addr string) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(5 * time.Second))
	br := bufio.NewReader(c)
	io.WriteString(c, "POST /a HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\n\r\nhi")
	resp, err := http.ReadResponse(br, &http.Request{Method: "POST"})
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("the POST: %d", resp.StatusCode)
	}
	return c, br
}

// A request with ambiguous framing on a kept connection, in a read of its
// own, is answered 400 as the first request on a connection is, on every
// engine: the net/http engine refused it in the read net/http waits for
// the next request with, whose failure net/http takes for the client
// leaving, and closed the connection without a word.
func TestAmbiguousFramingOnAKeptConnection(t *testing.T) {
	for _, e := range engines {
		t.Run(e.name, func(t *testing.T) {
			t.Parallel()
			up := startUpstream(t, nil)
			ln := listen(t)
			e.start(t, ln, up.URL())
			for _, next := range []string{
				"POST /b HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
				"POST /b HTTP/1.0\r\nHost: a\r\nConnection: keep-alive\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
				"GET /b HTTP/1.1\r\nHost: a\r\nX-A: b\r\n c\r\n\r\n",
			} {
				c, br := postThen(t, ln.Addr().String())
				io.WriteString(c, next)
				resp, err := http.ReadResponse(br, nil)
				if err != nil || resp.StatusCode != 400 {
					t.Errorf("%q on a kept connection: %v %v, want a 400", next, resp, err)
				}
			}
		})
	}
}
