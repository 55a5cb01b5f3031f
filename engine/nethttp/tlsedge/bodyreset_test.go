package tlsedge_test

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/preforkd/preforkd/core"
	"github.com/preforkd/preforkd/engine"
	"github.com/preforkd/preforkd/internal/shmtest"
	"github.com/preforkd/preforkd/shm"
)

// Over TLS, a client that resets its connection while its request body
// is still arriving went away, as on cleartext: counted once as 499,
// nothing sent. So is an HTTP/2 client that resets its stream (or its
// connection) mid-body: no answer can go on a closed stream. One that
// ends its body short (a FIN after close_notify; an HTTP/2 END_STREAM
// short of its content-length) is still answered 400.
func TestBodyResetOverTLSIsClientGone(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		h2   bool
		end  func(t *testing.T, c *tls.Conn, fr *http2.Framer)
		want int
	}{
		{"h1-reset", false, resetConn, core.StatusClientClosed},
		{"h1-fin", false, func(t *testing.T, c *tls.Conn, _ *http2.Framer) { c.CloseWrite() }, http.StatusBadRequest},
		{"h2-stream-reset", true, func(t *testing.T, _ *tls.Conn, fr *http2.Framer) { fr.WriteRSTStream(1, http2.ErrCodeCancel) }, core.StatusClientClosed},
		{"h2-conn-reset", true, resetConn, core.StatusClientClosed},
		{"h2-end-short", true, func(t *testing.T, _ *tls.Conn, fr *http2.Framer) { fr.WriteData(1, true, nil) }, http.StatusBadRequest},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			statuses := make(chan int, 4)
			c, err := core.New(shmtest.Private(t, shm.Options{Counters: 64}), core.Options{OnResponse: func(s int) { statuses <- s }})
			if err != nil {
				t.Fatal(err)
			}
			addr, conf, _, _ := tlsServerCore(t, c, okUpstream(t), engine.Limits{}, nil)
			conf = conf.Clone()
			conf.NextProtos = []string{"http/1.1"}
			if tc.h2 {
				conf.NextProtos = []string{"h2"}
			}
			conn, err := tls.Dial("tcp", addr, conf)
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
				io.WriteString(conn, "POST /x HTTP/1.1\r\nHost: a.example\r\nContent-Length: 100000\r\n\r\n")
				conn.Write(make([]byte, 1000))
			}
			time.Sleep(200 * time.Millisecond) // the server waits for the rest
			tc.end(t, conn, fr)
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
			time.Sleep(200 * time.Millisecond) // a second count would come now
			if len(statuses) > 0 {
				t.Errorf("counted again: %d", <-statuses)
			}
		})
	}
}

// resetConn resets c's TCP connection, with no close_notify first.
func resetConn(t *testing.T, c *tls.Conn, _ *http2.Framer) {
	tcp := c.NetConn().(*net.TCPConn)
	tcp.SetLinger(0)
	tcp.Close()
}
