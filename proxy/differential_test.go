package proxy_test

import (
	"bufio"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/preforkd/preforkd/engine"
)

// TestEnginesAgreeOnMutatedRequests sends the same requests, mutated the
// way request smugglers mutate them, to every engine that parses the
// request's bytes itself (fasthttp and the event loop: net/http decides
// by its own rules, the conformance rows say where), each followed on the
// same connection by a plain request, and compares what each engine did:
// the statuses the client got, in order, and the requests the upstream
// saw, with their framing and bodies. Two engines that read one request
// two ways are what the one request path is there to prevent. The
// mutations are drawn from a fixed seed: the same every run.
func TestEnginesAgreeOnMutatedRequests(t *testing.T) {
	t.Parallel()
	es := readers // net/http is not among them: see above
	if len(es) < 2 {
		t.Skip("one engine parses requests itself on this system")
	}
	rng := rand.New(rand.NewPCG(20, 2026))
	n := 200
	if testing.Short() {
		n = 100
	}
	reqs := make([]string, n)
	for i := range reqs {
		reqs[i] = mutateRequest(rng)
	}
	inBatches(t, n, func(t *testing.T, i int) {
		compareEngines(t, reqs[i], es, exchangeOnce)
	})
}

// inBatches runs each(i) for i in [0, n) as subtests, in eight batches
// that run in parallel, each one subtest at a time: a subtest's servers
// and regions go before its batch's next, and the waits of the engines'
// timeouts overlap.
func inBatches(t *testing.T, n int, each func(t *testing.T, i int)) {
	const batches = 8
	for b := range batches {
		t.Run(fmt.Sprintf("batch%d", b), func(t *testing.T) {
			t.Parallel()
			for i := b; i < n; i += batches {
				t.Run(fmt.Sprint(i), func(t *testing.T) { each(t, i) })
			}
		})
	}
}

// compareEngines runs one case on every engine of es and fails where an
// engine's outcome differs from the first's.
func compareEngines(t *testing.T, in string, es []storyEngine, run func(*testing.T, storyEngine, string) string) {
	var first, firstEngine string
	for _, e := range es {
		got := run(t, e, in)
		if first == "" {
			first, firstEngine = got, e.name
		} else if got != first {
			t.Errorf("%q:\n%s: %s\n%s: %s", in, firstEngine, first, e.name, got)
		}
	}
}

// exchangeOnce serves one connection with e, in front of an upstream
// that records what it gets, sends req then a plain GET and a last one
// that closes the connection, and tells what came of it. The engine's
// timeouts (1 s) end a request that waits for bytes that never come, on
// the engine's side, alike on each; far below the client's backstop.
func exchangeOnce(t *testing.T, e storyEngine, req string) string {
	up := startUpstream(t, nil)
	r := e.serve(t, storyOptions{Upstream: up.URL(), Limits: engine.Limits{MaxHeaderBytes: 8 << 10,
		ReadHeaderTimeout: time.Second, ClientBodyTimeout: time.Second, IdleTimeout: time.Second}})
	c, err := net.Dial("tcp", r.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	io.WriteString(c, req+"GET /second HTTP/1.1\r\nHost: a\r\n\r\nGET /last HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
	br := bufio.NewReader(c)
	var statuses []string
	// The first answer is to req, which may be a HEAD: its body, if any
	// were read, would be the next answer.
	first := &http.Request{Method: http.MethodGet}
	if strings.HasPrefix(req, "HEAD ") {
		first.Method = http.MethodHead
	}
	for range 6 {
		resp, err := http.ReadResponse(br, first)
		if err != nil {
			break
		}
		if resp.StatusCode >= 200 {
			first = nil // the next ones answer the GETs
		}
		_, err = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		statuses = append(statuses, fmt.Sprint(resp.StatusCode))
		if err != nil || resp.Close {
			break
		}
	}
	var seen []string
	for _, s := range up.Requests() {
		seen = append(seen, fmt.Sprintf("%s cl=%q te=%q body=%q", s.Line, s.Field("Content-Length"), s.Field("Transfer-Encoding"), s.Body))
	}
	if len(seen) == 0 && len(statuses) == 1 && statuses[0] >= "400" {
		// Refused, and nothing after: which fault an engine names first
		// (a 505 for the version, a 400 for a field, a 408 for a head
		// that never ends) may differ.
		return "refused"
	}
	return fmt.Sprintf("client %v; upstream %v", statuses, seen)
}

// The pieces mutateRequest draws from.
var (
	mutMethods  = []string{"GET", "POST", "PUT", "get", "G ET", "POST\t", "HEAD"}
	mutTargets  = []string{"/", "/a?b=c", "http://a/x", "*", "/a b", "/%00", "//x", "/a#f", ""}
	mutVersions = []string{"HTTP/1.1", "HTTP/1.0", "HTTP/1.2", "HTTP/2.0", "http/1.1", "HTTP/1.1 ", "HTTP/1.10", "HTTP/01.1"}
	mutFields   = []string{
		"Host: a", "Host: b", "Host:", "Host : a", "host: a",
		"Content-Length: 5", "Content-Length: 0", "Content-Length: 05", "Content-Length: +5", "Content-Length: 5, 5",
		"Content-Length: 5 ", "Content-Length:  5", "Content-Length: 4", "Content-Length: -1", "Content-Length: 0x5",
		"Content-Length: 99999999999999999999", "Content-Length : 5", "Content-Length:\t5",
		"Transfer-Encoding: chunked", "Transfer-Encoding: Chunked", "Transfer-Encoding: chunked, identity",
		"Transfer-Encoding: identity, chunked", "Transfer-Encoding: xchunked", "Transfer-Encoding: chunked ",
		"Transfer-Encoding:\tchunked", "Transfer-Encoding : chunked", "Transfer-Encoding: gzip", "Transfer-Encoding:",
		"Transfer-Encoding: \"chunked\"", "Transfer-Encoding: chunked\x0b", "Transfer_Encoding: chunked",
		"Connection: close", "Connection: keep-alive", "Connection: Transfer-Encoding", "Connection: Content-Length",
		"Expect: 100-continue", "Upgrade: websocket", "X-A: b", "X-A: b\x00c", "X-A: b\rc", "X-Forwarded-For: 1.2.3.4",
		" X-Folded: 1", "\tX-Folded: 1", "X-Empty:", ": no-name", "No-Colon", "X-\x7f: 1",
	}
	mutBodies = []string{"", "hello", "0\r\n\r\n", "5\r\nhello\r\n0\r\n\r\n", "5\r\nhello\r\n0\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: a\r\n\r\n",
		"hello\r\n", "GET /smuggled HTTP/1.1\r\nHost: a\r\n\r\n", "5;x=y\r\nhello\r\n0\r\nT: 1\r\n\r\n", "5\nhello\n0\n\n", "ffffffffffffffff\r\n"}
	mutEnds = []string{"\r\n", "\r\n", "\r\n", "\n", "\r", "\r\r\n"}
)

// mutateRequest draws a request: a line, up to four fields, an end of
// line style, a body.
func mutateRequest(rng *rand.Rand) string {
	pick := func(s []string) string { return s[rng.IntN(len(s))] }
	eol := "\r\n"
	if rng.IntN(8) == 0 {
		eol = pick(mutEnds)
	}
	var b strings.Builder
	b.WriteString(pick(mutMethods) + " " + pick(mutTargets) + " " + pick(mutVersions) + eol)
	fields := []string{"Host: a"}
	for range rng.IntN(4) {
		fields = append(fields, pick(mutFields))
	}
	if rng.IntN(4) == 0 {
		fields = fields[1:]
	}
	rng.Shuffle(len(fields), func(i, j int) { fields[i], fields[j] = fields[j], fields[i] })
	fields = slices.Compact(fields)
	for _, f := range fields {
		b.WriteString(f + eol)
	}
	b.WriteString(eol)
	b.WriteString(pick(mutBodies))
	return b.String()
}

// TestEnginesAgreeOnMutatedResponses is the same for what an upstream
// answers: the same mutated responses, to a GET and the plain request
// after it on the same connection, through every engine that reads the
// upstream itself (all three), and what each client got compared: the
// statuses, the bodies, whether the response ended whole, and on how
// many upstream connections the two requests went.
func TestEnginesAgreeOnMutatedResponses(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(9, 2026))
	n := 100
	if testing.Short() {
		n = 30
	}
	replies := make([]string, n)
	for i := range replies {
		replies[i] = mutateResponse(rng)
	}
	es := withNetHTTP()
	inBatches(t, n, func(t *testing.T, i int) {
		compareEngines(t, replies[i], es, relayOnce)
	})
}

// relayOnce serves one connection with e in front of an upstream that
// answers the first request with reply and the next with a plain 200,
// and tells what the client got.
func relayOnce(t *testing.T, e storyEngine, reply string) string {
	up := startUpstream(t, func(req *seenRequest, w *bufio.Writer, c net.Conn) {
		if req.Line != "GET /first HTTP/1.1" {
			w.WriteString("HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nsecond")
			return
		}
		w.WriteString(reply)
		w.Flush()
		// What comes after the reply is the upstream's to decide: it
		// closes when it said so, or when its body has no end.
		if strings.Contains(strings.ToLower(reply), "connection: close") || !strings.Contains(reply, "\r\n\r\n") {
			c.Close()
		}
	})
	// A body that never ends is cut by the upstream timeout, far before
	// the client stops waiting.
	r := e.serve(t, storyOptions{Upstream: up.URL(), Client: engine.Upstream{Timeout: time.Second}})
	c, err := net.Dial("tcp", r.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	io.WriteString(c, "GET /first HTTP/1.1\r\nHost: a\r\n\r\nGET /second HTTP/1.1\r\nHost: a\r\n\r\n")
	br := bufio.NewReader(c)
	var got []string
	for finals := 0; finals < 2; {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			break
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		switch {
		case resp.StatusCode < 200:
			got = append(got, fmt.Sprint(resp.StatusCode))
			continue
		case resp.Header.Get("Content-Type") == "application/problem+json":
			body = nil // preforkd's own answer (its request id differs)
		}
		finals++
		whole := "whole"
		if err != nil {
			whole = "cut"
		}
		got = append(got, fmt.Sprintf("%d %q %s", resp.StatusCode, body, whole))
		if err != nil || resp.Close {
			break
		}
	}
	conns := 0
	for _, s := range up.Requests() {
		conns = max(conns, s.Conn)
	}
	return fmt.Sprintf("client %v; upstream connections %d", got, conns)
}

// The pieces mutateResponse draws from.
var (
	respLines = []string{"HTTP/1.1 200 OK", "HTTP/1.1 204 No Content", "HTTP/1.1 304 Not Modified", "HTTP/1.0 200 OK",
		"HTTP/1.1 200", "HTTP/1.1 200 ", "HTTP/1.1 404 Not Found", "HTTP/1.1 103 Early Hints", "HTTP/1.1 100 Continue",
		"HTTP/1.1 099 Odd", "HTTP/1.1 600 Odd", "HTTP/1.1 20 OK", "HTTP/2 200", "HTTP/1.1  200 OK", "http/1.1 200 OK"}
	respFields = []string{
		"Content-Length: 5", "Content-Length: 0", "Content-Length: 10", "Content-Length: 05", "Content-Length: 5, 5",
		"Content-Length: +5", "Content-Length: -1", "Content-Length:5", "Content-Length : 5",
		"Transfer-Encoding: chunked", "Transfer-Encoding: gzip", "Transfer-Encoding: gzip, chunked",
		"Transfer-Encoding: chunked, gzip", "Transfer-Encoding: identity", "Transfer-Encoding:",
		"Connection: close", "Connection: keep-alive", "Connection: X-A", "X-A: 1", "Keep-Alive: timeout=5",
		"Content-Type: text/plain", "X-B: b\x00", " X-Folded: 1", "Date: Tue, 01 Dec 2026 00:00:00 GMT",
		"Upgrade: websocket", "Trailer: X-T", "Set-Cookie: a=b",
	}
	respBodies = []string{"", "hello", "hellohello", "5\r\nhello\r\n0\r\n\r\n", "5\r\nhello\r\n0\r\nX-T: 1\r\n\r\n",
		"5\r\nhel", "zz\r\nhello\r\n0\r\n\r\n", "5\r\nhello\r\n", "hel", "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nextra"}
)

// mutateResponse draws a response: a status line, up to four fields, a
// body.
func mutateResponse(rng *rand.Rand) string {
	pick := func(s []string) string { return s[rng.IntN(len(s))] }
	var b strings.Builder
	b.WriteString(pick(respLines) + "\r\n")
	fields := []string{}
	for range rng.IntN(5) {
		fields = append(fields, pick(respFields))
	}
	slices.Sort(fields)
	for _, f := range slices.Compact(fields) {
		b.WriteString(f + "\r\n")
	}
	b.WriteString("\r\n")
	b.WriteString(pick(respBodies))
	return b.String()
}
