package tlsedge_test

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"crypto/tls"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/preforkd/preforkd/config"
	"github.com/preforkd/preforkd/core"
	"github.com/preforkd/preforkd/engine"
	"github.com/preforkd/preforkd/engine/loop"
	"github.com/preforkd/preforkd/internal/shmtest"
	"github.com/preforkd/preforkd/internal/wiretest"
	"github.com/preforkd/preforkd/metrics"
	"github.com/preforkd/preforkd/shm"
)

// SPEC "One view of a request": a request sent over HTTP/2 is decided,
// keyed, forwarded, cached, logged and counted as the same request sent
// over HTTP/1.1. Each case is a run of requests, each written in both
// wire forms; one run goes to the event loop over cleartext HTTP/1.1, the
// other to the TLS listener over HTTP/2, each with a core of the same
// configuration and an upstream of its own, and what the clients got,
// what the upstreams received, the access log entries and the request
// counters must be the same (the protocol, the scheme and
// X-Forwarded-Proto aside).

// viewStep is one request in both wire forms.
type viewStep struct {
	h1       string   // the whole HTTP/1.1 request, as sent
	h2       []string // HTTP/2 header fields, name, value pairs
	data     []string // HTTP/2 DATA frames (none: the headers end the stream)
	trailers []string // HTTP/2 trailer fields, after the DATA
	hold     bool     // HTTP/2: the headers do not end the stream, nothing follows
}

// viewAnswer is what a client got.
type viewAnswer struct {
	status string
	head   string // the response's fields, as headView writes them
	body   string
}

// headView writes response fields in a form both protocols share: names
// in lower case, sorted, without those HTTP/2 has none of (Connection,
// Keep-Alive) and the Date.
func headView(h http.Header) string {
	var lines []string
	for k, vs := range h {
		k = strings.ToLower(k)
		switch k {
		case "date", "connection", "keep-alive":
			continue
		}
		for _, v := range vs {
			lines = append(lines, k+": "+v)
		}
	}
	slices.Sort(lines)
	return strings.Join(lines, "; ")
}

// viewSide is one engine, its core's region, its upstream and its log.
type viewSide struct {
	addr   string
	region *shm.Region
	up     *wiretest.Upstream
	mu     sync.Mutex
	logged []string // loggedView of each entry, read while Log runs
}

const oneViewConfig = `
[server]
request_id = ""
trusted_proxies = ["127.0.0.1/32"]
max_request_body = "100KiB"

[[ratelimit]]
name = "by-cookie"
path = "/rl/cookie"
limit = 1
window = "1h"
by = "cookie:sid"

[[ratelimit]]
name = "by-header"
path = "/rl/header"
limit = 1
window = "1h"
by = "header:X-Api-Key"

[[ratelimit]]
name = "by-query"
path = "/rl/query"
limit = 1
window = "1h"
by = "query:k"

[[idempotency]]
path = "/idem"
methods = ["POST"]

[[ratelimit]]
name = "by-host"
path = "/rl/host"
limit = 1
window = "1h"
by = "header:Host"

[[ratelimit]]
name = "by-cookie-field"
path = "/rl/cookies"
limit = 1
window = "1h"
by = "header:Cookie"

[[ratelimit]]
name = "by-ip"
path = "/rl/ip"
limit = 1
window = "1h"

[[cache]]
path = "/c/*"
`

// oneViewReplies are the upstream's answers of their own, by path (under
// /c too, with the cache on).
var oneViewReplies = map[string]string{
	"/r/chunked":  "HTTP/1.1 200 OK\r\nCache-Control: max-age=60\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n",
	"/r/trailers": "HTTP/1.1 200 OK\r\nTrailer: X-Sum\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\nX-Sum: 7\r\n\r\n",
	"/r/hop":      "HTTP/1.1 200 OK\r\nConnection: X-Hop, Keep-Alive\r\nX-Hop: 1\r\nKeep-Alive: timeout=5\r\nProxy-Connection: keep-alive\r\nUpgrade: h2c\r\nTE: trailers\r\nCache-Control: max-age=60\r\nContent-Length: 2\r\n\r\nok",
	"/r/204":      "HTTP/1.1 204 No Content\r\nCache-Control: max-age=60\r\nContent-Length: 0\r\n\r\n",
	"/r/304":      "HTTP/1.1 304 Not Modified\r\nETag: \"e\"\r\nCache-Control: max-age=60\r\nContent-Length: 5\r\n\r\n",
	"/r/multi":    "HTTP/1.1 200 OK\r\nSet-Cookie: a=1\r\nSet-Cookie: b=2\r\nX-Multi: 1\r\nx-multi: 2\r\nVary: Accept\r\nVary: Cookie\r\nCache-Control: max-age=60\r\nContent-Length: 2\r\n\r\nok",
	"/r/early":    "HTTP/1.1 103 Early Hints\r\nLink: </s.css>; rel=preload\r\n\r\nHTTP/1.1 200 OK\r\nCache-Control: max-age=60\r\nContent-Length: 2\r\n\r\nok",
	"/r/close":    "HTTP/1.1 200 OK\r\nCache-Control: max-age=60\r\nConnection: close\r\n\r\nread to the end",
	"/r/empty":    "HTTP/1.1 200 OK\r\nCache-Control: max-age=60\r\nContent-Length: 0\r\n\r\n",
	"/r/redirect": "HTTP/1.1 301 Moved Permanently\r\nLocation: /r/empty\r\nCache-Control: max-age=60\r\nContent-Length: 0\r\n\r\n",
}

// oneViewUpstream answers with what it got: the Host, the Cookie lines,
// the target and the body, cacheable for a minute, varying by Cookie
// under /c/vary.
func oneViewUpstream(req *wiretest.Seen, w *bufio.Writer, c net.Conn) {
	body := fmt.Sprintf("%s host=%q cookie=%q body=%q", req.Line, req.Field("Host"), req.Field("Cookie"), req.Body)
	if r, ok := oneViewReplies[strings.TrimPrefix(req.Req.URL.Path, "/c")]; ok {
		w.WriteString(r)
		if strings.HasSuffix(req.Req.URL.Path, "/r/close") {
			w.Flush()
			c.Close() // the body's end
		}
		return
	}
	vary := ""
	if strings.HasPrefix(req.Req.URL.Path, "/c/vary") {
		vary = "Vary: Cookie\r\n"
	}
	fmt.Fprintf(w, "HTTP/1.1 200 OK\r\nCache-Control: max-age=60\r\n%sContent-Length: %d\r\n\r\n%s", vary, len(body), body)
}

func startViewSide(t *testing.T, tls bool, extra string) (*viewSide, *tls.Config) {
	t.Helper()
	cfg, err := config.Parse([]byte(oneViewConfig+extra), "t")
	if err != nil {
		t.Fatal(err)
	}
	o, err := cfg.CoreOptions()
	if err != nil {
		t.Fatal(err)
	}
	s := &viewSide{up: wiretest.StartUpstream(t, oneViewUpstream)}
	// Both sides' clocks stand still at the same instant: their
	// RateLimit, Retry-After and Age values are never a second apart.
	o.Now = func() time.Duration { return time.Hour }
	o.Wall = func() time.Time { return time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC) }
	o.AccessLog = accessFunc(func(e *core.AccessEntry) {
		s.mu.Lock()
		s.logged = append(s.logged, loggedView(e))
		s.mu.Unlock()
	})
	so := cfg.RegionOptions()
	metrics.Geometry(&so, 8)
	s.region = shmtest.Private(t, so)
	c, err := core.New(s.region, o)
	if err != nil {
		t.Fatal(err)
	}
	if tls {
		addr, conf, _, _ := tlsServerCore(t, c, s.up.URL(), engine.Limits{}, nil)
		s.addr = addr
		return s, conf
	}
	srv, err := loop.New(loop.Options{Upstream: s.up.URL(), Core: c, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	s.addr = ln.Addr().String()
	return s, nil
}

// entries waits for the access log entries of each side's nth request
// (from 0) and returns them, "(none)" for a side that logged none: a
// request is logged by the time the next one is sent (at most once,
// when its answer was sent). An answer the engine makes before the core
// sees the request (a malformed head) is counted, not logged.
func entries(n int, sides ...*viewSide) []string {
	out := make([]string, len(sides))
	deadline := time.Now().Add(2 * time.Second)
	for {
		done := true
		for i, s := range sides {
			s.mu.Lock()
			if len(s.logged) > n {
				out[i] = s.logged[n]
			} else {
				done = false
			}
			s.mu.Unlock()
		}
		if done || time.Now().After(deadline) {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	for i, s := range sides {
		s.mu.Lock()
		if len(s.logged) <= n {
			s.logged = append(s.logged, "(none)")
			out[i] = "(none)"
		}
		s.mu.Unlock()
	}
	return out
}

func h1Send(t *testing.T, addr, req string) viewAnswer {
	t.Helper()
	c, br := wiretest.Dial(t, addr, 10*time.Second)
	defer c.Close()
	io.WriteString(c, req)
	method, _, _ := strings.Cut(req, " ")
	resp, err := http.ReadResponse(br, &http.Request{Method: method})
	interim := ""
	for err == nil && resp.StatusCode/100 == 1 {
		interim += fmt.Sprint(resp.StatusCode) + " "
		resp, err = http.ReadResponse(br, &http.Request{Method: method})
	}
	if err != nil {
		t.Fatalf("%q: %v", req, err)
	}
	body, _ := io.ReadAll(resp.Body)
	return viewAnswer{status: interim + fmt.Sprint(resp.StatusCode), head: headView(resp.Header), body: string(body)}
}

// h2Send sends one HTTP/2 stream of fields, data and trailers on a
// connection of its own and returns what came back.
func h2Send(t *testing.T, addr string, conf *tls.Config, st viewStep) (a viewAnswer) {
	t.Helper()
	if len(st.data) > 4 {
		return h2Client(t, addr, conf, st)
	}
	c := h2Dial(t, addr, conf)
	defer c.Close()
	io.WriteString(c, http2.ClientPreface)
	fr := http2.NewFramer(c, c)
	fr.WriteSettings()
	block := func(fields []string) []byte {
		var hb bytes.Buffer
		enc := hpack.NewEncoder(&hb)
		for i := 0; i+1 < len(fields); i += 2 {
			enc.WriteField(hpack.HeaderField{Name: fields[i], Value: fields[i+1]})
		}
		return hb.Bytes()
	}
	// Written while the answer is read: the server's writes (its
	// window updates among them) must not wait for a client that writes.
	written := make(chan struct{})
	defer func() { <-written }()
	go func() {
		defer close(written)
		fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, EndStream: len(st.data) == 0 && len(st.trailers) == 0 && !st.hold, EndHeaders: true, BlockFragment: block(st.h2)})
		for i, d := range st.data {
			fr.WriteData(1, i == len(st.data)-1 && len(st.trailers) == 0, []byte(d))
		}
		if len(st.trailers) > 0 {
			fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, EndStream: true, EndHeaders: true, BlockFragment: block(st.trailers)})
		}
	}()
	h := http.Header{}
	defer func() { a.head = headView(h) }()
	dec := hpack.NewDecoder(4096, nil)
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			t.Fatalf("%q: %v", st.h2, err)
		}
		switch f := f.(type) {
		case *http2.HeadersFrame:
			hs, _ := dec.DecodeFull(f.HeaderBlockFragment())
			for _, f := range hs {
				if f.Name == ":status" && a.status != "" {
					a.status += " " + f.Value // after an interim response
					h = http.Header{}         // whose fields are not the response's
				} else if f.Name == ":status" {
					a.status = f.Value
				} else {
					h.Add(f.Name, f.Value)
				}
			}
			if f.StreamEnded() {
				return a
			}
		case *http2.DataFrame:
			a.body += string(f.Data())
			if f.StreamEnded() {
				return a
			}
		case *http2.RSTStreamFrame, *http2.GoAwayFrame:
			return a
		}
	}
}

// h2Client sends st with net/http's HTTP/2 client, which keeps to the server's
// flow-control windows: a body of many DATA frames, its length unknown
// unless the fields give it.
func h2Client(t *testing.T, addr string, conf *tls.Config, st viewStep) viewAnswer {
	t.Helper()
	req, err := http.NewRequest("GET", "https://"+addr, io.NopCloser(strings.NewReader(strings.Join(st.data, ""))))
	if err != nil {
		t.Fatal(err)
	}
	req.ContentLength = -1
	for i := 0; i+1 < len(st.h2); i += 2 {
		switch k, v := st.h2[i], st.h2[i+1]; k {
		case ":method":
			req.Method = v
		case ":authority":
			req.Host = v
		case ":path":
			req.URL.Opaque = v
		case ":scheme":
		case "content-length":
			fmt.Sscan(v, &req.ContentLength)
		default:
			req.Header.Add(k, v)
		}
	}
	req.Header.Set("User-Agent", "")
	cl := &http.Client{Transport: &http.Transport{TLSClientConfig: conf, ForceAttemptHTTP2: true, DisableCompression: true}, Timeout: 10 * time.Second}
	defer cl.CloseIdleConnections()
	resp, err := cl.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.ProtoMajor != 2 {
		t.Fatalf("%s, not HTTP/2", resp.Proto)
	}
	body, _ := io.ReadAll(resp.Body)
	return viewAnswer{status: fmt.Sprint(resp.StatusCode), head: headView(resp.Header), body: string(body)}
}

// seenView is what an upstream received, in a form both sides share:
// header names in lower case, sorted, without the fields that tell the
// listener's scheme and the framing (compared by the body received).
func seenView(r *wiretest.Seen) string {
	var lines []string
	for _, l := range r.Lines {
		k, v, _ := strings.Cut(l, ":")
		k = strings.ToLower(k)
		switch k {
		case "x-forwarded-proto":
			continue
		}
		lines = append(lines, k+": "+strings.Trim(v, " \t"))
	}
	slices.Sort(lines)
	body := fmt.Sprintf("%q", r.Body)
	if len(r.Body) > 64 {
		body = fmt.Sprintf("of %d bytes, sha-256 %x", len(r.Body), sha256.Sum256(r.Body))
	}
	return fmt.Sprintf("%s\n%s\nbody %s whole %v trailers %q", r.Line, strings.Join(lines, "\n"), body, r.BodyOK, r.Req.Trailer)
}

// loggedView is an access log entry without what tells the protocol, the
// scheme and the time.
func loggedView(e *core.AccessEntry) string {
	return fmt.Sprintf("%s %s ?%q target %q %d %d bytes rule %q cache %q client %v", e.Method, e.Path, e.Query, e.Target, e.Status, e.Bytes, e.Rule, e.Cache, e.Client)
}

// longBody is a request body past the engines' read-ahead.
var longBody = strings.Repeat("0123456789abcdef", 150<<10/16)

// pieces cuts s into DATA frames of at most n bytes.
func pieces(s string, n int) []string {
	var out []string
	for len(s) > n {
		out = append(out, s[:n])
		s = s[n:]
	}
	return append(out, s)
}

func TestOneViewOverHTTP1AndHTTP2(t *testing.T) {
	h2get := func(path string, fields ...string) []string {
		return append([]string{":method", "GET", ":scheme", "https", ":authority", "a.example", ":path", path}, fields...)
	}
	for _, tc := range []struct {
		name  string
		steps []viewStep
	}{
		{"cookie crumbs key a rule as one line", []viewStep{
			{h1: "GET /rl/cookie HTTP/1.1\r\nHost: a.example\r\nCookie: a=1; sid=s1\r\n\r\n",
				h2: h2get("/rl/cookie", "cookie", "a=1", "cookie", "sid=s1")},
			{h1: "GET /rl/cookie HTTP/1.1\r\nHost: a.example\r\nCookie: sid=s1; b=2\r\n\r\n",
				h2: h2get("/rl/cookie", "cookie", "sid=s1", "cookie", "b=2")},
			{h1: "GET /rl/cookie HTTP/1.1\r\nHost: a.example\r\nCookie: a=1; sid=s2\r\n\r\n",
				h2: h2get("/rl/cookie", "cookie", "a=1", "cookie", "sid=s2")},
		}},
		{"cookie crumbs vary a cached answer as one line", []viewStep{
			{h1: "GET /c/vary HTTP/1.1\r\nHost: a.example\r\nCookie: a=1; b=2\r\n\r\n",
				h2: h2get("/c/vary", "cookie", "a=1", "cookie", "b=2")},
			{h1: "GET /c/vary HTTP/1.1\r\nHost: a.example\r\nCookie: a=1; b=2\r\n\r\n",
				h2: h2get("/c/vary", "cookie", "a=1; b=2")},
			{h1: "GET /c/vary HTTP/1.1\r\nHost: a.example\r\nCookie: a=1; b=3\r\n\r\n",
				h2: h2get("/c/vary", "cookie", "a=1", "cookie", "b=3")},
		}},
		{"authority with a port, in upper case, with a trailing dot", []viewStep{
			{h1: "GET /c/host HTTP/1.1\r\nHost: a.example:443\r\n\r\n",
				h2: []string{":method", "GET", ":scheme", "https", ":authority", "a.example:443", ":path", "/c/host"}},
			{h1: "GET /c/host HTTP/1.1\r\nHost: A.EXAMPLE\r\n\r\n",
				h2: []string{":method", "GET", ":scheme", "https", ":authority", "A.EXAMPLE", ":path", "/c/host"}},
			{h1: "GET /c/host HTTP/1.1\r\nHost: a.example.\r\n\r\n",
				h2: []string{":method", "GET", ":scheme", "https", ":authority", "a.example.", ":path", "/c/host"}},
			{h1: "GET /c/host HTTP/1.1\r\nHost: a.example\r\n\r\n",
				h2: []string{":method", "GET", ":scheme", "https", ":authority", "a.example", ":path", "/c/host"}},
			{h1: "GET /c/host HTTP/1.1\r\nHost: a.example:443\r\n\r\n",
				h2: []string{":method", "GET", ":scheme", "https", ":authority", "a.example:443", ":path", "/c/host"}},
		}},
		{"Host without :authority", []viewStep{
			{h1: "GET /c/host HTTP/1.1\r\nHost: b.example\r\n\r\n",
				h2: []string{":method", "GET", ":scheme", "https", ":path", "/c/host", "host", "b.example"}},
			{h1: "GET /c/host HTTP/1.1\r\nHost: b.example\r\n\r\n",
				h2: []string{":method", "GET", ":scheme", "https", ":authority", "b.example", ":path", "/c/host"}},
		}},
		{"dot segments and doubled slashes", []viewStep{
			{h1: "GET /c/x/../dot HTTP/1.1\r\nHost: a.example\r\n\r\n", h2: h2get("/c/x/../dot")},
			{h1: "GET /c/./dot HTTP/1.1\r\nHost: a.example\r\n\r\n", h2: h2get("/c/./dot")},
			{h1: "GET /c//dot HTTP/1.1\r\nHost: a.example\r\n\r\n", h2: h2get("/c//dot")},
			{h1: "GET /c/%2e%2e/c/dot HTTP/1.1\r\nHost: a.example\r\n\r\n", h2: h2get("/c/%2e%2e/c/dot")},
			{h1: "GET /rl/x/../cookie HTTP/1.1\r\nHost: a.example\r\nCookie: sid=1\r\n\r\n", h2: h2get("/rl/x/../cookie", "cookie", "sid=1")},
			{h1: "GET /rl/cookie HTTP/1.1\r\nHost: a.example\r\nCookie: sid=1\r\n\r\n", h2: h2get("/rl/cookie", "cookie", "sid=1")},
		}},
		{"OPTIONS *", []viewStep{
			{h1: "OPTIONS * HTTP/1.1\r\nHost: a.example\r\n\r\n", h2: []string{":method", "OPTIONS", ":scheme", "https", ":authority", "a.example", ":path", "*"}},
		}},
		{"repeated fields", []viewStep{
			{h1: "GET /rl/header HTTP/1.1\r\nHost: a.example\r\nX-Api-Key: k1\r\nX-Api-Key: k2\r\n\r\n",
				h2: h2get("/rl/header", "x-api-key", "k1", "x-api-key", "k2")},
			{h1: "GET /rl/header HTTP/1.1\r\nHost: a.example\r\nX-Api-Key: k1\r\n\r\n",
				h2: h2get("/rl/header", "x-api-key", "k1")},
			{h1: "GET /rl/header HTTP/1.1\r\nHost: a.example\r\nX-Api-Key: k1, k2\r\n\r\n",
				h2: h2get("/rl/header", "x-api-key", "k1, k2")},
			{h1: "GET /up HTTP/1.1\r\nHost: a.example\r\nX-Forwarded-For: 192.0.2.1\r\nX-Forwarded-For: 192.0.2.2\r\n\r\n",
				h2: h2get("/up", "x-forwarded-for", "192.0.2.1", "x-forwarded-for", "192.0.2.2")},
			{h1: "POST /idem HTTP/1.1\r\nHost: a.example\r\nIdempotency-Key: \"a\"\r\nIdempotency-Key: \"b\"\r\nContent-Length: 1\r\n\r\nx",
				h2: []string{":method", "POST", ":scheme", "https", ":authority", "a.example", ":path", "/idem", "idempotency-key", `"a"`, "idempotency-key", `"b"`}, data: []string{"x"}},
			{h1: "GET /rl/cookie HTTP/1.1\r\nHost: a.example\r\nCookie: a=1; sid=s1\r\n\r\n",
				h2: h2get("/rl/cookie", "cookie", "a=1", "cookie", "sid=s1")},
			{h1: "GET /rl/cookie HTTP/1.1\r\nHost: a.example\r\nCookie: sid=s1\r\n\r\n",
				h2: h2get("/rl/cookie", "cookie", "sid=s1")},
		}},
		{"hop-by-hop and cache bypass", []viewStep{
			{h1: "GET /c/te HTTP/1.1\r\nHost: a.example\r\nTE: trailers\r\nConnection: TE\r\n\r\n", h2: h2get("/c/te", "te", "trailers")},
			{h1: "GET /c/te HTTP/1.1\r\nHost: a.example\r\nAuthorization: Bearer x\r\n\r\n", h2: h2get("/c/te", "authorization", "Bearer x")},
			{h1: "GET /c/te HTTP/1.1\r\nHost: a.example\r\nCache-Control: no-store\r\n\r\n", h2: h2get("/c/te", "cache-control", "no-store")},
			{h1: "GET /c/te HTTP/1.1\r\nHost: a.example\r\n\r\n", h2: h2get("/c/te")},
		}},
		{"a long body without a length", []viewStep{
			{h1: "POST /up HTTP/1.1\r\nHost: a.example\r\nTransfer-Encoding: chunked\r\n\r\n" + fmt.Sprintf("%x\r\n%s\r\n0\r\n\r\n", len(longBody), longBody),
				h2: []string{":method", "POST", ":scheme", "https", ":authority", "a.example", ":path", "/up"}, data: pieces(longBody, 16<<10)},
			{h1: "POST /idem HTTP/1.1\r\nHost: a.example\r\nIdempotency-Key: \"L\"\r\nTransfer-Encoding: chunked\r\n\r\n" + fmt.Sprintf("%x\r\n%s\r\n0\r\n\r\n", len(longBody), longBody),
				h2: []string{":method", "POST", ":scheme", "https", ":authority", "a.example", ":path", "/idem", "idempotency-key", `"L"`}, data: pieces(longBody, 16<<10)},
			{h1: "POST /idem HTTP/1.1\r\nHost: a.example\r\nIdempotency-Key: \"L\"\r\nContent-Length: " + fmt.Sprint(len(longBody)) + "\r\n\r\n" + longBody,
				h2: []string{":method", "POST", ":scheme", "https", ":authority", "a.example", ":path", "/idem", "idempotency-key", `"L"`, "content-length", fmt.Sprint(len(longBody))}, data: pieces(longBody, 16<<10)},
		}},
		{"odd values", []viewStep{
			{h1: "GET /rl/header HTTP/1.1\r\nHost: a.example\r\nX-Api-Key: k\xc3\xa9\r\n\r\n", h2: h2get("/rl/header", "x-api-key", "k\xc3\xa9")},
			{h1: "GET /rl/header HTTP/1.1\r\nHost: a.example\r\nX-Api-Key: k\xc3\xa9\r\n\r\n", h2: h2get("/rl/header", "x-api-key", "k\xc3\xa9")},
			{h1: "GET /c/\xc3\xa9 HTTP/1.1\r\nHost: a.example\r\n\r\n", h2: h2get("/c/\xc3\xa9")},
			{h1: "GET /c/a;b=c HTTP/1.1\r\nHost: a.example\r\n\r\n", h2: h2get("/c/a;b=c")},
			{h1: "GET /c/q?? HTTP/1.1\r\nHost: a.example\r\n\r\n", h2: h2get("/c/q??")},
			{h1: "GET /c/q?a&&b= HTTP/1.1\r\nHost: a.example\r\n\r\n", h2: h2get("/c/q?a&&b=")},
			{h1: "GET /c/q?%zz HTTP/1.1\r\nHost: a.example\r\n\r\n", h2: h2get("/c/q?%zz")},
			{h1: "GET /c/%00 HTTP/1.1\r\nHost: a.example\r\n\r\n", h2: h2get("/c/%00")},
			{h1: "get /c/lower HTTP/1.1\r\nHost: a.example\r\n\r\n", h2: []string{":method", "get", ":scheme", "https", ":authority", "a.example", ":path", "/c/lower"}},
			{h1: "GET /c/q?x=\xc3\xa9 HTTP/1.1\r\nHost: a.example\r\n\r\n", h2: h2get("/c/q?x=\xc3\xa9")},
			{h1: "GET /c/%7e HTTP/1.1\r\nHost: a.example\r\n\r\n", h2: h2get("/c/%7e")},
			{h1: "GET /c/~ HTTP/1.1\r\nHost: a.example\r\n\r\n", h2: h2get("/c/~")},
			{h1: "GET /c/%7E HTTP/1.1\r\nHost: a.example\r\n\r\n", h2: h2get("/c/%7E")},
			{h1: "GET /c/q?a=%2f HTTP/1.1\r\nHost: a.example\r\n\r\n", h2: h2get("/c/q?a=%2f")},
			{h1: "GET /c/q?a=%2F HTTP/1.1\r\nHost: a.example\r\n\r\n", h2: h2get("/c/q?a=%2F")},
		}},
		{"odd authorities", []viewStep{
			{h1: "GET /c/h HTTP/1.1\r\nHost: a.example:x\r\n\r\n", h2: []string{":method", "GET", ":scheme", "https", ":authority", "a.example:x", ":path", "/c/h"}},
			{h1: "GET /c/h HTTP/1.1\r\nHost: [::1]:443\r\n\r\n", h2: []string{":method", "GET", ":scheme", "https", ":authority", "[::1]:443", ":path", "/c/h"}},
			{h1: "GET /c/h HTTP/1.1\r\nHost: a_b.example\r\n\r\n", h2: []string{":method", "GET", ":scheme", "https", ":authority", "a_b.example", ":path", "/c/h"}},
			{h1: "GET /c/h HTTP/1.1\r\nHost: a.example:\r\n\r\n", h2: []string{":method", "GET", ":scheme", "https", ":authority", "a.example:", ":path", "/c/h"}},
			{h1: "GET /c/h HTTP/1.1\r\nHost: a.example:0443\r\n\r\n", h2: []string{":method", "GET", ":scheme", "https", ":authority", "a.example:0443", ":path", "/c/h"}},
			{h1: "GET /c/h HTTP/1.1\r\nHost: a.ex%41mple\r\n\r\n", h2: []string{":method", "GET", ":scheme", "https", ":authority", "a.ex%41mple", ":path", "/c/h"}},
			{h1: "GET /rl/host HTTP/1.1\r\nHost: a.example\r\n\r\n", h2: h2get("/rl/host")},
			{h1: "GET /rl/host HTTP/1.1\r\nHost: a.example\r\n\r\n", h2: h2get("/rl/host")},
			{h1: "GET /rl/host HTTP/1.1\r\nHost: b.example\r\n\r\n", h2: []string{":method", "GET", ":scheme", "https", ":path", "/rl/host", "host", "b.example"}},
			{h1: "GET /rl/host HTTP/1.1\r\nHost: b.example\r\n\r\n", h2: []string{":method", "GET", ":scheme", "https", ":path", "/rl/host", "host", "b.example"}},
		}},
		{"cookie as a header key", []viewStep{
			{h1: "GET /rl/cookies HTTP/1.1\r\nHost: a.example\r\nCookie: a=1; b=2\r\n\r\n", h2: h2get("/rl/cookies", "cookie", "a=1", "cookie", "b=2")},
			{h1: "GET /rl/cookies HTTP/1.1\r\nHost: a.example\r\nCookie: a=1; b=2\r\n\r\n", h2: h2get("/rl/cookies", "cookie", "a=1; b=2")},
		}},
		{"a GET whose stream ends with an empty DATA", []viewStep{
			{h1: "GET /c/empty HTTP/1.1\r\nHost: a.example\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", h2: h2get("/c/empty"), data: []string{""}},
			{h1: "GET /c/empty HTTP/1.1\r\nHost: a.example\r\nContent-Length: 0\r\n\r\n", h2: h2get("/c/empty", "content-length", "0")},
			{h1: "DELETE /c/empty HTTP/1.1\r\nHost: a.example\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", h2: []string{":method", "DELETE", ":scheme", "https", ":authority", "a.example", ":path", "/c/empty"}, data: []string{""}},
			{h1: "GET /c/empty HTTP/1.1\r\nHost: a.example\r\n\r\n", h2: h2get("/c/empty")},
		}},
		{"X-Forwarded-For from a trusted proxy", []viewStep{
			{h1: "GET /rl/ip HTTP/1.1\r\nHost: a.example\r\nX-Forwarded-For: 192.0.2.1, 192.0.2.9\r\n\r\n",
				h2: h2get("/rl/ip", "x-forwarded-for", "192.0.2.1, 192.0.2.9")},
			{h1: "GET /rl/ip HTTP/1.1\r\nHost: a.example\r\nX-Forwarded-For: 192.0.2.1\r\nX-Forwarded-For: 192.0.2.9\r\n\r\n",
				h2: h2get("/rl/ip", "x-forwarded-for", "192.0.2.1", "x-forwarded-for", "192.0.2.9")},
			{h1: "GET /rl/ip HTTP/1.1\r\nHost: a.example\r\nx-forwarded-for: 192.0.2.8\r\nX-FORWARDED-FOR: 192.0.2.1\r\n\r\n",
				h2: h2get("/rl/ip", "x-forwarded-for", "192.0.2.8", "x-forwarded-for", "192.0.2.1")},
			{h1: "GET /rl/ip HTTP/1.1\r\nHost: a.example\r\nForwarded: for=192.0.2.7\r\n\r\n",
				h2: h2get("/rl/ip", "forwarded", "for=192.0.2.7")},
			{h1: "GET /rl/ip HTTP/1.1\r\nHost: a.example\r\nX-Real-IP: 192.0.2.6\r\n\r\n",
				h2: h2get("/rl/ip", "x-real-ip", "192.0.2.6")},
			{h1: "GET /rl/ip HTTP/1.1\r\nHost: a.example\r\nX-Forwarded-For: 192.0.2.5,\r\n\r\n",
				h2: h2get("/rl/ip", "x-forwarded-for", "192.0.2.5,")},
			{h1: "GET /c/xfh HTTP/1.1\r\nHost: a.example\r\nX-Forwarded-Host: b.example\r\nX-Forwarded-Port: 8443\r\nVia: 1.1 p\r\n\r\n",
				h2: h2get("/c/xfh", "x-forwarded-host", "b.example", "x-forwarded-port", "8443", "via", "1.1 p")},
			{h1: "GET /rl/ip HTTP/1.1\r\nHost: a.example\r\nX-Forwarded-For: 192.0.2.4\r\nX-Forwarded-For:\r\n\r\n",
				h2: h2get("/rl/ip", "x-forwarded-for", "192.0.2.4", "x-forwarded-for", "")},
		}},
		{"Expect: 100-continue", []viewStep{
			{h1: "POST /rl/header HTTP/1.1\r\nHost: a.example\r\nX-Api-Key: e\r\nContent-Length: 2\r\n\r\nab",
				h2: []string{":method", "POST", ":scheme", "https", ":authority", "a.example", ":path", "/rl/header", "x-api-key", "e", "content-length", "2"}, data: []string{"ab"}},
			{h1: "POST /rl/header HTTP/1.1\r\nHost: a.example\r\nX-Api-Key: e\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n",
				h2: []string{":method", "POST", ":scheme", "https", ":authority", "a.example", ":path", "/rl/header", "x-api-key", "e", "expect", "100-continue", "content-length", "2"}, hold: true},
		}},
		{"padded HTTP/2 values", []viewStep{
			{h1: "GET /rl/cookie HTTP/1.1\r\nHost: a.example\r\nCookie: a=1; sid=s9\r\n\r\n",
				h2: h2get("/rl/cookie", "cookie", "a=1 ", "cookie", " sid=s9 ")},
			{h1: "GET /rl/cookie HTTP/1.1\r\nHost: a.example\r\nCookie: sid=s9\r\n\r\n",
				h2: h2get("/rl/cookie", "cookie", "\tsid=s9")},
			{h1: "GET /c/vary HTTP/1.1\r\nHost: a.example\r\nCookie: a=1; b=2\r\n\r\n",
				h2: h2get("/c/vary", "cookie", "a=1", "cookie", "b=2 ")},
			{h1: "GET /c/vary HTTP/1.1\r\nHost: a.example\r\nCookie: a=1; b=2\r\n\r\n",
				h2: h2get("/c/vary", "cookie", " a=1", "cookie", "b=2")},
			{h1: "GET /c/vary HTTP/1.1\r\nHost: a.example\r\nCookie: a=1; b=2\r\n\r\n",
				h2: h2get("/c/vary", "cookie", "a=1\t", "cookie", "  b=2")},
			{h1: "GET /c/vary HTTP/1.1\r\nHost: a.example\r\nCache-Control: no-cache\r\n\r\n",
				h2: h2get("/c/vary", "cache-control", " no-cache ")},
			{h1: "POST /idem HTTP/1.1\r\nHost: a.example\r\nIdempotency-Key: \"p\"\r\nContent-Length: 1\r\n\r\nx",
				h2: []string{":method", "POST", ":scheme", "https", ":authority", "a.example", ":path", "/idem", "idempotency-key", ` "p" `}, data: []string{"x"}},
			{h1: "POST /idem HTTP/1.1\r\nHost: a.example\r\nIdempotency-Key: \"p\"\r\nContent-Length: 1\r\n\r\nx",
				h2: []string{":method", "POST", ":scheme", "https", ":authority", "a.example", ":path", "/idem", "idempotency-key", `"p"`}, data: []string{"x"}},
			{h1: "GET /rl/ip HTTP/1.1\r\nHost: a.example\r\nX-Forwarded-For: 192.0.2.3\r\n\r\n",
				h2: h2get("/rl/ip", "x-forwarded-for", " 192.0.2.3 ")},
			{h1: "GET /rl/ip HTTP/1.1\r\nHost: a.example\r\nX-Forwarded-For: 192.0.2.3\r\n\r\n",
				h2: h2get("/rl/ip", "x-forwarded-for", "192.0.2.3")},
		}},
		{"the upstream's answers", []viewStep{
			{h1: "GET /r/chunked HTTP/1.1\r\nHost: a.example\r\n\r\n", h2: h2get("/r/chunked")},
			{h1: "HEAD /r/chunked HTTP/1.1\r\nHost: a.example\r\n\r\n", h2: []string{":method", "HEAD", ":scheme", "https", ":authority", "a.example", ":path", "/r/chunked"}},
			{h1: "GET /c/r/chunked HTTP/1.1\r\nHost: a.example\r\n\r\n", h2: h2get("/c/r/chunked")},
			{h1: "HEAD /c/r/chunked HTTP/1.1\r\nHost: a.example\r\n\r\n", h2: []string{":method", "HEAD", ":scheme", "https", ":authority", "a.example", ":path", "/c/r/chunked"}},
			{h1: "GET /r/trailers HTTP/1.1\r\nHost: a.example\r\n\r\n", h2: h2get("/r/trailers")},
			{h1: "HEAD /r/trailers HTTP/1.1\r\nHost: a.example\r\n\r\n", h2: []string{":method", "HEAD", ":scheme", "https", ":authority", "a.example", ":path", "/r/trailers"}},
			{h1: "GET /c/r/trailers HTTP/1.1\r\nHost: a.example\r\n\r\n", h2: h2get("/c/r/trailers")},
			{h1: "HEAD /c/r/trailers HTTP/1.1\r\nHost: a.example\r\n\r\n", h2: []string{":method", "HEAD", ":scheme", "https", ":authority", "a.example", ":path", "/c/r/trailers"}},
			{h1: "GET /r/hop HTTP/1.1\r\nHost: a.example\r\n\r\n", h2: h2get("/r/hop")},
			{h1: "HEAD /r/hop HTTP/1.1\r\nHost: a.example\r\n\r\n", h2: []string{":method", "HEAD", ":scheme", "https", ":authority", "a.example", ":path", "/r/hop"}},
			{h1: "GET /c/r/hop HTTP/1.1\r\nHost: a.example\r\n\r\n", h2: h2get("/c/r/hop")},
			{h1: "HEAD /c/r/hop HTTP/1.1\r\nHost: a.example\r\n\r\n", h2: []string{":method", "HEAD", ":scheme", "https", ":authority", "a.example", ":path", "/c/r/hop"}},
			{h1: "GET /r/204 HTTP/1.1\r\nHost: a.example\r\n\r\n", h2: h2get("/r/204")},
			{h1: "HEAD /r/204 HTTP/1.1\r\nHost: a.example\r\n\r\n", h2: []string{":method", "HEAD", ":scheme", "https", ":authority", "a.example", ":path", "/r/204"}},
			{h1: "GET /c/r/204 HTTP/1.1\r\nHost: a.example\r\n\r\n", h2: h2get("/c/r/204")},
			{h1: "HEAD /c/r/204 HTTP/1.1\r\nHost: a.example\r\n\r\n", h2: []string{":method", "HEAD", ":scheme", "https", ":authority", "a.example", ":path", "/c/r/204"}},
			{h1: "GET /r/304 HTTP/1.1\r\nHost: a.example\r\n\r\n", h2: h2get("/r/304")},
			{h1: "HEAD /r/304 HTTP/1.1\r\nHost: a.example\r\n\r\n", h2: []string{":method", "HEAD", ":scheme", "https", ":authority", "a.example", ":path", "/r/304"}},
			{h1: "GET /c/r/304 HTTP/1.1\r\nHost: a.example\r\n\r\n", h2: h2get("/c/r/304")},
			{h1: "HEAD /c/r/304 HTTP/1.1\r\nHost: a.example\r\n\r\n", h2: []string{":method", "HEAD", ":scheme", "https", ":authority", "a.example", ":path", "/c/r/304"}},
			{h1: "GET /r/multi HTTP/1.1\r\nHost: a.example\r\n\r\n", h2: h2get("/r/multi")},
			{h1: "HEAD /r/multi HTTP/1.1\r\nHost: a.example\r\n\r\n", h2: []string{":method", "HEAD", ":scheme", "https", ":authority", "a.example", ":path", "/r/multi"}},
			{h1: "GET /c/r/multi HTTP/1.1\r\nHost: a.example\r\n\r\n", h2: h2get("/c/r/multi")},
			{h1: "HEAD /c/r/multi HTTP/1.1\r\nHost: a.example\r\n\r\n", h2: []string{":method", "HEAD", ":scheme", "https", ":authority", "a.example", ":path", "/c/r/multi"}},
			{h1: "GET /r/early HTTP/1.1\r\nHost: a.example\r\n\r\n", h2: h2get("/r/early")},
			{h1: "HEAD /r/early HTTP/1.1\r\nHost: a.example\r\n\r\n", h2: []string{":method", "HEAD", ":scheme", "https", ":authority", "a.example", ":path", "/r/early"}},
			{h1: "GET /c/r/early HTTP/1.1\r\nHost: a.example\r\n\r\n", h2: h2get("/c/r/early")},
			{h1: "HEAD /c/r/early HTTP/1.1\r\nHost: a.example\r\n\r\n", h2: []string{":method", "HEAD", ":scheme", "https", ":authority", "a.example", ":path", "/c/r/early"}},
			{h1: "GET /r/close HTTP/1.1\r\nHost: a.example\r\n\r\n", h2: h2get("/r/close")},
			{h1: "HEAD /r/close HTTP/1.1\r\nHost: a.example\r\n\r\n", h2: []string{":method", "HEAD", ":scheme", "https", ":authority", "a.example", ":path", "/r/close"}},
			{h1: "GET /c/r/close HTTP/1.1\r\nHost: a.example\r\n\r\n", h2: h2get("/c/r/close")},
			{h1: "HEAD /c/r/close HTTP/1.1\r\nHost: a.example\r\n\r\n", h2: []string{":method", "HEAD", ":scheme", "https", ":authority", "a.example", ":path", "/c/r/close"}},
			{h1: "GET /r/empty HTTP/1.1\r\nHost: a.example\r\n\r\n", h2: h2get("/r/empty")},
			{h1: "HEAD /r/empty HTTP/1.1\r\nHost: a.example\r\n\r\n", h2: []string{":method", "HEAD", ":scheme", "https", ":authority", "a.example", ":path", "/r/empty"}},
			{h1: "GET /c/r/empty HTTP/1.1\r\nHost: a.example\r\n\r\n", h2: h2get("/c/r/empty")},
			{h1: "HEAD /c/r/empty HTTP/1.1\r\nHost: a.example\r\n\r\n", h2: []string{":method", "HEAD", ":scheme", "https", ":authority", "a.example", ":path", "/c/r/empty"}},
			{h1: "GET /r/redirect HTTP/1.1\r\nHost: a.example\r\n\r\n", h2: h2get("/r/redirect")},
			{h1: "HEAD /r/redirect HTTP/1.1\r\nHost: a.example\r\n\r\n", h2: []string{":method", "HEAD", ":scheme", "https", ":authority", "a.example", ":path", "/r/redirect"}},
			{h1: "GET /c/r/redirect HTTP/1.1\r\nHost: a.example\r\n\r\n", h2: h2get("/c/r/redirect")},
			{h1: "HEAD /c/r/redirect HTTP/1.1\r\nHost: a.example\r\n\r\n", h2: []string{":method", "HEAD", ":scheme", "https", ":authority", "a.example", ":path", "/c/r/redirect"}},
		}},
		{"HEAD from GET", []viewStep{
			{h1: "GET /c/head HTTP/1.1\r\nHost: a.example\r\n\r\n", h2: h2get("/c/head")},
			{h1: "HEAD /c/head HTTP/1.1\r\nHost: a.example\r\n\r\n", h2: []string{":method", "HEAD", ":scheme", "https", ":authority", "a.example", ":path", "/c/head"}},
		}},
		{"header keys in any case", []viewStep{
			{h1: "GET /rl/header HTTP/1.1\r\nHost: a.example\r\nX-API-KEY: k1\r\n\r\n",
				h2: h2get("/rl/header", "x-api-key", "k1")},
			{h1: "GET /rl/header HTTP/1.1\r\nHost: a.example\r\nx-api-key: k1\r\n\r\n",
				h2: h2get("/rl/header", "x-api-key", "k1")},
			{h1: "GET /rl/header HTTP/1.1\r\nHost: a.example\r\nX-Api-Key: k2\r\nX-Forwarded-For: 192.0.2.7\r\n\r\n",
				h2: h2get("/rl/header", "x-api-key", "k2", "x-forwarded-for", "192.0.2.7")},
		}},
		{"idempotency key and a body", []viewStep{
			{h1: "POST /idem HTTP/1.1\r\nHost: a.example\r\nIdempotency-Key: \"k\"\r\nContent-Length: 3\r\n\r\nabc",
				h2: []string{":method", "POST", ":scheme", "https", ":authority", "a.example", ":path", "/idem", "idempotency-key", `"k"`, "content-length", "3"}, data: []string{"abc"}},
			{h1: "POST /idem HTTP/1.1\r\nHost: a.example\r\nidempotency-key: \"k\"\r\nContent-Length: 3\r\n\r\nabc",
				h2: []string{":method", "POST", ":scheme", "https", ":authority", "a.example", ":path", "/idem", "idempotency-key", `"k"`}, data: []string{"a", "bc"}},
			{h1: "POST /idem HTTP/1.1\r\nHost: a.example\r\nIdempotency-Key: \"k\"\r\nContent-Length: 3\r\n\r\nabd",
				h2: []string{":method", "POST", ":scheme", "https", ":authority", "a.example", ":path", "/idem", "idempotency-key", `"k"`}, data: []string{"abd", ""}},
		}},
		{"a body without a length, an empty last DATA, trailers", []viewStep{
			{h1: "POST /up HTTP/1.1\r\nHost: a.example\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
				h2: []string{":method", "POST", ":scheme", "https", ":authority", "a.example", ":path", "/up"}, data: []string{"abc"}},
			{h1: "POST /up HTTP/1.1\r\nHost: a.example\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
				h2: []string{":method", "POST", ":scheme", "https", ":authority", "a.example", ":path", "/up"}, data: []string{"ab", "c", ""}},
			{h1: "POST /up HTTP/1.1\r\nHost: a.example\r\nContent-Length: 0\r\n\r\n",
				h2: []string{":method", "POST", ":scheme", "https", ":authority", "a.example", ":path", "/up"}, data: []string{""}},
			{h1: "POST /up HTTP/1.1\r\nHost: a.example\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\nX-Sum: 1\r\n\r\n",
				h2: []string{":method", "POST", ":scheme", "https", ":authority", "a.example", ":path", "/up"}, data: []string{"abc"}, trailers: []string{"x-sum", "1"}},
		}},
		{"cache-control request directives", []viewStep{
			{h1: "GET /c/cc HTTP/1.1\r\nHost: a.example\r\n\r\n", h2: h2get("/c/cc")},
			{h1: "GET /c/cc HTTP/1.1\r\nHost: a.example\r\nCache-Control: no-cache\r\n\r\n", h2: h2get("/c/cc", "cache-control", "no-cache")},
			{h1: "GET /c/cc HTTP/1.1\r\nHost: a.example\r\nCache-Control: max-age=0\r\n\r\n", h2: h2get("/c/cc", "cache-control", "max-age=0")},
			{h1: "GET /c/cc HTTP/1.1\r\nHost: a.example\r\nPragma: no-cache\r\n\r\n", h2: h2get("/c/cc", "pragma", "no-cache")},
			{h1: "GET /c/cc HTTP/1.1\r\nHost: a.example\r\nCache-Control: only-if-cached\r\n\r\n", h2: h2get("/c/cc", "cache-control", "only-if-cached")},
		}},
		{"queries and percent-encoding", []viewStep{
			{h1: "GET /c/q?x=1 HTTP/1.1\r\nHost: a.example\r\n\r\n", h2: h2get("/c/q?x=1")},
			{h1: "GET /c/q? HTTP/1.1\r\nHost: a.example\r\n\r\n", h2: h2get("/c/q?")},
			{h1: "GET /c/q HTTP/1.1\r\nHost: a.example\r\n\r\n", h2: h2get("/c/q")},
			{h1: "GET /c/%71 HTTP/1.1\r\nHost: a.example\r\n\r\n", h2: h2get("/c/%71")},
			{h1: "GET /c/q?x=%31 HTTP/1.1\r\nHost: a.example\r\n\r\n", h2: h2get("/c/q?x=%31")},
			{h1: "GET /c/q#f HTTP/1.1\r\nHost: a.example\r\n\r\n", h2: h2get("/c/q#f")},
			{h1: "GET /c/a%2Fb HTTP/1.1\r\nHost: a.example\r\n\r\n", h2: h2get("/c/a%2Fb")},
			{h1: "GET /rl/query?k=a%20b HTTP/1.1\r\nHost: a.example\r\n\r\n", h2: h2get("/rl/query?k=a%20b")},
			{h1: "GET /rl/query?k=a+b HTTP/1.1\r\nHost: a.example\r\n\r\n", h2: h2get("/rl/query?k=a+b")},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h1, _ := startViewSide(t, false, "")
			h2, conf := startViewSide(t, true, "")
			for i, st := range tc.steps {
				a1 := h1Send(t, h1.addr, st.h1)
				a2 := h2Send(t, h2.addr, conf, st)
				if a1 != a2 {
					t.Errorf("step %d: HTTP/1.1 got %+v\nHTTP/2 got %+v", i, a1, a2)
				}
				if l := entries(i, h1, h2); l[0] != l[1] {
					t.Errorf("step %d, access log: HTTP/1.1 %s\nHTTP/2   %s", i, l[0], l[1])
				}
			}
			s1, s2 := h1.up.Requests(), h2.up.Requests()
			for i := range max(len(s1), len(s2)) {
				var v1, v2 string
				if i < len(s1) {
					v1 = seenView(s1[i])
				}
				if i < len(s2) {
					v2 = seenView(s2[i])
				}
				if v1 != v2 {
					t.Errorf("upstream request %d: from HTTP/1.1\n%s\nfrom HTTP/2\n%s", i, v1, v2)
				}
			}
			var m1, m2 metrics.Snapshot
			metrics.Read(h1.region, &m1)
			metrics.Read(h2.region, &m2)
			if m1.Requests() == 0 {
				t.Error("preforkd_http_requests_total counted nothing")
			}
			for code := 100; code < 600; code++ {
				if n1, n2 := m1.Value(metrics.HTTPRequests, code-100), m2.Value(metrics.HTTPRequests, code-100); n1 != n2 {
					t.Errorf("preforkd_http_requests_total{code=%d}: %d over HTTP/1.1, %d over HTTP/2", code, n1, n2)
				}
			}
		})
	}
}

// Some malformed HTTP/2 requests never reach the engine: x/net's server
// resets their stream (PROTOCOL_ERROR; RFC 9113 §8.1.1 makes a malformed
// request a stream error and only allows an answer before the reset)
// where the HTTP/1.1 engines answer 400: a :path that is not an
// origin-form target ("c/rel", "https://b.example/p"), whose
// percent-encoding is bad or that holds a control character; an
// authority with userinfo; two Host fields, or a Host that differs from
// the :authority, even in case only (§8.3.1; over HTTP/1.1 an
// absolute-form target's authority replaces Host, RFC 9112 §3.2.2); a
// connection-specific field (§8.2.2). Either way the request is refused
// and never forwarded; no response was sent on the stream, so none is
// logged or counted.
func TestHTTP2MalformedStreamsAreReset(t *testing.T) {
	h2, conf := startViewSide(t, true, "")
	for _, fields := range [][]string{
		{":method", "GET", ":scheme", "https", ":authority", "a.example", ":path", "c/rel"},
		{":method", "GET", ":scheme", "https", ":authority", "a.example", ":path", "https://b.example/c/p"},
		{":method", "GET", ":scheme", "https", ":authority", "a.example", ":path", "/c/%zz"},
		{":method", "GET", ":scheme", "https", ":authority", "a.example", ":path", "/c/x\x7f"},
		{":method", "GET", ":scheme", "https", ":path", "/c/p", "host", "a.example", "host", "a.example"},
		{":method", "GET", ":scheme", "https", ":authority", "a.example", ":path", "/c/p", "te", "gzip"},
		{":method", "GET", ":scheme", "https", ":authority", "a.example", ":path", "/c/p", "connection", "close"},
		{":method", "GET", ":scheme", "https", ":path", "/c/p", "host", "u@a.example"},
		{":method", "GET", ":scheme", "https", ":authority", "u@a.example", ":path", "/c/p"},
		{":method", "GET", ":scheme", "https", ":authority", "a.example", ":path", "/c/p", "host", "b.example"},
		{":method", "GET", ":scheme", "https", ":authority", "a.example", ":path", "/c/p", "host", "A.EXAMPLE"},
	} {
		if a := h2Send(t, h2.addr, conf, viewStep{h2: fields}); a.status != "" && a.status != "400" {
			t.Errorf("%q: %+v, want the stream reset or 400", fields, a)
		}
	}
	if seen := h2.up.Requests(); len(seen) != 0 {
		t.Errorf("the upstream got %q", seen[0].Line)
	}
}
