package proxy_test

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/preforkd/preforkd/accesslog"
	"github.com/preforkd/preforkd/core"
	"github.com/preforkd/preforkd/engine"
	"github.com/preforkd/preforkd/internal/waitfor"
	"github.com/preforkd/preforkd/metrics"
)

// The answers a client has not taken yet, on every engine: the drain and
// the idle wait leave them alone, and pipelined requests queued behind
// them are requests, not an oversized head.

// Every engine: a response whose head went out before the drain began
// (no Connection: close) ends during the drain; the client, told
// nothing, sends its next request at once. The drain rule keeps the
// connection DrainIdleGrace: that request is answered, with
// Connection: close.
func TestDrainKeepsAConnectionNotToldToClose(t *testing.T) {
	t.Parallel()
	eachEngine(t, withNetHTTP(), func(t *testing.T, e storyEngine) {
		up := startUpstream(t, func(req *seenRequest, w *bufio.Writer, c net.Conn) {
			if req.Req.URL.Path == "/slow" {
				w.WriteString("HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nab")
				w.Flush()
				time.Sleep(400 * time.Millisecond)
				w.WriteString("cd")
				return
			}
			w.WriteString("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		})
		r := e.serve(t, storyOptions{Upstream: up.URL()})
		c, br := dial(t, r.Addr)
		resp := roundTripHead(t, c, br, "GET /slow HTTP/1.1\r\nHost: a\r\n\r\n")
		if resp.Close {
			t.Fatal("Connection: close before the drain")
		}
		go r.Shutdown(context.Background())
		if b := readBody(t, resp); string(b) != "abcd" {
			t.Fatalf("body %q", b)
		}
		io.WriteString(c, "GET /next HTTP/1.1\r\nHost: a\r\n\r\n")
		c.SetReadDeadline(time.Now().Add(3 * time.Second))
		resp2, err := http.ReadResponse(br, &http.Request{Method: "GET"})
		if err != nil {
			t.Fatalf("the next request: %v", err)
		}
		io.Copy(io.Discard, resp2.Body)
		if resp2.StatusCode != 200 || !resp2.Close {
			t.Errorf("the next request: %d close=%v", resp2.StatusCode, resp2.Close)
		}
	})
}

// Every engine: a cache hit of 16 MiB that the client starts reading a
// second after it asked (idle_timeout 300ms, send_timeout 5s) arrives
// whole: idle_timeout is the wait for the next request, not for the
// client to take its answer.
func TestIdleTimeoutWaitsForTheAnswerToGo(t *testing.T) {
	t.Parallel()
	eachEngine(t, readers, func(t *testing.T, e storyEngine) {
		big := strings.Repeat("x", 16<<20)
		up := startUpstream(t, func(req *seenRequest, w *bufio.Writer, c net.Conn) {
			w.WriteString("HTTP/1.1 200 OK\r\nCache-Control: max-age=600\r\nContent-Length: " + strconv.Itoa(len(big)) + "\r\n\r\n" + big)
		})
		rules := "[table]\ncounters = 1024\nresponses = 64\nresponse_bytes = \"64MiB\"\n[[cache]]\npath = \"/*\"\nmax_body = \"32MiB\"\n"
		r := e.serve(t, storyOptions{Upstream: up.URL(), Core: configCore(t, rules, nil),
			Limits: engine.Limits{IdleTimeout: 300 * time.Millisecond, SendTimeout: 5 * time.Second}})
		c0, br0 := dial(t, r.Addr)
		if resp, b := roundTrip(t, c0, br0, "GET /big HTTP/1.1\r\nHost: a\r\n\r\n"); resp.StatusCode != 200 || len(b) != len(big) {
			t.Fatalf("the fill: %d, %d bytes", resp.StatusCode, len(b))
		}
		c, br := dial(t, r.Addr)
		io.WriteString(c, "GET /big HTTP/1.1\r\nHost: a\r\n\r\n")
		time.Sleep(time.Second)
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		resp, err := http.ReadResponse(br, &http.Request{Method: "GET"})
		if err != nil {
			t.Fatal(err)
		}
		n, err := io.Copy(io.Discard, resp.Body)
		if err != nil || n != int64(len(big)) {
			t.Fatalf("the hit (X-Cache %s): got %d of %d bytes: %v", resp.Header.Get("X-Cache"), n, len(big), err)
		}
	})
}

// Every engine: a cache fill, then pipelined hits of a large cached
// answer, read only later: each is answered 200, in order, though more
// than max_header_bytes of them wait in the input while the answers do.
func TestPipelinedHitsBehindAFill(t *testing.T) {
	t.Parallel()
	eachEngine(t, readers, func(t *testing.T, e storyEngine) {
		big := strings.Repeat("x", 300<<10) // over the loop's highWater: reading the input is held
		up := startUpstream(t, func(req *seenRequest, w *bufio.Writer, c net.Conn) {
			time.Sleep(300 * time.Millisecond)
			w.WriteString("HTTP/1.1 200 OK\r\nCache-Control: max-age=600\r\nContent-Length: " + strconv.Itoa(len(big)) + "\r\n\r\n" + big)
		})
		rules := "[table]\ncounters = 1024\nresponses = 64\nresponse_bytes = \"8MiB\"\n[[cache]]\npath = \"/*\"\nmax_body = \"2MiB\"\n"
		r := e.serve(t, storyOptions{Upstream: up.URL(), Core: configCore(t, rules, nil)})
		c, br := dial(t, r.Addr)
		const n = 80 // 88 KiB of requests: more than max_header_bytes held in the input
		req := "GET /big HTTP/1.1\r\nHost: a\r\nX-Pad: " + strings.Repeat("p", 1000) + "\r\n\r\n"
		go io.WriteString(c, strings.Repeat(req, n))
		time.Sleep(600 * time.Millisecond)
		c.SetReadDeadline(time.Now().Add(30 * time.Second))
		for i := range n {
			resp, err := http.ReadResponse(br, &http.Request{Method: "GET"})
			if err != nil {
				t.Fatalf("response %d: %v", i, err)
			}
			b, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != 200 || len(b) != len(big) {
				t.Fatalf("response %d of %d pipelined: %d, %d bytes", i, n, resp.StatusCode, len(b))
			}
		}
	})
}

// The loop and net/http: a client that goes away (a reset) while its
// request is with the upstream is counted as 499 at once, as nginx logs
// it, not as a 5xx that the canary would take for the server's error,
// and its upstream request is cut. (fasthttp does not watch a connection
// while its handler runs: README says so.)
func TestClientGoneBeforeItsResponseIs499(t *testing.T) {
	t.Parallel()
	eachEngine(t, watchingEngines(), func(t *testing.T, e storyEngine) {
		_, conn, statuses := requestWithTheUpstream(t, e)
		conn.(*net.TCPConn).SetLinger(0) // a reset
		conn.Close()
		wantCountedGone(t, statuses)
	})
}

// The loop and net/http: a request the drain cuts at its deadline, with
// the upstream and no response begun, is counted as 499 like one whose
// client went: the client got no response, and it is no server error
// that a canary judges. (The loop counted a 500 no client was sent.)
func TestDrainCutBeforeItsResponseIs499(t *testing.T) {
	t.Parallel()
	eachEngine(t, watchingEngines(), func(t *testing.T, e storyEngine) {
		r, _, statuses := requestWithTheUpstream(t, e)
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		r.Shutdown(ctx)
		wantCountedGone(t, statuses)
	})
}

// requestWithTheUpstream serves e in front of an upstream that holds
// every request until the test ends, and sends it one: it returns when
// the request has been with the upstream a moment, and the statuses the
// core counts.
func requestWithTheUpstream(t *testing.T, e storyEngine) (*running, net.Conn, <-chan int) {
	t.Helper()
	release := make(chan struct{})
	up := startUpstream(t, func(req *seenRequest, w *bufio.Writer, c net.Conn) {
		<-release
		w.WriteString("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
	})
	statuses := make(chan int, 4)
	c := configCoreWith(t, "", func(o *core.Options) { o.OnResponse = func(status int) { statuses <- status } })
	r := e.serve(t, storyOptions{Upstream: up.URL(), Core: c})
	t.Cleanup(func() { close(release) }) // first of the clean-ups: the upstream's stop waits for its handler
	conn, _ := dial(t, r.Addr)
	io.WriteString(conn, "GET /slow HTTP/1.1\r\nHost: a\r\n\r\n")
	time.Sleep(100 * time.Millisecond) // with the upstream
	return r, conn, statuses
}

// The loop and net/http: a client that goes away while its request waits
// for another's (a duplicate of an idempotency key in flight) is counted
// as 499, as one that goes away while its request is with the upstream,
// not as the 409 nobody read.
// It is counted under preforkd_idempotency_requests_total as gone: it
// got neither the original's response nor a conflict.
func TestClientGoneWhileItsDuplicateWaitsIs499(t *testing.T) {
	t.Parallel()
	clientGoneWhileWaiting(t, "POST /orders HTTP/1.1\r\nHost: a\r\nIdempotency-Key: \"k1\"\r\nContent-Length: 2\r\n\r\nhi", func(t *testing.T, s *metrics.Snapshot) {
		got := func(res int) uint64 { return s.Value(metrics.IdempotencyRequests, res) }
		if got(metrics.IdemExecuted) != 1 || got(metrics.IdemGone) != 1 || got(metrics.IdemConflict) != 0 {
			t.Errorf("executed %d, gone %d, conflict %d; want 1, 1, 0",
				got(metrics.IdemExecuted), got(metrics.IdemGone), got(metrics.IdemConflict))
		}
	})
}

// The loop and net/http: a client that goes away while its miss waits for
// another's fetch of the same response is counted as 499, and its request
// is not forwarded after all (net/http forwarded it, for nobody, once the
// wait ended).
func TestClientGoneWhileItsMissWaitsIsNotForwarded(t *testing.T) {
	t.Parallel()
	clientGoneWhileWaiting(t, "GET /c HTTP/1.1\r\nHost: a\r\n\r\n", nil)
}

// clientGoneWhileWaiting sends req twice, the second while the upstream
// holds the first, and resets the second client while its request waits
// for the first: on the loop and net/http it is counted 499, and never
// reaches the application; check, unless nil, is then given the
// statistics.
func clientGoneWhileWaiting(t *testing.T, req string, check func(t *testing.T, s *metrics.Snapshot)) {
	eachEngine(t, watchingEngines(), func(t *testing.T, e storyEngine) {
		release := make(chan struct{})
		up := startUpstream(t, func(req *seenRequest, w *bufio.Writer, c net.Conn) {
			<-release
			w.WriteString("HTTP/1.1 200 OK\r\nCache-Control: max-age=60\r\nContent-Length: 2\r\n\r\nok")
		})
		statuses := make(chan int, 4)
		lines := make(chan core.AccessEntry, 4)
		c, region := configCoreIn(t, "[[idempotency]]\npath = \"/orders\"\n[[cache]]\npath = \"/c\"\n", func(o *core.Options) {
			o.OnResponse = func(status int) { statuses <- status }
			o.AccessLog = accessFunc(func(e *core.AccessEntry) { lines <- *e })
		})
		r := e.serve(t, storyOptions{Upstream: up.URL(), Core: c})
		first, _ := dial(t, r.Addr)
		io.WriteString(first, req)
		if !waitfor.Cond(5*time.Second, func() bool { return len(up.Requests()) == 1 }) {
			t.Fatal("the first request did not reach the upstream")
		}
		second, _ := dial(t, r.Addr)
		io.WriteString(second, req)
		time.Sleep(100 * time.Millisecond) // waiting for the first
		second.(*net.TCPConn).SetLinger(0) // a reset
		second.Close()
		wantCountedGone(t, statuses)
		if e := <-lines; e.Status != core.StatusClientClosed || e.Bytes != 0 {
			t.Errorf("logged as %d with %d bytes sent, want %d with none", e.Status, e.Bytes, core.StatusClientClosed)
		}
		close(release)
		if !waitfor.Cond(5*time.Second, func() bool { return len(statuses) == 1 }) {
			t.Error("the first request was not counted")
		}
		if n := len(up.Requests()); n != 1 {
			t.Errorf("the upstream got %d requests, want 1: the waiting client's went on after it left", n)
		}
		if check != nil {
			var s metrics.Snapshot
			metrics.Read(region, &s)
			check(t, &s)
		}
	})
}

// accessFunc is a core.AccessLog that calls itself.
type accessFunc func(e *core.AccessEntry)

func (f accessFunc) Log(e *core.AccessEntry) { f(e) }

// A request whose body stops arriving before it went upstream ends in 408
// with no upstream time, on every engine, forwarding or serving an
// application: the access log says "-" (and the upstream histogram counts
// nothing), as for any request the application never got. The clock
// starts when the request goes to the application, not when the core let
// it pass.
func TestBodyTimeoutBeforeUpstreamHasNoUpstreamTime(t *testing.T) {
	t.Parallel()
	const req = "POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 300000\r\n\r\nab"
	// check sends the request, and wants either a 408 with no upstream
	// time, or (an application given the request before its body: the
	// fast engine's streams it) the application's answer with one.
	check := func(t *testing.T, e storyEngine, o storyOptions) {
		lines := make(chan core.AccessEntry, 4)
		o.Core = configCoreWith(t, "", func(o *core.Options) {
			o.AccessLog = accessFunc(func(e *core.AccessEntry) { lines <- *e })
		})
		o.Limits = engine.Limits{ClientBodyTimeout: 300 * time.Millisecond}
		r := e.serve(t, o)
		conn, br := dial(t, r.Addr)
		// A whole request first: it reached the application.
		io.WriteString(conn, "POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\n\r\nab")
		if resp, _ := readResponse(t, br, "POST"); resp.StatusCode != http.StatusOK {
			t.Fatalf("a whole request: status %d", resp.StatusCode)
		}
		if l := <-lines; l.Upstream < 0 {
			t.Errorf("a whole request: logged %d with no upstream time", l.Status)
		}
		io.WriteString(conn, req)
		resp, _ := readResponse(t, br, "POST")
		if resp.StatusCode != http.StatusRequestTimeout && (o.App == nil || resp.StatusCode != http.StatusOK) {
			t.Errorf("status %d, want 408", resp.StatusCode)
		}
		select {
		case l := <-lines:
			if l.Status != resp.StatusCode {
				t.Errorf("logged %d, sent %d", l.Status, resp.StatusCode)
			}
			if went := l.Status == http.StatusOK; went != (l.Upstream >= 0) {
				t.Errorf("logged %d with upstream time %v: want one only for a request that reached the application", l.Status, l.Upstream)
			}
		case <-time.After(5 * time.Second):
			t.Error("no access log entry within 5 s")
		}
	}
	eachEngine(t, withNetHTTP(), func(t *testing.T, e storyEngine) {
		up := startUpstream(t, nil)
		check(t, e, storyOptions{Upstream: up.URL()})
		if n := len(up.Requests()); n != 1 {
			t.Errorf("the upstream saw %d requests, want the whole one alone", n)
		}
	})
	t.Run("app", func(t *testing.T) {
		t.Parallel()
		eachEngine(t, readers, func(t *testing.T, e storyEngine) {
			check(t, e, storyOptions{App: func(string) int { return 200 }})
		})
	})
}

// accessBoth is a core.AccessLog that gives each entry to every log.
type accessBoth []*accesslog.Log

func (b accessBoth) Log(e *core.AccessEntry) {
	for _, l := range b {
		l.Log(e)
	}
}

// The access log's target is the request target as the client sent it,
// an absolute-form one included (nginx's $request is the request line as
// received), in the combined format and in JSON, on every engine; an
// origin-form one is its path and query, as before.
func TestAccessLogTargetAsSent(t *testing.T) {
	t.Parallel()
	eachEngine(t, withNetHTTP(), func(t *testing.T, e storyEngine) {
		up := startUpstream(t, nil)
		dir := t.TempDir()
		var logs accessBoth
		for _, f := range []accesslog.Format{accesslog.Combined, accesslog.JSON} {
			l, err := accesslog.New(accesslog.Options{Path: filepath.Join(dir, strconv.Itoa(int(f))), Format: f, FlushEvery: time.Hour})
			if err != nil {
				t.Fatal(err)
			}
			logs = append(logs, l)
		}
		served := make(chan struct{}, 4)
		c := configCoreWith(t, "", func(o *core.Options) {
			o.AccessLog = accessFunc(func(e *core.AccessEntry) { logs.Log(e); served <- struct{}{} })
		})
		r := e.serve(t, storyOptions{Upstream: up.URL(), Core: c})
		conn, br := dial(t, r.Addr)
		targets := []string{"http://App.example:8080/p?q=1", "http://app.example?q=2", "/o?q=3"}
		for _, target := range targets {
			io.WriteString(conn, "GET "+target+" HTTP/1.1\r\nHost: a\r\n\r\n")
			if resp, _ := readResponse(t, br, "GET"); resp.StatusCode != http.StatusOK {
				t.Fatalf("%s: status %d", target, resp.StatusCode)
			}
			select {
			case <-served:
			case <-time.After(5 * time.Second):
				t.Fatalf("%s: not logged within 5 s", target)
			}
		}
		for _, l := range logs {
			l.Close()
		}
		combined, _ := os.ReadFile(filepath.Join(dir, strconv.Itoa(int(accesslog.Combined))))
		json, _ := os.ReadFile(filepath.Join(dir, strconv.Itoa(int(accesslog.JSON))))
		for _, target := range targets {
			if want := `"GET ` + target + ` HTTP/1.1"`; !strings.Contains(string(combined), want) {
				t.Errorf("combined: no %s in\n%s", want, combined)
			}
			if want := `"target":"` + target + `"`; !strings.Contains(string(json), want) {
				t.Errorf("json: no %s in\n%s", want, json)
			}
		}
	})
}

// A 413 of preforkd's own says RFC 9110's name for it, Content Too Large,
// in its problem's title and, where the engine writes its status line
// itself (the loop, the fast engine), in its reason phrase too, on every
// engine: Go's and fasthttp's status texts keep RFC 2616's Request Entity
// Too Large.
func TestContentTooLarge(t *testing.T) {
	t.Parallel()
	eachEngine(t, withNetHTTP(), func(t *testing.T, e storyEngine) {
		up := startUpstream(t, nil)
		c := configCore(t, "[server]\nmax_request_body = 4\n[[idempotency]]\npath = \"/orders\"\n", nil)
		r := e.serve(t, storyOptions{Upstream: up.URL(), Core: c})
		conn, br := dial(t, r.Addr)
		io.WriteString(conn, "POST /orders HTTP/1.1\r\nHost: a\r\nIdempotency-Key: \"k1\"\r\nContent-Length: 10\r\n\r\n0123456789")
		resp, body := readResponse(t, br, "POST")
		if resp.StatusCode != http.StatusRequestEntityTooLarge || !strings.Contains(string(body), `"title":"Content Too Large"`) {
			t.Errorf("%d %s, want 413 titled Content Too Large", resp.StatusCode, body)
		}
		// net/http writes the status line of what a handler answers
		// itself, with Go's status text: a reason phrase, which clients
		// ignore (RFC 9112 §4), that the engine cannot choose.
		if e.name != "nethttp-forward" && resp.Status != "413 Content Too Large" {
			t.Errorf("status line %q, want 413 Content Too Large", resp.Status)
		}
		// 422 too is RFC 9110's Unprocessable Content (§15.5.21): the
		// idempotency key reused with another body.
		conn, br = dial(t, r.Addr)
		io.WriteString(conn, "POST /orders HTTP/1.1\r\nHost: a\r\nIdempotency-Key: \"k2\"\r\nContent-Length: 2\r\n\r\nab")
		if resp, body := readResponse(t, br, "POST"); resp.StatusCode != http.StatusOK {
			t.Fatalf("first: %d %s", resp.StatusCode, body)
		}
		io.WriteString(conn, "POST /orders HTTP/1.1\r\nHost: a\r\nIdempotency-Key: \"k2\"\r\nContent-Length: 2\r\n\r\ncd")
		resp, body = readResponse(t, br, "POST")
		if resp.StatusCode != http.StatusUnprocessableEntity || !strings.Contains(string(body), `"title":"Unprocessable Content"`) {
			t.Errorf("%d %s, want 422 titled Unprocessable Content", resp.StatusCode, body)
		}
		if e.name != "nethttp-forward" && resp.Status != "422 Unprocessable Content" {
			t.Errorf("status line %q, want 422 Unprocessable Content", resp.Status)
		}
	})
}

// An application served in process gets the path the core forwards
// (dot segments resolved), which fasthttp's engine writes in place of
// the target it read: the access log still has the target as sent.
func TestAccessLogTargetAsSentToAnApp(t *testing.T) {
	t.Parallel()
	eachEngine(t, readers, func(t *testing.T, e storyEngine) {
		lines := make(chan string, 4)
		c := configCoreWith(t, "", func(o *core.Options) {
			o.AccessLog = accessFunc(func(e *core.AccessEntry) { lines <- e.Target })
		})
		r := e.serve(t, storyOptions{App: func(string) int { return 200 }, Core: c})
		conn, br := dial(t, r.Addr)
		const target = "/a/./b/../c?q=1"
		io.WriteString(conn, "GET "+target+" HTTP/1.1\r\nHost: a\r\n\r\n")
		if resp, _ := readResponse(t, br, "GET"); resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d", resp.StatusCode)
		}
		select {
		case got := <-lines:
			if got != target {
				t.Errorf("logged target %q, want %q as sent", got, target)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("not logged within 5 s")
		}
	})
}

// wantCountedGone waits for a request whose client reset its connection
// to be counted, as 499.
func wantCountedGone(t *testing.T, statuses <-chan int) {
	t.Helper()
	select {
	case status := <-statuses:
		if status != core.StatusClientClosed {
			t.Errorf("counted as %d, want %d", status, core.StatusClientClosed)
		}
	case <-time.After(5 * time.Second):
		t.Error("not counted within 5 s of the client's reset")
	}
}
