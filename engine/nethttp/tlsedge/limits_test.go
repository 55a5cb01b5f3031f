//lint:file-ignore SA1019 x/net's http2.Transport is the client that speaks HTTP/2 over a TLS connection with test-chosen settings; the server under test is x/net's too (tlsedge.go).

package tlsedge_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"testing"
	"time"

	"golang.org/x/net/http2"

	"github.com/preforkd/preforkd/engine"
	"github.com/preforkd/preforkd/internal/wiretest"
)

// The edge makes the handshakes and serves HTTP/2 itself: the Server's
// limits and its Shutdown hold over what it holds.

func okUpstream(t *testing.T) string {
	return wiretest.Application(t, func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, r.Header.Get("X-Forwarded-Proto")+" "+r.URL.Path)
	})
}

// A header section cut short over TLS gets 408 at read_header_timeout.
func TestHeadTimeoutOverTLS(t *testing.T) {
	addr, conf, _, _ := tlsServerConfig(t, okUpstream(t), engine.Limits{ReadHeaderTimeout: 500 * time.Millisecond}, nil)
	c, err := tls.Dial("tcp", addr, conf)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	io.WriteString(c, "GET / HTTP/1.1\r\nHost: a\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 408 {
		t.Fatalf("%d, want 408", resp.StatusCode)
	}
}

// read_header_timeout runs from the accept on a new connection, as in
// cleartext: the TLS handshake takes part of it, so that a client that
// makes the handshake slowly and then sends its header slowly holds the
// connection no longer than one that sends it slowly in cleartext. Each
// of these clients would be served within read_header_timeout of its
// handshake's end.
func TestHeadTimeoutOverTLSRunsFromTheAccept(t *testing.T) {
	const timeout = 1500 * time.Millisecond
	addr, conf, _, _ := tlsServerConfig(t, okUpstream(t), engine.Limits{ReadHeaderTimeout: timeout}, nil)
	for _, proto := range []string{"http/1.1", "h2"} {
		for _, begun := range []bool{true, false} {
			if proto == "h2" && !begun {
				continue // a header block is sent whole or not at all here
			}
			raw, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer raw.Close()
			time.Sleep(time.Second) // a slow handshake, well within its bound
			conf := conf.Clone()
			conf.NextProtos = []string{proto}
			c := tls.Client(raw, conf)
			c.SetDeadline(time.Now().Add(10 * time.Second))
			if err := c.Handshake(); err != nil {
				t.Fatal(err)
			}
			var got string
			if proto == "h2" {
				io.WriteString(c, http2.ClientPreface)
				fr := http2.NewFramer(c, c)
				fr.WriteSettings()
				time.Sleep(time.Second)                            // past read_header_timeout from the accept
				block := []byte{0x82, 0x87, 0x84, 0x41, 0x01, 'a'} // :method GET, :scheme https, :path /, :authority a
				fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block, EndStream: true, EndHeaders: true})
				got = "closed"
				for {
					f, err := fr.ReadFrame()
					if err != nil {
						break
					}
					if h, ok := f.(*http2.HeadersFrame); ok && h.StreamID == 1 {
						got = "answered"
						break
					}
				}
			} else {
				if begun {
					io.WriteString(c, "GET / HTTP/1.1\r\n")
				}
				time.Sleep(time.Second) // past read_header_timeout from the accept
				if begun {
					io.WriteString(c, "Host: a\r\n\r\n")
				} else {
					io.WriteString(c, "GET / HTTP/1.1\r\nHost: a\r\n\r\n")
				}
				got = "closed"
				if resp, err := http.ReadResponse(bufio.NewReader(c), nil); err == nil {
					got = fmt.Sprint(resp.StatusCode)
				}
			}
			want := "closed"
			if proto == "http/1.1" && begun {
				want = "408"
			}
			if got != want {
				t.Errorf("%s, header begun %v: %s, want %s: its header came 2s after the accept, read_header_timeout %v",
					proto, begun, got, want, timeout)
			}
		}
	}
}

// max_connections holds over TLS: with one connection open, a second
// client gets no handshake until the first closes.
func TestMaxConnectionsOverTLS(t *testing.T) {
	addr, conf, _, _ := tlsServerConfig(t, okUpstream(t), engine.Limits{MaxConnections: 1}, nil)
	conf.NextProtos = []string{"http/1.1"}
	c1, err := tls.Dial("tcp", addr, conf)
	if err != nil {
		t.Fatal(err)
	}
	d := &net.Dialer{Timeout: 500 * time.Millisecond}
	raw, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	c2 := tls.Client(raw, conf)
	raw.SetDeadline(time.Now().Add(500 * time.Millisecond))
	if err := c2.Handshake(); err == nil {
		t.Fatalf("a second handshake completed with max_connections 1")
	}
	raw.Close()
	c1.Close()
	c3, err := tls.DialWithDialer(&net.Dialer{Timeout: 3 * time.Second}, "tcp", addr, conf)
	if err != nil {
		t.Fatalf("after the first closed: %v", err)
	}
	c3.Close()
}

// Shutdown's ctx runs out while an HTTP/2 stream is in progress (its
// upstream is slow): Shutdown returns "having closed the rest", so the
// client's connection is closed by then, as net/http's Close does for
// every connection it serves (and did for HTTP/2 before the edge served
// it itself).
func TestShutdownDeadlineClosesHTTP2(t *testing.T) {
	release := make(chan struct{})
	up := wiretest.Application(t, func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-time.After(10 * time.Second):
		}
		io.WriteString(w, "late")
	})
	t.Cleanup(func() { close(release) })
	addr, conf, s, _ := tlsServerConfig(t, up, engine.Limits{}, nil)
	h2 := &http.Client{Transport: &http2.Transport{TLSClientConfig: conf}}
	errc := make(chan error, 1)
	go func() {
		resp, err := h2.Get("https://" + addr + "/slow")
		if err == nil {
			_, err = io.ReadAll(resp.Body)
			resp.Body.Close()
		}
		errc <- err
	}()
	time.Sleep(300 * time.Millisecond) // the stream reached the upstream
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	s.Shutdown(ctx)
	t.Logf("Shutdown returned after %v", time.Since(start))
	select {
	case err := <-errc:
		if err == nil {
			t.Errorf("the stream was answered after Shutdown returned")
		}
	case <-time.After(time.Second):
		t.Errorf("Shutdown returned past its deadline with the HTTP/2 connection still open")
	}
}

// Shutdown's ctx runs out while a client has not finished its
// handshake: the connection is closed by the time Shutdown returns.
func TestShutdownDeadlineClosesHandshakes(t *testing.T) {
	addr, _, s, _ := tlsServerConfig(t, okUpstream(t), engine.Limits{}, nil) // read_header_timeout 10s
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	time.Sleep(100 * time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	s.Shutdown(ctx)
	t.Logf("Shutdown returned after %v", time.Since(start))
	c.SetReadDeadline(time.Now().Add(time.Second))
	if _, err := c.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("a connection in its handshake still open after Shutdown returned: %v", err)
	}
}

// send_timeout bounds a write the client does not take, not the pause
// between two writes: an upstream that streams (server-sent events) and
// pauses longer than send_timeout, within upstream_timeout, reaches an
// HTTP/2 client whole, as it reaches an HTTP/1.1 one.
func TestSendTimeoutIsNotAPauseBoundOverHTTP2(t *testing.T) {
	const send = 300 * time.Millisecond
	up := wiretest.Application(t, func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "a")
		w.(http.Flusher).Flush()
		time.Sleep(4 * send) // the upstream thinks; the client reads all it got
		io.WriteString(w, "b")
	})
	addr, conf, _, _ := tlsServerConfig(t, up, engine.Limits{SendTimeout: send}, nil)
	h1 := &http.Client{Transport: &http.Transport{TLSClientConfig: conf}, Timeout: 10 * time.Second}
	h2 := &http.Client{Transport: &http2.Transport{TLSClientConfig: conf}, Timeout: 10 * time.Second}
	for name, c := range map[string]*http.Client{"HTTP/1.1": h1, "HTTP/2.0": h2} {
		resp, err := c.Get("https://" + addr + "/events")
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || string(b) != "ab" {
			t.Errorf("%s: %q, %v; want the whole stream %q", name, b, err, "ab")
		}
	}
}

// send_timeout still cuts an HTTP/2 stream its client gives no room to
// (a flow-control window of 0): the write that waits for room is the one
// bounded, while the connection serves on.
func TestSendTimeoutCutsAStalledHTTP2Stream(t *testing.T) {
	const send = 300 * time.Millisecond
	up := wiretest.Application(t, func(w http.ResponseWriter, r *http.Request) {
		w.Write(make([]byte, 256<<10))
	})
	addr, conf, _, _ := tlsServerConfig(t, up, engine.Limits{SendTimeout: send}, nil)
	c := h2Dial(t, addr, conf)
	defer c.Close()
	io.WriteString(c, http2.ClientPreface)
	fr := http2.NewFramer(c, c)
	fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 0})
	block := []byte{0x82, 0x87, 0x84, 0x41, 0x01, 'a'} // :method GET, :scheme https, :path /, :authority a
	fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block, EndStream: true, EndHeaders: true})
	start := time.Now()
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			t.Fatalf("after %v: %v, want the stream reset", time.Since(start), err)
		}
		if f, ok := f.(*http2.RSTStreamFrame); ok && f.StreamID == 1 {
			break
		}
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("the stalled stream was reset after %v, want about send_timeout (%v)", d, send)
	}
}

// A connection accepted before a drain began, whose handshake ends after
// it, is served as the drain rule serves every connection accepted (its
// request may be on its way): its request is answered, with Connection:
// close, not dropped when the handshake ends. Over HTTP/2 and HTTP/1.1
// alike.
func TestHandshakeAcrossDrainIsServed(t *testing.T) {
	for _, proto := range []string{"http/1.1", "h2"} {
		t.Run(proto, func(t *testing.T) {
			addr, conf, s, _ := tlsServerConfig(t, okUpstream(t), engine.Limits{}, nil)
			raw, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer raw.Close()
			raw.SetDeadline(time.Now().Add(10 * time.Second))
			time.Sleep(100 * time.Millisecond) // accepted: its handshake awaits the ClientHello
			drained := make(chan error, 1)
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				drained <- s.Shutdown(ctx)
			}()
			time.Sleep(100 * time.Millisecond) // the drain began: the listener is closed
			conf.NextProtos = []string{proto}
			c := tls.Client(raw, conf)
			if err := c.Handshake(); err != nil {
				t.Fatalf("handshake: %v", err)
			}
			var rt http.RoundTripper
			if proto == "h2" {
				cc, err := (&http2.Transport{}).NewClientConn(c)
				if err != nil {
					t.Fatal(err)
				}
				rt = cc
			} else {
				rt = oneConn{c}
			}
			req, _ := http.NewRequest("GET", "https://a.example/late", nil)
			resp, err := rt.RoundTrip(req)
			if err != nil {
				t.Fatalf("a request on a connection accepted before the drain: %v", err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 || string(b) != "https /late" {
				t.Errorf("%d %q, want the upstream's answer", resp.StatusCode, b)
			}
			c.Close()
			if err := <-drained; err != nil {
				t.Errorf("Shutdown: %v", err)
			}
		})
	}
}

// oneConn is an HTTP/1.1 round trip on one connection.
type oneConn struct{ c net.Conn }

func (o oneConn) RoundTrip(req *http.Request) (*http.Response, error) {
	if err := req.Write(o.c); err != nil {
		return nil, err
	}
	return http.ReadResponse(bufio.NewReader(o.c), req)
}

// client_body_timeout bounds the wait for a client's next bytes, not a
// pause of the upstream's in reading the body: an upload that the
// upstream takes slowly (it stops reading for longer than
// client_body_timeout, its buffers full) reaches it whole over HTTP/2 as
// over HTTP/1.1, the client having sent all it was let send.
func TestClientBodyTimeoutIsNotTheUpstreamsPauseOverHTTP2(t *testing.T) {
	const cbt = 300 * time.Millisecond
	const size = 16 << 20
	up := wiretest.Application(t, func(w http.ResponseWriter, r *http.Request) {
		io.CopyN(io.Discard, r.Body, 64<<10)
		time.Sleep(5 * cbt) // the upstream is busy; what the client sends waits
		n, err := io.Copy(io.Discard, r.Body)
		if err != nil {
			w.WriteHeader(http.StatusBadRequest)
		}
		fmt.Fprint(w, 64<<10+n)
	})
	addr, conf, _, _ := tlsServerConfig(t, up, engine.Limits{ClientBodyTimeout: cbt}, nil)
	h1 := &http.Client{Transport: &http.Transport{TLSClientConfig: conf}, Timeout: 20 * time.Second}
	h2 := &http.Client{Transport: &http2.Transport{TLSClientConfig: conf}, Timeout: 20 * time.Second}
	for _, name := range []string{"HTTP/1.1", "HTTP/2.0"} {
		c := map[string]*http.Client{"HTTP/1.1": h1, "HTTP/2.0": h2}[name]
		resp, err := c.Post("https://"+addr+"/upload", "application/octet-stream", bytes.NewReader(make([]byte, size)))
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || string(b) != fmt.Sprint(size) {
			t.Errorf("%s: %d %q, want 200 and the whole body (%d bytes) with the upstream", name, resp.StatusCode, b, size)
		}
	}
}

// client_body_timeout still answers 408 to an HTTP/2 client that stops
// sending its body.
func TestClientBodyTimeoutCutsAStalledHTTP2Upload(t *testing.T) {
	const cbt = 300 * time.Millisecond
	addr, conf, _, _ := tlsServerConfig(t, okUpstream(t), engine.Limits{ClientBodyTimeout: cbt}, nil)
	c := &http.Client{Transport: &http2.Transport{TLSClientConfig: conf}, Timeout: 10 * time.Second}
	pr, pw := io.Pipe()
	defer pw.Close()
	go pw.Write(make([]byte, 100)) // then nothing
	req, _ := http.NewRequest(http.MethodPost, "https://"+addr+"/up", pr)
	req.ContentLength = 1 << 20
	start := time.Now()
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestTimeout || time.Since(start) > 5*time.Second {
		t.Errorf("%d after %v, want 408 at about client_body_timeout (%v)", resp.StatusCode, time.Since(start), cbt)
	}
}
