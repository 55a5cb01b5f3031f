package proxy_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/preforkd/preforkd/engine"
)

// What the upstream sees of the same request, engine by engine.

// statusOf sends req on a fresh connection to e (forwarding to a recording
// upstream) and returns the status the client got and the request lines
// the upstream saw.
func statusOf(t *testing.T, e storyEngine, req string) string {
	up := startUpstream(t, nil)
	r := e.serve(t, storyOptions{Upstream: up.URL(), Limits: engine.Limits{ClientBodyTimeout: time.Second}})
	c, err := net.Dial("tcp", r.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	io.WriteString(c, req)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return "error " + err.Error()
	}
	io.Copy(io.Discard, resp.Body)
	var lines []string
	for _, s := range up.WaitRequests(1, 200*time.Millisecond) {
		lines = append(lines, s.Line)
	}
	return fmt.Sprintf("%d upstream=%q", resp.StatusCode, lines)
}

// An absolute-form target reaches the upstream with the path as sent, as
// the same path in origin form does: the net/http engine re-encodes it
// from the parsed URL ("/a%7Cb" for "/a|b", "%22" for '"', "%7B%7D" for
// braces), while the fast engines and the origin form send it as sent.
func TestAbsoluteFormPathAsSent(t *testing.T) {
	t.Parallel()
	eachEngine(t, withNetHTTP(), func(t *testing.T, e storyEngine) {
		for _, p := range []string{"/a|b", "/a{b}", "/a\"b"} {
			got := statusOf(t, e, "GET http://a"+p+" HTTP/1.1\r\nHost: a\r\n\r\n")
			want := statusOf(t, e, "GET "+p+" HTTP/1.1\r\nHost: a\r\n\r\n")
			if got != want {
				t.Errorf("absolute-form %s: %s; origin-form: %s", p, got, want)
			}
		}
	})
}

// A chunked body's trailer section is checked as a header section is, on
// every engine: a malformed line refuses the request, and nothing is
// forwarded. Well-formed trailer fields are dropped (none is forwarded),
// whatever their names; fasthttp alone refuses the names a trailer may
// not carry (Content-Type, Host, ...), as README says.
func TestTrailerSectionAlike(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ trailer, want string }{
		{"X-T: a\x01b\r\n", "400 upstream=[]"},
		{"no colon here\r\n", "400 upstream=[]"},
		{" folded\r\n", "400 upstream=[]"},
		{"X-T: a\r\n folded\r\n", `200 upstream=["POST /t HTTP/1.1"]`}, // obs-fold goes with the field
		{":x\r\n", "400 upstream=[]"},
		{"X-T: a\r\n", `200 upstream=["POST /t HTTP/1.1"]`},
		{"Content-Type: text/plain\r\n", `200 upstream=["POST /t HTTP/1.1"]`},
	} {
		t.Run(fmt.Sprintf("%q", tc.trailer), func(t *testing.T) {
			t.Parallel()
			req := "POST /t HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n" + tc.trailer + "\r\n"
			eachEngine(t, withNetHTTP(), func(t *testing.T, e storyEngine) {
				want := tc.want
				if e.name == "fasthttp" && strings.HasPrefix(tc.trailer, "Content-Type") {
					want = "400 upstream=[]"
				}
				if got := statusOf(t, e, req); got != want {
					t.Errorf("%s, want %s", got, want)
				}
			})
		})
	}
}
