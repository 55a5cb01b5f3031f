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
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/preforkd/preforkd/core"
	"github.com/preforkd/preforkd/engine"
	"github.com/preforkd/preforkd/engine/nethttp"
	"github.com/preforkd/preforkd/engine/nethttp/tlsedge"
	"github.com/preforkd/preforkd/internal/shmtest"
	"github.com/preforkd/preforkd/internal/tlstest"
	"github.com/preforkd/preforkd/internal/wiretest"
	"github.com/preforkd/preforkd/shm"
	"github.com/preforkd/preforkd/tlsconf"
)

// Over TLS, a client that resets its connection while its request body
// is still arriving went away, as on cleartext: counted once as 499,
// nothing sent. So is an HTTP/2 client that resets its stream (or its
// connection) mid-body: no answer can go on a closed stream. One that
// ends its body short (a FIN after close_notify; an HTTP/2 END_STREAM
// short of its content-length) is still answered 400. With Expect:
// 100-continue the same, the reset or FIN coming after the 100 Continue
// and part of the body. And the same when the engine serves an
// application (an embedding program's http.Handler), over TLS or in
// cleartext, that reads the body and answers 400 when the read fails:
// its answer to a client gone goes nowhere and is counted as 499.
func TestBodyResetOverTLSIsClientGone(t *testing.T) {
	t.Parallel()
	appReset, appFIN := core.StatusClientClosed, http.StatusBadRequest
	for _, tc := range []struct {
		name   string
		h2     bool
		expect bool // sent with Expect: 100-continue, the body after the 100
		app    bool // served by an application that reads the body, not forwarded
		clear  bool // in cleartext (an application's)
		end    func(t *testing.T, c net.Conn, fr *http2.Framer)
		want   int
	}{
		{"h1-reset", false, false, false, false, resetConn, core.StatusClientClosed},
		{"h1-fin", false, false, false, false, finConn, http.StatusBadRequest},
		{"h1-expect-reset", false, true, false, false, resetConn, core.StatusClientClosed},
		{"h1-expect-fin", false, true, false, false, finConn, http.StatusBadRequest},
		{"h2-stream-reset", true, false, false, false, resetStream, core.StatusClientClosed},
		{"h2-conn-reset", true, false, false, false, resetConn, core.StatusClientClosed},
		{"h2-end-short", true, false, false, false, endShort, http.StatusBadRequest},
		{"app-h1-reset", false, false, true, false, resetConn, appReset},
		{"app-h1-fin", false, false, true, false, finConn, appFIN},
		{"app-h1-expect-reset", false, true, true, false, resetConn, appReset},
		{"app-h1-expect-fin", false, true, true, false, finConn, appFIN},
		{"app-h2-stream-reset", true, false, true, false, resetStream, appReset},
		{"app-h2-conn-reset", true, false, true, false, resetConn, appReset},
		{"app-h2-end-short", true, false, true, false, endShort, appFIN},
		{"app-h2-duplex-stream-reset", true, false, true, false, resetStream, appReset},
		{"app-clear-reset", false, false, true, true, resetConn, appReset},
		{"app-clear-fin", false, false, true, true, finConn, appFIN},
		{"app-clear-expect-reset", false, true, true, true, resetConn, appReset},
		{"app-clear-expect-fin", false, true, true, true, finConn, appFIN},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			statuses, lines := make(chan int, 4), make(chan core.AccessEntry, 4)
			c, err := core.New(shmtest.Private(t, shm.Options{Counters: 64}), core.Options{
				OnResponse: func(s int) { statuses <- s },
				AccessLog:  accessFunc(func(e *core.AccessEntry) { lines <- *e }),
			})
			if err != nil {
				t.Fatal(err)
			}
			// reading is closed once the upstream, or the application,
			// has the body's first bytes: the reset comes while it waits
			// for the rest.
			reading, ended := make(chan struct{}), make(chan struct{})
			read := func(w http.ResponseWriter, r *http.Request) error {
				var b [1]byte
				if _, err := io.ReadFull(r.Body, b[:]); err != nil {
					return err
				}
				close(reading)
				_, err := io.Copy(io.Discard, r.Body)
				return err
			}
			var addr string
			var conf *tls.Config
			if tc.app {
				addr, conf = appServer(t, c, !tc.clear, func(w http.ResponseWriter, r *http.Request) {
					if strings.Contains(tc.name, "duplex") {
						// Full duplex, as a streaming RPC: the body is read
						// on a goroutine of its own, and the handler answers
						// once the read failed, nothing but time between them
						// (a channel from the reader would hide from -race
						// the read of its error without a lock): once the
						// reset was sent, a moment for it to arrive.
						go read(w, r)
						<-reading
						select {
						case <-ended:
						case <-time.After(5 * time.Second): // the test failed before
						}
						time.Sleep(300 * time.Millisecond)
						http.Error(w, "the body could not be read", http.StatusBadRequest)
						return
					}
					if read(w, r) != nil {
						http.Error(w, "the body could not be read", http.StatusBadRequest)
					}
				})
			} else {
				up := wiretest.Application(t, func(w http.ResponseWriter, r *http.Request) { read(w, r) })
				addr, conf, _, _ = tlsServerCore(t, c, up, engine.Limits{}, nil)
			}
			var conn net.Conn
			if tc.clear {
				conn, err = net.Dial("tcp", addr)
			} else {
				conf = conf.Clone()
				conf.NextProtos = []string{"http/1.1"}
				if tc.h2 {
					conf.NextProtos = []string{"h2"}
				}
				conn, err = tls.Dial("tcp", addr, conf)
			}
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			conn.SetDeadline(time.Now().Add(10 * time.Second))
			var fr *http2.Framer
			if tc.h2 {
				io.WriteString(conn, http2.ClientPreface)
				fr = http2.NewFramer(conn, conn)
				fr.WriteSettings()
				var hb bytes.Buffer
				enc := hpack.NewEncoder(&hb)
				for _, f := range [][2]string{{":method", "POST"}, {":scheme", "https"}, {":authority", "a.example"}, {":path", "/x"}, {"content-length", "100000"}} {
					enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
				}
				fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, EndHeaders: true, BlockFragment: hb.Bytes()})
				fr.WriteData(1, false, make([]byte, 1000))
				go func() { // the server's frames, until the connection ends
					for {
						if _, err := fr.ReadFrame(); err != nil {
							return
						}
					}
				}()
			} else {
				expect := map[bool]string{true: "Expect: 100-continue\r\n"}[tc.expect]
				io.WriteString(conn, "POST /x HTTP/1.1\r\nHost: a.example\r\nContent-Length: 100000\r\n"+expect+"\r\n")
				if tc.expect {
					br := bufio.NewReader(conn)
					resp, err := http.ReadResponse(br, nil)
					if err != nil || resp.StatusCode != http.StatusContinue || br.Buffered() > 0 {
						t.Fatalf("want a lone 100 Continue, got %v, %v", resp, err)
					}
				}
				part := 1000
				if tc.expect && !tc.app {
					part = 70000 // past what is read ahead: the upstream reads it
				}
				conn.Write(make([]byte, part))
			}
			if tc.app || tc.expect {
				select {
				case <-reading:
				case <-time.After(5 * time.Second):
					t.Fatal("the body's reader did not begin within 5 s")
				}
			}
			time.Sleep(200 * time.Millisecond) // the server waits for the rest
			tc.end(t, conn, fr)
			close(ended)
			if !tc.h2 && tc.want != core.StatusClientClosed {
				resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				if resp.StatusCode != tc.want {
					t.Errorf("answered %d, want %d", resp.StatusCode, tc.want)
				}
			}
			select {
			case s := <-statuses:
				if s != tc.want {
					t.Errorf("counted %d, want %d", s, tc.want)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("not counted within 5 s")
			}
			select {
			case l := <-lines:
				if l.Status != tc.want || tc.want == core.StatusClientClosed && l.Bytes != 0 {
					t.Errorf("logged %d with %d bytes sent, want %d", l.Status, l.Bytes, tc.want)
				}
			case <-time.After(time.Second):
				t.Error("not logged within a second")
			}
			time.Sleep(200 * time.Millisecond) // a second count or line would come now
			if len(statuses) > 0 || len(lines) > 0 {
				t.Errorf("counted again (%d) or logged again (%d)", len(statuses), len(lines))
			}
		})
	}
}

// resetConn resets c's TCP connection, with no close_notify first.
func resetConn(t *testing.T, c net.Conn, _ *http2.Framer) {
	if tc, ok := c.(*tls.Conn); ok {
		c = tc.NetConn()
	}
	tcp := c.(*net.TCPConn)
	tcp.SetLinger(0)
	tcp.Close()
}

// finConn ends c's request short: close_notify over TLS, then a FIN.
func finConn(t *testing.T, c net.Conn, _ *http2.Framer) {
	c.(interface{ CloseWrite() error }).CloseWrite()
}

// resetStream resets HTTP/2 stream 1.
func resetStream(t *testing.T, _ net.Conn, fr *http2.Framer) {
	fr.WriteRSTStream(1, http2.ErrCodeCancel)
}

// endShort ends HTTP/2 stream 1 short of its content-length.
func endShort(t *testing.T, _ net.Conn, fr *http2.Framer) { fr.WriteData(1, true, nil) }

// appServer serves app with c over TLS (HTTP/1.1 and HTTP/2), or in
// cleartext, and returns its address and a client's TLS configuration.
func appServer(t *testing.T, c *core.Core, overTLS bool, app http.HandlerFunc) (string, *tls.Config) {
	ca := tlstest.NewCA(t)
	var edge nethttp.Edge
	if overTLS {
		cert, key := ca.Leaf(t, "a.example")
		tc, err := tlsconf.Options{Certificates: []tlsconf.Pair{{Cert: cert, Key: key}}, HTTP2: true}.Config()
		if err != nil {
			t.Fatal(err)
		}
		if edge, err = tlsedge.New(tlsedge.Options{Config: tc}); err != nil {
			t.Fatal(err)
		}
	}
	s, err := nethttp.NewServer(nethttp.ServerOptions{Core: c, Handler: app, Edge: edge, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go s.Serve(ln)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		s.Shutdown(ctx)
	})
	return ln.Addr().String(), &tls.Config{ServerName: "a.example", RootCAs: ca.Pool}
}
