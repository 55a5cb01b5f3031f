package tlsconf_test

import (
	"crypto/tls"
	"io"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/preforkd/preforkd/internal/tlstest"
	"github.com/preforkd/preforkd/tlsconf"
)

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC) // a period of 12h begins

// Every process derives the same keys at the same time; at each period
// the new key is first and the previous one still opens its tickets; a
// chain handed on later (Advance) derives the same keys, and none older
// than the period before it.
func TestTicketKeys(t *testing.T) {
	a, err := tlsconf.NewTickets(12*time.Hour, t0)
	if err != nil {
		t.Fatal(err)
	}
	b := a // another worker, handed the same chain
	k0 := a.Keys(t0)
	if len(k0) != 2 || k0 != nil && k0[0] == k0[1] {
		t.Fatalf("keys at start: %d", len(k0))
	}
	if kb := b.Keys(t0); kb[0] != k0[0] || kb[1] != k0[1] {
		t.Error("two holders of one chain disagree")
	}
	later := t0.Add(12 * time.Hour)
	k1 := a.Keys(later)
	if k1[1] != k0[0] || k1[0] == k0[0] {
		t.Errorf("after a period: the previous key is not the old current one, or the key did not change")
	}
	if k := a.Keys(later.Add(-time.Second)); k[0] != k0[0] {
		t.Error("the keys changed before the period's end")
	}
	handed := a.Advance(later)
	if k := handed.Keys(later); k[0] != k1[0] || k[1] != k1[1] {
		t.Error("an advanced chain derives other keys")
	}
	if k := handed.Keys(t0); len(k) != 1 || k[0] != k0[0] {
		t.Error("an advanced chain gives back a key older than the period before it was handed")
	}
	if next := a.NextChange(t0); !next.After(t0) || next.Sub(t0) > 12*time.Hour {
		t.Errorf("next change %v", next)
	}
	c, _ := tlsconf.NewTickets(12*time.Hour, t0)
	if c.Keys(t0)[0] == k0[0] {
		t.Error("two chains drawn alike")
	}
	if _, err := tlsconf.NewTickets(time.Second, t0); err == nil {
		t.Error("a rotation of 1s accepted")
	}
}

// serve serves one TLS connection after another on ln with cfg, each
// answering "ok" once its handshake is done.
func serve(ln net.Listener, cfg *tls.Config) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			tc := tls.Server(c, cfg)
			if tc.Handshake() == nil {
				io.WriteString(tc, "ok")
			}
		}()
	}
}

func listener(t *testing.T, cfg *tls.Config) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go serve(ln, cfg)
	return ln.Addr().String()
}

// The first certificate unless the client's SNI names another's; h2
// offered before http/1.1 with HTTP2; TLS 1.2 at least, 1.3 when asked.
func TestCertificatesBySNI(t *testing.T) {
	ca := tlstest.NewCA(t)
	ac, ak := ca.Leaf(t, "a.example")
	bc, bk := ca.Leaf(t, "b.example", "*.b.example")
	cfg, err := tlsconf.Options{Certificates: []tlsconf.Pair{{Cert: ac, Key: ak}, {Cert: bc, Key: bk}}, HTTP2: true}.Config()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(cfg.NextProtos, ",") != "h2,http/1.1" || cfg.MinVersion != tls.VersionTLS12 {
		t.Errorf("NextProtos %v, MinVersion %#x", cfg.NextProtos, cfg.MinVersion)
	}
	addr := listener(t, cfg)
	for _, tc := range []struct{ sni, want string }{
		{"a.example", "a.example"}, {"b.example", "b.example"}, {"x.b.example", "b.example"}, {"other.example", "a.example"}, {"", "a.example"},
	} {
		c, err := tls.Dial("tcp", addr, &tls.Config{ServerName: tc.sni, InsecureSkipVerify: true})
		if err != nil {
			t.Fatal(err)
		}
		if got := c.ConnectionState().PeerCertificates[0].Subject.CommonName; got != tc.want {
			t.Errorf("SNI %q: served %q, want %q", tc.sni, got, tc.want)
		}
		c.Close()
	}
	bad := []tlsconf.Pair{{Cert: ac, Key: bk}}
	if _, err := (tlsconf.Options{Certificates: bad}).Config(); err == nil || !strings.Contains(err.Error(), "certificate 1") {
		t.Errorf("a key of another certificate: %v", err)
	}
	if _, err := (tlsconf.Options{}).Config(); err == nil {
		t.Error("no certificate accepted")
	}
	v13, _ := tlsconf.Options{Certificates: []tlsconf.Pair{{Cert: ac, Key: ak}}, MinVersion: tls.VersionTLS13}.Config()
	if _, err := tls.Dial("tcp", listener(t, v13), &tls.Config{InsecureSkipVerify: true, MaxVersion: tls.VersionTLS12}); err == nil {
		t.Error("TLS 1.2 accepted with MinVersion 1.3")
	}
	if s := (tlsconf.Key("secret")).String(); s != "xxxxx" {
		t.Errorf("a key prints as %q", s)
	}
}

// A session begun on one server resumes on another that shares the
// chain (another worker), not on one with a chain of its own.
func TestResumptionAcrossProcesses(t *testing.T) {
	ca := tlstest.NewCA(t)
	c, k := ca.Leaf(t, "a.example")
	pairs := []tlsconf.Pair{{Cert: c, Key: k}}
	chain, _ := tlsconf.NewTickets(time.Hour, time.Now())
	other, _ := tlsconf.NewTickets(time.Hour, time.Now())
	cfg1, _ := tlsconf.Options{Certificates: pairs, Tickets: chain}.Config()
	cfg2, _ := tlsconf.Options{Certificates: pairs, Tickets: chain}.Config()
	cfg3, _ := tlsconf.Options{Certificates: pairs, Tickets: other}.Config()
	s1, s2, s3 := listener(t, cfg1), listener(t, cfg2), listener(t, cfg3)
	for _, version := range []uint16{tls.VersionTLS12, tls.VersionTLS13} {
		client := &tls.Config{ServerName: "a.example", RootCAs: ca.Pool, ClientSessionCache: tls.NewLRUClientSessionCache(8), MaxVersion: version}
		dial := func(addr string) bool {
			conn, err := tls.Dial("tcp", addr, client)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			io.ReadAll(conn) // the ticket comes after the handshake (TLS 1.3)
			return conn.ConnectionState().DidResume
		}
		if dial(s1) {
			t.Fatal("resumed a first session")
		}
		if !dial(s2) {
			t.Errorf("TLS %#x: no resumption on another server of the chain", version)
		}
		if dial(s3) {
			t.Errorf("TLS %#x: resumed on a server of another chain", version)
		}
	}
}

// frozenCache is a client session cache that keeps the first session it
// is given: every dial offers the same ticket.
type frozenCache struct{ s *tls.ClientSessionState }

func (f *frozenCache) Get(string) (*tls.ClientSessionState, bool) { return f.s, f.s != nil }
func (f *frozenCache) Put(_ string, s *tls.ClientSessionState) {
	if f.s == nil {
		f.s = s
	}
}

// Rotate changes the keys at each period: a ticket of the previous
// period still resumes, one of two periods ago does not.
func TestRotate(t *testing.T) {
	ca := tlstest.NewCA(t)
	c, k := ca.Leaf(t, "a.example")
	var clock atomic.Int64
	clock.Store(t0.UnixNano())
	now := func() time.Time { return time.Unix(0, clock.Load()) }
	chain, _ := tlsconf.NewTickets(time.Hour, t0)
	cfg, _ := tlsconf.Options{Certificates: []tlsconf.Pair{{Cert: c, Key: k}}}.Config()
	wake, set := make(chan struct{}), make(chan int64, 4)
	stop := tlsconf.RotateWith(cfg, chain, now, wake, func(e int64) { set <- e })
	defer stop()
	<-set
	advance := func(to time.Time) {
		clock.Store(to.UnixNano())
		wake <- struct{}{}
		<-set
	}
	addr := listener(t, cfg)
	dial := func(cache tls.ClientSessionCache) bool {
		conn, err := tls.Dial("tcp", addr, &tls.Config{ServerName: "a.example", RootCAs: ca.Pool, ClientSessionCache: cache})
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		io.ReadAll(conn)
		return conn.ConnectionState().DidResume
	}
	first, second := &frozenCache{}, &frozenCache{}
	dial(first) // tickets of the first period
	advance(t0.Add(time.Hour))
	dial(second) // of the second
	if !dial(first) {
		t.Error("a ticket of the previous period did not resume")
	}
	advance(t0.Add(2 * time.Hour))
	if dial(first) {
		t.Error("a ticket of two periods ago resumed")
	}
	if !dial(second) {
		t.Error("a ticket of the previous period did not resume, one period later")
	}
	stop()
	stop() // idempotent
}

// The first certificate is the default, served to the SNIs the others do
// not cover: a default that covers a name too (a wildcard) does not take
// it from the certificate listed for it.
func TestDefaultCertificateDoesNotShadowAnother(t *testing.T) {
	ca := tlstest.NewCA(t)
	wc, wk := ca.Leaf(t, "*.a.example", "a.example")
	ac, ak := ca.Leaf(t, "api.a.example")
	cfg, err := tlsconf.Options{Certificates: []tlsconf.Pair{{Cert: wc, Key: wk}, {Cert: ac, Key: ak}}}.Config()
	if err != nil {
		t.Fatal(err)
	}
	addr := listener(t, cfg)
	for _, tc := range []struct{ sni, want string }{
		{"api.a.example", "api.a.example"}, {"www.a.example", "*.a.example"}, {"a.example", "*.a.example"}, {"", "*.a.example"},
	} {
		c, err := tls.Dial("tcp", addr, &tls.Config{ServerName: tc.sni, InsecureSkipVerify: true})
		if err != nil {
			t.Fatal(err)
		}
		if got := c.ConnectionState().PeerCertificates[0].Subject.CommonName; got != tc.want {
			t.Errorf("SNI %q: served %q, want %q", tc.sni, got, tc.want)
		}
		c.Close()
	}
}
