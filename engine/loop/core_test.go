//go:build linux

package loop_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/preforkd/preforkd/engine/loop"
	"github.com/preforkd/preforkd/internal/wiretest"
)

// The core's stages through the loop: what the core makes wait is
// finished off the loop, and every other connection of the loop goes on
// meanwhile.

const idemRules = "[table]\ncounters = 1024\nresponses = 64\nresponse_bytes = \"64KiB\"\n" +
	"[[idempotency]]\npath = \"/orders\"\nmax_body = \"4KiB\"\nwait = \"5s\"\n"

// Twenty duplicates of one keyed request at once: the upstream runs it
// once, nineteen wait (on the waiters) and get its response replayed;
// while they wait, other requests on the same loop are answered.
func TestParallelDuplicatesRunOnce(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	var runs atomic.Int32
	up := wiretest.StartUpstream(t, func(req *wiretest.Seen, w *bufio.Writer, c net.Conn) {
		if req.Req.URL.Path == "/orders" {
			runs.Add(1)
			<-release
			fmt.Fprintf(w, "HTTP/1.1 201 Created\r\nContent-Type: application/json\r\nContent-Length: 12\r\n\r\n{\"order\":42}")
			return
		}
		w.WriteString("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
	})
	addr, _ := serve(t, loop.Options{Upstream: up.URL(), Loops: 1, Core: configCore(t, idemRules)})
	const n = 20
	answers := make(chan string, n)
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			c, br := dial(t, addr)
			resp, body := roundTrip(t, c, br, "POST /orders HTTP/1.1\r\nHost: a\r\nIdempotency-Key: \"k1\"\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n{\"item\":42}")
			answers <- fmt.Sprintf("%d %s replayed=%s", resp.StatusCode, body, resp.Header.Get("Idempotent-Replayed"))
		})
	}
	deadline := time.Now().Add(5 * time.Second)
	for runs.Load() == 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond) // the duplicates arrive, and wait
	c, br := dial(t, addr)
	if resp, _ := roundTrip(t, c, br, "GET /other HTTP/1.1\r\nHost: a\r\n\r\n"); resp.StatusCode != 200 {
		t.Errorf("a request beside the waiting duplicates: %d", resp.StatusCode)
	}
	close(release)
	wg.Wait()
	close(answers)
	got := map[string]int{}
	for a := range answers {
		got[a]++
	}
	want := map[string]int{`201 {"order":42} replayed=`: 1, `201 {"order":42} replayed=true`: n - 1}
	if fmt.Sprint(got) != fmt.Sprint(want) || runs.Load() != 1 {
		t.Errorf("answers %v, the upstream ran it %d times; want %v, once", got, runs.Load(), want)
	}
}

// Fifty misses of one cacheable URL at once: one fetch, forty-nine hits
// after a wait on the waiters.
func TestCacheOneFetchPerMiss(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	var fetches atomic.Int32
	up := wiretest.StartUpstream(t, func(req *wiretest.Seen, w *bufio.Writer, c net.Conn) {
		fetches.Add(1)
		<-release
		w.WriteString("HTTP/1.1 200 OK\r\nCache-Control: max-age=60\r\nContent-Length: 3\r\n\r\nhot")
	})
	addr, _ := serve(t, loop.Options{Upstream: up.URL(), Core: configCore(t,
		"[table]\ncounters = 1024\nresponses = 64\nresponse_bytes = \"64KiB\"\n[[cache]]\npath = \"/*\"\nmax_body = \"4KiB\"\n")})
	const n = 50
	xc := make(chan string, n)
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			c, br := dial(t, addr)
			resp, body := roundTrip(t, c, br, "GET /hot HTTP/1.1\r\nHost: a\r\n\r\n")
			xc <- resp.Header.Get("X-Cache") + " " + string(body)
		})
	}
	time.Sleep(300 * time.Millisecond)
	close(release)
	wg.Wait()
	close(xc)
	got := map[string]int{}
	for x := range xc {
		got[x]++
	}
	if got["MISS hot"] != 1 || got["HIT hot"] != n-1 || fetches.Load() != 1 {
		t.Errorf("X-Cache %v, %d fetches; want one MISS, %d HIT, one fetch", got, fetches.Load(), n-1)
	}
}

// Expect: 100-continue is decided first: a request the rules refuse gets
// its 429 without 100 Continue and its body is never read; one they let
// through gets 100 Continue, then its answer.
func TestExpectDecidedFirst(t *testing.T) {
	t.Parallel()
	up := wiretest.StartUpstream(t, nil)
	addr, _ := serve(t, loop.Options{Upstream: up.URL(), Core: configCore(t,
		"[table]\ncounters = 1024\n[[ratelimit]]\nname = \"up\"\npath = \"/up\"\nlimit = 1\nwindow = \"1m\"\n")})
	for i, want := range []int{200, 429} {
		c, br := dial(t, addr)
		io.WriteString(c, "POST /up HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n")
		resp := readHead(t, br, "POST")
		if want == 429 {
			if resp.StatusCode != 429 {
				t.Fatalf("request %d: %d, want 429 without 100 Continue", i, resp.StatusCode)
			}
			readBody(t, resp)
			if !isClosed(t, c, br) {
				t.Error("the connection of a refused Expect request stays open: its body may follow")
			}
			continue
		}
		if resp.StatusCode != 100 {
			t.Fatalf("request %d: %d, want 100 Continue", i, resp.StatusCode)
		}
		io.WriteString(c, "hello")
		if resp, body := readResponse(t, br, "POST"); resp.StatusCode != 200 || string(body) != "ok" {
			t.Fatalf("request %d after its body: %d %q", i, resp.StatusCode, body)
		}
	}
	if seen := up.Requests(); len(seen) != 1 || string(seen[0].Body) != "hello" {
		t.Errorf("the upstream saw %d requests", len(seen))
	}
}

// The body of a keyed request is read before the core fingerprints it:
// one over max_request_body is a 413 from the core, never forwarded; a
// body that arrives slowly is waited for (not a loop's wait: its other
// connections are answered meanwhile).
func TestBodyReadForTheFingerprint(t *testing.T) {
	t.Parallel()
	up := wiretest.StartUpstream(t, func(req *wiretest.Seen, w *bufio.Writer, c net.Conn) {
		fmt.Fprintf(w, "HTTP/1.1 201 Created\r\nContent-Length: %d\r\n\r\n%s", len(req.Body), req.Body)
	})
	addr, _ := serve(t, loop.Options{Upstream: up.URL(), Loops: 1,
		Core: configCore(t, "[server]\nmax_request_body = 16\n"+idemRules)})
	c, br := dial(t, addr)
	resp, body := roundTrip(t, c, br, "POST /orders HTTP/1.1\r\nHost: a\r\nIdempotency-Key: \"k2\"\r\nTransfer-Encoding: chunked\r\n\r\n"+
		"10\r\n0123456789abcdef\r\n1\r\nx\r\n0\r\n\r\n")
	if resp.StatusCode != 413 {
		t.Errorf("a keyed body over max_request_body: %d %s", resp.StatusCode, body)
	}

	slow, slowR := dial(t, addr)
	io.WriteString(slow, "POST /orders HTTP/1.1\r\nHost: a\r\nIdempotency-Key: \"k3\"\r\nContent-Length: 6\r\n\r\nabc")
	other, otherR := dial(t, addr)
	if resp, _ := roundTrip(t, other, otherR, "GET /x HTTP/1.1\r\nHost: a\r\n\r\n"); resp.StatusCode != 201 {
		t.Errorf("a request beside a body on its way: %d", resp.StatusCode)
	}
	time.Sleep(100 * time.Millisecond)
	io.WriteString(slow, "def")
	if resp, body := readResponse(t, slowR, "POST"); resp.StatusCode != 201 || string(body) != "abcdef" {
		t.Errorf("the keyed request: %d %q", resp.StatusCode, body)
	}
	if n := len(up.Requests()); n != 2 {
		t.Errorf("the upstream saw %d requests, want 2 (the refused one never)", n)
	}
}

// A response the core keeps for a retry is read to its end when its
// client went away, and replayed to the retry.
func TestClientGoneStillStores(t *testing.T) {
	t.Parallel()
	var runs atomic.Int32
	up := wiretest.StartUpstream(t, func(req *wiretest.Seen, w *bufio.Writer, c net.Conn) {
		runs.Add(1)
		w.WriteString("HTTP/1.1 201 Created\r\nContent-Length: 4\r\n\r\n")
		w.Flush()
		time.Sleep(200 * time.Millisecond)
		w.WriteString("done")
	})
	addr, _ := serve(t, loop.Options{Upstream: up.URL(), Core: configCore(t, idemRules)})
	req := "POST /orders HTTP/1.1\r\nHost: a\r\nIdempotency-Key: \"k4\"\r\nContent-Length: 2\r\n\r\n{}"
	c, br := dial(t, addr)
	io.WriteString(c, req)
	readHead(t, br, "POST")
	c.Close() // gone mid-body
	time.Sleep(400 * time.Millisecond)
	c2, br2 := dial(t, addr)
	resp, body := roundTrip(t, c2, br2, req)
	if resp.StatusCode != 201 || string(body) != "done" || resp.Header.Get("Idempotent-Replayed") != "true" || runs.Load() != 1 {
		t.Errorf("the retry: %d %q replayed=%q, the upstream ran %d times", resp.StatusCode, body, resp.Header.Get("Idempotent-Replayed"), runs.Load())
	}
}

// The waiters for other requests are bounded and never queued for: a
// client whose duplicates of its own in-flight request hold them all
// delays no one else's. Another client's duplicate, with none free, is
// answered at once (409, as when its wait runs out), not after the
// first's wait.
func TestLongWaitsNeverQueue(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	var runs atomic.Int32
	up := wiretest.StartUpstream(t, func(req *wiretest.Seen, w *bufio.Writer, c net.Conn) {
		runs.Add(1)
		<-release
		w.WriteString("HTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\nok")
	})
	addr, _ := serve(t, loop.Options{Upstream: up.URL(), Loops: 1, Waiters: 1, Core: configCore(t, idemRules)})
	order := func(key string) (int, string) {
		c, br := dial(t, addr)
		resp, _ := roundTrip(t, c, br, "POST /orders HTTP/1.1\r\nHost: a\r\nIdempotency-Key: \""+key+"\"\r\nContent-Length: 2\r\n\r\n{}")
		return resp.StatusCode, resp.Header.Get("Retry-After")
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	defer close(release)
	for _, key := range []string{"a", "b"} { // two originals, in flight until released
		wg.Go(func() { order(key) })
	}
	for deadline := time.Now().Add(5 * time.Second); runs.Load() < 2 && time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond)
	}
	wg.Go(func() { order("a") }) // a's duplicate takes the one waiter (wait = "5s")
	time.Sleep(100 * time.Millisecond)
	start := time.Now()
	status, retry := order("b")
	if took := time.Since(start); status != 409 || retry == "" || took > 2*time.Second {
		t.Errorf("b's duplicate, the one waiter busy: %d (Retry-After %q) after %v; want 409 at once, not after a's wait", status, retry, took)
	}
}
