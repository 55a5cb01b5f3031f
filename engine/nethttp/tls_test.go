//lint:file-ignore SA1019 x/net's http2.Transport is the client that speaks HTTP/2 over a TLS connection with test-chosen settings; the server under test is x/net's too (server.go).

package nethttp_test

import (
	"context"
	"crypto/tls"
	"io"
	"log/slog"
	"net"
	"net/http"
	"testing"
	"time"

	"golang.org/x/net/http2"

	"github.com/preforkd/preforkd/config"
	"github.com/preforkd/preforkd/core"
	"github.com/preforkd/preforkd/engine/nethttp"
	"github.com/preforkd/preforkd/internal/tlstest"
	"github.com/preforkd/preforkd/shm"
	"github.com/preforkd/preforkd/tlsconf"
)

// tlsServer serves a TLS listener with HTTP/2 on, forwarding to upstream,
// and returns its address, a client that trusts it, and the server.
func tlsServer(t testing.TB, upstream string) (string, *tls.Config, *nethttp.Server) {
	t.Helper()
	ca := tlstest.NewCA(t)
	cert, key := ca.Leaf(t, "a.example")
	tc, err := tlsconf.Options{Certificates: []tlsconf.Pair{{Cert: cert, Key: key}}, HTTP2: true}.Config()
	if err != nil {
		t.Fatal(err)
	}
	c, err := core.New(newRegion(t, shm.Options{Counters: 64}), core.Options{})
	if err != nil {
		t.Fatal(err)
	}
	s, err := nethttp.NewServer(nethttp.ServerOptions{Core: c, Upstream: upstream, TLS: tc, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go s.Serve(ln)
	return ln.Addr().String(), &tls.Config{ServerName: "a.example", RootCAs: ca.Pool}, s
}

// Over TLS, HTTP/1.1 and HTTP/2 reach the upstream alike (with
// X-Forwarded-Proto: https), and Shutdown drains both promptly: an idle
// HTTP/2 connection gets GOAWAY, an idle HTTP/1.1 one its grace.
func TestTLSServesAndDrains(t *testing.T) {
	up := httpUpstream(t, func(w http.ResponseWriter, r *http.Request) {
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

// httpUpstream is an application on a loopback listener.
func httpUpstream(t *testing.T, h http.HandlerFunc) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return "http://" + ln.Addr().String()
}

// Forwarding, the core sees the request as the upstream gets it: a field
// the forwarder drops (Keep-Alive, hop by hop) keys nothing, and
// X-Forwarded-Proto is the one it writes.
func TestForwardingView(t *testing.T) {
	up := httpUpstream(t, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
	cfg, err := config.Parse([]byte(`
[[ratelimit]]
name = "by-hop"
path = "/hop"
limit = 1
window = "1h"
by = "header:Keep-Alive|ip"
[[ratelimit]]
name = "by-proto"
path = "/proto"
limit = 1
window = "1h"
by = "header:X-Forwarded-Proto"
`), "t")
	if err != nil {
		t.Fatal(err)
	}
	o, err := cfg.CoreOptions()
	if err != nil {
		t.Fatal(err)
	}
	c, err := core.New(newRegion(t, shm.Options{Counters: 64}), o)
	if err != nil {
		t.Fatal(err)
	}
	s, err := nethttp.NewServer(nethttp.ServerOptions{Core: c, Upstream: up, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go s.Serve(ln)
	t.Cleanup(func() { s.Shutdown(context.Background()) })
	get := func(path, name, value string) int {
		req, _ := http.NewRequest("GET", "http://"+ln.Addr().String()+path, nil)
		req.Header.Set(name, value)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	// Two values of a hop-by-hop field are one client: the second is
	// refused.
	if a, b := get("/hop", "Keep-Alive", "timeout=1"), get("/hop", "Keep-Alive", "timeout=2"); a != 200 || b != 429 {
		t.Errorf("keyed by a hop-by-hop field: %d, %d; want 200, 429", a, b)
	}
	// Whatever the client claims, X-Forwarded-Proto is http here: one key.
	if a, b := get("/proto", "X-Forwarded-Proto", "https"), get("/proto", "X-Forwarded-Proto", "gopher"); a != 200 || b != 429 {
		t.Errorf("keyed by X-Forwarded-Proto: %d, %d; want 200, 429", a, b)
	}
}
