//lint:file-ignore SA1019 x/net's http2.Transport is the client that speaks HTTP/2 over a TLS connection with test-chosen settings; the server under test is x/net's too (tlsedge.go).

package tlsedge_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptrace"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/preforkd/preforkd/core"
	"github.com/preforkd/preforkd/engine"
	"github.com/preforkd/preforkd/engine/nethttp"
	"github.com/preforkd/preforkd/engine/nethttp/tlsedge"
	"github.com/preforkd/preforkd/internal/logtest"
	"github.com/preforkd/preforkd/internal/shmtest"
	"github.com/preforkd/preforkd/internal/tlstest"
	"github.com/preforkd/preforkd/internal/wiretest"
	"github.com/preforkd/preforkd/metrics"
	"github.com/preforkd/preforkd/shm"
	"github.com/preforkd/preforkd/tlsconf"
)

// tlsServer serves a TLS listener with HTTP/2 on, forwarding to upstream,
// and returns its address, a client that trusts it, and the server.
func tlsServer(t testing.TB, upstream string) (string, *tls.Config, *nethttp.Server) {
	t.Helper()
	addr, client, s, _ := tlsServerConfig(t, upstream, engine.Limits{}, nil)
	return addr, client, s
}

// tlsServerConfig is tlsServer with lim, logging to log (nil: nowhere),
// and the TLS configuration it serves.
func tlsServerConfig(t testing.TB, upstream string, lim engine.Limits, log *slog.Logger) (string, *tls.Config, *nethttp.Server, *tls.Config) {
	t.Helper()
	o := shm.Options{Counters: 64}
	metrics.Geometry(&o, 8)
	return tlsServerIn(t, shmtest.Private(t, o), upstream, lim, log)
}

// tlsServerIn is tlsServerConfig counting in region.
func tlsServerIn(t testing.TB, region *shm.Region, upstream string, lim engine.Limits, log *slog.Logger) (string, *tls.Config, *nethttp.Server, *tls.Config) {
	t.Helper()
	c, err := core.New(region, core.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return tlsServerCore(t, c, upstream, lim, log)
}

// tlsServerCore is tlsServerIn deciding with c.
func tlsServerCore(t testing.TB, c *core.Core, upstream string, lim engine.Limits, log *slog.Logger) (string, *tls.Config, *nethttp.Server, *tls.Config) {
	t.Helper()
	ca := tlstest.NewCA(t)
	cert, key := ca.Leaf(t, "a.example")
	tc, err := tlsconf.Options{Certificates: []tlsconf.Pair{{Cert: cert, Key: key}}, HTTP2: true}.Config()
	if err != nil {
		t.Fatal(err)
	}
	up, err := nethttp.NewUpstream(c, upstream, engine.Upstream{})
	if err != nil {
		t.Fatal(err)
	}
	edge, err := tlsedge.New(tlsedge.Options{Config: tc})
	if err != nil {
		t.Fatal(err)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s, err := nethttp.NewServer(nethttp.ServerOptions{Core: c, Upstream: up, Edge: edge, Limits: lim, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go s.Serve(ln)
	return ln.Addr().String(), &tls.Config{ServerName: "a.example", RootCAs: ca.Pool}, s, tc
}

// Over TLS, HTTP/1.1 and HTTP/2 reach the upstream alike (with
// X-Forwarded-Proto: https), and Shutdown drains both promptly: an idle
// HTTP/2 connection gets GOAWAY, an idle HTTP/1.1 one its grace.
func TestTLSServesAndDrains(t *testing.T) {
	up := wiretest.Application(t, func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, r.Header.Get("X-Forwarded-Proto")+" "+r.Proto)
	})
	addr, conf, s := tlsServer(t, up)
	h1 := &http.Client{Transport: &http.Transport{TLSClientConfig: conf}}
	h2 := &http.Client{Transport: &http2.Transport{TLSClientConfig: conf}}
	for name, c := range map[string]*http.Client{"HTTP/1.1": h1, "HTTP/2.0": h2} {
		resp, err := c.Get("https://" + addr + "/x")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.Proto != name || string(b) != "https HTTP/1.1" {
			t.Errorf("%s: %s %q, want the upstream reached over HTTP/1.1 with X-Forwarded-Proto https", name, resp.Proto, b)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	if err := s.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown: %v after %v", err, time.Since(start))
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("Shutdown took %v with two idle connections", d)
	}
}

// A request the core refuses as malformed (a path with an encoded slash)
// closes an HTTP/1.1 connection, as on every engine, but not an HTTP/2
// one: it was one stream, and Connection: close would make net/http send
// GOAWAY to every other stream's client.
func TestMalformedRequestClosesHTTP1Only(t *testing.T) {
	up := wiretest.Application(t, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
	addr, conf, _ := tlsServer(t, up)
	h1 := &http.Client{Transport: &http.Transport{TLSClientConfig: conf}}
	h2 := &http.Client{Transport: &http2.Transport{TLSClientConfig: conf}}
	for name, c := range map[string]*http.Client{"HTTP/1.1": h1, "HTTP/2.0": h2} {
		var reused []bool
		trace := &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) { reused = append(reused, i.Reused) }}
		var closed []bool
		for _, path := range []string{"/ok", "/a%2Fb", "/ok"} {
			req, _ := http.NewRequestWithContext(httptrace.WithClientTrace(context.Background(), trace), "GET", "https://"+addr+path, nil)
			resp, err := c.Do(req)
			if err != nil {
				t.Fatalf("%s %s: %v", name, path, err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if want := map[bool]int{true: 200, false: 400}[path == "/ok"]; resp.StatusCode != want {
				t.Fatalf("%s %s: %d, want %d", name, path, resp.StatusCode, want)
			}
			closed = append(closed, resp.Close)
		}
		if name == "HTTP/1.1" && (!closed[1] || reused[2]) {
			t.Errorf("HTTP/1.1: after the 400 Close %v, next request on the same connection %v; want it closed", closed[1], reused[2])
		}
		if name == "HTTP/2.0" && !reused[2] {
			t.Errorf("HTTP/2: the request after the 400 came on a new connection (GOAWAY); want the same one")
		}
	}
}

// The session ticket keys set on the configuration after the edge was
// made are the ones it serves with (tlsconf.Rotate sets them so): a
// ticket of keys rotated out no longer resumes.
func TestTicketKeysReachTheServedConfig(t *testing.T) {
	up := wiretest.Application(t, func(w http.ResponseWriter, r *http.Request) {})
	addr, client, _, tc := tlsServerConfig(t, up, engine.Limits{}, nil)
	client.MaxVersion = tls.VersionTLS12 // the ticket comes in the handshake
	client.ClientSessionCache = tls.NewLRUClientSessionCache(4)
	resumed := func() bool {
		c, err := tls.Dial("tcp", addr, client)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		return c.ConnectionState().DidResume
	}
	tc.SetSessionTicketKeys([][32]byte{{1}})
	resumed() // a ticket of key 1
	if !resumed() {
		t.Fatal("a ticket of the current key did not resume")
	}
	tc.SetSessionTicketKeys([][32]byte{{2}})
	if resumed() {
		t.Error("a ticket of a key rotated out resumed: the edge serves keys of its own")
	}
}

// A header section just under max_header_bytes (64 KiB by default) is
// served over HTTP/2 as over HTTP/1.1.
func TestMaxHeaderBytesOverHTTP2(t *testing.T) {
	up := wiretest.Application(t, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
	addr, conf, _ := tlsServer(t, up)
	h1 := &http.Client{Transport: &http.Transport{TLSClientConfig: conf}}
	h2 := &http.Client{Transport: &http2.Transport{TLSClientConfig: conf}}
	pad := strings.Repeat("x", engine.DefaultMaxHeaderBytes-2000)
	for name, c := range map[string]*http.Client{"HTTP/1.1": h1, "HTTP/2.0": h2} {
		req, _ := http.NewRequest("GET", "https://"+addr+"/big", nil)
		req.Header.Set("X-Pad", pad)
		resp, err := c.Do(req)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Errorf("%s: a header of %d bytes got %d, want 200 (max_header_bytes %d)", name, len(pad), resp.StatusCode, engine.DefaultMaxHeaderBytes)
		}
	}
}

// read_header_timeout holds on HTTP/2 as on HTTP/1.1: a header block
// begun and never ended, or no request at all on a new connection, closes
// the connection once it ran out (before idle_timeout, much longer here).
func TestReadHeaderTimeoutOverHTTP2(t *testing.T) {
	up := wiretest.Application(t, func(w http.ResponseWriter, r *http.Request) {})
	var logged logtest.Buffer
	const timeout = time.Second
	addr, conf, _, _ := tlsServerConfig(t, up, engine.Limits{ReadHeaderTimeout: timeout, IdleTimeout: time.Minute}, slog.New(slog.NewTextHandler(&logged, nil)))
	conf.NextProtos = []string{"h2"}
	for _, stall := range []string{"no preface", "no request", "a header block never ended", "after a request, a block never ended"} {
		c, err := tls.Dial("tcp", addr, conf)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if stall != "no preface" {
			io.WriteString(c, http2.ClientPreface)
		}
		fr := http2.NewFramer(c, c)
		if stall != "no preface" {
			fr.WriteSettings()
		}
		block := []byte{0x82, 0x87, 0x84, 0x41, 0x01, 'a'} // :method GET, :scheme https, :path /, :authority a
		if stall == "after a request, a block never ended" {
			fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block, EndStream: true, EndHeaders: true})
			time.Sleep(timeout * 3 / 2) // past the timeout, between requests: idle, not cut
			fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 3, BlockFragment: block[:2], EndStream: true})
		} else if stall == "a header block never ended" {
			fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block[:2], EndStream: true})
		}
		start := time.Now()
		c.SetReadDeadline(time.Now().Add(10 * timeout))
		var sawResponse bool
		for {
			f, err := fr.ReadFrame()
			if err != nil {
				break
			}
			if h, ok := f.(*http2.HeadersFrame); ok && h.StreamID == 1 {
				sawResponse = true
			}
		}
		if d := time.Since(start); d > 5*timeout {
			t.Errorf("%s: the connection stayed %v, want it closed at read_header_timeout", stall, d)
		}
		if stall == "after a request, a block never ended" && (!sawResponse || time.Since(start) < timeout/2) {
			t.Errorf("%s: answered %v, closed after %v; want the first answered, and the close at the second's timeout, not while idle",
				stall, sawResponse, time.Since(start))
		}
	}
	if l := logged.String(); l != "" {
		t.Errorf("the timeouts were logged, want them quiet as on HTTP/1:\n%s", l)
	}
}

// The server's own refusals (CONNECT: 405) close an HTTP/1.1 connection
// but not an HTTP/2 one: no GOAWAY, the next stream is served.
func TestOwnRefusalKeepsTheHTTP2Connection(t *testing.T) {
	up := wiretest.Application(t, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
	addr, conf, _ := tlsServer(t, up)
	c := h2Dial(t, addr, conf)
	defer c.Close()
	io.WriteString(c, http2.ClientPreface)
	fr := http2.NewFramer(c, c)
	fr.WriteSettings()
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	block := func(fields ...string) []byte {
		hb.Reset()
		for i := 0; i < len(fields); i += 2 {
			enc.WriteField(hpack.HeaderField{Name: fields[i], Value: fields[i+1]})
		}
		return bytes.Clone(hb.Bytes())
	}
	fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, EndStream: true, EndHeaders: true,
		BlockFragment: block(":method", "CONNECT", ":authority", "a.example:443")})
	fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 3, EndStream: true, EndHeaders: true,
		BlockFragment: block(":method", "GET", ":scheme", "https", ":path", "/", ":authority", "a.example")})
	dec := hpack.NewDecoder(4096, nil)
	statuses := map[uint32]string{}
	for len(statuses) < 2 {
		f, err := fr.ReadFrame()
		if err != nil {
			t.Fatalf("after %v: %v", statuses, err)
		}
		switch f := f.(type) {
		case *http2.GoAwayFrame:
			t.Fatalf("GOAWAY after %v: the refusal closed the HTTP/2 connection", statuses)
		case *http2.HeadersFrame:
			hs, _ := dec.DecodeFull(f.HeaderBlockFragment())
			for _, h := range hs {
				if h.Name == ":status" {
					statuses[f.StreamID] = h.Value
				}
			}
		}
	}
	if statuses[1] != "405" || statuses[3] != "200" {
		t.Errorf("statuses %v, want 405 to CONNECT and 200 to the next stream", statuses)
	}
}

// cannedUpstream answers every request on a connection with the same
// small response, reading only up to the end of each request head.
func cannedUpstream(b *testing.B) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { ln.Close() })
	resp := []byte("HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 6\r\n\r\nhello\n")
	wiretest.AcceptEach(ln, func(c net.Conn) {
		br := bufio.NewReader(c)
		for {
			for {
				line, err := br.ReadSlice('\n')
				if err != nil {
					return
				}
				if len(line) <= 2 {
					break
				}
			}
			if _, err := c.Write(resp); err != nil {
				return
			}
		}
	})
	return "http://" + ln.Addr().String()
}

// BenchmarkTLSForward measures a request over TLS, HTTP/1.1 keep-alive
// and HTTP/2, through the core (no rule) and the forwarder to an upstream
// that answers at once: the net/http engine's cost per request on the
// daemon's TLS listener, beside what crypto costs.
func BenchmarkTLSForward(b *testing.B) {
	up := cannedUpstream(b)
	for _, proto := range []string{"h1", "h2"} {
		b.Run(proto, func(b *testing.B) {
			addr, conf, _ := tlsServer(b, up)
			var rt http.RoundTripper = &http.Transport{TLSClientConfig: conf, MaxIdleConnsPerHost: 64}
			if proto == "h2" {
				rt = &http2.Transport{TLSClientConfig: conf}
			}
			c := &http.Client{Transport: rt}
			b.ReportAllocs()
			b.SetParallelism(4)
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					resp, err := c.Get("https://" + addr + "/api/items")
					if err != nil {
						b.Error(err)
						return
					}
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
			})
		})
	}
}

// An upstream that answers the head of a long upload (413) while the
// HTTP/2 client pauses mid-body: the answer reaches the client at once,
// not at client_body_timeout, and the connection serves the next stream.
func TestEarlyAnswerWhileHTTP2ClientPauses(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	wiretest.AcceptEach(ln, func(c net.Conn) {
		br := bufio.NewReader(c)
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		if req.Method == http.MethodGet {
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
			return
		}
		io.WriteString(c, "HTTP/1.1 413 Content Too Large\r\nContent-Length: 3\r\nConnection: close\r\n\r\nbig")
		io.Copy(io.Discard, br)
	})
	addr, conf, _, _ := tlsServerConfig(t, "http://"+ln.Addr().String(), engine.Limits{ClientBodyTimeout: 20 * time.Second}, nil)
	c := &http.Client{Transport: &http2.Transport{TLSClientConfig: conf}, Timeout: 15 * time.Second}
	pr, pw := io.Pipe()
	defer pw.Close()
	go pw.Write(bytes.Repeat([]byte("x"), 100<<10)) // past the read-ahead: streamed; then the client pauses
	req, _ := http.NewRequest(http.MethodPost, "https://"+addr+"/up", pr)
	req.ContentLength = 1 << 20
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("no answer while the client pauses: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 413 || string(body) != "big" {
		t.Fatalf("%d %q, want the upstream's 413", resp.StatusCode, body)
	}
	resp, err = c.Get("https://" + addr + "/next")
	if err != nil {
		t.Fatalf("the next stream: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("the next stream: %d", resp.StatusCode)
	}
}

// Over TLS, HTTP/1.1 requests are checked as in cleartext: the bytes past
// TLS go through the Server's checks, so a header line ended by a bare LF
// is refused and net/http's own refusals are the server's problem+json;
// a cleartext request on the TLS port gets net/http's words for it.
func TestTLSHTTP1Checked(t *testing.T) {
	up := wiretest.Application(t, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
	addr, conf, _ := tlsServer(t, up)
	for _, tc := range []struct{ send, detail string }{
		{"GET / HTTP/1.1\r\nHost: a\nX-A: b\r\n\r\n", engine.ErrBareLF.Detail},
		{"GET / HTTP/1.1\r\nX-A: b\r\n\r\n", "missing required Host header"},
	} {
		c, err := tls.Dial("tcp", addr, conf)
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(5 * time.Second))
		io.WriteString(c, tc.send)
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		c.Close()
		if resp.StatusCode != 400 || resp.Header.Get("Content-Type") != "application/problem+json" ||
			!bytes.Contains(body, []byte(`"detail":"`+tc.detail+`"`)) {
			t.Errorf("%q: %d %q %s, want 400 problem+json saying %q", tc.send, resp.StatusCode, resp.Header.Get("Content-Type"), body, tc.detail)
		}
	}
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	io.WriteString(c, "GET / HTTP/1.1\r\nHost: a\r\n\r\n")
	got, _ := io.ReadAll(c)
	if !bytes.HasPrefix(got, []byte("HTTP/1.0 400 Bad Request\r\n\r\nClient sent an HTTP request to an HTTPS server.")) {
		t.Errorf("a cleartext request on the TLS port: %q", got)
	}
}

// Every TLS connection is counted from its accept, in one state at a
// time: during its handshake (reading), HTTP/1.1 and HTTP/2 alike once
// served, and none once closed, whether it was served, failed its
// handshake or never finished it.
func TestTLSConnectionsCounted(t *testing.T) {
	up := wiretest.Application(t, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
	o := shm.Options{Counters: 64}
	metrics.Geometry(&o, 8)
	region := shmtest.Private(t, o)
	addr, conf, _, _ := tlsServerIn(t, region, up, engine.Limits{}, nil)
	type counts struct{ reading, writing, idle, accepted uint64 }
	want := func(when string, w counts) {
		t.Helper()
		var got counts
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			var s metrics.Snapshot
			metrics.Read(region, &s)
			got = counts{s.Conns(metrics.ConnReading), s.Conns(metrics.ConnWriting), s.Conns(metrics.ConnIdle),
				s.Value(metrics.ConnectionsAccepted, 0)}
			if got == w || time.Now().After(deadline) {
				break
			}
		}
		if got != w {
			t.Fatalf("%s: %+v, want %+v", when, got, w)
		}
	}
	h1 := &http.Transport{TLSClientConfig: conf}
	h2 := &http2.Transport{TLSClientConfig: conf}
	for _, rt := range []http.RoundTripper{h1, h2} {
		req, _ := http.NewRequest("GET", "https://"+addr+"/", nil)
		resp, err := rt.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	silent, err := net.Dial("tcp", addr) // no ClientHello
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	bad, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	io.WriteString(bad, "\x16\x03\x01\x00\x05hello") // not a ClientHello
	io.Copy(io.Discard, bad)
	bad.Close()
	want("served and pending", counts{reading: 1, idle: 2, accepted: 4})
	h1.CloseIdleConnections()
	h2.CloseIdleConnections()
	silent.Close()
	want("all closed", counts{accepted: 4})
}

// An HTTP/2 client that cancels its stream (RST_STREAM) while the request
// is with the upstream is counted as 499 at once, as an HTTP/1.1 client
// that goes away is, and the connection serves on.
func TestStreamResetIs499(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	up := wiretest.Application(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			select {
			case <-release:
			case <-r.Context().Done():
			}
		}
		io.WriteString(w, "ok")
	})
	o := shm.Options{Counters: 64}
	metrics.Geometry(&o, 8)
	statuses := make(chan int, 4)
	c, err := core.New(shmtest.Private(t, o), core.Options{OnResponse: func(status int) { statuses <- status }})
	if err != nil {
		t.Fatal(err)
	}
	addr, conf, _, _ := tlsServerCore(t, c, up, engine.Limits{}, nil)
	h2 := &http.Client{Transport: &http2.Transport{TLSClientConfig: conf}, Timeout: 10 * time.Second}
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "GET", "https://"+addr+"/slow", nil)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if resp, err := h2.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	time.Sleep(200 * time.Millisecond) // with the upstream
	cancel()                           // RST_STREAM CANCEL
	<-done
	select {
	case status := <-statuses:
		if status != core.StatusClientClosed {
			t.Errorf("counted as %d, want %d", status, core.StatusClientClosed)
		}
	case <-time.After(5 * time.Second):
		t.Error("not counted within 5 s of the stream's reset")
	}
}

// What an Edge cannot serve is refused when it is built, not left to
// fail every client: a configuration without a certificate (each
// handshake would fail), and a second Server on one Edge (whose HTTP/2
// connections would be served by the last Server's handler and core, and
// never drained by the first's Shutdown).
func TestEdgeRefusesWhatCannotServe(t *testing.T) {
	if _, err := tlsedge.New(tlsedge.Options{Config: &tls.Config{}}); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Errorf("New with no certificate: %v, want an error naming the certificate", err)
	}
	ca := tlstest.NewCA(t)
	cert, key := ca.Leaf(t, "a.example")
	tc, err := tlsconf.Options{Certificates: []tlsconf.Pair{{Cert: cert, Key: key}}, HTTP2: true}.Config()
	if err != nil {
		t.Fatal(err)
	}
	edge, err := tlsedge.New(tlsedge.Options{Config: tc})
	if err != nil {
		t.Fatal(err)
	}
	o := shm.Options{Counters: 64}
	metrics.Geometry(&o, 8)
	c, err := core.New(shmtest.Private(t, o), core.Options{})
	if err != nil {
		t.Fatal(err)
	}
	app := http.NotFoundHandler()
	if _, err := nethttp.NewServer(nethttp.ServerOptions{Core: c, Handler: app, Edge: edge}); err != nil {
		t.Fatal(err)
	}
	if _, err := nethttp.NewServer(nethttp.ServerOptions{Core: c, Handler: app, Edge: edge}); err == nil || !strings.Contains(err.Error(), "tlsedge.New") {
		t.Errorf("a second Server on one Edge: %v, want an error that says to build one with tlsedge.New for each", err)
	}
}

// accessFunc is a core.AccessLog that calls itself.
type accessFunc func(e *core.AccessEntry)

func (f accessFunc) Log(e *core.AccessEntry) { f(e) }

// The access log entry of a request over TLS says https, over HTTP/1.1
// and HTTP/2 alike: the operator tells it from the cleartext port's.
func TestAccessEntrySchemeHTTPS(t *testing.T) {
	up := wiretest.Application(t, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
	o := shm.Options{Counters: 64}
	metrics.Geometry(&o, 8)
	lines := make(chan core.AccessEntry, 4)
	c, err := core.New(shmtest.Private(t, o), core.Options{AccessLog: accessFunc(func(e *core.AccessEntry) { lines <- *e })})
	if err != nil {
		t.Fatal(err)
	}
	addr, conf, _, _ := tlsServerCore(t, c, up, engine.Limits{}, nil)
	h1 := &http.Client{Transport: &http.Transport{TLSClientConfig: conf}, Timeout: 10 * time.Second}
	h2 := &http.Client{Transport: &http2.Transport{TLSClientConfig: conf}, Timeout: 10 * time.Second}
	for name, cl := range map[string]*http.Client{"HTTP/1.1": h1, "HTTP/2.0": h2} {
		resp, err := cl.Get("https://" + addr + "/x")
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		select {
		case l := <-lines:
			if l.Scheme != "https" || l.Proto != name {
				t.Errorf("%s: logged %s with scheme %q, want https", name, l.Proto, l.Scheme)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: no access log entry within 5 s", name)
		}
	}
}

// Over TLS, HTTP/1.1 framing that is ambiguous is refused (400) and the
// connection closed, as the other engines refuse it (and so is obs-fold,
// which net/http unfolded, where SPEC has it refused): net/http framed a
// body with both Content-Length and Transfer-Encoding by the latter and
// ignored Transfer-Encoding in HTTP/1.0, then served what followed on the
// connection as the next request, where a front end that framed the body
// the other way (RFC 9112 §6.1 has the server close the connection after
// such a request) forwarded it as that body: a request smuggled past it.
func TestTLSHTTP1AmbiguousFramingIsRefused(t *testing.T) {
	up := wiretest.StartUpstream(t, nil)
	addr, conf, _ := tlsServer(t, up.URL())
	conf.NextProtos = []string{"http/1.1"}
	const smuggled = "GET /smuggled HTTP/1.1\r\nHost: a.example\r\n\r\n"
	for _, tc := range []struct{ send, detail string }{
		{"POST /p HTTP/1.1\r\nHost: a.example\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + smuggled, engine.ErrCLTE.Detail},
		{"POST /p HTTP/1.1\r\nHost: a.example\r\ntransfer-encoding: chunked\r\ncontent-length: 44\r\n\r\n0\r\n\r\n" + smuggled, engine.ErrCLTE.Detail},
		{"POST /p HTTP/1.0\r\nHost: a.example\r\nConnection: keep-alive\r\nTransfer-Encoding: chunked\r\n\r\n" + smuggled, engine.ErrEncoding10.Detail},
		{"GET /p HTTP/1.1\r\nHost: a.example\r\nX-A: b\r\n c\r\n\r\n" + smuggled, engine.ErrObsFold.Detail},
		{"GET /p HTTP/1.1\r\nHost: a.example\r\nX-A: b\r\n\tTransfer-Encoding: chunked\r\n\r\n" + smuggled, engine.ErrObsFold.Detail},
	} {
		c, err := tls.Dial("tcp", addr, conf)
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(5 * time.Second))
		io.WriteString(c, tc.send)
		got, _ := io.ReadAll(c)
		c.Close()
		if !bytes.HasPrefix(got, []byte("HTTP/1.1 400 ")) || bytes.Count(got, []byte("HTTP/1.1 ")) != 1 ||
			!bytes.Contains(got, []byte(`"detail":"`+tc.detail+`"`)) {
			t.Errorf("%q: got %q, want one 400 saying %q, then the connection closed", tc.send, got, tc.detail)
		}
	}
	for _, s := range up.Requests() {
		t.Errorf("the upstream got %q", s.Line)
	}
	// Framing that is not ambiguous is served, with a request after it.
	c, err := tls.Dial("tcp", addr, conf)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	io.WriteString(c, "POST /p HTTP/1.1\r\nHost: a.example\r\nTransfer-Encoding: chunked\r\nX-Content-Length: 5\r\n\r\n3\r\nabc\r\n0\r\n\r\n"+
		"POST /q HTTP/1.0\r\nHost: a.example\r\nX-Transfer-Encoding: chunked\r\nContent-Length: 2\r\n\r\nhi")
	got, _ := io.ReadAll(c)
	if n := bytes.Count(got, []byte(" 200 OK\r\n")); n != 2 {
		t.Errorf("two requests framed one way each: %q, want two 200s", got)
	}
}
