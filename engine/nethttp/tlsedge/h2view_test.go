package tlsedge_test

import (
	"bufio"
	"crypto/tls"
	"fmt"
	"net"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/preforkd/preforkd/config"
	"github.com/preforkd/preforkd/core"
	"github.com/preforkd/preforkd/engine"
	"github.com/preforkd/preforkd/internal/shmtest"
	"github.com/preforkd/preforkd/internal/wiretest"
	"github.com/preforkd/preforkd/metrics"
	"github.com/preforkd/preforkd/shm"
)

// h2Request sends one HTTP/2 stream of the header fields given as name,
// value pairs (pseudo-fields included, as they are: no client would send
// some of them), with no body, on a connection of its own, and returns
// the response's status ("" for none: a reset stream) and body.
func h2Request(t *testing.T, addr string, conf *tls.Config, fields ...string) (status, body string) {
	t.Helper()
	return h2Exchange(t, addr, conf, fields, nil)
}

// A :path holds what HTTP/2 lets a field value hold, a space among
// them, where an HTTP/1.1 request line cannot: such a target is
// refused (400), as nginx refuses it, and never written into the
// upstream's request line ("GET /a b HTTP/1.1", which the upstream reads
// as another request than the one the rules saw, or not at all).
func TestHTTP2TargetWithSpaceIsRefused(t *testing.T) {
	up := wiretest.StartUpstream(t, nil)
	addr, conf, _ := tlsServer(t, up.URL())
	for _, path := range []string{"/a b", "/p?q=a b", "/p HTTP/1.1"} {
		status, body := h2Request(t, addr, conf, ":method", "GET", ":scheme", "https", ":authority", "a.example", ":path", path)
		if status != "400" {
			t.Errorf(":path %q: %q %q, want 400", path, status, body)
		}
	}
	if seen := up.Requests(); len(seen) != 0 {
		t.Errorf("the upstream got %q", seen[0].Line)
	}
	// The same target percent-encoded is served.
	if status, body := h2Request(t, addr, conf, ":method", "GET", ":scheme", "https", ":authority", "a.example", ":path", "/a%20b?q=a%20b"); status != "200" {
		t.Errorf("/a%%20b: %q %q, want 200", status, body)
	}
}

// A '#' in a :path is refused (400) wherever it is, as the event loop
// and fasthttp refuse it in a request line: after the query too, which
// the path's own checks do not read, where it would reach the upstream
// ("/p?q=k#x"), which may take it for a fragment and read "q=k", while
// the rules and the cache keyed "q=k#x".
func TestHTTP2FragmentIsRefused(t *testing.T) {
	up := wiretest.StartUpstream(t, nil)
	addr, conf, _ := tlsServer(t, up.URL())
	for _, path := range []string{"/p#x", "/p?q=k#x", "/p?#"} {
		status, body := h2Request(t, addr, conf, ":method", "GET", ":scheme", "https", ":authority", "a.example", ":path", path)
		if status != "400" {
			t.Errorf(":path %q: %q %q, want 400", path, status, body)
		}
	}
	if seen := up.Requests(); len(seen) != 0 {
		t.Errorf("the upstream got %q", seen[0].Line)
	}
}

// An https request names its authority (RFC 9113 §8.3.1: :authority or
// Host, else it is malformed), as an HTTP/1.1 request its Host: one with
// neither is refused (400), as every engine refuses an HTTP/1.1 request
// without Host, not forwarded with the upstream's own authority for Host,
// where no rule by host and no cache entry of the site's name applies.
func TestHTTP2WithoutAuthorityIsRefused(t *testing.T) {
	up := wiretest.StartUpstream(t, nil)
	addr, conf, _ := tlsServer(t, up.URL())
	if status, body := h2Request(t, addr, conf, ":method", "GET", ":scheme", "https", ":path", "/"); status != "400" {
		t.Errorf("no :authority, no host: %q %q, want 400", status, body)
	}
	if seen := up.Requests(); len(seen) != 0 {
		t.Errorf("the upstream got %q %q", seen[0].Line, seen[0].Lines)
	}
	// Host in place of :authority is an authority.
	if status, body := h2Request(t, addr, conf, ":method", "GET", ":scheme", "https", ":path", "/", "host", "a.example"); status != "200" {
		t.Errorf("host without :authority: %q %q, want 200", status, body)
	}
}

// HTTP/1.1 parsers strip the whitespace around a field value; HTTP/2
// carries it to the handler as sent. Keyed as sent, " k" would be a
// client of its own for the rules while the upstream, which reads the
// forwarded line over HTTP/1.1, gets "k": every padding of one API key
// another budget. The rules read it as the upstream will, as they read
// "X-Api-Key:  k" over HTTP/1.1: one key, one budget.
func TestHTTP2PaddedFieldValueIsOneKey(t *testing.T) {
	up := wiretest.StartUpstream(t, nil)
	cfg, err := config.Parse([]byte(`
[[ratelimit]]
name = "by-key"
path = "/x"
limit = 1
window = "1h"
by = "header:X-Api-Key"
`), "t")
	if err != nil {
		t.Fatal(err)
	}
	o, err := cfg.CoreOptions()
	if err != nil {
		t.Fatal(err)
	}
	so := shm.Options{Counters: 64}
	metrics.Geometry(&so, 8)
	c, err := core.New(shmtest.Private(t, so), o)
	if err != nil {
		t.Fatal(err)
	}
	addr, conf, _, _ := tlsServerCore(t, c, up.URL(), engine.Limits{}, nil)
	for i, v := range []string{"k", " k", "k ", "\tk", "k\t", "  k  "} {
		status, body := h2Request(t, addr, conf, ":method", "GET", ":scheme", "https", ":authority", "a.example", ":path", "/x", "x-api-key", v)
		switch {
		case i == 0 && status != "200":
			t.Fatalf("%q: %q %q, want 200", v, status, body)
		case i > 0 && status != "429":
			t.Errorf("%q: %q, want 429: the upstream reads it as %q, whose budget is spent", v, status, "k")
		}
	}
	if seen := up.Requests(); len(seen) != 1 {
		t.Errorf("the upstream got %d requests for one key, limit 1", len(seen))
	}
}

// An HTTP/2 stream names its scheme (:scheme), and x/net's server gives a
// stream that says "http" no TLS state, whatever its connection. That is
// the request "GET http://a.example/page HTTP/1.1" on the TLS port, which
// is refused (400): so is the stream. Forwarded, it told the upstream
// X-Forwarded-Proto: http, and the cache, whose key has no scheme, kept
// the answer for every https client (a redirect to https, links with
// http://).
func TestHTTP2SchemeIsTheConnections(t *testing.T) {
	up := wiretest.StartUpstream(t, func(req *wiretest.Seen, w *bufio.Writer, c net.Conn) {
		p := req.Req.Header.Get("X-Forwarded-Proto")
		fmt.Fprintf(w, "HTTP/1.1 200 OK\r\nCache-Control: max-age=60\r\nContent-Length: %d\r\n\r\n%s", len(p), p)
	})
	c, _ := configCore(t, "[[cache]]\npath = \"/*\"\n")
	addr, conf, _, _ := tlsServerCore(t, c, up.URL(), engine.Limits{}, nil)
	if status, body := h2Request(t, addr, conf, ":method", "GET", ":scheme", "http", ":authority", "a.example", ":path", "/page"); status != "400" {
		t.Errorf(":scheme http on TLS: %q %q, want 400", status, body)
	}
	if status, body := h2Request(t, addr, conf, ":method", "GET", ":scheme", "https", ":authority", "a.example", ":path", "/page"); status != "200" || body != "https" {
		t.Errorf(":scheme https: %q %q, want 200 and the upstream told https", status, body)
	}
}

// A :method is a token (RFC 9110 §9.1), as an HTTP/1.1 request line's
// first word; HTTP/2 lets its value hold spaces and tabs. Written into the
// upstream's request line, "GET /admin?" makes "GET /admin? /p HTTP/1.1":
// a request line the upstream reads as another target than the one the
// rules saw, or not at all (a 502 for the client's error). It is refused
// (400), as the other engines refuse such a request line, and never
// forwarded.
func TestHTTP2MethodNotATokenIsRefused(t *testing.T) {
	up := wiretest.StartUpstream(t, nil)
	addr, conf, _ := tlsServer(t, up.URL())
	for _, m := range []string{"GE T", "GET /admin?", "GET\t", "G\"T", "GET,"} {
		status, body := h2Request(t, addr, conf, ":method", m, ":scheme", "https", ":authority", "a.example", ":path", "/p")
		if status != "400" {
			t.Errorf(":method %q: %q %q, want 400", m, status, body)
		}
	}
	if seen := up.Requests(); len(seen) != 0 {
		t.Errorf("the upstream got %q", seen[0].Line)
	}
	// A method the server does not know, but a token, is forwarded.
	if status, body := h2Request(t, addr, conf, ":method", "PROPFIND", ":scheme", "https", ":authority", "a.example", ":path", "/p"); status != "200" {
		t.Errorf("PROPFIND: %q %q, want 200", status, body)
	}
}

// An HTTP/2 request whose content-length disagrees with its DATA is
// malformed (RFC 9113 §8.1.1). x/net's server resets a stream whose DATA
// run past it or stop short of it, but not one that declares a length and
// ends with its headers, nor one that declares two lengths (it checks the
// first) or one that is not a number: those reached the upstream, with a
// Content-Length of the forwarder's own that the rules, which read the
// client's, did not see. Each is refused (400), never forwarded.
func TestHTTP2LengthThatDisagreesIsRefused(t *testing.T) {
	up := wiretest.StartUpstream(t, nil)
	addr, conf, _ := tlsServer(t, up.URL())
	post := []string{":method", "POST", ":scheme", "https", ":authority", "a.example", ":path", "/p"}
	for _, tc := range []struct {
		name   string
		fields []string
		data   []string
	}{
		{"a length, no DATA", []string{"content-length", "5"}, nil},
		{"a length not a number, no DATA", []string{"content-length", "x"}, nil},
		{"two lengths", []string{"content-length", "3", "content-length", "8"}, []string{"abc"}},
		{"a length not a number, empty DATA", []string{"content-length", "x"}, []string{""}},
	} {
		status, body := h2Exchange(t, addr, conf, append(post[:len(post):len(post)], tc.fields...), tc.data)
		if status != "400" && status != "" {
			t.Errorf("%s: %q %q, want 400 or the stream reset", tc.name, status, body)
		}
	}
	if seen := up.Requests(); len(seen) != 0 {
		t.Errorf("the upstream got %q %q", seen[0].Line, seen[0].Lines)
	}
	// A length that agrees is served: 0 with no DATA, 3 with 3 bytes.
	for _, tc := range []struct {
		length string
		data   []string
	}{{"0", nil}, {"3", []string{"abc"}}} {
		if status, body := h2Exchange(t, addr, conf, append(post[:len(post):len(post)], "content-length", tc.length), tc.data); status != "200" {
			t.Errorf("content-length %s: %q %q, want 200", tc.length, status, body)
		}
	}
}

// h2Dial connects to addr over TLS with conf, h2 agreed, with a deadline
// for the whole exchange.
func h2Dial(t *testing.T, addr string, conf *tls.Config) *tls.Conn {
	t.Helper()
	conf = conf.Clone()
	conf.NextProtos = []string{"h2"}
	c, err := tls.Dial("tcp", addr, conf)
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(10 * time.Second))
	return c
}

// h2Exchange is h2Request with a body: the DATA frames given, the last
// ending the stream (none: the headers end it).
func h2Exchange(t *testing.T, addr string, conf *tls.Config, fields []string, data []string) (status, body string) {
	t.Helper()
	c := h2Dial(t, addr, conf)
	defer c.Close()
	status, body, err := wiretest.H2Stream(c, fields, data)
	if err != nil {
		t.Fatalf("%q: %v", fields, err)
	}
	return status, body
}

// With extended CONNECT on (GODEBUG=http2xconnect=1, which x/net reads
// from the daemon's environment), x/net's server takes a :protocol on any
// request and hands it to the handler as a header field called
// ":protocol". On a request other than CONNECT it is malformed (RFC 8441
// §4), and it was forwarded: ":protocol: x" went to the upstream as a
// header line whose name is no HTTP/1.1 field name. It is refused (400).
// The test runs itself again with the setting, which x/net reads once.
func TestHTTP2ProtocolOutsideConnectIsRefused(t *testing.T) {
	if os.Getenv("TLSEDGE_XCONNECT") == "" {
		cmd := exec.Command(os.Args[0], "-test.run=^TestHTTP2ProtocolOutsideConnectIsRefused$", "-test.count=1")
		cmd.Env = append(os.Environ(), "TLSEDGE_XCONNECT=1", "GODEBUG=http2xconnect=1")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		return
	}
	up := wiretest.StartUpstream(t, nil)
	addr, conf, _ := tlsServer(t, up.URL())
	for _, m := range []string{"GET", "POST", "OPTIONS"} {
		status, body := h2Request(t, addr, conf, ":method", m, ":protocol", "websocket", ":scheme", "https", ":authority", "a.example", ":path", "/p")
		if status != "400" && status != "" {
			t.Errorf("%s with :protocol: %q %q, want 400 or the stream reset", m, status, body)
		}
	}
	if status, body := h2Request(t, addr, conf, ":method", "CONNECT", ":protocol", "websocket", ":scheme", "https", ":authority", "a.example", ":path", "/p"); status != "405" {
		t.Errorf("extended CONNECT: %q %q, want 405", status, body)
	}
	time.Sleep(50 * time.Millisecond)
	if seen := up.Requests(); len(seen) != 0 {
		t.Errorf("the upstream got %q %q", seen[0].Line, seen[0].Lines)
	}
}

// A :path with an empty query ("/a?") is forwarded as sent, and keyed
// apart from "/a": an application's redirect from it to "/a" is never
// served for "/a", where it would redirect to itself.
func TestHTTP2EmptyQueryIsKeyedApart(t *testing.T) {
	up := wiretest.StartUpstream(t, func(req *wiretest.Seen, w *bufio.Writer, c net.Conn) {
		if req.Req.RequestURI == "/a?" {
			w.WriteString("HTTP/1.1 301 Moved Permanently\r\nLocation: /a\r\nCache-Control: max-age=3600\r\nContent-Length: 0\r\n\r\n")
			return
		}
		w.WriteString("HTTP/1.1 200 OK\r\nCache-Control: max-age=60\r\nContent-Length: 2\r\n\r\nok")
	})
	c, _ := configCore(t, "[[cache]]\npath = \"/*\"\n")
	addr, conf, _, _ := tlsServerCore(t, c, up.URL(), engine.Limits{}, nil)
	for _, tt := range []struct{ path, status string }{{"/a?", "301"}, {"/a", "200"}, {"/a?", "301"}, {"/a", "200"}} {
		if status, body := h2Request(t, addr, conf, ":method", "GET", ":scheme", "https", ":authority", "a.example", ":path", tt.path); status != tt.status {
			t.Errorf(":path %s: %q %q, want %s", tt.path, status, body, tt.status)
		}
	}
}
