package proxy

// The harness of FuzzRequest (fuzz_test.go): what the request parser
// promises whatever a client sends. It lives in the package, as the parser
// does; the fuzz target and its seeds (the conformance table) are in
// proxy_test.

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/textproto"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/preforkd/preforkd/core"
	"github.com/preforkd/preforkd/engine"
	"github.com/preforkd/preforkd/internal/shmtest"
	"github.com/preforkd/preforkd/route"
	"github.com/preforkd/preforkd/shm"
)

// The upstream and the client of CheckRequest.
const (
	checkUpstream     = "http://upstream.test/base"
	checkUpstreamHost = "upstream.test"
	checkPrefix       = "/base"
)

var checkPeer = netip.MustParseAddr("192.0.2.7")

// CheckRequest serves data as one client connection, read exactly as the
// server reads one: fasthttp's own header and body parsing with the
// server's settings, the connection's own checks (conn.Read), the Expect
// hook. Where the server would forward a request (parse accepted it, its
// path is acceptable and its body could be read), it checks that:
//
//   - the request has not both Content-Length and Transfer-Encoding;
//   - the head appendHead sends upstream, followed by the body, is exactly
//     one request to net/http's ReadRequest, with the method, the path as
//     the core passes it on, the query, and the client's header fields but
//     the hop-by-hop ones (as listed here, independently of the parser),
//     one Host, the X-Forwarded-* fields, and the body the server read;
//   - Header and HeaderLines (what the core sees) answer, for every name,
//     exactly the lines that head carries (X-Forwarded-For: the client's
//     chain, to which the head adds the peer; Content-Length: the same
//     number, when the client sent one).
//
// It returns how many requests the server would have forwarded.
func CheckRequest(t testing.TB, data []byte) (forwarded int) {
	t.Helper()
	dc, err := core.New(shmtest.Private(t, shm.Options{Counters: 64, MaxWorkers: 1}), core.Options{}) // no rule: every request passes
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(Options{Upstream: checkUpstream, Core: dc, Limits: engine.Limits{MaxHeaderBytes: 8 << 10}}) // as the conformance suite's engine
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	// serve's prologue, then the checks where serveParsed would forward.
	s.srv.Handler = func(ctx *fasthttp.RequestCtx) {
		c := ctx.Conn().(*conn)
		r := c.early // parsed by expect (Expect: 100-continue)
		if r != nil {
			c.early = nil
		} else {
			r = s.requests.Get().(*request)
			r.ctx, r.c = ctx, c
			if bad := r.parse(); bad != nil {
				if bad != engine.ErrTarget || !isOptionsAsterisk(ctx) { // OPTIONS * is answered 200
					s.refuse(ctx, bad, nil)
				}
				s.done(r)
				return
			}
		}
		defer s.done(r)
		if checkParsed(t, dc, r) {
			forwarded++
		}
	}
	c := &conn{Conn: &byteConn{r: bytes.NewReader(data)}, s: s, peer: checkPeer, idleSince: time.Now()}
	c.head.Start()
	_ = s.srv.ServeConn(c) // a refused request ends it with an error
	return forwarded
}

// checkParsed checks a request parse accepted, and reports whether the
// server would forward it: whether dc, which has no rule, lets it pass.
func checkParsed(t testing.TB, dc *core.Core, r *request) bool {
	t.Helper()
	h := &r.ctx.Request.Header
	lines := rawLines(h.RawHeaders())
	if has(lines, "content-length") && has(lines, "transfer-encoding") {
		t.Fatalf("accepted with both Content-Length and Transfer-Encoding:\n%s", requestHead(h))
	}

	// What serveParsed and forward do before the head is written.
	r.body.reset(r)
	ex := dc.Begin(r)
	defer ex.Finish(nil)
	if ex.Decide() != core.Pass {
		return false // 400: the path, the authority, ... is not acceptable
	}
	r.fwd = ex.Forward()
	if r.body.readAhead(r, readAheadBytes) != nil {
		return false // 400: the body could not be read
	}
	if r.upgrade && !r.body.done {
		return false // 400
	}
	head := r.appendHead(nil)
	msg := head
	if r.body.done {
		msg = append(slices.Clip(head), r.body.bytes()...)
	}

	// The upstream reads one request.
	br := bufio.NewReader(bytes.NewReader(msg))
	up, err := http.ReadRequest(br)
	if err != nil {
		t.Fatalf("the forwarded head does not parse: %v\nrequest:\n%s\nforwarded:\n%s", err, requestHead(h), head)
	}
	body, err := io.ReadAll(up.Body)
	if err != nil {
		t.Fatalf("the forwarded body does not read: %v\nforwarded:\n%s", err, head)
	}
	if r.body.done {
		if !bytes.Equal(body, r.body.bytes()) {
			t.Fatalf("the upstream reads body %q; the server read %q\nforwarded:\n%s", body, r.body.bytes(), head)
		}
		if n := br.Buffered(); n > 0 {
			rest, _ := br.Peek(n)
			t.Fatalf("%d bytes after the forwarded request: %q\nforwarded:\n%s", n, rest, head)
		}
	}

	want := expectHead(h, lines)
	if up.Method != want.method {
		t.Fatalf("forwarded method %q, want %q\nforwarded:\n%s", up.Method, want.method, head)
	}
	if up.RequestURI != want.target {
		t.Fatalf("forwarded target %q, want %q\nforwarded:\n%s", up.RequestURI, want.target, head)
	}
	// The fields as sent: ReadRequest takes Host out of its Header, and
	// may add to it.
	tp := textproto.NewReader(bufio.NewReader(bytes.NewReader(head)))
	if _, err := tp.ReadLine(); err != nil {
		t.Fatal(err)
	}
	got, err := tp.ReadMIMEHeader()
	if err != nil {
		t.Fatalf("the forwarded header section does not parse: %v\nforwarded:\n%s", err, head)
	}
	if len(got["Host"]) != 1 || got["Host"][0] != up.Host {
		t.Fatalf("forwarded with %d Host fields %q\nrequest:\n%s\nforwarded:\n%s", len(got["Host"]), got["Host"], requestHead(h), head)
	}
	for name, values := range want.fields {
		if !slices.Equal(got[name], values) {
			t.Fatalf("forwarded %s %q, want %q\nrequest:\n%s\nforwarded:\n%s", name, got[name], values, requestHead(h), head)
		}
	}
	for name, values := range got {
		if _, ok := want.fields[name]; !ok && !framing(name) && !(name == "Connection" && r.upgrade) {
			t.Fatalf("forwarded %s %q, which is not the client's to forward\nrequest:\n%s\nforwarded:\n%s", name, values, requestHead(h), head)
		}
	}
	if r.upgrade && !slices.Equal(got["Connection"], []string{"Upgrade"}) {
		t.Fatalf("an upgrade forwarded with Connection %q\nforwarded:\n%s", got["Connection"], head)
	}

	// The core sees what the upstream gets.
	names := map[string]bool{"host": true, "x-forwarded-for": true, "x-forwarded-proto": true,
		"x-forwarded-host": true, "content-length": true, "transfer-encoding": true, "connection": true}
	for _, l := range lines {
		names[strings.ToLower(l.name)] = true
	}
	for name := range names {
		seen := r.HeaderLines(name, nil)
		first, n := r.Header(name)
		if n != len(seen) || (n > 0 && first != seen[0]) {
			t.Fatalf("Header(%q) = %q, %d; HeaderLines %q", name, first, n, seen)
		}
		sent := got[textproto.CanonicalMIMEHeaderKey(name)]
		ok := true
		switch name {
		case "x-forwarded-for":
			chain := slices.DeleteFunc(slices.Clone(seen), func(v string) bool { return v == "" })
			ok = slices.Equal(sent, []string{strings.Join(append(chain, checkPeer.String()), ", ")})
		case "content-length":
			for _, v := range seen {
				ok = ok && len(sent) == 1 && sameNumber(v, sent[0])
			}
		case "transfer-encoding", "connection":
			ok = len(seen) == 0 // the framing and the upgrade are the server's own
		case "host":
			ok = len(seen) == 0 || slices.Equal(seen, sent) // none: the upstream's name is sent
		default:
			ok = slices.Equal(seen, sent)
		}
		if !ok {
			t.Fatalf("the core sees %s %q; the upstream gets %q\nrequest:\n%s\nforwarded:\n%s", name, seen, sent, requestHead(h), head)
		}
	}
	return true
}

// requestHead is the request line and header section fasthttp read.
func requestHead(h *fasthttp.RequestHeader) string {
	return string(h.Method()) + " " + string(h.RequestURI()) + " " + string(h.Protocol()) + "\r\n" + string(h.RawHeaders())
}

// framing reports whether a forwarded field is the server's own framing
// of the body.
func framing(name string) bool { return name == "Content-Length" || name == "Transfer-Encoding" }

func sameNumber(a, b string) bool {
	x, errA := strconv.ParseInt(a, 10, 64)
	y, errB := strconv.ParseInt(b, 10, 64)
	return errA == nil && errB == nil && x == y
}

// line is one header line as the client sent it.
type line struct{ name, value string }

// rawLines splits a header section into its lines, values trimmed.
func rawLines(raw []byte) []line {
	var out []line
	for _, l := range strings.Split(string(raw), "\n") {
		l = strings.TrimSuffix(l, "\r")
		if l == "" {
			break
		}
		name, value, _ := strings.Cut(l, ":")
		out = append(out, line{name, strings.Trim(value, " \t")})
	}
	return out
}

func has(lines []line, name string) bool {
	for _, l := range lines {
		if strings.EqualFold(strings.Trim(l.name, " \t"), name) {
			return true
		}
	}
	return false
}

// wantHead is what the upstream must get for a request.
type wantHead struct {
	method, target string
	fields         map[string][]string // by canonical name, framing aside
}

// ownFields are the fields whose fate a rule of their own decides: never
// forwarded as the client sent them, whatever Connection names.
var ownFields = map[string]bool{
	"connection": true, "keep-alive": true, "te": true, "trailer": true, "transfer-encoding": true,
	"upgrade": true, "expect": true, "content-length": true, "host": true,
	"x-forwarded-for": true, "x-forwarded-proto": true, "x-forwarded-host": true,
}

// expectHead is the model of the forwarded head, from the request line and
// the raw header lines: RFC 9110 §7.6.1 (Connection and the fields it
// names, Keep-Alive, TE, Trailer, Transfer-Encoding, Proxy-*, Upgrade but
// on an upgrade), Expect answered here, names with '_' dropped, Host
// replaced by the authority of an absolute-form target, X-Forwarded-*
// written anew.
func expectHead(h *fasthttp.RequestHeader, lines []line) wantHead {
	w := wantHead{method: string(h.Method()), fields: map[string][]string{}}

	uri := string(h.RequestURI())
	authority, absolute := "", !strings.HasPrefix(uri, "/")
	if absolute {
		rest := uri[len("http://"):] // parse accepts no other absolute form
		i := strings.IndexAny(rest, "/?")
		if i < 0 {
			i = len(rest)
		}
		authority, uri = rest[:i], rest[i:]
	}
	path, query, hasQuery := strings.Cut(uri, "?")
	if path == "" {
		path = "/"
	}
	_, fwd, _ := route.Normalize(path)
	w.target = checkPrefix + fwd
	if hasQuery {
		w.target += "?" + query
	}

	named := map[string]bool{}
	upgradeAsked, upgradeField, h2c := false, false, false
	for _, l := range lines {
		switch strings.ToLower(l.name) {
		case "connection":
			for _, t := range strings.Split(l.value, ",") {
				t = strings.ToLower(strings.Trim(t, " \t"))
				named[t] = true
				upgradeAsked = upgradeAsked || t == "upgrade"
			}
		case "upgrade":
			upgradeField = true
			for _, t := range strings.Split(l.value, ",") {
				h2c = h2c || strings.EqualFold(strings.Trim(t, " \t"), "h2c")
			}
		}
	}
	upgrade := upgradeAsked && upgradeField && !h2c && string(h.Protocol()) == "HTTP/1.1"

	var hosts, chain []string
	for _, l := range lines {
		name := strings.ToLower(l.name)
		switch {
		case name == "host":
			hosts = append(hosts, l.value)
			continue
		case name == "x-forwarded-for":
			if l.value != "" {
				chain = append(chain, l.value)
			}
			continue
		case name == "upgrade" && upgrade:
		case ownFields[name], len(name) > len("proxy-") && strings.HasPrefix(name, "proxy-"),
			strings.Contains(name, "_"), named[name]:
			continue
		}
		key := textproto.CanonicalMIMEHeaderKey(l.name)
		w.fields[key] = append(w.fields[key], l.value)
	}
	host := authority
	switch {
	case absolute:
		w.fields["Host"] = []string{authority}
	case len(hosts) == 0 || hosts[0] == "":
		// HTTP/1.0 may send none, or an empty one (no authority, RFC
		// 9110 §7.2): HTTP/1.1 needs one.
		w.fields["Host"] = []string{checkUpstreamHost}
	default:
		host = hosts[len(hosts)-1]
		w.fields["Host"] = hosts
	}
	w.fields["X-Forwarded-For"] = []string{strings.Join(append(chain, checkPeer.String()), ", ")}
	w.fields["X-Forwarded-Proto"] = []string{"http"}
	if host != "" {
		w.fields["X-Forwarded-Host"] = []string{host}
	}
	return w
}

// byteConn is a client connection that sends its bytes and then closes;
// what the server writes is dropped.
type byteConn struct{ r *bytes.Reader }

func (c *byteConn) Read(p []byte) (int, error)  { return c.r.Read(p) }
func (c *byteConn) Write(p []byte) (int, error) { return len(p), nil }
func (c *byteConn) Close() error                { return nil }
func (c *byteConn) LocalAddr() net.Addr         { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 8080} }
func (c *byteConn) RemoteAddr() net.Addr {
	return net.TCPAddrFromAddrPort(netip.AddrPortFrom(checkPeer, 40000))
}
func (c *byteConn) SetDeadline(time.Time) error      { return nil }
func (c *byteConn) SetReadDeadline(time.Time) error  { return nil }
func (c *byteConn) SetWriteDeadline(time.Time) error { return nil }
