package proxy_test

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strings"
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
				got, _ := io.ReadAll(br)
				if strings.Contains(string(got), " 200 OK") {
					t.Errorf("%q after a POST: got %q, want no 200", next, got)
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
