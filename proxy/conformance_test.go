package proxy_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/preforkd/preforkd/core"
	"github.com/preforkd/preforkd/engine"
	"github.com/preforkd/preforkd/engine/nethttp"
	"github.com/preforkd/preforkd/proxy"
)

// The conformance suite: raw request bytes in, and what the client got
// back and what the upstream saw. The exchanges here are the data plane's
// (framing, hop-by-hop fields, bodies, targets), run against
// every engine in engines: every engine preforkd proxies with must pass
// every one. The decision core's answers are compared across the fast
// engine and the net/http adapter in engines_test.go.

// servingEngine is an HTTP engine under test. start serves ln, forwarding to
// upstream, until the test ends.
type servingEngine struct {
	name  string
	start func(t *testing.T, ln net.Listener, upstream string)
}

var engines = []servingEngine{
	{"fasthttp", startFast},
	{"nethttp", startNetHTTP},
}

// netHTTPForwarder is the net/http engine over c forwarding to upstream
// by itself, with lim.
func netHTTPForwarder(t testing.TB, c *core.Core, upstream string, lim engine.Limits) *nethttp.Server {
	t.Helper()
	up, err := nethttp.NewUpstream(c, upstream, engine.Upstream{})
	if err != nil {
		t.Fatal(err)
	}
	s, err := nethttp.NewServer(nethttp.ServerOptions{Core: c, Upstream: up, Limits: lim, Logger: quietLog})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// startNetHTTP serves ln with the net/http engine forwarding by itself
// (what the daemon's TLS listeners serve with), in cleartext.
func startNetHTTP(t *testing.T, ln net.Listener, upstream string) {
	t.Helper()
	s := netHTTPForwarder(t, configCore(t, "", nil), upstream, engine.Limits{MaxHeaderBytes: 8 << 10})
	served := make(chan error, 1)
	go func() { served <- s.Serve(ln) }()
	stopAtCleanup(t, s, served)
}

// stopAtCleanup shuts s down when the test ends, and checks that it
// stopped serving without an error.
func stopAtCleanup(t testing.TB, s interface{ Shutdown(context.Context) error }, served <-chan error) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := s.Shutdown(ctx); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
}

func startFast(t *testing.T, ln net.Listener, upstream string) {
	t.Helper()
	s, served := start(t, ln, proxy.Options{Upstream: upstream, Limits: engine.Limits{MaxHeaderBytes: 8 << 10}})
	stopAtCleanup(t, s, served)
}

// exchange is one conformance case.
type exchange struct {
	name string
	// send is written to the server as is; "\n" in it stands for CRLF
	// unless raw.
	send string
	raw  bool
	// reply is what the upstream answers (CRLF as in send); "" is 200
	// "ok".
	reply string

	status int      // the client gets this status
	reason string   // with this reason phrase, when not ""
	has    []string // header lines the response has ("Name: value"; "Name: *" for any value)
	hasNot []string // header names it has not
	body   string   // its body, when not ""
	closed bool     // the server closes the connection after it
	// closeField: the response says Connection: close (which
	// http.ReadResponse takes out of the header into Response.Close).
	closeField bool
	head       bool     // the request is HEAD (the response has no body)
	then       string   // a second request on the same connection, answered 200
	upLine     string   // the upstream saw this request line; "" means it saw no request
	upHas      []string // header lines the upstream saw
	upNot      []string // header names it did not see
	upBody     *string  // the body it got
	upCount    int      // how many requests the upstream saw, when not 1 (or 0 with upLine "")
	upConns    int      // how many connections they came on, when set
	// interim are the interim responses the client gets first: status,
	// a space, and "Name=value " for each field.
	interim []string
	// then2 is the body of a second response the client gets without
	// asking again (to a pipelined request), with interim2 before it.
	then2    string
	interim2 []string
	// trailing is the status of one more response the server sends after
	// the first, to bytes it did not take for the first request; 0: none.
	trailing int
	// netHTTP, when set, is what the net/http engine does instead, where
	// net/http parses the request itself and decides otherwise (its
	// send is the row's): why says why. The fast engine parses the raw
	// bytes and refuses what net/http lets through.
	netHTTP *exchange
	// inOrder, when set, is what an engine that writes each response out
	// before it reads the next request does instead (net/http, the event
	// loop), where the fast engine's buffering decides otherwise; why
	// says why.
	inOrder *exchange
	// fastHTTP, when set, is what the fasthttp engine does instead, where
	// fasthttp's parser, which it reads requests with, decides otherwise.
	fastHTTP *exchange
	why      string
}

// netHTTP501 is the net/http engine's answer to a transfer coding net/http
// does not know: refused all the same, with 501 where the others say 400.
var netHTTP501 = &exchange{status: 501, closed: true,
	why: "net/http refuses a transfer coding it does not know with 501 (RFC 9112 §6.1 allows both)"}

func crlf(s string) string { return strings.ReplaceAll(s, "\n", "\r\n") }

func ptr(s string) *string { return &s }

var bigHeader = "GET / HTTP/1.1\nHost: a\nX-Big: " + strings.Repeat("b", 9<<10) + "\n\n"

var exchanges = []exchange{
	{
		name:   "forwarded as sent, with X-Forwarded-*",
		send:   "GET /x/y?a=1&b=%2F HTTP/1.1\nHost: app.example\nUser-Agent: t\nx-custom: Keep Case\nForwarded: for=1.2.3.4\n\n",
		status: 200, body: "ok", has: []string{"Content-Type: text/plain"},
		upLine: "GET /x/y?a=1&b=%2F HTTP/1.1",
		upHas: []string{"Host: app.example", "User-Agent: t", "x-custom: Keep Case", "Forwarded: for=1.2.3.4",
			"X-Forwarded-For: 127.0.0.1", "X-Forwarded-Proto: http", "X-Forwarded-Host: app.example"},
		netHTTP: &exchange{
			status: 200, body: "ok", has: []string{"Content-Type: text/plain"},
			upLine: "GET /x/y?a=1&b=%2F HTTP/1.1",
			upHas: []string{"Host: app.example", "User-Agent: t", "X-Custom: Keep Case", "Forwarded: for=1.2.3.4",
				"X-Forwarded-For: 127.0.0.1", "X-Forwarded-Proto: http", "X-Forwarded-Host: app.example"},
			why: "net/http gives field names in canonical form",
		},
	},
	{
		name:   "X-Forwarded-For chain kept, peer appended",
		send:   "GET / HTTP/1.1\nHost: a\nX-Forwarded-For: 192.0.2.1, 10.0.0.1\nx-forwarded-for: 198.51.100.7\nX-Forwarded-Proto: https\nX-Forwarded-Host: evil\n\n",
		status: 200,
		upLine: "GET / HTTP/1.1",
		upHas:  []string{"X-Forwarded-For: 192.0.2.1, 10.0.0.1, 198.51.100.7, 127.0.0.1", "X-Forwarded-Proto: http", "X-Forwarded-Host: a"},
	},
	{
		name: "hop-by-hop request fields dropped",
		send: "GET / HTTP/1.1\nHost: a\nConnection: keep-alive, X-Hop\nX-Hop: 1\nX-Kept: 2\nKeep-Alive: timeout=5\nTE: trailers\n" +
			"Trailer: X-T\nUpgrade: h2c\nProxy-Authorization: Basic eA==\nProxy-Connection: keep-alive\n\n",
		status: 200, then: "GET /again HTTP/1.1\nHost: a\n\n",
		upLine: "GET / HTTP/1.1", upCount: 2,
		upHas: []string{"X-Kept: 2"},
		upNot: []string{"Connection", "X-Hop", "Keep-Alive", "TE", "Trailer", "Upgrade", "Proxy-Authorization", "Proxy-Connection"},
	},
	{
		name:   "an upgrade to h2c is not passed on",
		send:   "GET /h2 HTTP/1.1\nHost: a\nConnection: Upgrade, HTTP2-Settings\nUpgrade: h2c\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\n\n",
		reply:  "HTTP/1.1 101 Switching Protocols\nConnection: Upgrade\nUpgrade: h2c\n\n",
		status: 502,
		upLine: "GET /h2 HTTP/1.1", upNot: []string{"Upgrade", "Connection", "HTTP2-Settings"},
	},
	{
		name:   "X-Forwarded-For named by Connection is still the client's chain",
		send:   "GET / HTTP/1.1\nHost: a\nConnection: X-Forwarded-For\nX-Forwarded-For: 192.0.2.1\n\n",
		status: 200,
		upLine: "GET / HTTP/1.1", upHas: []string{"X-Forwarded-For: 192.0.2.1, 127.0.0.1"},
	},
	{
		name:   "Connection: close is the client's, not forwarded",
		send:   "GET / HTTP/1.1\nHost: a\nConnection: close\n\n",
		status: 200, closed: true, closeField: true,
		upLine: "GET / HTTP/1.1", upNot: []string{"Connection"},
	},
	{
		name: "hop-by-hop response fields dropped",
		send: "GET / HTTP/1.1\nHost: a\n\n",
		reply: "HTTP/1.1 200 OK\nConnection: keep-alive, X-Up-Hop\nKeep-Alive: timeout=5\nX-Up-Hop: 1\nProxy-Foo: 2\n" +
			"Upgrade: h2c\nX-Kept: 3\nSet-Cookie: a=1; Path=/\nSet-Cookie: a=2; Path=/x\ndate: Mon, 01 Jan 2001 00:00:00 GMT\nContent-Length: 2\n\nok",
		status: 200, body: "ok", then: "GET / HTTP/1.1\nHost: a\n\n",
		has:    []string{"X-Kept: 3", "Set-Cookie: a=1; Path=/", "Set-Cookie: a=2; Path=/x"},
		hasNot: []string{"Keep-Alive", "X-Up-Hop", "Proxy-Foo", "Upgrade", "Connection"},
		upLine: "GET / HTTP/1.1", upCount: 2,
	},
	{
		name:   "a chunk-size line over 4 KiB (extensions): 400, closed, nothing forwarded",
		send:   "POST / HTTP/1.1\nHost: a\nTransfer-Encoding: chunked\n\n1;x=" + strings.Repeat("a", 5<<10) + "\nx\n0\n\n",
		status: 400, closed: true,
		fastHTTP: &exchange{status: 200, body: "ok", upLine: "POST / HTTP/1.1",
			why: "fasthttp's parser bounds no chunk-size line (nor does nginx's): the one byte of body is forwarded"},
	},
	{
		name:   "a Date the upstream's Connection names: the client still gets a Date",
		send:   "GET / HTTP/1.1\nHost: a\n\n",
		reply:  "HTTP/1.1 200 OK\nConnection: date\nDate: Mon, 01 Jan 2001 00:00:00 GMT\nContent-Length: 2\n\nok",
		status: 200, body: "ok",
		has:    []string{"Date: *"},
		upLine: "GET / HTTP/1.1",
	},
	{
		name: "every response field Connection names is dropped, however many",
		send: "GET / HTTP/1.1\nHost: a\n\n",
		reply: "HTTP/1.1 200 OK\nConnection: X-H1, X-H2, X-H3, X-H4, X-H5\nConnection: X-H6, X-H7, X-H8, X-H9, X-H10\n" +
			"X-H1: 1\nX-H2: 2\nX-H3: 3\nX-H4: 4\nX-H5: 5\nX-H6: 6\nX-H7: 7\nX-H8: 8\nX-H9: 9\nX-H10: 10\nX-Kept: 11\nContent-Length: 2\n\nok",
		status: 200, body: "ok",
		has:    []string{"X-Kept: 11"},
		hasNot: []string{"X-H1", "X-H2", "X-H3", "X-H4", "X-H5", "X-H6", "X-H7", "X-H8", "X-H9", "X-H10"},
		upLine: "GET / HTTP/1.1",
	},
	{
		name:   "dot segments removed and slashes merged, query as sent",
		send:   "GET /a//b/./c/../d/%2e%2E/e/?q=/../x//y HTTP/1.1\nHost: a\n\n",
		status: 200,
		upLine: "GET /a/b/e/?q=/../x//y HTTP/1.1",
	},
	{
		name:   "an empty Host is replaced, never sent beside another",
		send:   "GET /e HTTP/1.0\nHost:\n\n",
		status: 200, closed: true,
		upLine: "GET /e HTTP/1.1", upNot: []string{"X-Forwarded-Host"},
	},
	{
		name:   "absolute-form target: its authority is the Host",
		send:   "GET http://app.example:8080/p?q=1 HTTP/1.1\nHost: other\n\n",
		status: 200,
		upLine: "GET /p?q=1 HTTP/1.1", upHas: []string{"Host: app.example:8080", "X-Forwarded-Host: app.example:8080"},
		upNot: []string{},
	},
	{
		name:   "HEAD: no body, the connection goes on",
		send:   "HEAD /h HTTP/1.1\nHost: a\n\n",
		reply:  "HTTP/1.1 200 OK\nContent-Length: 5\nContent-Type: text/plain\n\n",
		status: 200, head: true, has: []string{"Content-Length: 5"},
		then:   "GET / HTTP/1.1\nHost: a\n\n",
		upLine: "HEAD /h HTTP/1.1", upCount: 2,
	},
	{
		name:   "204 carries no body",
		send:   "DELETE /r HTTP/1.1\nHost: a\n\n",
		reply:  "HTTP/1.1 204 No Content\nX-R: 1\n\n",
		status: 204, has: []string{"X-R: 1"}, hasNot: []string{"Content-Length", "Transfer-Encoding"},
		then:   "GET / HTTP/1.1\nHost: a\n\n",
		upLine: "DELETE /r HTTP/1.1", upCount: 2, upConns: 1,
	},
	{
		name:   "304 carries no body",
		send:   "GET /c HTTP/1.1\nHost: a\nIf-None-Match: \"x\"\n\n",
		reply:  "HTTP/1.1 304 Not Modified\nETag: \"x\"\n\n",
		status: 304, has: []string{"Etag: \"x\""}, hasNot: []string{"Transfer-Encoding"},
		then:   "GET / HTTP/1.1\nHost: a\n\n",
		upLine: "GET /c HTTP/1.1", upCount: 2, upConns: 1, upHas: []string{"If-None-Match: \"x\""},
	},
	{
		name:   "a 304's Content-Length is not passed on: every engine's 304, the cache's too, goes without",
		send:   "GET /c HTTP/1.1\nHost: a\nIf-None-Match: \"x\"\n\n",
		reply:  "HTTP/1.1 304 Not Modified\nETag: \"x\"\nContent-Length: 100\n\n",
		status: 304, has: []string{"Etag: \"x\""}, hasNot: []string{"Content-Length", "Transfer-Encoding"},
		then:   "GET / HTTP/1.1\nHost: a\n\n",
		upLine: "GET /c HTTP/1.1", upCount: 2, upConns: 1,
	},
	{
		name:   "a repeated Content-Length from the upstream, even the same: 502",
		send:   "GET / HTTP/1.1\nHost: a\n\n",
		reply:  "HTTP/1.1 200 OK\nContent-Length: 2\nContent-Length: 2\n\nok",
		status: 502, upLine: "GET / HTTP/1.1",
	},
	{
		name:   "a space before a response field's colon: 502",
		send:   "GET / HTTP/1.1\nHost: a\n\n",
		reply:  "HTTP/1.1 200 OK\nX-A : 1\nContent-Length: 2\n\nok",
		status: 502, upLine: "GET / HTTP/1.1",
	},
	{
		name:   "a folded response field: 502",
		send:   "GET / HTTP/1.1\nHost: a\n\n",
		reply:  "HTTP/1.1 200 OK\nX-A: 1\n 2\nContent-Length: 2\n\nok",
		status: 502, upLine: "GET / HTTP/1.1",
	},
	{
		name:   "a response transfer coding other than chunked: 502 (its body would reach the client coded)",
		send:   "GET / HTTP/1.1\nHost: a\n\n",
		reply:  "HTTP/1.1 200 OK\nTransfer-Encoding: gzip\nConnection: close\n\nhel",
		status: 502, upLine: "GET / HTTP/1.1",
	},
	{
		name:   "a response coded under chunked: 502",
		send:   "GET / HTTP/1.1\nHost: a\n\n",
		reply:  "HTTP/1.1 200 OK\nTransfer-Encoding: gzip, chunked\n\n3\nhel\n0\n\n",
		status: 502, upLine: "GET / HTTP/1.1",
	},
	{
		name:   "Transfer-Encoding in an HTTP/1.0 response: 502",
		send:   "GET / HTTP/1.1\nHost: a\n\n",
		reply:  "HTTP/1.0 200 OK\nTransfer-Encoding: chunked\nContent-Length: 5\n\n3\nhel\n0\n\n",
		status: 502, upLine: "GET / HTTP/1.1",
	},
	{
		name:   "a Content-Length list from the upstream: 502",
		send:   "GET / HTTP/1.1\nHost: a\n\n",
		reply:  "HTTP/1.1 200 OK\nContent-Length: 2, 2\n\nok",
		status: 502, upLine: "GET / HTTP/1.1",
	},
	{
		name:   "a negative Content-Length from the upstream: 502",
		send:   "GET / HTTP/1.1\nHost: a\n\n",
		reply:  "HTTP/1.1 200 OK\nContent-Length: -1\n\nok",
		status: 502, upLine: "GET / HTTP/1.1",
	},
	{
		name:   "a response header section over 16 KiB: 502",
		send:   "GET / HTTP/1.1\nHost: a\n\n",
		reply:  "HTTP/1.1 200 OK\nX-Big: " + strings.Repeat("a", 16<<10) + "\nContent-Length: 2\n\nok",
		status: 502, upLine: "GET / HTTP/1.1",
	},
	{
		name:   "a response header section just under 16 KiB passes",
		send:   "GET / HTTP/1.1\nHost: a\n\n",
		reply:  "HTTP/1.1 200 OK\nX-Big: " + strings.Repeat("a", 16<<10-80) + "\nContent-Length: 2\n\nok",
		status: 200, body: "ok", upLine: "GET / HTTP/1.1",
	},
	{
		name:   "a control character in the upstream's reason phrase: 502",
		send:   "GET / HTTP/1.1\nHost: a\n\n",
		reply:  "HTTP/1.1 200 O\x01K\nContent-Length: 2\n\nok",
		status: 502, upLine: "GET / HTTP/1.1",
	},
	{
		name:   "a body with a Content-Length",
		send:   "POST /p HTTP/1.1\nHost: a\nContent-Type: application/json\nContent-Length: 8\n\n{\"a\": 1}",
		status: 200,
		upLine: "POST /p HTTP/1.1", upHas: []string{"Content-Length: 8", "Content-Type: application/json"},
		upBody: ptr("{\"a\": 1}"),
	},
	{
		name:   "an empty body keeps its Content-Length: 0",
		send:   "POST /p HTTP/1.1\nHost: a\nContent-Length: 0\n\n",
		status: 200,
		upLine: "POST /p HTTP/1.1", upHas: []string{"Content-Length: 0"}, upBody: ptr(""),
	},
	{
		name:   "a chunked body is sent with its length",
		send:   "POST /p HTTP/1.1\nHost: a\nTransfer-Encoding: chunked\n\n4;ext=1\nwiki\n5\npedia\n0\nX-Trailer: t\n\n",
		status: 200, then: "GET / HTTP/1.1\nHost: a\n\n",
		upLine: "POST /p HTTP/1.1", upCount: 2,
		upHas: []string{"Content-Length: 9"}, upNot: []string{"Transfer-Encoding", "X-Trailer"},
		upBody: ptr("wikipedia"),
	},
	{
		name:    "Expect: 100-continue is answered here",
		send:    "POST /e HTTP/1.1\nHost: a\nExpect: 100-continue\nContent-Length: 3\n\nabc",
		interim: []string{"100 "},
		status:  200,
		upLine:  "POST /e HTTP/1.1", upNot: []string{"Expect"}, upBody: ptr("abc"),
	},
	{
		// A field name is case-insensitive (RFC 9110 §5.1); fasthttp,
		// which keeps names as sent, looks for "Expect" alone.
		name:    "Expect: 100-continue in any case is answered here",
		send:    "POST /e HTTP/1.1\nHost: a\nexpect: 100-Continue\nContent-Length: 3\n\nabc",
		interim: []string{"100 "},
		status:  200,
		upLine:  "POST /e HTTP/1.1", upNot: []string{"Expect"}, upBody: ptr("abc"),
	},
	{
		name:   "an HTTP/1.0 client's Expect: 100-continue is ignored: no 100",
		send:   "POST /e HTTP/1.0\nHost: a\nExpect: 100-continue\nContent-Length: 3\n\nabc",
		status: 200, closed: true,
		upLine: "POST /e HTTP/1.1", upNot: []string{"Expect"}, upBody: ptr("abc"),
	},
	{
		name:   "a chunked response",
		send:   "GET / HTTP/1.1\nHost: a\n\n",
		reply:  "HTTP/1.1 200 OK\nTransfer-Encoding: chunked\n\n3\nabc\n3;x=y\ndef\n0\nX-T: 1\n\n",
		status: 200, body: "abcdef", then: "GET / HTTP/1.1\nHost: a\n\n",
		upLine: "GET / HTTP/1.1", upCount: 2, upConns: 1,
	},
	{
		// MaxTrailer bounds the section, not a line: one line of it is
		// longer than the upstream connection's buffer.
		name:   "a chunked response with one trailer line of MaxTrailer",
		send:   "GET / HTTP/1.1\nHost: a\n\n",
		reply:  "HTTP/1.1 200 OK\nTransfer-Encoding: chunked\n\n3\nabc\n0\nX: " + strings.Repeat("a", engine.MaxTrailer-4) + "\n\n",
		status: 200, body: "abc", then: "GET / HTTP/1.1\nHost: a\n\n",
		upLine: "GET / HTTP/1.1", upCount: 2, upConns: 1,
	},
	{
		name:   "Transfer-Encoding overrides Content-Length, and that upstream connection is not reused",
		send:   "GET / HTTP/1.1\nHost: a\n\n",
		reply:  "HTTP/1.1 200 OK\nContent-Length: 3\nTransfer-Encoding: chunked\n\n6\nabcdef\n0\n\n",
		status: 200, body: "abcdef", then: "GET / HTTP/1.1\nHost: a\n\n",
		upLine: "GET / HTTP/1.1", upCount: 2, upConns: 2,
	},
	{
		name:   "an HTTP/1.0 upstream's connection is not reused",
		send:   "GET / HTTP/1.1\nHost: a\n\n",
		reply:  "HTTP/1.0 200 OK\nContent-Length: 3\n\nabc",
		status: 200, body: "abc", then: "GET / HTTP/1.1\nHost: a\n\n",
		upLine: "GET / HTTP/1.1", upCount: 2, upConns: 2,
	},
	{
		name:   "an HTTP/1.0 upstream's keep-alive is taken",
		send:   "GET / HTTP/1.1\nHost: a\n\n",
		reply:  "HTTP/1.0 200 OK\nConnection: keep-alive\nKeep-Alive: timeout=5\nContent-Length: 3\n\nabc",
		status: 200, body: "abc", then: "GET / HTTP/1.1\nHost: a\n\n", hasNot: []string{"Keep-Alive"},
		upLine: "GET / HTTP/1.1", upCount: 2, upConns: 1,
	},
	{
		name:   "a response delimited by the upstream's close",
		send:   "GET / HTTP/1.1\nHost: a\n\n",
		reply:  "HTTP/1.1 200 OK\nConnection: close\n\nuntil close",
		status: 200, body: "until close", then: "GET / HTTP/1.1\nHost: a\n\n",
		upLine: "GET / HTTP/1.1", upCount: 2,
	},
	{
		name:   "an HTTP/1.0 client gets a body of unknown length up to the close",
		send:   "GET /old HTTP/1.0\nHost: a\n\n",
		reply:  "HTTP/1.1 200 OK\nTransfer-Encoding: chunked\n\n3\nabc\n3\ndef\n0\n\n",
		status: 200, body: "abcdef", closed: true, hasNot: []string{"Transfer-Encoding", "Content-Length"},
		upLine: "GET /old HTTP/1.1",
	},
	{
		name:   "an HTTP/1.0 client keeps its connection with a length",
		send:   "GET /old HTTP/1.0\nHost: a\nConnection: keep-alive\n\n",
		status: 200, body: "ok", then: "GET / HTTP/1.1\nHost: a\n\n",
		upLine: "GET /old HTTP/1.1", upCount: 2,
	},
	{
		// RFC 9112 §9.6: a client that sends close closes; keep-alive
		// beside it, before or after, in one line or two, changes nothing.
		name:   "an HTTP/1.0 client's close wins over a keep-alive after it",
		send:   "GET /old HTTP/1.0\nHost: a\nConnection: close, keep-alive\n\n",
		status: 200, body: "ok", closed: true, closeField: true,
		upLine: "GET /old HTTP/1.1",
	},
	{
		name:   "an HTTP/1.0 client's close wins over a keep-alive before it",
		send:   "GET /old HTTP/1.0\nHost: a\nConnection: keep-alive, close\n\n",
		status: 200, body: "ok", closed: true, closeField: true,
		upLine: "GET /old HTTP/1.1",
	},
	{
		name:   "an HTTP/1.0 client's close wins over a keep-alive in another line",
		send:   "GET /old HTTP/1.0\nHost: a\nConnection: close\nConnection: keep-alive\n\n",
		status: 200, body: "ok", closed: true, closeField: true,
		upLine: "GET /old HTTP/1.1",
	},
	{
		name:   "no Content-Type where the upstream sent none",
		send:   "GET / HTTP/1.1\nHost: a\n\n",
		reply:  "HTTP/1.1 200 OK\nContent-Length: 3\n\nabc",
		status: 200, body: "abc", hasNot: []string{"Content-Type"},
		upLine: "GET / HTTP/1.1",
	},
	{
		name:    "interim responses are forwarded, without their hop-by-hop fields (those Connection names too); 100 is not",
		send:    "GET / HTTP/1.1\nHost: a\n\n",
		reply:   "HTTP/1.1 100 Continue\n\nHTTP/1.1 102 Processing\n\nHTTP/1.1 103 Early Hints\nLink: </s.css>; rel=preload\nX-Hop: 1\nConnection: keep-alive, X-Hop\n\nHTTP/1.1 200 OK\nContent-Length: 2\n\nok",
		interim: []string{"102 ", "103 Link=</s.css>; rel=preload "},
		status:  200, body: "ok",
		upLine: "GET / HTTP/1.1",
	},
	{
		// engine.MaxInterims: the one past the bound is refused, not
		// passed on first.
		name:    "16 interim responses pass",
		send:    "GET / HTTP/1.1\nHost: a\n\n",
		reply:   strings.Repeat("HTTP/1.1 102 Processing\n\n", 16) + "HTTP/1.1 200 OK\nContent-Length: 2\n\nok",
		interim: slices.Repeat([]string{"102 "}, 16),
		status:  200, body: "ok",
		upLine: "GET / HTTP/1.1",
	},
	{
		name:    "17 interim responses: a 502 after the first 16, the 17th not passed on",
		send:    "GET / HTTP/1.1\nHost: a\n\n",
		reply:   strings.Repeat("HTTP/1.1 102 Processing\n\n", 17) + "HTTP/1.1 200 OK\nContent-Length: 2\n\nok",
		interim: slices.Repeat([]string{"102 "}, 16),
		status:  502,
		upLine:  "GET / HTTP/1.1",
	},
	{
		name:   "an HTTP/1.0 client gets no interim response",
		send:   "GET / HTTP/1.0\nHost: a\n\n",
		reply:  "HTTP/1.1 103 Early Hints\nLink: </s.css>; rel=preload\n\nHTTP/1.1 200 OK\nContent-Length: 2\n\nok",
		status: 200, body: "ok", closed: true,
		upLine: "GET / HTTP/1.1",
	},
	{
		name:   "a pipelined request gets no interim response from the fast engine: the previous response may wait in its buffer",
		send:   "GET /again HTTP/1.1\nHost: a\n\nGET / HTTP/1.1\nHost: a\n\n",
		reply:  "HTTP/1.1 103 Early Hints\nLink: </s.css>; rel=preload\n\nHTTP/1.1 200 OK\nContent-Length: 3\n\nabc",
		status: 200, body: "ok", then2: "abc",
		upLine: "GET /again HTTP/1.1", upCount: 2,
		inOrder: &exchange{status: 200, body: "ok", then2: "abc", interim2: []string{"103 Link=</s.css>; rel=preload "},
			upLine: "GET /again HTTP/1.1", upCount: 2,
			why: "it writes out each response before it reads the next request: the interim response cannot overtake one"},
	},
	{
		name:   "Content-Length and Transfer-Encoding: 400, closed, nothing forwarded",
		send:   "POST / HTTP/1.1\nHost: a\nContent-Length: 3\nTransfer-Encoding: chunked\n\n0\n\nGET /smuggled HTTP/1.1\nHost: a\n\n",
		status: 400, closed: true, has: []string{"Content-Type: application/problem+json"},
	},
	{
		name:   "Transfer-Encoding then Content-Length: 400, closed",
		send:   "POST / HTTP/1.1\nHost: a\ntransfer-encoding: chunked\ncontent-length: 0\n\n0\n\n",
		status: 400, closed: true,
	},
	{
		// fasthttp alone frames this body as none: its bytes would be read
		// as the next request.
		name:   "Transfer-Encoding other than chunked: 400, closed, nothing forwarded",
		send:   "POST / HTTP/1.1\nHost: a\nTransfer-Encoding: identity\n\nGET /smuggled HTTP/1.1\nHost: a\n\n",
		status: 400, closed: true,
		netHTTP: netHTTP501,
	},
	{
		name:   "Transfer-Encoding lines after chunked: 400, closed, nothing forwarded",
		send:   "POST / HTTP/1.1\nHost: a\nTransfer-Encoding: chunked\nTransfer-Encoding: identity\n\n0\n\nGET /smuggled HTTP/1.1\nHost: a\n\n",
		status: 400, closed: true,
		netHTTP: netHTTP501,
	},
	{
		// RFC 9110 §5.6.1 would have empty list elements skipped, but
		// fasthttp, net/http and nginx all refuse them in this field:
		// the engines refuse alike rather than frame a body some would
		// not.
		name:   "an empty element in Transfer-Encoding: 400, closed, nothing forwarded",
		send:   "POST / HTTP/1.1\nHost: a\nTransfer-Encoding: chunked,\n\n0\n\nGET /smuggled HTTP/1.1\nHost: a\n\n",
		status: 400, closed: true,
		netHTTP: netHTTP501,
	},
	{
		name:   "an empty element before chunked: 400, closed, nothing forwarded",
		send:   "POST / HTTP/1.1\nHost: a\nTransfer-Encoding: , chunked\n\n0\n\nGET /smuggled HTTP/1.1\nHost: a\n\n",
		status: 400, closed: true,
		netHTTP: netHTTP501,
	},
	{
		name:   "two Content-Lengths: 400, closed",
		send:   "POST / HTTP/1.1\nHost: a\nContent-Length: 3\nContent-Length: 4\n\nabcd",
		status: 400, closed: true,
	},
	{
		name:   "obs-fold: 400, closed",
		send:   "GET / HTTP/1.1\nHost: a\nX-A: b\n c: d\n\n",
		status: 400, closed: true,
	},
	{
		name:   "a bad chunk size: 400, closed, nothing forwarded",
		send:   "POST / HTTP/1.1\nHost: a\nTransfer-Encoding: chunked\n\nzz\nabc\n0\n\n",
		status: 400, closed: true,
	},
	{
		name:   "HTTP/1.0 with Transfer-Encoding: 400, closed",
		send:   "POST / HTTP/1.0\nHost: a\nTransfer-Encoding: chunked\n\n3\nabc\n0\n\nGET /smuggled HTTP/1.1\nHost: a\n\n",
		status: 400, closed: true,
	},
	{
		name:   "CONNECT is refused",
		send:   "CONNECT a.example:443 HTTP/1.1\nHost: a.example:443\n\n",
		status: 405, closed: true,
	},
	{
		name:   "PRI is refused",
		send:   "PRI /x HTTP/1.1\nHost: a\n\n",
		status: 400, closed: true,
	},
	{
		name:   "the HTTP/2 preface is refused",
		send:   "PRI * HTTP/2.0\n\nSM\n\n",
		status: 400, closed: true,
	},
	{
		name:   "asterisk-form but OPTIONS is refused",
		send:   "GET * HTTP/1.1\nHost: a\n\n",
		status: 400, closed: true,
	},
	{
		name:   "OPTIONS * is answered here",
		send:   "OPTIONS * HTTP/1.1\nHost: a\n\n",
		status: 200, has: []string{"Allow: GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS"},
		then: "GET / HTTP/1.1\nHost: a\n\n", upLine: "GET / HTTP/1.1",
	},
	{
		// The body was never asked for: the connection closes after the
		// answer rather than guess whether the client sends it.
		name:   "OPTIONS * with Expect: 100-continue is answered here, its body not awaited",
		send:   "OPTIONS * HTTP/1.1\nHost: a\nExpect: 100-continue\nContent-Length: 3\n\n",
		status: 200, has: []string{"Allow: GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS"}, closed: true, closeField: true,
		netHTTP: &exchange{status: 200, has: []string{"Allow: GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS"},
			why: "net/http keeps the connection: the client is to send the body anyway, which net/http reads and drops before the next request"},
	},
	{
		name:   "Expect: 100-continue on a request without a body gets no 100",
		send:   "GET / HTTP/1.1\nHost: a\nExpect: 100-continue\n\n",
		status: 200, body: "ok", upLine: "GET / HTTP/1.1", upNot: []string{"Expect"},
	},
	{
		name:   "the upstream's reason phrase is kept",
		send:   "GET / HTTP/1.1\nHost: a\n\n",
		reply:  "HTTP/1.1 200 Fine Thanks\nContent-Length: 2\n\nok",
		status: 200, reason: "Fine Thanks", body: "ok", upLine: "GET / HTTP/1.1",
		netHTTP: &exchange{status: 200, reason: "OK", body: "ok", upLine: "GET / HTTP/1.1",
			why: "a net/http handler cannot choose the reason phrase: it writes each status's own"},
	},
	{
		name:   "a fragment in the target is refused, and the connection closes",
		send:   "GET /a#b HTTP/1.1\nHost: a\n\n",
		status: 400, closed: true,
	},
	{
		name:   "a fragment after the query is refused, and the connection closes",
		send:   "GET /a?q=k#b HTTP/1.1\nHost: a\n\n",
		status: 400, closed: true,
	},
	{
		name:   "an absolute-form target of another scheme is refused, and the connection closes",
		send:   "GET ftp://app.example/p HTTP/1.1\nHost: a\n\n",
		status: 400, closed: true,
	},
	{
		// An https URI names a resource of the TLS service (RFC 9110
		// §4.2.2): a cleartext listener cannot answer for it with
		// authority, and forwarding it as http would carry a request
		// meant for TLS in clear to the application. RFC 9112 §3.2.2
		// asks a server to accept the absolute form, not every scheme
		// in it; every engine refuses it alike (a TLS listener, the
		// net/http engine's, takes https:// and refuses http://).
		name:   "an https:// absolute-form target on a cleartext listener is refused, and the connection closes",
		send:   "GET https://app.example/p HTTP/1.1\nHost: a\n\n",
		status: 400, closed: true,
	},
	{
		name:   "userinfo in Host is refused, and the connection closes",
		send:   "GET / HTTP/1.1\nHost: u@a\n\n",
		status: 400, closed: true,
	},
	{
		name:   "a Host with a blank is refused, and the connection closes",
		send:   "GET / HTTP/1.1\nHost: a b\n\n",
		status: 400, closed: true,
	},
	{
		name:   "a Host with a path, a query and a fragment is refused, and the connection closes",
		send:   "GET / HTTP/1.1\nHost: evil.example/x?y#\n\n",
		status: 400, closed: true,
	},
	{
		name:   "a Host with quotes and angle brackets is refused, and the connection closes",
		send:   "GET / HTTP/1.1\nHost: a\"<x>\n\n",
		status: 400, closed: true,
	},
	{
		name:   "a Host with an unclosed IP literal is refused, and the connection closes",
		send:   "GET / HTTP/1.1\nHost: [::1\n\n",
		status: 400, closed: true,
	},
	{
		name:   "a Host with a port that is not a number is refused, and the connection closes",
		send:   "GET / HTTP/1.1\nHost: a:8o\n\n",
		status: 400, closed: true,
	},
	{
		name:   "a Host with a bad percent-encoding is refused, and the connection closes",
		send:   "GET / HTTP/1.1\nHost: a%zz\n\n",
		status: 400, closed: true,
	},
	{
		name:   "a Host with sub-delims is passed on, and so is an IP literal with a port",
		send:   "GET / HTTP/1.1\nHost: a-b.c_d~e,x=1\n\n",
		status: 200, then: "GET / HTTP/1.1\nHost: [::1]:8080\n\n",
		upLine: "GET / HTTP/1.1", upCount: 2,
	},
	{
		name:   "userinfo in an absolute-form target is refused, and the connection closes",
		send:   "GET http://u@app.example/ HTTP/1.1\nHost: a\n\n",
		status: 400, closed: true,
	},
	{
		name:   "a bad path is refused, and the connection closes",
		send:   "GET /a%2Fb HTTP/1.1\nHost: a\n\n",
		status: 400, closed: true,
	},
	{
		name:   "a dot segment with parameters is refused: applications read it two ways",
		send:   "GET /admin/..;/login HTTP/1.1\nHost: a\n\n",
		status: 400, closed: true,
	},
	{
		name:   "a refused target's body is never taken for a request",
		send:   "POST /a#f HTTP/1.1\nHost: a\nContent-Length: 35\n\nGET /smuggled HTTP/1.1\nHost: a\n\n",
		status: 400, closed: true,
	},
	{
		name:   "a refused target with a broken length: closed, what follows never a request",
		send:   "POST /a#f HTTP/1.1\nHost: a\nContent-Length: -1\n\nGET /smuggled HTTP/1.1\nHost: a\n\n",
		status: 400, closed: true,
	},
	{
		name:   "an HTTP/1.1 request without Host: 400",
		send:   "GET / HTTP/1.1\nX-A: b\n\n",
		status: 400, closed: true,
	},
	{
		name:   "an HTTP/1.1 request in absolute form without Host: 400",
		send:   "GET http://a/ HTTP/1.1\nX-A: b\n\n",
		status: 400, closed: true,
	},
	{
		// An http URI has a host (RFC 9110 §4.2.1), and an HTTP/1.1
		// client sends it as Host (RFC 9112 §3.2): an empty one is no
		// Host at all (fasthttp and nginx refuse it too).
		name:   "an HTTP/1.1 request with an empty Host: 400",
		send:   "GET / HTTP/1.1\nHost:\n\n",
		status: 400, closed: true,
	},
	{
		name:   "an HTTP/1.1 request in absolute form with an empty Host: 400",
		send:   "GET http://a/x HTTP/1.1\nHost:\n\n",
		status: 400, closed: true,
		netHTTP: &exchange{status: 200, upLine: "GET /x HTTP/1.1", upHas: []string{"Host: a"},
			why: "net/http drops the Host line of an absolute-form request before any handler sees it: " +
				"the target's authority is all there is, as RFC 9112 §3.2.2 says a server uses"},
	},
	{
		name:   "an absolute-form target with an empty authority is refused, and the connection closes",
		send:   "GET http:///x HTTP/1.1\nHost: a\n\n",
		status: 400, closed: true,
	},
	{
		name:   "an HTTP/1.0 request without Host is served",
		send:   "GET / HTTP/1.0\n\n",
		status: 200, closed: true,
		upLine: "GET / HTTP/1.1",
	},
	{
		name:   "HTTP/2.0 on an HTTP/1 connection: 505",
		send:   "GET / HTTP/2.0\nHost: a\n\n",
		status: 505, closed: true,
	},
	{
		name:   "HTTP/1.2: 505",
		send:   "GET / HTTP/1.2\nHost: a\n\n",
		status: 505, closed: true,
		netHTTP: &exchange{status: 200, upLine: "GET / HTTP/1.1",
			why: "net/http serves a higher HTTP/1 minor version as 1.1, as RFC 9110 §2.5 says a server should; the loop and fasthttp refuse it (nothing sends it)"},
	},
	{
		name:   "a header section over the limit: 431",
		send:   bigHeader,
		status: 431, closed: true,
	},
	{
		name:   "a control character in a header value: 400",
		send:   "GET / HTTP/1.1\nHost: a\nX-A: b\x00c\n\n",
		status: 400, closed: true,
	},
	{
		name:   "DEL in a header value: 400",
		send:   "GET / HTTP/1.1\nHost: a\nX-A: b\x7fc\n\n",
		status: 400, closed: true,
	},
}

func TestConformance(t *testing.T) {
	for _, e := range engines {
		t.Run(e.name, func(t *testing.T) {
			t.Parallel()
			for _, x := range exchanges {
				t.Run(x.name, func(t *testing.T) {
					t.Parallel()
					runExchange(t, e, x)
				})
			}
		})
	}
}

func runExchange(t *testing.T, e servingEngine, x exchange) {
	alt := x.inOrder
	switch {
	case e.name == "fasthttp":
		alt = x.fastHTTP
	case e.name == "nethttp" && x.netHTTP != nil:
		alt = x.netHTTP
	}
	if alt != nil {
		alt := *alt
		alt.name, alt.send, alt.raw, alt.reply, alt.head = x.name, x.send, x.raw, x.reply, x.head
		t.Logf("%s's own behaviour: %s", e.name, alt.why)
		x = alt
	}
	var up *rawUpstream
	if x.reply == "" {
		up = startUpstream(t, nil)
	} else {
		reply := crlf(x.reply)
		var replied atomic.Bool // the follow-up request gets a plain answer
		up = startUpstream(t, func(req *seenRequest, w *bufio.Writer, c net.Conn) {
			if req.Line == "GET /again HTTP/1.1" || replied.Swap(true) {
				w.WriteString("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
				return
			}
			w.WriteString(reply)
			if strings.Contains(reply, "Connection: close") {
				w.Flush()
				c.Close()
			}
		})
	}
	ln := listen(t)
	e.start(t, ln, up.URL())

	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	send := x.send
	if !x.raw {
		send = crlf(send)
	}
	if _, err := io.WriteString(c, send); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	method := "GET"
	if x.head {
		method = "HEAD"
	}
	interim, resp, err := readFinal(br, method)
	if fmt.Sprint(interim) != fmt.Sprint(x.interim) {
		t.Errorf("interim responses %q, want %q", interim, x.interim)
	}
	if err != nil {
		t.Fatalf("reading the response: %v", err)
	}
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("reading the response body: %v", err)
	}
	if resp.StatusCode != x.status {
		t.Errorf("status %d, want %d (body %q)", resp.StatusCode, x.status, body)
	}
	if want := fmt.Sprintf("%d %s", x.status, x.reason); x.reason != "" && resp.Status != want {
		t.Errorf("status line %q, want %q", resp.Status, want)
	}
	if x.body != "" && string(body) != x.body {
		t.Errorf("body %q, want %q", body, x.body)
	}
	if x.head && len(body) != 0 {
		t.Errorf("a HEAD response with a body: %q", body)
	}
	checkHeader(t, "response", resp.Header, x.has, x.hasNot)
	if x.closeField && !resp.Close {
		t.Errorf("the response lacks Connection: close")
	}
	if got := resp.Header.Values("Date"); len(got) != 1 {
		t.Errorf("Date fields %q, want one", got)
	}
	if resp.StatusCode >= 400 && resp.Header.Get("Content-Type") != "application/problem+json" {
		t.Errorf("an error answer of Content-Type %q, want application/problem+json", resp.Header.Get("Content-Type"))
	}

	if x.then != "" && !x.closed {
		if _, err := io.WriteString(c, crlf(x.then)); err != nil {
			t.Fatalf("a second request on the connection: %v", err)
		}
		r2, err := http.ReadResponse(br, &http.Request{Method: "GET"})
		if err != nil {
			t.Fatalf("the second request on the connection: %v", err)
		}
		io.Copy(io.Discard, r2.Body)
		if r2.StatusCode != 200 {
			t.Errorf("the second request: status %d", r2.StatusCode)
		}
	}
	if x.then2 != "" {
		interim2, r2, err := readFinal(br, "GET")
		if fmt.Sprint(interim2) != fmt.Sprint(x.interim2) {
			t.Errorf("interim responses before the second %q, want %q", interim2, x.interim2)
		}
		if err != nil {
			t.Fatalf("the second response: %v", err)
		}
		b2, _ := io.ReadAll(r2.Body)
		if r2.StatusCode != 200 || string(b2) != x.then2 {
			t.Errorf("the second response: %d %q, want 200 %q", r2.StatusCode, b2, x.then2)
		}
	}
	if x.trailing != 0 {
		// What the server answered to the bytes after the request.
		r2, err := http.ReadResponse(br, &http.Request{Method: "GET"})
		if err != nil || r2.StatusCode != x.trailing {
			t.Fatalf("after the response: %v %v, want a %d", r2, err, x.trailing)
		}
		io.Copy(io.Discard, r2.Body)
	}
	if closed := isClosed(t, c, br); closed != x.closed {
		t.Errorf("connection closed after the response: %v, want %v", closed, x.closed)
	}

	want := x.upCount
	if want == 0 && x.upLine != "" {
		want = 1
	}
	seen := up.WaitRequests(want, 2*time.Second)
	if x.upLine == "" {
		// Give a request that should not have been forwarded a moment to
		// arrive all the same.
		time.Sleep(50 * time.Millisecond)
		seen = up.Requests()
	}
	if len(seen) != want {
		var lines []string
		for _, s := range seen {
			lines = append(lines, s.Line)
		}
		t.Fatalf("the upstream saw %d requests %q, want %d", len(seen), lines, want)
	}
	if want == 0 {
		return
	}
	if x.upConns > 0 && seen[len(seen)-1].Conn != x.upConns {
		t.Errorf("the upstream's requests came on %d connections, want %d", seen[len(seen)-1].Conn, x.upConns)
	}
	s := seen[0]
	if s.Line != x.upLine {
		t.Errorf("upstream request line %q, want %q", s.Line, x.upLine)
	}
	for _, h := range x.upHas {
		if !containsLine(s.Lines, h) {
			t.Errorf("the upstream did not see %q; it saw %q", h, s.Lines)
		}
	}
	for _, name := range x.upNot {
		if v := s.Field(name); len(v) > 0 {
			t.Errorf("the upstream saw %s: %q", name, v)
		}
	}
	if x.upBody != nil && (string(s.Body) != *x.upBody || !s.BodyOK) {
		t.Errorf("the upstream got body %q (whole: %v), want %q", s.Body, s.BodyOK, *x.upBody)
	}
}

// checkHeader checks lines ("Name: value") present and names absent.
func checkHeader(t *testing.T, what string, h http.Header, has, hasNot []string) {
	t.Helper()
	for _, l := range has {
		k, v, _ := strings.Cut(l, ": ")
		found := false
		for _, got := range h.Values(k) {
			found = found || got == v || v == "*" // "Name: *": any value
		}
		if !found {
			t.Errorf("%s lacks %q; it has %s: %q", what, l, k, h.Values(k))
		}
	}
	for _, k := range hasNot {
		if v := h.Values(k); len(v) > 0 {
			t.Errorf("%s has %s: %q", what, k, v)
		}
	}
}

func containsLine(lines []string, want string) bool {
	for _, l := range lines {
		if l == want {
			return true
		}
	}
	return false
}

// isClosed reports whether the server closed c (after what br read).
func isClosed(t *testing.T, c net.Conn, br *bufio.Reader) bool {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	_, err := br.Peek(1)
	var ne net.Error
	switch {
	case errors.As(err, &ne) && ne.Timeout():
		return false
	case err == nil:
		rest, _ := br.Peek(br.Buffered())
		t.Errorf("bytes after the response: %q", rest)
		return false
	}
	return true
}

// readFinal reads a response to a request of method from br, and the
// interim responses before it: each its status, a space, and
// "Name=value " for each field.
func readFinal(br *bufio.Reader, method string) (interim []string, resp *http.Response, err error) {
	resp, err = http.ReadResponse(br, &http.Request{Method: method})
	for err == nil && resp.StatusCode < 200 && resp.StatusCode != 101 {
		i := fmt.Sprintf("%d ", resp.StatusCode)
		for _, k := range slices.Sorted(maps.Keys(resp.Header)) {
			i += fmt.Sprintf("%s=%s ", k, strings.Join(resp.Header[k], ","))
		}
		interim = append(interim, i)
		resp, err = http.ReadResponse(br, &http.Request{Method: method}) // after an interim response
	}
	return interim, resp, err
}
