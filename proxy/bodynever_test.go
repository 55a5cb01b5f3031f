package proxy_test

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/preforkd/preforkd/core"
	"github.com/preforkd/preforkd/engine"
)

// A request whose body never begins to arrive (nothing after its head,
// with or without Expect: 100-continue) gets client_body_timeout's 408,
// on every engine: the body's detail, the request id, one access line
// (naming the request sent) and one count, all of the 408 sent. fasthttp reads a body's first
// bytes itself before any handler runs; its failure there is still the
// body's, not the header's. It drops the head of a request with a
// Content-Length when that read fails, though: that one is counted, but
// has no request id and no access line (README says so).
func TestBodyThatNeverBeginsTimesOut(t *testing.T) {
	t.Parallel()
	for _, expect := range []string{"", "Expect: 100-continue\r\n"} {
		name := "plain"
		if expect != "" {
			name = "expect"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			eachEngine(t, withNetHTTP(), func(t *testing.T, e storyEngine) {
				up := startUpstream(t, nil)
				statuses := make(chan int, 4)
				lines := make(chan core.AccessEntry, 4)
				c := configCoreWith(t, "", func(o *core.Options) {
					o.OnResponse = func(status int) { statuses <- status }
					o.AccessLog = accessFunc(func(e *core.AccessEntry) { lines <- *e })
				})
				r := e.serve(t, storyOptions{Upstream: up.URL(), Core: c, Limits: engine.Limits{
					ReadHeaderTimeout: 10 * time.Second,
					ClientBodyTimeout: 300 * time.Millisecond,
				}})
				conn, br := dial(t, r.Addr)
				io.WriteString(conn, "POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 10\r\n"+expect+"\r\n")
				resp, body := readResponse(t, br, "POST")
				if resp.StatusCode == http.StatusContinue {
					resp, body = readResponse(t, br, "POST")
				}
				if resp.StatusCode != http.StatusRequestTimeout || !strings.Contains(string(body), "request body") {
					t.Errorf("answered %d %q, want 408 for the body", resp.StatusCode, body)
				}
				headless := e.name == "fasthttp" && expect == ""
				if resp.Header.Get("X-Request-Id") == "" && !headless {
					t.Error("no X-Request-Id: the answer did not come through the core")
				}
				select {
				case l := <-lines:
					if headless {
						t.Errorf("logged %d, though fasthttp dropped the head", l.Status)
					}
					if l.Status != http.StatusRequestTimeout {
						t.Errorf("logged %d, sent 408", l.Status)
					}
					if l.Method != "POST" || l.Path != "/x" || (l.Target != "" && l.Target != "/x") {
						t.Errorf("logged %s %q (target %q), sent POST /x", l.Method, l.Path, l.Target)
					}
				case <-time.After(time.Second):
					if !headless {
						t.Error("no access log entry within a second")
					}
				}
				select {
				case s := <-statuses:
					if s != http.StatusRequestTimeout {
						t.Errorf("counted %d, sent 408", s)
					}
				case <-time.After(5 * time.Second):
					t.Error("not counted within 5 s")
				}
				conn.Close()
				time.Sleep(200 * time.Millisecond) // a second count or line would come now
				if len(statuses) > 0 || len(lines) > 0 {
					t.Errorf("counted again (%d) or logged again (%d)", len(statuses), len(lines))
				}
				if n := len(up.Requests()); n != 0 {
					t.Errorf("the upstream saw %d requests, want none", n)
				}
			})
		})
	}
}
