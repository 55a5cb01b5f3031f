package proxy_test

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/preforkd/preforkd/core"
)

// A client that resets its connection while its request body is still
// arriving, before any response began, went away: every engine counts
// and logs it once as 499, writes nothing and forwards nothing. One that
// only closes its sending side (a FIN) with its body short may still read
// the answer: every engine answers it 400 ("the request body ended
// early" or could not be read), logged and counted once; so is one whose
// body streamed to the upstream past the read-ahead. With Expect:
// 100-continue the same, whether the reset comes after part of the body
// or before any of it (fasthttp reads a body's first bytes itself before
// its handler runs), or at once after the head, before the 100 Continue
// could be written. And the same with an idempotency key, whose body the
// core reads itself to fingerprint it: the key is not held, so that the
// client's retry runs.
func TestBodyResetMidwayIsClientGone(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		expect bool
		part   int  // body bytes sent of the 100000 declared; -1: none, reset at once
		reset  bool // else a FIN
		want   int
		keyed  bool // through an [[idempotency]] block, with a key
	}{
		{"reset", false, 1000, true, core.StatusClientClosed, false},
		{"reset-streaming", false, 70000, true, core.StatusClientClosed, false}, // past the read-ahead: the upstream has the head
		{"fin", false, 1000, false, http.StatusBadRequest, false},
		{"expect-reset", true, 1000, true, core.StatusClientClosed, false},
		{"expect-reset-unbegun", true, 0, true, core.StatusClientClosed, false},
		{"expect-fin", true, 1000, false, http.StatusBadRequest, false},
		{"reset-at-once", false, -1, true, core.StatusClientClosed, false},
		{"expect-reset-at-once", true, -1, true, core.StatusClientClosed, false},
		{"keyed-reset", false, 1000, true, core.StatusClientClosed, true},
		{"keyed-fin", false, 1000, false, http.StatusBadRequest, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			eachEngine(t, withNetHTTP(), func(t *testing.T, e storyEngine) {
				up := startUpstream(t, nil)
				statuses := make(chan int, 4)
				lines := make(chan core.AccessEntry, 4)
				conf, key := "", ""
				if tc.keyed {
					conf, key = "[[idempotency]]\npath = \"/x\"\n", "Idempotency-Key: \"k1\"\r\n"
				}
				c := configCoreWith(t, conf, func(o *core.Options) {
					o.OnResponse = func(status int) { statuses <- status }
					o.AccessLog = accessFunc(func(e *core.AccessEntry) { lines <- *e })
				})
				r := e.serve(t, storyOptions{Upstream: up.URL(), Core: c})
				conn, br := dial(t, r.Addr)
				head := "POST /x HTTP/1.1\r\nHost: a\r\n" + key + "Content-Length: 100000\r\n"
				if tc.part < 0 {
					io.WriteString(conn, head+map[bool]string{true: "Expect: 100-continue\r\n"}[tc.expect]+"\r\n")
				} else if tc.expect {
					io.WriteString(conn, head+"Expect: 100-continue\r\n\r\n")
					if resp, _ := readResponse(t, br, "POST"); resp.StatusCode != http.StatusContinue {
						t.Fatalf("answered %d, want 100 Continue", resp.StatusCode)
					}
				} else {
					io.WriteString(conn, head+"\r\n")
				}
				if tc.part >= 0 {
					conn.Write(make([]byte, tc.part))
					time.Sleep(200 * time.Millisecond) // the engine waits for the rest
				}
				if tc.reset {
					conn.(*net.TCPConn).SetLinger(0)
					conn.Close()
				} else {
					conn.(*net.TCPConn).CloseWrite()
					resp, _ := readResponse(t, br, "POST")
					if resp.StatusCode != tc.want {
						t.Errorf("answered %d, want %d", resp.StatusCode, tc.want)
					}
					wantEnd(t, br)
				}
				select {
				case s := <-statuses:
					if s != tc.want {
						t.Errorf("counted %d, want %d", s, tc.want)
					}
				case <-time.After(5 * time.Second):
					t.Fatal("not counted within 5 s")
				}
				// fasthttp drops the head of a request with no Expect whose
				// body's first read fails: no access line (README says so).
				headless := e.name == "fasthttp" && !tc.expect && tc.part < 0
				select {
				case l := <-lines:
					if headless || l.Status != tc.want || tc.reset && l.Bytes != 0 {
						t.Errorf("logged %d with %d bytes sent, want %d (headless %v)", l.Status, l.Bytes, tc.want, headless)
					}
				case <-time.After(time.Second):
					if !headless {
						t.Error("not logged within a second")
					}
				}
				time.Sleep(200 * time.Millisecond) // a second count or line would come now
				if len(statuses) > 0 || len(lines) > 0 {
					t.Errorf("counted again (%d) or logged again (%d)", len(statuses), len(lines))
				}
				if n := len(up.Requests()); n != 0 && tc.part < 64<<10 {
					t.Errorf("the upstream saw %d requests, want none", n)
				}
				if tc.keyed {
					// The key is free: the retry runs (no 409).
					conn, br := dial(t, r.Addr)
					io.WriteString(conn, "POST /x HTTP/1.1\r\nHost: a\r\n"+key+"Content-Length: 2\r\n\r\nab")
					if resp, _ := readResponse(t, br, "POST"); resp.StatusCode != http.StatusOK {
						t.Errorf("the retry was answered %d, want 200", resp.StatusCode)
					}
				}
			})
		})
	}
}

// wantEnd reads the end of the connection from br, with nothing more.
func wantEnd(t *testing.T, br *bufio.Reader) {
	t.Helper()
	if b, err := br.ReadByte(); err == nil {
		rest, _ := br.Peek(br.Buffered())
		t.Errorf("more after the answer: %q", append([]byte{b}, rest...))
	} else if !strings.Contains(err.Error(), "EOF") && !strings.Contains(err.Error(), "reset") {
		t.Errorf("after the answer: %v, want the end of the connection", err)
	}
}

// A request whose body is still arriving when the drain cuts it at its
// deadline got no response, as one whose client reset mid-body: every
// engine counts and logs it once as 499, with nothing sent (net/http and
// fasthttp answered the read of the closed connection 400), whether the
// engine reads that body or the core does (an idempotency key), and
// whether any of the body came. But fasthttp reads a body's first bytes
// before its handler, and drops a request whose connection the server
// closed under that read before anything of ours sees it: neither
// counted nor logged (README says so).
func TestDrainCutMidBodyIs499(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		key  string
		part int // body bytes sent of the 100000 declared
	}{
		{"plain", "", 1000},
		{"keyed", "Idempotency-Key: \"k1\"\r\n", 1000},
		{"unbegun", "", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			eachEngine(t, withNetHTTP(), func(t *testing.T, e storyEngine) {
				up := startUpstream(t, nil)
				statuses := make(chan int, 4)
				lines := make(chan core.AccessEntry, 4)
				c := configCoreWith(t, "[[idempotency]]\npath = \"/x\"\n", func(o *core.Options) {
					o.OnResponse = func(status int) { statuses <- status }
					o.AccessLog = accessFunc(func(e *core.AccessEntry) { lines <- *e })
				})
				r := e.serve(t, storyOptions{Upstream: up.URL(), Core: c})
				conn, _ := dial(t, r.Addr)
				io.WriteString(conn, "POST /x HTTP/1.1\r\nHost: a\r\n"+tc.key+"Content-Length: 100000\r\n\r\n")
				conn.Write(make([]byte, tc.part))
				time.Sleep(200 * time.Millisecond) // the engine waits for the rest
				ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
				defer cancel()
				r.Shutdown(ctx)
				if e.name == "fasthttp" && tc.part == 0 {
					time.Sleep(500 * time.Millisecond) // nothing comes
				} else {
					wantCountedGone(t, statuses)
					select {
					case l := <-lines:
						if l.Status != core.StatusClientClosed || l.Bytes != 0 {
							t.Errorf("logged %d with %d bytes sent, want %d with none", l.Status, l.Bytes, core.StatusClientClosed)
						}
					case <-time.After(time.Second):
						t.Error("not logged within a second")
					}
				}
				time.Sleep(200 * time.Millisecond) // a second count or line would come now
				if len(statuses) > 0 || len(lines) > 0 {
					t.Errorf("counted again (%d) or logged again (%d)", len(statuses), len(lines))
				}
			})
		})
	}
}

// TestUpstream499IsAnAnswer: a 499 the upstream sends is a response like
// any other, not the client gone (core.StatusClientClosed, which the core
// counts for a client that left): relayed, stored by the cache, and then
// served from it, on every engine. The engines once took a stored 499 for
// the core's own and sent nothing.
func TestUpstream499IsAnAnswer(t *testing.T) {
	t.Parallel()
	eachEngine(t, withNetHTTP(), func(t *testing.T, e storyEngine) {
		up := startUpstream(t, func(req *seenRequest, w *bufio.Writer, c net.Conn) {
			w.WriteString("HTTP/1.1 499 Custom\r\nCache-Control: max-age=3600\r\nContent-Length: 2\r\n\r\nhi")
		})
		c, _ := configCoreIn(t, "[table]\nresponses = 64\nresponse_bytes = \"256KiB\"\n[[cache]]\npath = \"/*\"\nmax_body = \"64KiB\"\n", func(*core.Options) {})
		r := e.serve(t, storyOptions{Upstream: up.URL(), Core: c})
		for _, want := range []string{"MISS", "HIT"} {
			conn, br := dial(t, r.Addr)
			conn.SetDeadline(time.Now().Add(5 * time.Second))
			resp, body := roundTrip(t, conn, br, "GET /s HTTP/1.1\r\nHost: a\r\n\r\n")
			conn.Close()
			if resp.StatusCode != 499 || string(body) != "hi" || resp.Header.Get("X-Cache") != want {
				t.Fatalf("%s: %d %q X-Cache %q, want the upstream's 499", want, resp.StatusCode, body, resp.Header.Get("X-Cache"))
			}
		}
	})
}
