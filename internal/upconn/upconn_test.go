package upconn

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"io"
	"math/big"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/preforkd/preforkd/engine"
	"github.com/preforkd/preforkd/internal/wiretest"
)

// BenchmarkCleanCheck is the check every reuse of a pooled upstream
// connection makes (Conn.clean): one non-blocking peek of the socket.
func BenchmarkCleanCheck(b *testing.B) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err == nil {
			defer c.Close()
			io.Copy(io.Discard, c)
		}
	}()
	u := New(engine.Target{Addr: ln.Addr().String()}, engine.Upstream{ConnectTimeout: time.Second, Timeout: time.Second, IdleTimeout: time.Minute})
	defer u.Close()
	c, err := u.Dial(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	b.ReportAllocs()
	for b.Loop() {
		if ok, _ := c.clean(); !ok {
			b.Fatal("a quiet connection is not clean")
		}
	}
}

// TestCleanCheck: a quiet connection is clean, one with a byte to read or
// closed by the upstream is not, over TLS too (where the bytes waiting
// are read through TLS: application data makes it unclean). Go's TLS 1.3
// server sends its session tickets within the handshake's last flight,
// so the client has read them by the time a test could look; a server
// that sends them later is not exercised here.
func TestCleanCheck(t *testing.T) {
	for _, useTLS := range []bool{false, true} {
		conns := make(chan net.Conn, 3)
		ln := upstream(t, useTLS, conns)
		u := New(engine.Target{Addr: ln.Addr().String(), TLS: useTLS, Hostname: "localhost"},
			engine.Upstream{ConnectTimeout: time.Second, Timeout: time.Second, IdleTimeout: time.Minute})
		defer u.Close()
		if useTLS {
			u.tls = &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS13}
		}
		dial := func() (*Conn, net.Conn) {
			c, err := u.Dial(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { c.Close() })
			return c, <-conns
		}
		settle := func() { time.Sleep(50 * time.Millisecond) } // what the server sent has arrived

		quiet, _ := dial()
		settle()
		for look := range 2 { // the first look reads what TLS sent after the handshake
			if ok, stray := quiet.clean(); !ok || stray {
				t.Errorf("tls %v: a quiet connection is not clean (look %d)", useTLS, look+1)
			}
		}
		talker, srv := dial()
		io.WriteString(srv, "HTTP/1.1 200 OK\r\n\r\n")
		settle()
		if ok, stray := talker.clean(); ok || !stray && !useTLS {
			t.Errorf("tls %v: a connection with bytes to read is clean, or they are not stray", useTLS)
		}
		closed, srv2 := dial()
		srv2.Close()
		settle()
		if ok, stray := closed.clean(); ok || stray {
			t.Errorf("tls %v: a connection the upstream closed is clean, or stray", useTLS)
		}
	}
}

// testServerTLS is a server configuration with a certificate made now.
func testServerTLS(t *testing.T) *tls.Config {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), DNSNames: []string{"localhost"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}}
}

// Done keeps a reusable connection whose response was read to its end,
// closes the rest, and reports a connection with bytes read past its
// response unclean whether or not it was to be reused.
func TestDone(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	wiretest.AcceptEach(ln, func(c net.Conn) {
		var ask [1]byte // 's': an answer with stray bytes after it
		if _, err := io.ReadFull(c, ask[:]); err != nil {
			return
		}
		resp := "HTTP/1.1 204 No Content\r\n\r\n"
		if ask[0] == 's' {
			resp += "stray"
		}
		io.WriteString(c, resp)
		io.Copy(io.Discard, c)
	})
	u := New(engine.Target{Addr: ln.Addr().String()}, engine.Upstream{ConnectTimeout: time.Second, Timeout: time.Second, MaxIdle: 4, IdleTimeout: time.Minute})
	defer u.Close()
	for _, tc := range []struct {
		name            string
		reusable, stray bool
		clean, kept     bool
	}{
		{"reusable, read to its end", true, false, true, true},
		{"reusable, bytes past it", true, true, false, false},
		{"not reusable, read to its end", false, false, true, false},
		{"not reusable, bytes past it", false, true, false, false},
	} {
		c, err := u.Dial(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		ask := "n"
		if tc.stray {
			ask = "s"
		}
		if _, err := io.WriteString(c, ask); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(c.Buf, make([]byte, len("HTTP/1.1 204 No Content\r\n\r\n"))); err != nil {
			t.Fatal(err)
		}
		if tc.stray {
			c.Buf.Peek(len("stray")) // read past the response
		}
		if got := u.Done(c, tc.reusable, time.Now()); got != tc.clean {
			t.Errorf("%s: clean %v, want %v", tc.name, got, tc.clean)
		}
		u.mu.Lock()
		kept := len(u.idle) > 0 && u.idle[len(u.idle)-1] == c
		u.idle = u.idle[:0]
		u.mu.Unlock()
		if kept != tc.kept {
			t.Errorf("%s: kept %v, want %v", tc.name, kept, tc.kept)
		}
		if _, err := c.Conn.Write([]byte("x")); (err == nil) != tc.kept {
			t.Errorf("%s: writing after Done: %v", tc.name, err)
		}
	}
}

// An idle connection the upstream closes is closed soon after, not kept
// until its idle time runs out (a socket in CLOSE_WAIT meanwhile), over
// TLS too (where a close_notify comes before the EOF); a quiet one is
// kept; bytes sent unasked also close it, and are counted (Stray) when
// not over TLS. The reaper that rests while none is idle wakes for the
// next.
func TestClosedIdleConnectionsClosed(t *testing.T) {
	for _, useTLS := range []bool{false, true} {
		conns := make(chan net.Conn, 4)
		ln := upstream(t, useTLS, conns)
		u := New(engine.Target{Addr: ln.Addr().String(), TLS: useTLS, Hostname: "localhost"},
			engine.Upstream{ConnectTimeout: time.Second, Timeout: time.Second, MaxIdle: 4, IdleTimeout: time.Minute})
		defer u.Close()
		if useTLS {
			u.tls = &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS13}
		}
		var srv []net.Conn
		for range 4 {
			c, err := u.Dial(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			srv = append(srv, <-conns)
			u.Put(c, time.Now())
		}
		var strays atomic.Int32
		u.Stray = func() { strays.Add(1) }
		defer srv[0].Close()
		defer srv[1].Close()
		io.WriteString(srv[1], "HTTP/1.1 200 OK\r\n\r\n") // unasked
		for _, s := range srv[2:] {
			s.Close()
		}
		idle := func() int {
			u.mu.Lock()
			defer u.mu.Unlock()
			return len(u.idle)
		}
		for deadline := time.Now().Add(3 * time.Second); idle() > 1 && time.Now().Before(deadline); {
			time.Sleep(20 * time.Millisecond)
		}
		if n := idle(); n != 1 {
			t.Fatalf("tls %v: %d idle connections kept 3s after the upstream closed 2 of 4 and wrote on 1, want 1", useTLS, n)
		}
		if n := strays.Load(); n != 1 && !useTLS { // over TLS they are not read (TestCleanCheck)
			t.Errorf("bytes sent unasked counted %d times, want 1", n)
		}

		// With none idle the reaper rests; the next Put wakes it.
		c, err := u.Get(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		resting := func() bool {
			u.mu.Lock()
			defer u.mu.Unlock()
			return u.resting
		}
		for deadline := time.Now().Add(3 * time.Second); !resting() && time.Now().Before(deadline); {
			time.Sleep(20 * time.Millisecond)
		}
		u.Put(c, time.Now())
		srv[0].Close()
		for deadline := time.Now().Add(3 * time.Second); idle() > 0 && time.Now().Before(deadline); {
			time.Sleep(20 * time.Millisecond)
		}
		if !resting() || idle() > 0 {
			t.Errorf("tls %v: a connection put back to a resting reaper and closed by the upstream is kept", useTLS)
		}
	}
}

// An idle connection is reused after waiting longer than the upstream
// timeout (which bounds a wait for the upstream's bytes, not idleness),
// over TLS too.
func TestIdleLongerThanTimeoutReused(t *testing.T) {
	for _, useTLS := range []bool{false, true} {
		ln := upstream(t, useTLS, nil)
		wiretest.AcceptEach(ln, func(c net.Conn) {
			var b [1]byte
			for {
				if _, err := c.Read(b[:]); err != nil {
					return
				}
				c.Write(b[:])
			}
		})
		u := New(engine.Target{Addr: ln.Addr().String(), TLS: useTLS, Hostname: "localhost"},
			engine.Upstream{ConnectTimeout: time.Second, Timeout: 100 * time.Millisecond, MaxIdle: 4, IdleTimeout: time.Minute})
		defer u.Close()
		if useTLS {
			u.tls = &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS13}
		}
		c, err := u.Dial(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.WriteString(c, "x"); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Buf.ReadByte(); err != nil {
			t.Fatal(err)
		}
		u.Put(c, time.Now())
		time.Sleep(1500 * time.Millisecond) // past the timeout, and a look of the reaper
		got, err := u.Get(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if got != c {
			t.Errorf("tls %v: an idle connection is not reused after the upstream timeout", useTLS)
		}
		got.Close()
	}
}

// upstream listens on 127.0.0.1, over TLS with useTLS, until the test
// ends; with conns, it accepts each connection itself, in order, and
// passes it on once its handshake is done.
func upstream(t *testing.T, useTLS bool, conns chan<- net.Conn) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	if useTLS {
		ln = tls.NewListener(ln, testServerTLS(t))
	}
	if conns != nil {
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				if tc, ok := c.(*tls.Conn); ok {
					tc.Handshake()
				}
				conns <- c
			}
		}()
	}
	return ln
}
