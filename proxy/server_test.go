package proxy_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/textproto"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/preforkd/preforkd/core"
	"github.com/preforkd/preforkd/engine"
	"github.com/preforkd/preforkd/internal/httpfield"
	"github.com/preforkd/preforkd/internal/wiretest"
	"github.com/preforkd/preforkd/proxy"
)

// Stories that a table of exchanges cannot tell: streaming, timeouts,
// limits, upgrades, the drain; each told once, for every engine it holds
// for (stories_test.go).

// serve starts a Server with opts on a loopback listener and returns its
// address. It is closed when the test ends, and the test fails if Serve
// then returns an error.
func serve(t testing.TB, opts proxy.Options) (string, *proxy.Server) {
	t.Helper()
	ln := listen(t)
	s, served := start(t, ln, opts)
	t.Cleanup(func() {
		s.Close()
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return ln.Addr().String(), s
}

// start serves ln with a Server for opts, which logs to quietLog unless
// opts has a Logger; served gets what Serve returns. It is closed when
// the test ends, if the test did not stop it before.
func start(t testing.TB, ln net.Listener, opts proxy.Options) (s *proxy.Server, served <-chan error) {
	t.Helper()
	if opts.Logger == nil {
		opts.Logger = quietLog
	}
	if opts.Core == nil {
		opts.Core = configCore(t, "", nil) // no rule: every request passes
	}
	s, err := proxy.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Serve(ln) }()
	// Closed when the test ends, before its core's region is (cleanups
	// run last first): a request still served would count into memory
	// no longer mapped.
	t.Cleanup(func() { s.Close() })
	return s, done
}

// listen returns a loopback listener, closed when the test ends.
func listen(t testing.TB) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

// acceptEach serves every connection ln accepts with handle
// (wiretest.AcceptEach).
func acceptEach(ln net.Listener, handle func(c net.Conn)) { wiretest.AcceptEach(ln, handle) }

// dial connects to addr with a deadline for the whole test step.
func dial(t *testing.T, addr string) (net.Conn, *bufio.Reader) {
	t.Helper()
	return wiretest.Dial(t, addr, 20*time.Second)
}

// roundTrip writes the raw request req on c and reads its response from br.
func roundTrip(t *testing.T, c io.Writer, br *bufio.Reader, req string) (*http.Response, []byte) {
	t.Helper()
	resp := roundTripHead(t, c, br, req)
	return resp, readBody(t, resp)
}

// roundTripHead writes the raw request req on c and reads the head of its
// response from br; the body is left to the caller.
func roundTripHead(t *testing.T, c io.Writer, br *bufio.Reader, req string) *http.Response {
	t.Helper()
	if _, err := io.WriteString(c, req); err != nil {
		t.Fatalf("writing a request: %v", err)
	}
	method, _, _ := strings.Cut(req, " ")
	return readHead(t, br, method)
}

func readResponse(t *testing.T, br *bufio.Reader, method string) (*http.Response, []byte) {
	t.Helper()
	resp := readHead(t, br, method)
	return resp, readBody(t, resp)
}

func readHead(t *testing.T, br *bufio.Reader, method string) *http.Response {
	t.Helper()
	resp, err := http.ReadResponse(br, &http.Request{Method: method})
	if err != nil {
		t.Fatalf("reading a response: %v", err)
	}
	return resp
}

func readBody(t *testing.T, resp *http.Response) []byte {
	t.Helper()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("reading a response body: %v", err)
	}
	return body
}

// switchHead is the 101 of the test upstreams that switch to their echo
// protocol.
const switchHead = "HTTP/1.1 101 Switching Protocols\r\nUpgrade: echo\r\nConnection: Upgrade\r\n\r\n"

// upgradeRequest asks for the echo protocol.
const upgradeRequest = "GET /ws HTTP/1.1\r\nHost: a\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n"

// echoTunnel answers head, echoes the tunnel's bytes until the client's
// side ends, then closes the connection.
func echoTunnel(w *bufio.Writer, c net.Conn, head string) {
	w.WriteString(head)
	w.Flush()
	io.Copy(c, c)
	c.Close()
}

// startEchoUpstream starts an upstream that switches every request to an
// echo tunnel.
func startEchoUpstream(t *testing.T) *wiretest.Upstream {
	t.Helper()
	return startUpstream(t, func(req *seenRequest, w *bufio.Writer, c net.Conn) { echoTunnel(w, c, switchHead) })
}

// openTunnel sends upgradeRequest on c and fails the test unless it is
// answered 101.
func openTunnel(t *testing.T, c io.Writer, br *bufio.Reader) {
	t.Helper()
	if resp := roundTripHead(t, c, br, upgradeRequest); resp.StatusCode != 101 {
		t.Fatalf("status %d", resp.StatusCode)
	}
}

// readRawHead reads a response's status line and header from br as they
// came, with nothing net/http would add or drop.
func readRawHead(t *testing.T, br *bufio.Reader) (string, textproto.MIMEHeader) {
	t.Helper()
	tp := textproto.NewReader(br)
	status, err := tp.ReadLine()
	if err != nil {
		t.Fatal(err)
	}
	h, err := tp.ReadMIMEHeader()
	if err != nil {
		t.Fatal(err)
	}
	return status, h
}

// wantEcho sends "ping" through the tunnel on c, ends the client's side,
// and wants want back before the tunnel's end.
func wantEcho(t *testing.T, c net.Conn, br *bufio.Reader, want, what string) {
	t.Helper()
	io.WriteString(c, "ping")
	c.(*net.TCPConn).CloseWrite()
	if got, err := io.ReadAll(br); err != nil || string(got) != want {
		t.Errorf("%s: through the tunnel %q, %v", what, got, err)
	}
}

func TestServerSentEventsArriveOneByOne(t *testing.T) {
	t.Parallel()
	eachEngine(t, withNetHTTP(), func(t *testing.T, e storyEngine) {
		next := make(chan struct{})
		up := startUpstream(t, func(req *seenRequest, w *bufio.Writer, c net.Conn) {
			w.WriteString("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
			for i := range 3 {
				ev := fmt.Sprintf("data: %d\n\n", i)
				fmt.Fprintf(w, "%x\r\n%s\r\n", len(ev), ev)
				w.Flush()
				<-next // the client must have seen this event before the next is sent
			}
			w.WriteString("0\r\n\r\n")
		})
		r := e.serve(t, storyOptions{Upstream: up.URL()})
		c, br := dial(t, r.Addr)
		resp := roundTripHead(t, c, br, "GET /events HTTP/1.1\r\nHost: a\r\n\r\n")
		if resp.Header.Get("Content-Type") != "text/event-stream" {
			t.Errorf("Content-Type %q", resp.Header.Get("Content-Type"))
		}
		events := bufio.NewReader(resp.Body)
		for i := range 3 {
			c.SetReadDeadline(time.Now().Add(2 * time.Second))
			line, err := events.ReadString('\n')
			if err != nil {
				t.Fatalf("event %d did not arrive on its own: %v", i, err)
			}
			if want := fmt.Sprintf("data: %d\n", i); line != want {
				t.Fatalf("event %d: %q, want %q", i, line, want)
			}
			events.ReadString('\n')
			next <- struct{}{}
		}
		if rest, err := io.ReadAll(resp.Body); err != nil || len(rest) != 0 {
			t.Errorf("after the events: %q, %v", rest, err)
		}
	})
}

func sum(r io.Reader) ([32]byte, int64) {
	h := sha256.New()
	n, _ := io.Copy(h, r)
	var out [32]byte
	copy(out[:], h.Sum(nil))
	return out, n
}

// TestLargeBodiesStream sends bodies far over the read-ahead both ways,
// with a length and chunked, and checks every byte arrives.
func TestLargeBodiesStream(t *testing.T) {
	t.Parallel()
	eachEngine(t, withNetHTTP(), func(t *testing.T, e storyEngine) {
		const size = 8 << 20
		want, _ := sum(wiretest.Pattern(size))
		up := startUpstream(t, func(req *seenRequest, w *bufio.Writer, c net.Conn) {
			if req.Req.Method == "POST" {
				got, _ := sum(bytes.NewReader(req.Body))
				fmt.Fprintf(w, "HTTP/1.1 200 OK\r\nContent-Length: 64\r\n\r\n%x", got)
				return
			}
			if req.Req.URL.Query().Get("chunked") != "" {
				w.WriteString("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
				buf := make([]byte, 100<<10)
				r := wiretest.Pattern(size)
				for {
					n, err := io.ReadFull(r, buf)
					if n > 0 {
						fmt.Fprintf(w, "%x\r\n", n)
						w.Write(buf[:n])
						w.WriteString("\r\n")
					}
					if err != nil {
						break
					}
				}
				w.WriteString("0\r\n\r\n")
				return
			}
			fmt.Fprintf(w, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n", size)
			io.Copy(w, wiretest.Pattern(size))
		})
		addr := e.serve(t, storyOptions{Upstream: up.URL()}).Addr
		for _, chunked := range []bool{false, true} {
			t.Run(fmt.Sprintf("upload chunked=%v", chunked), func(t *testing.T) {
				c, br := dial(t, addr)
				if chunked {
					io.WriteString(c, "POST /up HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n")
					cw := httpChunkedWriter(c)
					io.Copy(cw, wiretest.Pattern(size))
					cw.Close()
				} else {
					fmt.Fprintf(c, "POST /up HTTP/1.1\r\nHost: a\r\nContent-Length: %d\r\n\r\n", size)
					io.Copy(c, wiretest.Pattern(size))
				}
				resp, body := readResponse(t, br, "POST")
				if resp.StatusCode != 200 || string(body) != fmt.Sprintf("%x", want) {
					t.Errorf("upload: status %d, the upstream got sha256 %s, want %x", resp.StatusCode, body, want)
				}
				seen := up.Requests()
				last := seen[len(seen)-1]
				wantFraming := []string{strconv.Itoa(size)}
				if chunked {
					if got := last.Field("Transfer-Encoding"); len(got) != 1 || got[0] != "chunked" {
						t.Errorf("a long chunked upload went upstream with Transfer-Encoding %q", got)
					}
				} else if got := last.Field("Content-Length"); fmt.Sprint(got) != fmt.Sprint(wantFraming) {
					t.Errorf("Content-Length upstream %q, want %q", got, wantFraming)
				}
			})
			t.Run(fmt.Sprintf("download chunked=%v", chunked), func(t *testing.T) {
				c, br := dial(t, addr)
				q := ""
				if chunked {
					q = "?chunked=1"
				}
				resp := roundTripHead(t, c, br, "GET /down"+q+" HTTP/1.1\r\nHost: a\r\n\r\n")
				got, n := sum(resp.Body)
				if got != want || n != size {
					t.Errorf("download: %d bytes, sha256 %x, want %d, %x", n, got, size, want)
				}
				if !chunked && resp.ContentLength != size {
					t.Errorf("download Content-Length %d, want %d", resp.ContentLength, size)
				}
			})
		}
	})
}

// httpChunkedWriter frames what is written to w as chunks.
func httpChunkedWriter(w io.Writer) io.WriteCloser { return &chunkWriter{w} }

type chunkWriter struct{ w io.Writer }

func (c *chunkWriter) Write(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	if _, err := fmt.Fprintf(c.w, "%x\r\n%s\r\n", len(p), p); err != nil {
		return 0, err
	}
	return len(p), nil
}

func (c *chunkWriter) Close() error {
	_, err := io.WriteString(c.w, "0\r\n\r\n")
	return err
}

func TestUpstreamFailures(t *testing.T) {
	t.Parallel()
	// 502: nothing listens.
	ln := listen(t)
	closedPort := ln.Addr().String()
	ln.Close()

	// 502 at the connect timeout: a listener whose backlog is full drops
	// the SYNs of new connections.
	full := wiretest.FullBacklog(t)

	// 504: an upstream that reads the request and says nothing.
	silent := startUpstream(t, func(req *seenRequest, w *bufio.Writer, c net.Conn) {
		time.Sleep(2 * time.Second)
	})
	// 502: an upstream that closes without an answer.
	rude := startUpstream(t, func(req *seenRequest, w *bufio.Writer, c net.Conn) {
		c.Close()
	})

	cases := []struct {
		name     string
		upstream string
		status   int
		within   time.Duration
		atLeast  time.Duration
	}{
		{"refused", "http://" + closedPort, 502, time.Second, 0},
		{"connect timeout", "http://" + full, 502, 2 * time.Second, 300 * time.Millisecond},
		{"no response header", silent.URL(), 504, 2 * time.Second, 300 * time.Millisecond},
		{"closed without a response", rude.URL(), 502, time.Second, 0},
	}
	eachEngine(t, readers, func(t *testing.T, e storyEngine) {
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel()
				r := e.serve(t, storyOptions{Upstream: tc.upstream,
					Client: engine.Upstream{ConnectTimeout: 300 * time.Millisecond, Timeout: 300 * time.Millisecond}})
				c, br := dial(t, r.Addr)
				start := time.Now()
				resp, body := roundTrip(t, c, br, "GET /x HTTP/1.1\r\nHost: a\r\n\r\n")
				took := time.Since(start)
				if resp.StatusCode != tc.status {
					t.Errorf("status %d, want %d: %s", resp.StatusCode, tc.status, body)
				}
				if resp.Header.Get("Content-Type") != "application/problem+json" {
					t.Errorf("Content-Type %q", resp.Header.Get("Content-Type"))
				}
				if took > tc.within || took < tc.atLeast {
					t.Errorf("answered after %v, want between %v and %v", took, tc.atLeast, tc.within)
				}
				st := r.Stats()
				if got := st.UpstreamErrors + st.UpstreamTimeouts; got != 1 || (tc.status == 504) != (st.UpstreamTimeouts == 1) {
					t.Errorf("stats %+v", st)
				}
				// The client's connection is fine: the next request is answered.
				if resp, _ := roundTrip(t, c, br, "GET /x HTTP/1.1\r\nHost: a\r\n\r\n"); resp.StatusCode != tc.status {
					t.Errorf("second request: %d", resp.StatusCode)
				}
			})
		}
	})
}

func TestSlowBodyIsCut(t *testing.T) {
	t.Parallel()
	eachEngine(t, readers, func(t *testing.T, e storyEngine) {
		up := startUpstream(t, nil)
		r := e.serve(t, storyOptions{Upstream: up.URL(), Limits: engine.Limits{ClientBodyTimeout: 300 * time.Millisecond}})
		c, br := dial(t, r.Addr)
		start := time.Now()
		io.WriteString(c, "POST /slow HTTP/1.1\r\nHost: a\r\nContent-Length: 10\r\n\r\n")
		// One byte a second: each gap is over the timeout.
		go wiretest.Trickle(c, strings.Repeat("x", 10), time.Second)
		resp, _ := readResponse(t, br, "POST")
		if resp.StatusCode != http.StatusRequestTimeout {
			t.Errorf("status %d, want 408", resp.StatusCode)
		}
		if took := time.Since(start); took > 900*time.Millisecond {
			t.Errorf("cut after %v, want about 300ms", took)
		}
		if !isClosed(t, c, br) {
			t.Errorf("the connection stays open after a body timeout")
		}
		if n := len(up.Requests()); n != 0 {
			t.Errorf("the upstream saw %d requests", n)
		}
		if st := r.Stats(); st.BadRequests != 1 {
			t.Errorf("stats %+v", st)
		}
	})
}

// TestBodyTimeoutIsBetweenReads sends a body slowly but faster than the
// timeout: it is never cut.
func TestBodyTimeoutIsBetweenReads(t *testing.T) {
	t.Parallel()
	eachEngine(t, withNetHTTP(), func(t *testing.T, e storyEngine) {
		up := startUpstream(t, nil)
		// 150 ms between bytes against 1 s: room for a loaded machine's
		// scheduling (400 ms failed once in CI while every package ran).
		r := e.serve(t, storyOptions{Upstream: up.URL(), Limits: engine.Limits{ClientBodyTimeout: time.Second}})
		c, br := dial(t, r.Addr)
		io.WriteString(c, "POST /slow HTTP/1.1\r\nHost: a\r\nContent-Length: 6\r\n\r\n")
		for range 6 {
			time.Sleep(150 * time.Millisecond)
			c.Write([]byte("y"))
		}
		resp, _ := readResponse(t, br, "POST")
		if resp.StatusCode != 200 {
			t.Errorf("status %d", resp.StatusCode)
		}
		if seen := up.Requests(); len(seen) != 1 || string(seen[0].Body) != "yyyyyy" {
			t.Errorf("upstream saw %v", seen)
		}
	})
}

// A keyed request whose body stops arriving is answered 408, its body
// timeout named, on every engine: the core reads the body for the key's
// fingerprint and must tell a timeout from a body it cannot read.
func TestIdempotencyBodyTimeout(t *testing.T) {
	t.Parallel()
	eachEngine(t, withNetHTTP(), func(t *testing.T, e storyEngine) {
		up := startUpstream(t, nil)
		c := configCore(t, "[[idempotency]]\npath = \"/orders\"\n", nil)
		r := e.serve(t, storyOptions{Upstream: up.URL(), Core: c, Limits: engine.Limits{ClientBodyTimeout: 300 * time.Millisecond}})
		conn, br := dial(t, r.Addr)
		io.WriteString(conn, "POST /orders HTTP/1.1\r\nHost: a\r\nIdempotency-Key: \"k1\"\r\nContent-Length: 6\r\n\r\nab")
		resp, body := readResponse(t, br, "POST")
		if resp.StatusCode != http.StatusRequestTimeout || !strings.Contains(string(body), "did not arrive in time") {
			t.Errorf("%d %s", resp.StatusCode, body)
		}
		if n := len(up.Requests()); n != 0 {
			t.Errorf("the upstream saw %d requests", n)
		}
	})
}

func TestHeaderAndIdleTimeouts(t *testing.T) {
	t.Parallel()
	eachEngine(t, readers, func(t *testing.T, e storyEngine) {
		up := startUpstream(t, nil)
		addr := e.serve(t, storyOptions{Upstream: up.URL(),
			Limits: engine.Limits{ReadHeaderTimeout: 300 * time.Millisecond, IdleTimeout: 500 * time.Millisecond}}).Addr

		t.Run("a header that never ends: 408", func(t *testing.T) {
			t.Parallel()
			c, br := dial(t, addr)
			start := time.Now()
			resp, _ := roundTrip(t, c, br, "GET / HTTP/1.1\r\nHost: a\r\nX-Slow: ")
			if resp.StatusCode != http.StatusRequestTimeout {
				t.Errorf("status %d", resp.StatusCode)
			}
			if took := time.Since(start); took > time.Second {
				t.Errorf("answered after %v", took)
			}
		})
		t.Run("a connection that sends nothing is closed silently", func(t *testing.T) {
			t.Parallel()
			start := time.Now() // before the server can start its clock
			c, _ := dial(t, addr)
			b, err := io.ReadAll(c)
			if err != nil || len(b) != 0 {
				t.Errorf("read %q, %v; want a quiet close", b, err)
			}
			if took := time.Since(start); took < 250*time.Millisecond || took > time.Second {
				t.Errorf("closed after %v, want about 300ms", took)
			}
		})
		t.Run("an idle keep-alive connection is closed at the idle timeout", func(t *testing.T) {
			t.Parallel()
			c, br := dial(t, addr)
			start := time.Now() // the idle clock starts after the response, later than this
			roundTrip(t, c, br, "GET / HTTP/1.1\r\nHost: a\r\n\r\n")
			b, err := io.ReadAll(br)
			if err != nil || len(b) != 0 {
				t.Errorf("read %q, %v; want a quiet close", b, err)
			}
			// Longer than the header timeout: idle is not reading a header.
			if took := time.Since(start); took < 450*time.Millisecond || took > 1500*time.Millisecond {
				t.Errorf("closed after %v, want about 500ms", took)
			}
		})
		t.Run("a header ended by a bare LF: 400 at once", func(t *testing.T) {
			t.Parallel()
			c, br := dial(t, addr)
			start := time.Now()
			resp, _ := roundTrip(t, c, br, "GET / HTTP/1.1\nHost: a\n")
			if resp.StatusCode != http.StatusBadRequest {
				t.Errorf("status %d", resp.StatusCode)
			}
			if took := time.Since(start); took > 200*time.Millisecond {
				t.Errorf("answered after %v, want at once", took)
			}
		})
	})
}

// TestHeaderTimeoutFromTheFirstByte: the header of a request on a
// keep-alive connection has read_header_timeout from its first byte, on
// every engine: a client that sends a byte or two, then waits, is not
// given the idle timeout again to send the rest. (net/http starts the
// header's clock once four bytes came.) The same when those bytes came
// with the request before (pipelined): the clock starts once that one is
// answered.
func TestHeaderTimeoutFromTheFirstByte(t *testing.T) {
	t.Parallel()
	eachEngine(t, withNetHTTP(), func(t *testing.T, e storyEngine) {
		up := startUpstream(t, nil)
		r := e.serve(t, storyOptions{Upstream: up.URL(),
			Limits: engine.Limits{ReadHeaderTimeout: 300 * time.Millisecond, IdleTimeout: 3 * time.Second}})
		for _, readAhead := range []bool{false, true} {
			c, br := dial(t, r.Addr)
			if readAhead {
				roundTrip(t, c, br, "GET / HTTP/1.1\r\nHost: a\r\n\r\nGE")
			} else {
				roundTrip(t, c, br, "GET / HTTP/1.1\r\nHost: a\r\n\r\n")
				io.WriteString(c, "GE")
			}
			start := time.Now()
			resp, _ := readResponse(t, br, "GET")
			if resp.StatusCode != http.StatusRequestTimeout {
				t.Errorf("read ahead %v: status %d, want 408", readAhead, resp.StatusCode)
			}
			if took := time.Since(start); took > 1500*time.Millisecond {
				t.Errorf("read ahead %v: answered after %v, want about 300ms", readAhead, took)
			}
		}
	})
}

func TestSendTimeout(t *testing.T) {
	t.Parallel()
	eachEngine(t, readers, func(t *testing.T, e storyEngine) {
		const size = 64 << 20
		up := startUpstream(t, func(req *seenRequest, w *bufio.Writer, c net.Conn) {
			fmt.Fprintf(w, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n", size)
			io.Copy(w, wiretest.Pattern(size))
		})
		r := e.serve(t, storyOptions{Upstream: up.URL(), Limits: engine.Limits{SendTimeout: 300 * time.Millisecond}})
		c, _ := dial(t, r.Addr)
		c.(*net.TCPConn).SetReadBuffer(4 << 10)
		io.WriteString(c, "GET /big HTTP/1.1\r\nHost: a\r\n\r\n")
		// Counted first: 0 open before the engine accepted it would say
		// nothing (and the connection would outlive the test).
		if !waitOpen(r, 1, 5*time.Second) {
			t.Fatalf("the connection was not counted open within 5s")
		}
		// Read nothing: the server's writes stall, and it must give up.
		if !waitOpen(r, 0, 5*time.Second) {
			t.Fatalf("a client that reads nothing still holds its connection after 5s")
		}
	})
}

// waitOpen waits up to d for r to have open client connections, and
// says whether it came to that.
func waitOpen(r *running, open int64, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for r.Stats().Open != open && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	return r.Stats().Open == open
}

func TestMaxConnections(t *testing.T) {
	t.Parallel()
	eachEngine(t, readers, func(t *testing.T, e storyEngine) {
		up := startUpstream(t, nil)
		r := e.serve(t, storyOptions{Upstream: up.URL(), Limits: engine.Limits{MaxConnections: 2}})
		c1, br1 := dial(t, r.Addr)
		dial(t, r.Addr)
		c3, br3 := dial(t, r.Addr) // the kernel accepts it; the server does not yet
		io.WriteString(c3, "GET /third HTTP/1.1\r\nHost: a\r\n\r\n")
		c3.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
		if _, err := br3.Peek(1); err == nil {
			t.Fatal("a third connection was served with MaxConnections 2")
		}
		if open := r.Stats().Open; open != 2 {
			t.Errorf("%d connections open, want 2", open)
		}
		roundTrip(t, c1, br1, "GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
		c3.SetReadDeadline(time.Now().Add(5 * time.Second))
		if resp, _ := readResponse(t, br3, "GET"); resp.StatusCode != 200 {
			t.Errorf("the third connection, once a slot was free: %d", resp.StatusCode)
		}
	})
}

// An upgraded connection counts against max_connections until its tunnel
// ends, on every engine (a tunnel is a connection, as nginx counts it
// against worker_connections): with a bound of one, a tunnel open keeps
// the next connection waiting, and it is served once the tunnel ends.
func TestMaxConnectionsCountsTunnels(t *testing.T) {
	t.Parallel()
	eachEngine(t, withNetHTTP(), func(t *testing.T, e storyEngine) {
		up := startUpstream(t, func(req *seenRequest, w *bufio.Writer, c net.Conn) {
			if len(req.Field("Upgrade")) == 0 {
				w.WriteString("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
				return
			}
			echoTunnel(w, c, switchHead)
		})
		r := e.serve(t, storyOptions{Upstream: up.URL(), Limits: engine.Limits{MaxConnections: 1}})
		c, br := dial(t, r.Addr)
		openTunnel(t, c, br)
		c2, br2 := dial(t, r.Addr)
		io.WriteString(c2, "GET / HTTP/1.1\r\nHost: a\r\n\r\n")
		c2.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
		if _, err := br2.ReadByte(); err == nil {
			t.Fatal("a second connection was served while a tunnel held the one allowed")
		}
		c.Close()
		c2.SetReadDeadline(time.Now().Add(5 * time.Second))
		if resp, _ := readResponse(t, br2, "GET"); resp.StatusCode != 200 {
			t.Errorf("once the tunnel ended: %d", resp.StatusCode)
		}
	})
}

// TestSlowloris opens many connections that send a partial header and
// nothing more: each is cut at the header timeout, and the server never
// holds more than MaxConnections.
func TestSlowloris(t *testing.T) {
	t.Parallel()
	eachEngine(t, readers, func(t *testing.T, e storyEngine) {
		const n, max = 200, 50
		up := startUpstream(t, nil)
		r := e.serve(t, storyOptions{Upstream: up.URL(), Limits: engine.Limits{MaxConnections: max, ReadHeaderTimeout: 300 * time.Millisecond}})
		stopSampling := wiretest.SamplePeak(5*time.Millisecond, func() int64 { return r.Stats().Open })
		start := time.Now()
		wiretest.Slowloris(r.Addr, n, "GET / HTTP/1.1\r\nHost: a\r\n", 10*time.Second)
		peak := stopSampling()
		took := time.Since(start)
		if peak > max {
			t.Errorf("%d connections open at once, over MaxConnections %d", peak, max)
		}
		// n/max rounds of the header timeout, and some slack.
		if want := time.Duration(n/max+2) * 300 * time.Millisecond * 2; took > want {
			t.Errorf("%d slow connections took %v to be cut, want under %v", n, took, want)
		}
		// A real client gets in once they are gone.
		c, br := dial(t, r.Addr)
		if resp, _ := roundTrip(t, c, br, "GET / HTTP/1.1\r\nHost: a\r\n\r\n"); resp.StatusCode != 200 {
			t.Errorf("status %d", resp.StatusCode)
		}
	})
}

func TestUpgradeIsTunnelled(t *testing.T) {
	t.Parallel()
	eachEngine(t, withNetHTTP(), func(t *testing.T, e storyEngine) {
		up := startUpstream(t, func(req *seenRequest, w *bufio.Writer, c net.Conn) {
			if req.Req.Header.Get("Upgrade") != "echo" {
				w.WriteString("HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
				return
			}
			w.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: echo\r\nConnection: Upgrade\r\nX-Up: 1\r\n\r\nhello ")
			w.Flush()
			// Echo until the client half-closes, then say bye.
			br := bufio.NewReader(c)
			io.Copy(c, br)
			io.WriteString(c, "bye")
			c.Close()
		})
		r := e.serve(t, storyOptions{Upstream: up.URL()})
		c, br := dial(t, r.Addr)
		resp := roundTripHead(t, c, br, "GET /ws HTTP/1.1\r\nHost: a\r\nConnection: keep-alive, Upgrade\r\nUpgrade: echo\r\n\r\n")
		// The application sent no Date: the 101 has preforkd's, as every
		// response it passes on.
		if resp.StatusCode != 101 || resp.Header.Get("Upgrade") != "echo" || resp.Header.Get("X-Up") != "1" ||
			!strings.EqualFold(resp.Header.Get("Connection"), "upgrade") || resp.Header.Get("Date") == "" {
			t.Fatalf("response %d %v", resp.StatusCode, resp.Header)
		}
		io.WriteString(c, "ping 1, ")
		io.WriteString(c, "ping 2")
		c.(*net.TCPConn).CloseWrite()
		got, err := io.ReadAll(br)
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != "hello ping 1, ping 2bye" {
			t.Errorf("through the tunnel: %q", got)
		}
		// Both ends were passed on: the tunnel is closed, not left to the
		// upstream timeout. (The net/http engine keeps no count to ask.)
		if r.Stats != nil && !waitOpen(r, 0, 5*time.Second) {
			t.Errorf("%d connections open after both sides ended", r.Stats().Open)
		}
		seen := up.Requests()
		if len(seen) != 1 || fmt.Sprint(seen[0].Field("Connection")) != "[Upgrade]" || fmt.Sprint(seen[0].Field("Upgrade")) != "[echo]" {
			t.Errorf("the upstream saw %+v", seen)
		}
	})
}

// TestUpgradeWhateverTheHeadSaysOfReuse: a 101 switches the connection
// to the tunnel, whatever its head says of keeping the connection for
// another HTTP exchange (an HTTP/1.0 status line, Keep-Alive: timeout=0,
// close among the Connection options): there is no next exchange on
// it, so it is tunnelled on every engine, as nginx tunnels it, and the
// client is told Connection: upgrade, never told protocols switched on
// a connection then closed under it.
func TestUpgradeWhateverTheHeadSaysOfReuse(t *testing.T) {
	t.Parallel()
	for _, head := range []string{
		"HTTP/1.0 101 Switching Protocols\r\nUpgrade: echo\r\nConnection: Upgrade\r\n\r\n",
		"HTTP/1.1 101 Switching Protocols\r\nUpgrade: echo\r\nConnection: Upgrade\r\nKeep-Alive: timeout=0\r\n\r\n",
		"HTTP/1.1 101 Switching Protocols\r\nUpgrade: echo\r\nConnection: Upgrade, close\r\n\r\n",
	} {
		eachEngine(t, withNetHTTP(), func(t *testing.T, e storyEngine) {
			up := startUpstream(t, func(req *seenRequest, w *bufio.Writer, c net.Conn) {
				w.WriteString(head + "hello ")
				w.Flush()
				io.Copy(c, bufio.NewReader(c))
				io.WriteString(c, "bye")
				c.Close()
			})
			r := e.serve(t, storyOptions{Upstream: up.URL()})
			c, br := dial(t, r.Addr)
			io.WriteString(c, upgradeRequest)
			status, h := readRawHead(t, br)
			if !strings.HasPrefix(status, "HTTP/1.1 101 ") || !httpfield.HasToken(h["Connection"], "upgrade") ||
				httpfield.HasToken(h["Connection"], "close") || h.Get("Upgrade") != "echo" {
				t.Fatalf("%q: the client got %q %v", head, status, h)
			}
			wantEcho(t, c, br, "hello pingbye", fmt.Sprintf("%q", head))
		})
	}
}

// A request that asks for an upgrade and also says close is tunnelled
// once the application answers 101, on every engine, as nginx tunnels it:
// close is for an HTTP exchange that does not come, and the client is
// told Connection: Upgrade alone. Any other answer closes the connection
// after it, as the client asked. (fasthttp once sent such a client the
// 101 with Connection: close too, and closed the connection under it.)
func TestUpgradeRequestThatSaysClose(t *testing.T) {
	t.Parallel()
	for _, conn := range []string{"Connection: close, Upgrade\r\n", "Connection: Upgrade\r\nConnection: close\r\n"} {
		eachEngine(t, withNetHTTP(), func(t *testing.T, e storyEngine) {
			up := startUpstream(t, func(req *seenRequest, w *bufio.Writer, c net.Conn) {
				if req.Req.URL.Path != "/ws" {
					w.WriteString("HTTP/1.1 426 Upgrade Required\r\nContent-Length: 2\r\n\r\nno")
					return
				}
				echoTunnel(w, c, switchHead)
			})
			r := e.serve(t, storyOptions{Upstream: up.URL()})
			c, br := dial(t, r.Addr)
			c.SetDeadline(time.Now().Add(10 * time.Second))
			io.WriteString(c, "GET /ws HTTP/1.1\r\nHost: a\r\n"+conn+"Upgrade: echo\r\n\r\n")
			status, h := readRawHead(t, br)
			if !strings.HasPrefix(status, "HTTP/1.1 101 ") || httpfield.HasToken(h["Connection"], "close") {
				t.Fatalf("%q: the client got %q %v, want a 101 without close", conn, status, h)
			}
			wantEcho(t, c, br, "ping", fmt.Sprintf("%q", conn))

			// Refused, the request's close is honoured.
			c, br = dial(t, r.Addr)
			c.SetDeadline(time.Now().Add(10 * time.Second))
			resp, _ := roundTrip(t, c, br, "GET /refused HTTP/1.1\r\nHost: a\r\n"+conn+"Upgrade: echo\r\n\r\n")
			if resp.StatusCode != 426 || !resp.Close {
				t.Errorf("%q: a refused upgrade: %d, close %v; want 426 and the connection closed", conn, resp.StatusCode, resp.Close)
			}
			if _, err := br.ReadByte(); err != io.EOF {
				t.Errorf("%q: after a refused upgrade that said close: %v, want the connection closed", conn, err)
			}
		})
	}
}

// The upstream's half-close is passed on as the client's, on every
// engine: the client still sends, and the upstream still reads.
func TestUpgradeUpstreamHalfClose(t *testing.T) {
	t.Parallel()
	eachEngine(t, withNetHTTP(), func(t *testing.T, e storyEngine) {
		got := make(chan string, 1)
		up := startUpstream(t, func(req *seenRequest, w *bufio.Writer, c net.Conn) {
			w.WriteString(switchHead + "hello")
			w.Flush()
			c.(*net.TCPConn).CloseWrite()
			b, _ := io.ReadAll(c)
			got <- string(b)
			c.Close()
		})
		r := e.serve(t, storyOptions{Upstream: up.URL()})
		c, br := dial(t, r.Addr)
		openTunnel(t, c, br)
		c.SetDeadline(time.Now().Add(5 * time.Second))
		if b, err := io.ReadAll(br); err != nil || string(b) != "hello" {
			t.Fatalf("from the upstream: %q, %v; want hello, then its end", b, err)
		}
		io.WriteString(c, "still here")
		c.(*net.TCPConn).CloseWrite()
		select {
		case s := <-got:
			if s != "still here" {
				t.Errorf("the upstream read %q after its half-close, want the client's last words", s)
			}
		case <-time.After(5 * time.Second):
			t.Error("the upstream never saw the client's end")
		}
	})
}

// A tunnel in use lives past upstream_timeout, on every engine: only a
// tunnel idle on both sides for that long ends. (The event loop once left
// the upstream's response timer armed, and its expiry crashed the worker.)
func TestUpgradeOutlivesTheUpstreamTimeout(t *testing.T) {
	t.Parallel()
	eachEngine(t, withNetHTTP(), func(t *testing.T, e storyEngine) {
		up := startUpstream(t, func(req *seenRequest, w *bufio.Writer, c net.Conn) {
			w.WriteString(switchHead)
			w.Flush()
			io.Copy(c, bufio.NewReader(c))
		})
		// Long enough that a loaded machine (the race detector, eight
		// tests at once) does not leave the tunnel idle that long between
		// two pings.
		const timeout = time.Second
		r := e.serve(t, storyOptions{Upstream: up.URL(), Client: engine.Upstream{Timeout: timeout}})
		c, br := dial(t, r.Addr)
		openTunnel(t, c, br)
		buf := make([]byte, 4)
		for range 8 { // a ping every 250 ms: 2 s, well past the timeout
			time.Sleep(timeout / 4)
			c.SetDeadline(time.Now().Add(5 * time.Second))
			io.WriteString(c, "ping")
			if _, err := io.ReadFull(br, buf); err != nil || string(buf) != "ping" {
				t.Fatalf("the tunnel in use ended: %q %v", buf, err)
			}
		}
	})
}

func TestUpgradeRefusedByUpstream(t *testing.T) {
	t.Parallel()
	eachEngine(t, withNetHTTP(), func(t *testing.T, e storyEngine) {
		up := startUpstream(t, nil) // answers 200 to everything
		r := e.serve(t, storyOptions{Upstream: up.URL()})
		c, br := dial(t, r.Addr)
		resp, body := roundTrip(t, c, br, "GET /ws HTTP/1.1\r\nHost: a\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n")
		if resp.StatusCode != 200 || string(body) != "ok" {
			t.Errorf("%d %q", resp.StatusCode, body)
		}
		if resp, _ := roundTrip(t, c, br, "GET /after HTTP/1.1\r\nHost: a\r\n\r\n"); resp.StatusCode != 200 {
			t.Errorf("the connection after a refused upgrade: %d", resp.StatusCode)
		}
	})
}

// A tunnel idle on both sides for upstream_timeout ends, on every
// engine (nginx's proxy_read_timeout on an upgraded connection): a peer
// that went silent holds neither the client's connection nor the
// upstream's for ever.
func TestUpgradeIdleTunnelEnds(t *testing.T) {
	t.Parallel()
	eachEngine(t, withNetHTTP(), func(t *testing.T, e storyEngine) {
		upEnded := make(chan struct{})
		up := startUpstream(t, func(req *seenRequest, w *bufio.Writer, c net.Conn) {
			w.WriteString(switchHead)
			w.Flush()
			io.Copy(io.Discard, c) // silent, until the tunnel is closed
			close(upEnded)
		})
		const timeout = 300 * time.Millisecond
		r := e.serve(t, storyOptions{Upstream: up.URL(), Client: engine.Upstream{Timeout: timeout}})
		c, br := dial(t, r.Addr)
		openTunnel(t, c, br)
		start := time.Now()
		c.SetReadDeadline(start.Add(10 * timeout))
		if b, err := br.ReadByte(); err != io.EOF {
			t.Fatalf("a tunnel idle for %v (timeout %v): %q, %v; want it closed", time.Since(start), timeout, b, err)
		}
		select {
		case <-upEnded:
		case <-time.After(10 * timeout):
			t.Errorf("the idle tunnel's upstream connection was kept")
		}
	})
}

// A tunnel whose client sends but never reads ends once a write to it
// has waited past the bound of a write, on every engine (nginx's
// send_timeout): the client's own bytes, which keep the tunnel from
// being idle, do not keep the upstream's waiting for ever.
func TestUpgradeClientThatNeverReadsIsCut(t *testing.T) {
	t.Parallel()
	eachEngine(t, withNetHTTP(), func(t *testing.T, e storyEngine) {
		upEnded := make(chan struct{})
		up := startUpstream(t, func(req *seenRequest, w *bufio.Writer, c net.Conn) {
			// The 101 and the first bytes of the tunnel in one write: the
			// client's small window takes part of them only.
			chunk := make([]byte, 256<<10)
			c.Write(append([]byte(switchHead), chunk...))
			go io.Copy(io.Discard, c)
			for {
				c.SetWriteDeadline(time.Now().Add(20 * time.Second))
				if _, err := c.Write(chunk); err != nil {
					break
				}
			}
			close(upEnded)
		})
		const timeout = 300 * time.Millisecond
		// The bound of a write to a client is send_timeout, as on every
		// connection, however long upstream_timeout is.
		r := e.serve(t, storyOptions{Upstream: up.URL(), Client: engine.Upstream{Timeout: time.Minute},
			Limits: engine.Limits{SendTimeout: timeout}})
		d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
			return rc.Control(func(fd uintptr) {
				syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096)
			})
		}}
		c, err := d.Dial("tcp", r.Addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		io.WriteString(c, upgradeRequest)
		start := time.Now()
		for {
			select {
			case <-upEnded:
				return
			case <-time.After(timeout / 6):
			}
			if time.Since(start) > 30*timeout {
				t.Fatalf("a client that never reads held its tunnel for %v (bound of a write %v)", time.Since(start), timeout)
			}
			c.SetWriteDeadline(time.Now().Add(time.Second))
			c.Write([]byte("x")) // busy: the tunnel is not idle
		}
	})
}

// A client that resets its connection after an upgrade request, before
// the upstream's 101 comes, has the upstream's connection closed once the
// 101 cannot be sent, on every engine: no tunnel starts, and nothing is
// left open (fasthttp once skipped the tunnel when it could not write
// the 101, and the upstream's connection stayed open for good, whatever
// upstream_timeout said).
func TestUpgradeClientGoneBeforeTheSwitch(t *testing.T) {
	t.Parallel()
	eachEngine(t, withNetHTTP(), func(t *testing.T, e storyEngine) {
		upEnded := make(chan error, 1)
		up := startUpstream(t, func(req *seenRequest, w *bufio.Writer, c net.Conn) {
			time.Sleep(200 * time.Millisecond) // the client is gone by then
			w.WriteString(switchHead + "hello")
			w.Flush()
			c.SetReadDeadline(time.Now().Add(5 * time.Second))
			_, err := io.Copy(io.Discard, c)
			upEnded <- err
		})
		region, c := countedCore(t)
		r := e.serve(t, storyOptions{Core: c, Upstream: up.URL(), Client: engine.Upstream{Timeout: time.Minute}})
		conn, _ := dial(t, r.Addr)
		io.WriteString(conn, upgradeRequest)
		time.Sleep(50 * time.Millisecond)
		conn.(*net.TCPConn).SetLinger(0)
		conn.Close()
		select {
		case err := <-upEnded:
			var te interface{ Timeout() bool }
			if errors.As(err, &te) && te.Timeout() {
				t.Errorf("the upstream's connection was left open after its 101 found the client gone: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the upstream never ended")
		}
		waitConns(t, region, "the client gone", connCounts{0, 0, 0, 1, 0})
	})
}

// A 101 that comes while the server drains still switches, on every
// engine: the client gets Connection: Upgrade, not close, and the tunnel
// carries its bytes until it ends, which the drain waits for (within its
// deadline), as nginx lets an upgraded connection run until
// worker_shutdown_timeout. (fasthttp once added close to the 101 of a
// drain, and so told the client protocols switched on a connection it
// then closed.)
func TestUpgradeSwitchedDuringADrain(t *testing.T) {
	t.Parallel()
	eachEngine(t, withNetHTTP(), func(t *testing.T, e storyEngine) {
		asked := make(chan struct{})
		up := startUpstream(t, func(req *seenRequest, w *bufio.Writer, c net.Conn) {
			close(asked)
			time.Sleep(200 * time.Millisecond) // the drain begins meanwhile
			echoTunnel(w, c, switchHead)
		})
		r := e.serve(t, storyOptions{Upstream: up.URL()})
		c, br := dial(t, r.Addr)
		c.SetDeadline(time.Now().Add(10 * time.Second))
		io.WriteString(c, upgradeRequest)
		<-asked
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		drained := make(chan struct{})
		go func() { r.Shutdown(ctx); close(drained) }()
		status, h := readRawHead(t, br)
		if !strings.HasPrefix(status, "HTTP/1.1 101 ") || httpfield.HasToken(h["Connection"], "close") {
			t.Fatalf("the 101 of a drain: %q %v, want it without close", status, h)
		}
		io.WriteString(c, "ping")
		if b := make([]byte, 4); func() error { _, err := io.ReadFull(br, b); return err }() != nil || string(b) != "ping" {
			t.Fatalf("the tunnel of a drain carried %q", b)
		}
		c.(*net.TCPConn).CloseWrite()
		if got, err := io.ReadAll(br); err != nil || len(got) != 0 {
			t.Errorf("the tunnel's end: %q, %v", got, err)
		}
		select {
		case <-drained:
		case <-time.After(5 * time.Second):
			t.Error("the drain did not end with the tunnel")
		}
	})
}

// An upgrade request whose body is longer than what is read ahead is
// refused 400 and never forwarded, on every engine: past the request,
// the connection's bytes are the tunnel's, and a body streamed to the
// upstream would run into them.
func TestUpgradeWithALongBodyRefused(t *testing.T) {
	t.Parallel()
	eachEngine(t, withNetHTTP(), func(t *testing.T, e storyEngine) {
		up := startUpstream(t, func(req *seenRequest, w *bufio.Writer, c net.Conn) {
			w.WriteString(switchHead)
		})
		r := e.serve(t, storyOptions{Upstream: up.URL()})
		c, br := dial(t, r.Addr)
		const n = 100 << 10 // past the 64 KiB read ahead
		go func() {
			fmt.Fprintf(c, "POST /ws HTTP/1.1\r\nHost: a\r\nConnection: Upgrade\r\nUpgrade: echo\r\nContent-Length: %d\r\n\r\n", n)
			io.Copy(c, wiretest.Pattern(n))
		}()
		resp, body := readResponse(t, br, "POST")
		if resp.StatusCode != 400 {
			t.Errorf("an upgrade with a %d-byte body: %d %q, want 400", n, resp.StatusCode, body)
		}
		if seen := up.Requests(); len(seen) != 0 {
			t.Errorf("the upstream saw %q", seen[0].Line)
		}
	})
}

// An upgrade request whose body ends within the read-ahead (64 KiB, that
// bound included) is forwarded with it, on every engine, as nginx reads
// a body before it forwards the request: the upstream gets the body,
// then the tunnel carries what the client sends after it. (The net/http
// engine once refused a body of exactly 64 KiB as longer than that.)
func TestUpgradeWithABodyForwarded(t *testing.T) {
	t.Parallel()
	for _, n := range []int{5, 64 << 10} {
		eachEngine(t, withNetHTTP(), func(t *testing.T, e storyEngine) {
			up := startEchoUpstream(t)
			r := e.serve(t, storyOptions{Upstream: up.URL()})
			c, br := dial(t, r.Addr)
			go func() {
				fmt.Fprintf(c, "POST /ws HTTP/1.1\r\nHost: a\r\nConnection: Upgrade\r\nUpgrade: echo\r\nContent-Length: %d\r\n\r\n", n)
				io.Copy(c, wiretest.Pattern(int64(n)))
			}()
			if resp := readHead(t, br, "POST"); resp.StatusCode != 101 {
				t.Fatalf("an upgrade with a %d-byte body: %d, want the upstream's 101", n, resp.StatusCode)
			}
			wantEcho(t, c, br, "ping", fmt.Sprintf("after a %d-byte body", n))
			if seen := up.Requests(); len(seen) != 1 || len(seen[0].Body) != n || !seen[0].BodyOK {
				t.Errorf("the upstream saw %d requests, want one with the %d-byte body", len(seen), n)
			}
		})
	}
}

// A 101 has no body (RFC 9110 §15.2: a 1xx ends at its head): what the
// application sends after the head is the tunnel's, whatever a
// Content-Length or Transfer-Encoding in it says, and that field is not
// passed on (§8.6, §6.1: neither is sent in a 1xx), on every engine. nginx
// also sends on what follows a 101's head as the tunnel's first bytes.
func TestUpgradeSwitchBodyIsTheTunnels(t *testing.T) {
	t.Parallel()
	for _, field := range []string{"Content-Length: 5", "Content-Length: 0", "Transfer-Encoding: chunked"} {
		eachEngine(t, withNetHTTP(), func(t *testing.T, e storyEngine) {
			up := startUpstream(t, func(req *seenRequest, w *bufio.Writer, c net.Conn) {
				echoTunnel(w, c, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: echo\r\nConnection: Upgrade\r\n"+field+"\r\n\r\nhello")
			})
			r := e.serve(t, storyOptions{Upstream: up.URL()})
			c, br := dial(t, r.Addr)
			io.WriteString(c, upgradeRequest)
			c.SetDeadline(time.Now().Add(10 * time.Second))
			status, h := readRawHead(t, br)
			if !strings.HasPrefix(status, "HTTP/1.1 101 ") || h.Get("Content-Length") != "" || h.Get("Transfer-Encoding") != "" {
				t.Fatalf("%s: the client got %q %v, want the 101 without the field", field, status, h)
			}
			if b := make([]byte, 5); func() error { _, err := io.ReadFull(br, b); return err }() != nil || string(b) != "hello" {
				t.Fatalf("%s: the tunnel's first bytes %q, want the application's hello", field, b)
			}
			wantEcho(t, c, br, "ping", field)
		})
	}
}

// The application's reset header on a 101 does what it does on any
// response, on every engine: it resets the rules it names for the
// request's key, and never reaches the client.
func TestUpgradeResetHeader(t *testing.T) {
	t.Parallel()
	eachEngine(t, withNetHTTP(), func(t *testing.T, e storyEngine) {
		up := startUpstream(t, func(req *seenRequest, w *bufio.Writer, c net.Conn) {
			w.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: echo\r\nConnection: Upgrade\r\nPreforkd-Reset: ws\r\n\r\n")
		})
		c := configCore(t, "[server]\nreset_header = \"Preforkd-Reset\"\n[table]\ncounters = 1024\n"+
			"[[ratelimit]]\nname = \"ws\"\npath = \"/ws\"\nlimit = 2\nwindow = \"1h\"\n", nil)
		r := e.serve(t, storyOptions{Upstream: up.URL(), Core: c})
		for i := range 3 {
			conn, br := dial(t, r.Addr)
			resp := roundTripHead(t, conn, br, upgradeRequest)
			if resp.StatusCode != 101 || resp.Header.Get("X-Ratelimit-Remaining") != "1" || resp.Header.Get("Preforkd-Reset") != "" {
				t.Errorf("upgrade %d: %d %v, want 101 with one left each time, without Preforkd-Reset", i+1, resp.StatusCode, resp.Header)
			}
			conn.Close()
		}
	})
}

// The rules decide an upgrade request as any request, on every engine:
// counted once (its tunnel's end counts nothing more), refused ones
// never reach the upstream; an idempotency key's 101 is kept, never
// replayed (what the tunnel carried is unknown), so the key's retry is
// refused 409, and not forwarded either.
func TestUpgradeDecidedByTheRules(t *testing.T) {
	t.Parallel()
	eachEngine(t, withNetHTTP(), func(t *testing.T, e storyEngine) {
		up := startEchoUpstream(t)
		c := configCore(t, "[table]\ncounters = 1024\n[[ratelimit]]\nname = \"ws\"\npath = \"/ws\"\nlimit = 2\nwindow = \"1h\"\n"+
			"[[idempotency]]\npath = \"/ws\"\nmax_body = \"4KiB\"\n", nil)
		r := e.serve(t, storyOptions{Upstream: up.URL(), Core: c})
		const ask = "POST /ws HTTP/1.1\r\nHost: a\r\nConnection: Upgrade\r\nUpgrade: echo\r\nIdempotency-Key: k1\r\nContent-Length: 0\r\n\r\n"
		for i, want := range []struct {
			status    int
			remaining string
		}{{101, "1"}, {409, "0"}, {429, "0"}} {
			conn, br := dial(t, r.Addr)
			resp := roundTripHead(t, conn, br, ask)
			if resp.StatusCode != want.status || resp.Header.Get("X-Ratelimit-Remaining") != want.remaining {
				t.Errorf("upgrade %d: %d, %q left; want %d, %q left", i+1, resp.StatusCode, resp.Header.Get("X-Ratelimit-Remaining"), want.status, want.remaining)
			}
			if resp.StatusCode == 101 {
				// The tunnel ends before the next request: its end is not
				// counted again.
				conn.(*net.TCPConn).CloseWrite()
				io.ReadAll(br)
			}
			conn.Close()
		}
		if seen := up.Requests(); len(seen) != 1 {
			t.Errorf("the upstream saw %d upgrade requests, want the first only", len(seen))
		}
	})
}

// An upgrade request is the upstream's to grant: a response the cache
// holds for its URL is never the answer (nginx operators write
// proxy_cache_bypass $http_upgrade for it), on every engine.
func TestUpgradeNotAnsweredFromCache(t *testing.T) {
	t.Parallel()
	eachEngine(t, withNetHTTP(), func(t *testing.T, e storyEngine) {
		up := startUpstream(t, func(req *seenRequest, w *bufio.Writer, c net.Conn) {
			if len(req.Field("Upgrade")) == 0 {
				w.WriteString("HTTP/1.1 200 OK\r\nCache-Control: max-age=60\r\nContent-Length: 4\r\n\r\npage")
				return
			}
			w.WriteString(switchHead)
		})
		var clock atomic.Int64
		r := e.serve(t, storyOptions{Upstream: up.URL(), Core: cacheCore(t, &clock)})
		for i, want := range []string{"MISS", "HIT"} {
			if status, xcache, _ := fetch(t, "http://"+r.Addr+"/ws"); status != 200 || xcache != want {
				t.Fatalf("GET %d: %d, X-Cache %q, want 200 %s", i+1, status, xcache, want)
			}
		}
		conn, br := dial(t, r.Addr)
		defer conn.Close()
		// The Host of the GETs: the same primary key.
		if resp := roundTripHead(t, conn, br, "GET /ws HTTP/1.1\r\nHost: "+r.Addr+"\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n"); resp.StatusCode != 101 {
			t.Errorf("upgrade: %d %v, want the upstream's 101", resp.StatusCode, resp.Header)
		}
	})
}

// A 101 is counted once it is handed over, on every engine, as the
// request duration histogram says ("from reading a request to handing
// its response over"): not when its tunnel ends, maybe hours later, or
// never if the worker is replaced meanwhile.
func TestUpgradeCountedWhenHandedOver(t *testing.T) {
	t.Parallel()
	eachEngine(t, withNetHTTP(), func(t *testing.T, e storyEngine) {
		up := startEchoUpstream(t)
		counted := make(chan int, 4)
		c := configCoreWith(t, "", func(o *core.Options) { o.OnResponse = func(status int) { counted <- status } })
		r := e.serve(t, storyOptions{Upstream: up.URL(), Core: c})
		conn, br := dial(t, r.Addr)
		openTunnel(t, conn, br)
		select {
		case status := <-counted:
			if status != 101 {
				t.Errorf("counted %d, want 101", status)
			}
		case <-time.After(2 * time.Second):
			t.Errorf("the 101 of a tunnel open for 2 s is not counted")
		}
	})
}

// TestStaleUpstreamConnection: the upstream closes every keep-alive
// connection right after its response; requests sent on such a pooled
// connection are sent again on a new one, never answered 502.
func TestStaleUpstreamConnection(t *testing.T) {
	t.Parallel()
	eachEngine(t, withNetHTTP(), func(t *testing.T, e storyEngine) {
		up := startUpstream(t, func(req *seenRequest, w *bufio.Writer, c net.Conn) {
			w.WriteString("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
			w.Flush()
			time.Sleep(20 * time.Millisecond)
			c.Close()
		})
		r := e.serve(t, storyOptions{Upstream: up.URL()})
		c, br := dial(t, r.Addr)
		for i := range 5 {
			if resp, body := roundTrip(t, c, br, "GET / HTTP/1.1\r\nHost: a\r\n\r\n"); resp.StatusCode != 200 {
				t.Fatalf("request %d: %d %s", i, resp.StatusCode, body)
			}
			time.Sleep(50 * time.Millisecond) // the upstream's close arrives at the pooled connection
		}
	})
}

// TestEarlyResponse: the upstream answers 413 after the head of a long
// upload, without reading it, while the client sends the whole body, and
// while it pauses past the read-ahead (reading the answer as it uploads).
// The paused client gets the answer at once, not when it sends its next
// bytes or client_body_timeout passes, and the connection closes after
// it: the rest of the body is never read.
func TestEarlyResponse(t *testing.T) {
	t.Parallel()
	for _, pause := range []bool{false, true} {
		t.Run(fmt.Sprintf("pause=%v", pause), func(t *testing.T) {
			t.Parallel()
			eachEngine(t, withNetHTTP(), func(t *testing.T, e storyEngine) {
				ln := listen(t)
				acceptEach(ln, func(c net.Conn) {
					br := bufio.NewReader(c)
					if _, err := http.ReadRequest(br); err != nil {
						return
					}
					io.WriteString(c, "HTTP/1.1 413 Content Too Large\r\nContent-Length: 3\r\nConnection: close\r\n\r\nbig")
					c.(*net.TCPConn).CloseWrite()
					io.Copy(io.Discard, br)
				})
				r := e.serve(t, storyOptions{Upstream: "http://" + ln.Addr().String(),
					Limits: engine.Limits{ClientBodyTimeout: 20 * time.Second}})
				c, br := dial(t, r.Addr)
				const size = 4 << 20
				fmt.Fprintf(c, "POST /up HTTP/1.1\r\nHost: a\r\nContent-Length: %d\r\n\r\n", size)
				if pause {
					io.WriteString(c, strings.Repeat("x", 100<<10)) // past the read-ahead: streamed
					c.SetReadDeadline(time.Now().Add(15 * time.Second))
				} else {
					go io.Copy(c, wiretest.Pattern(size))
				}
				resp, body := readResponse(t, br, "POST")
				if resp.StatusCode != 413 || string(body) != "big" {
					t.Errorf("pause=%v: %d %q", pause, resp.StatusCode, body)
				}
				if b, err := br.ReadByte(); pause && err == nil {
					t.Errorf("after the answer to a paused client: %q; want the connection closed", b)
				}
			})
		})
	}
}

// TestLongEarlyResponse: an upstream that answers before it read the
// body, with an answer longer than one read of it, to a client that sent
// part of its body and waits: the client gets the whole answer. (Stopping
// the wait for the client's body used to close the upstream connection,
// as a client that failed to send its body does, and cut the answer
// after what had been read of it.)
func TestLongEarlyResponse(t *testing.T) {
	t.Parallel()
	const answer = 1 << 20
	up := earlyAnswerer(t, answer)
	eachEngine(t, withNetHTTP(), func(t *testing.T, e storyEngine) {
		r := e.serve(t, storyOptions{Upstream: up})
		c, br := dial(t, r.Addr)
		fmt.Fprintf(c, "POST /up HTTP/1.1\r\nHost: a\r\nContent-Length: %d\r\n\r\n", 4<<20)
		io.Copy(c, wiretest.Pattern(100<<10)) // past the read-ahead: streamed
		time.Sleep(200 * time.Millisecond)    // the answer fills the buffers on its way
		resp := readHead(t, br, "POST")
		n, err := io.Copy(io.Discard, resp.Body)
		if resp.StatusCode != 413 || n != answer || err != nil {
			t.Errorf("%d, %d of %d bytes of the answer, %v", resp.StatusCode, n, answer, err)
		}
	})
}

// earlyAnswerer is an upstream that answers every request 413 with
// answer bytes of body as soon as it read its head, then reads the body.
func earlyAnswerer(t *testing.T, answer int64) (url string) {
	ln := listen(t)
	acceptEach(ln, func(c net.Conn) {
		br := bufio.NewReader(c)
		if _, err := http.ReadRequest(br); err != nil {
			return
		}
		fmt.Fprintf(c, "HTTP/1.1 413 Content Too Large\r\nContent-Length: %d\r\n\r\n", answer)
		io.Copy(c, wiretest.Pattern(answer))
		c.(*net.TCPConn).CloseWrite()
		io.Copy(io.Discard, br)
	})
	return "http://" + ln.Addr().String()
}

// TestEarlyResponseLingers: an upstream that answers before it read the
// body, to a client that sends its body until it sees the answer's head,
// then reads the answer slowly: the client gets the whole answer. The
// connection ends after it with the client's body unread, so the close
// must linger: a socket closed with unread bytes sends a reset, and a
// reset drops what was not yet delivered of the answer.
func TestEarlyResponseLingers(t *testing.T) {
	t.Parallel()
	const answer = 1 << 20
	up := earlyAnswerer(t, answer)
	eachEngine(t, withNetHTTP(), func(t *testing.T, e storyEngine) {
		r := e.serve(t, storyOptions{Upstream: up})
		// A small send buffer keeps what is on its way when the client
		// stops within what the close reads (engine.LingerBytes).
		d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
			return rc.Control(func(fd uintptr) { syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_SNDBUF, 8<<10) })
		}}
		c, err := d.Dial("tcp", r.Addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(20 * time.Second))
		br := bufio.NewReader(c)
		fmt.Fprintf(c, "POST /up HTTP/1.1\r\nHost: a\r\nContent-Length: %d\r\n\r\n", 64<<20)
		var stop atomic.Bool
		go func() {
			piece := make([]byte, 16<<10)
			for !stop.Load() {
				if _, err := c.Write(piece); err != nil {
					return
				}
			}
		}()
		resp := readHead(t, br, "POST")
		stop.Store(true)
		time.Sleep(200 * time.Millisecond) // a slow reader: the answer waits in the buffers
		n, err := io.Copy(io.Discard, resp.Body)
		if resp.StatusCode != 413 || n != answer || err != nil {
			t.Errorf("%d, %d of %d bytes of the answer, %v", resp.StatusCode, n, answer, err)
		}
	})
}

// TestHalfClosedClient: a client that shuts down its side once its
// requests are sent (a pipelined pair here) gets the application's answers
// or a connection closed with nothing on it, never an answer made up for
// it: the net/http engine takes the shutdown for a client gone, and used
// to return without a head, for net/http to send 200 with an empty body.
func TestHalfClosedClient(t *testing.T) {
	t.Parallel()
	ln := listen(t)
	acceptEach(ln, func(c net.Conn) {
		br := bufio.NewReader(c)
		for {
			if _, err := http.ReadRequest(br); err != nil {
				return
			}
			time.Sleep(200 * time.Millisecond) // the client's shutdown arrives first
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nslow")
		}
	})
	eachEngine(t, withNetHTTP(), func(t *testing.T, e storyEngine) {
		r := e.serve(t, storyOptions{Upstream: "http://" + ln.Addr().String()})
		c, br := dial(t, r.Addr)
		io.WriteString(c, "GET /a HTTP/1.1\r\nHost: a\r\n\r\nGET /b HTTP/1.1\r\nHost: a\r\n\r\n")
		c.(*net.TCPConn).CloseWrite()
		for i := 0; ; i++ {
			if _, err := br.Peek(1); err == io.EOF {
				break
			}
			resp, body := readResponse(t, br, "GET")
			if resp.StatusCode != 200 || string(body) != "slow" {
				t.Fatalf("response %d: %d %q; want the application's 200 \"slow\", or nothing", i, resp.StatusCode, body)
			}
		}
	})
}

// TestSlowUploadIsTheClients: a body streamed with pauses longer than
// upstream_timeout but within client_body_timeout is the client's to
// send: the upstream's clock does not run while it waits for the client,
// and the request is served (not 504, nor 408).
func TestSlowUploadIsTheClients(t *testing.T) {
	t.Parallel()
	eachEngine(t, withNetHTTP(), func(t *testing.T, e storyEngine) {
		ln := listen(t)
		acceptEach(ln, func(c net.Conn) {
			c.SetDeadline(time.Now().Add(10 * time.Second))
			br := bufio.NewReader(c)
			req, err := http.ReadRequest(br)
			if err != nil {
				return
			}
			n, _ := io.Copy(io.Discard, req.Body)
			fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%d", len(strconv.FormatInt(n, 10)), n)
		})
		r := e.serve(t, storyOptions{Upstream: "http://" + ln.Addr().String(),
			Client: engine.Upstream{Timeout: 300 * time.Millisecond},
			Limits: engine.Limits{ClientBodyTimeout: 5 * time.Second}})
		c, br := dial(t, r.Addr)
		const total = 100<<10 + 2
		go func() {
			fmt.Fprintf(c, "POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: %d\r\n\r\n", total)
			c.Write(make([]byte, 100<<10)) // past the read-ahead: streamed
			for range 2 {
				time.Sleep(700 * time.Millisecond)
				c.Write([]byte("x"))
			}
		}()
		resp, body := readResponse(t, br, "POST")
		if resp.StatusCode != 200 || string(body) != strconv.Itoa(total) {
			t.Errorf("%d %q, want 200 and the whole body upstream", resp.StatusCode, body)
		}
	})
}

// TestShutdownFailsNoRequest: a drain lets the request in flight finish,
// tells a busy keep-alive connection Connection: close, serves a request
// that arrives on an idle connection within the grace
// (engine.DrainIdleGrace), and closes idle connections after it.
func TestShutdownFailsNoRequest(t *testing.T) {
	t.Parallel()
	eachEngine(t, withNetHTTP(), func(t *testing.T, e storyEngine) {
		release := make(chan struct{})
		up := startUpstream(t, func(req *seenRequest, w *bufio.Writer, c net.Conn) {
			if req.Req.URL.Path == "/slow" {
				<-release
			}
			w.WriteString("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		})
		r := e.serve(t, storyOptions{Upstream: up.URL()})

		busy, busyR := dial(t, r.Addr)
		idle, idleR := dial(t, r.Addr)
		roundTrip(t, idle, idleR, "GET / HTTP/1.1\r\nHost: a\r\n\r\n")
		io.WriteString(busy, "GET /slow HTTP/1.1\r\nHost: a\r\n\r\n")
		up.WaitRequests(2, 2*time.Second)

		shut := make(chan error, 1)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			shut <- r.Shutdown(ctx)
		}()
		// A request on the idle connection within the grace is served, and
		// told that the connection ends.
		time.Sleep(100 * time.Millisecond)
		resp, _ := roundTrip(t, idle, idleR, "GET /late HTTP/1.1\r\nHost: a\r\n\r\n")
		if resp.StatusCode != 200 || !resp.Close {
			t.Errorf("a request on an idle connection during the drain: %d, close %v", resp.StatusCode, resp.Close)
		}
		// New connections are not accepted any more.
		if c, err := net.DialTimeout("tcp", r.Addr, time.Second); err == nil {
			c.SetReadDeadline(time.Now().Add(time.Second))
			io.WriteString(c, "GET / HTTP/1.1\r\nHost: a\r\n\r\n")
			if b, _ := io.ReadAll(c); len(b) != 0 {
				t.Errorf("a connection made after Shutdown was served: %q", b)
			}
			c.Close()
		}
		close(release)
		resp, _ = readResponse(t, busyR, "GET")
		if resp.StatusCode != 200 || !resp.Close {
			t.Errorf("the request in flight: %d, close %v", resp.StatusCode, resp.Close)
		}
		select {
		case err := <-shut:
			if err != nil {
				t.Errorf("Shutdown: %v", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("Shutdown did not return")
		}
		if err := r.Served(); err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
}

// TestShutdownClosesIdleAfterGrace: an idle connection that sends nothing
// is closed once idle for the grace (engine.DrainIdleGrace), quietly; one
// that never sent a request, at the header timeout if that comes before
// its grace.
func TestShutdownClosesIdleAfterGrace(t *testing.T) {
	t.Parallel()
	eachEngine(t, withNetHTTP(), func(t *testing.T, e storyEngine) {
		up := startUpstream(t, nil)
		r := e.serve(t, storyOptions{Upstream: up.URL(), Limits: engine.Limits{ReadHeaderTimeout: 300 * time.Millisecond}})
		idle, idleR := dial(t, r.Addr)
		roundTrip(t, idle, idleR, "GET / HTTP/1.1\r\nHost: a\r\n\r\n")
		idleSince := time.Now()
		fresh, _ := dial(t, r.Addr) // accepted, nothing sent
		time.Sleep(50 * time.Millisecond)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := r.Shutdown(ctx); err != nil {
			t.Fatalf("Shutdown: %v", err)
		}
		// Not at once: a client may be sending its next request.
		if took := time.Since(idleSince); took < engine.DrainIdleGrace-100*time.Millisecond || took > engine.DrainIdleGrace+time.Second {
			t.Errorf("Shutdown returned %v after the idle connection's response, want about %v", took, engine.DrainIdleGrace)
		}
		for _, c := range []io.Reader{idleR, fresh} {
			if b, err := io.ReadAll(c); len(b) != 0 || (err != nil && !errors.Is(err, syscall.ECONNRESET)) {
				t.Errorf("an idle connection at the drain read %q, %v; want a quiet close", b, err)
			}
		}
	})
}

// A response's last bytes reach the client only once its exchange ended
// (core.Exchange.Finish: counted, logged, stored), so that a client that
// has the whole response finds what it left, a cached entry or an
// idempotency key's stored response, from any connection: with a core
// slow to finish, the client gets the end after it. On every engine, for
// a body framed by length and a chunked one.
func TestResponseEndsAfterItsExchange(t *testing.T) {
	t.Parallel()
	eachEngine(t, withNetHTTP(), func(t *testing.T, e storyEngine) {
		up := startUpstream(t, func(req *seenRequest, w *bufio.Writer, c net.Conn) {
			if req.Req.URL.Path == "/chunked" {
				w.WriteString("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n")
			} else {
				w.WriteString("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello")
			}
		})
		var finished atomic.Bool
		c := configCoreWith(t, "", func(o *core.Options) {
			o.OnResponse = func(int) {
				time.Sleep(200 * time.Millisecond)
				finished.Store(true)
			}
		})
		r := e.serve(t, storyOptions{Upstream: up.URL(), Core: c})
		for _, path := range []string{"/length", "/chunked"} {
			finished.Store(false)
			conn, br := dial(t, r.Addr)
			if _, body := roundTrip(t, conn, br, "GET "+path+" HTTP/1.1\r\nHost: a\r\n\r\n"); string(body) != "hello" || !finished.Load() {
				t.Errorf("%s: %q, the exchange ended before the end came: %v", path, body, finished.Load())
			}
		}
	})
}

// OnResponse sees the status of every answer, the server's own ones too
// (those to requests it could not read among them: fasthttp answers them
// from its ErrorHandler, where no handler runs), before the client has it.
func TestOnResponse(t *testing.T) {
	t.Parallel()
	eachEngine(t, readers, func(t *testing.T, e storyEngine) {
		var mu sync.Mutex
		var seen []int
		r := e.serve(t, storyOptions{
			App: func(path string) int {
				if path == "/fail" {
					return 503
				}
				return 200
			},
			OnResponse: func(status int) {
				mu.Lock()
				seen = append(seen, status)
				mu.Unlock()
			},
		})
		c, br := dial(t, r.Addr)
		for _, tc := range []struct {
			req    string
			status int
		}{
			{"GET /ok HTTP/1.1\r\nHost: a\r\n\r\n", 200},
			{"GET /fail HTTP/1.1\r\nHost: a\r\n\r\n", 503},
			{"GET /a%2Fb HTTP/1.1\r\nHost: a\r\n\r\n", 400},
		} {
			resp, _ := roundTrip(t, c, br, tc.req)
			mu.Lock()
			got := slices.Clone(seen)
			mu.Unlock()
			if resp.StatusCode != tc.status || len(got) == 0 || got[len(got)-1] != tc.status {
				t.Fatalf("%q: status %d, OnResponse saw %v; want %d", tc.req, resp.StatusCode, got, tc.status)
			}
		}
		for _, tc := range []struct {
			req    string
			status int
		}{
			{"GARBAGE\r\n\r\n", 400},
			{"GET / HTTP/1.1\r\nHost: a\r\nX-Big: " + strings.Repeat("b", 80<<10) + "\r\n\r\n", 431},
		} {
			mu.Lock()
			before := len(seen)
			mu.Unlock()
			c, br := dial(t, r.Addr) // each closes its connection
			io.WriteString(c, tc.req)
			resp, err := http.ReadResponse(br, nil)
			if err != nil || resp.StatusCode != tc.status {
				t.Fatalf("%.20q: %v %v, want %d", tc.req, resp, err, tc.status)
			}
			mu.Lock()
			got := slices.Clone(seen)
			mu.Unlock()
			if len(got) != before+1 || got[before] != tc.status {
				t.Errorf("%.20q: answered %d, OnResponse saw %v", tc.req, tc.status, got)
			}
		}
		mu.Lock()
		defer mu.Unlock()
		if len(seen) != 5 {
			t.Errorf("OnResponse called %d times for 5 answers: %v", len(seen), seen)
		}
	})
}

// handingListener hands out the connections sent on conns; its Close
// first hands over late, as a shared listening socket may (a connection
// the kernel queued is accepted just before the listener closes), and
// returns once lateRead is closed.
type handingListener struct {
	conns    chan net.Conn
	late     net.Conn
	lateRead chan struct{}
	closed   chan struct{}
	once     sync.Once
}

func (l *handingListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.closed:
		return nil, net.ErrClosed
	}
}

func (l *handingListener) Close() error {
	l.once.Do(func() {
		if l.late != nil {
			l.conns <- l.late
			<-l.lateRead
		}
		close(l.closed)
	})
	return nil
}

func (l *handingListener) Addr() net.Addr { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)} }

// A drain that begins while no connection is open still serves one that
// its listener hands over as it closes: Shutdown waits until the listener
// is no longer served before it calls the drain done.
func TestShutdownServesTheLastAcceptedConnection(t *testing.T) {
	t.Parallel()
	client, server := net.Pipe()
	defer client.Close()
	ln := &handingListener{conns: make(chan net.Conn), late: server, lateRead: make(chan struct{}), closed: make(chan struct{})}
	s, served := start(t, ln, proxy.Options{App: func(ctx *fasthttp.RequestCtx) { ctx.WriteString("ok") }})

	// One request first: Serve is running.
	first, firstServer := net.Pipe()
	defer first.Close()
	ln.conns <- firstServer
	first.SetDeadline(time.Now().Add(5 * time.Second))
	if resp, _ := roundTrip(t, first, bufio.NewReader(first), "GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n"); resp.StatusCode != 200 {
		t.Fatalf("first request: %d", resp.StatusCode)
	}
	first.Close()

	shut := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		shut <- s.Shutdown(ctx)
	}()
	// The late connection's request is read (net.Pipe: the write returns
	// then) before the listener's Close returns.
	client.SetDeadline(time.Now().Add(5 * time.Second))
	go func() {
		io.WriteString(client, "GET /late HTTP/1.1\r\nHost: a\r\n\r\n")
		close(ln.lateRead)
	}()
	resp, body := readResponse(t, bufio.NewReader(client), "GET")
	if resp.StatusCode != 200 || string(body) != "ok" || !resp.Close {
		t.Errorf("the connection accepted as the listener closed: %d %q, close %v", resp.StatusCode, body, resp.Close)
	}
	if err := <-shut; err != nil {
		t.Errorf("Shutdown: %v", err)
	}
	if err := <-served; err != nil {
		t.Errorf("Serve: %v", err)
	}
}

// An application that echoes the request's fields cannot be made to say
// the reset header by a client, in whatever case the client writes it
// (field names are case-insensitive, RFC 9110 §5.1): the field is dropped
// from what the application gets, and hidden from the client.
func TestAppResetHeaderInAnyCase(t *testing.T) {
	t.Parallel()
	c := configCore(t, "[server]\nreset_header = \"Preforkd-Reset\"\n[[ratelimit]]\nname = \"login\"\npath = \"/signin\"\nlimit = 2\nwindow = \"1m\"\n", nil)
	ln := listen(t)
	start(t, ln, proxy.Options{Core: c, App: func(ctx *fasthttp.RequestCtx) {
		for k, v := range ctx.Request.Header.All() {
			ctx.Response.Header.AddBytesKV(append([]byte("X-Echo-"), k...), v)
			if engine.EqualFold(k, "preforkd-reset") {
				ctx.Response.Header.AddBytesKV(k, v) // as the application would
			}
		}
	}})
	conn, br := dial(t, ln.Addr().String())
	for i, want := range []int{200, 200, 429} {
		resp, _ := roundTrip(t, conn, br, "GET /signin HTTP/1.1\r\nHost: h\r\npreforkd-reset: login\r\n\r\n")
		if resp.StatusCode != want {
			t.Errorf("request %d: %d, want %d", i, resp.StatusCode, want)
		}
		for k := range resp.Header {
			if strings.HasSuffix(strings.ToLower(k), "preforkd-reset") {
				t.Errorf("request %d: the response has %s: %q", i, k, resp.Header[k])
			}
		}
	}
}

// TestUpstreamIdleBound: an upstream closes its idle connections after
// a while, which it may say (Node.js: Keep-Alive: timeout=5, and closes
// after 5 s) or not (gunicorn closes after 2 s, silently); a POST sent
// on one just as it closes is not retried, and gets a 502. So a
// connection is reused only within upstream_idle_timeout, and within a
// margin short of the Keep-Alive timeout (half of a 1 s one); the next
// request goes on a new connection after that.
func TestUpstreamIdleBound(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		keepAlive string        // the upstream's Keep-Alive field
		idle      time.Duration // server.upstream_idle_timeout
	}{
		{name: "Keep-Alive", keepAlive: "Keep-Alive: timeout=1, max=100\r\n"},
		{name: "upstream_idle_timeout", idle: 400 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			eachEngine(t, withNetHTTP(), func(t *testing.T, e storyEngine) {
				up := startUpstream(t, func(req *seenRequest, w *bufio.Writer, c net.Conn) {
					w.WriteString("HTTP/1.1 200 OK\r\n" + tc.keepAlive + "Content-Length: 2\r\n\r\nok")
				})
				r := e.serve(t, storyOptions{Upstream: up.URL(), Client: engine.Upstream{IdleTimeout: tc.idle}})
				c, br := dial(t, r.Addr)
				// The first pause lets the connection go back to the pool;
				// the second is past the bound of its wait there.
				for i, pause := range []time.Duration{0, 100 * time.Millisecond, 700 * time.Millisecond} {
					time.Sleep(pause)
					resp, body := roundTrip(t, c, br, "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\n\r\nx")
					if resp.StatusCode != 200 || resp.Header.Get("Keep-Alive") != "" {
						t.Fatalf("request %d: %d %q %q", i, resp.StatusCode, resp.Header, body)
					}
				}
				seen := up.Requests()
				if len(seen) != 3 || seen[1].Conn != seen[0].Conn || seen[2].Conn == seen[1].Conn {
					var conns []int
					for _, s := range seen {
						conns = append(conns, s.Conn)
					}
					t.Errorf("upstream connections of the requests: %v; want the first reused at once, and not after it was idle past its bound", conns)
				}
			})
		})
	}
}
