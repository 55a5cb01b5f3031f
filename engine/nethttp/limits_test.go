package nethttp_test

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/preforkd/preforkd/core"
	"github.com/preforkd/preforkd/engine"
	"github.com/preforkd/preforkd/engine/nethttp"
	"github.com/preforkd/preforkd/internal/shmtest"
	"github.com/preforkd/preforkd/shm"
)

// Every [server] limit, set on the net/http engine as an embedding
// program sets it (engine.Limits on nethttp.Server), and observed from
// a real client: the engine honours them as the daemon's engine does.
func TestServerLimits(t *testing.T) {
	t.Parallel()
	lim := engine.Limits{
		ReadHeaderTimeout: 300 * time.Millisecond,
		IdleTimeout:       400 * time.Millisecond,
		ClientBodyTimeout: 300 * time.Millisecond,
		SendTimeout:       300 * time.Millisecond,
		MaxHeaderBytes:    8 << 10,
		MaxConnections:    2,
	}
	big := strings.Repeat("x", 64<<20) // more than the socket buffers hold
	bodyErr := make(chan error, 4)
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/upload":
			_, err := io.Copy(io.Discard, r.Body)
			bodyErr <- err
		case "/big":
			io.WriteString(w, big)
		default:
			io.WriteString(w, "ok")
		}
	})
	_, ln := limitedServer(t, lim, app)
	dial := func() (net.Conn, *bufio.Reader) {
		t.Helper()
		conn, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		conn.SetDeadline(time.Now().Add(10 * time.Second))
		return conn, bufio.NewReader(conn)
	}
	// closedWithin reads until the server closes the connection, and
	// reports how long that took.
	closedWithin := func(conn net.Conn, r *bufio.Reader) time.Duration {
		t.Helper()
		start := time.Now()
		_, err := io.Copy(io.Discard, r)
		if err != nil && !errors.Is(err, net.ErrClosed) && !isReset(err) {
			t.Fatalf("reading until the close: %v", err)
		}
		return time.Since(start)
	}

	t.Run("read_header_timeout", func(t *testing.T) {
		conn, r := dial()
		io.WriteString(conn, "GET / HTTP/1.1\r\nHost: a\r\n") // and never the end of it
		if d := closedWithin(conn, r); d < 250*time.Millisecond || d > 3*time.Second {
			t.Errorf("a header never finished: closed after %v, want about %v", d, lim.ReadHeaderTimeout)
		}
	})
	t.Run("idle_timeout", func(t *testing.T) {
		conn, r := dial()
		io.WriteString(conn, "GET / HTTP/1.1\r\nHost: a\r\n\r\n")
		resp, err := http.ReadResponse(r, nil)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		if d := closedWithin(conn, r); d < 300*time.Millisecond || d > 3*time.Second {
			t.Errorf("an idle keep-alive connection: closed after %v, want about %v", d, lim.IdleTimeout)
		}
	})
	t.Run("client_body_timeout", func(t *testing.T) {
		conn, _ := dial()
		io.WriteString(conn, "POST /upload HTTP/1.1\r\nHost: a\r\nContent-Length: 100\r\n\r\nhalf")
		select {
		case err := <-bodyErr:
			if err == nil || !strings.Contains(err.Error(), "timeout") {
				t.Errorf("a body that stalls: the application read %v, want a timeout", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("a body that stalls: still read after 5s")
		}
	})
	t.Run("client_body_timeout, the body unread", func(t *testing.T) {
		// An application that answers without reading the body: net/http
		// reads what is left before it sends the answer, and waits for it
		// no longer than a read of the body would.
		// A whole body is dropped and the connection carries on.
		conn, r := dial()
		io.WriteString(conn, "POST /ignore HTTP/1.1\r\nHost: a\r\nContent-Length: 4\r\n\r\nwhol")
		resp, err := http.ReadResponse(r, nil)
		if err != nil || resp.StatusCode != 200 || resp.Close {
			t.Fatalf("the answer to a whole body left unread: %v %v", resp, err)
		}
		io.Copy(io.Discard, resp.Body)
		// One that stalls is waited for as long as a read of it would be.
		start := time.Now()
		io.WriteString(conn, "POST /ignore HTTP/1.1\r\nHost: a\r\nContent-Length: 100\r\n\r\nhalf")
		resp, err = http.ReadResponse(r, nil)
		if err != nil || resp.StatusCode != 200 || !resp.Close {
			t.Fatalf("the answer to a stalled body left unread: %v %v", resp, err)
		}
		if d := time.Since(start); d > 3*time.Second {
			t.Errorf("the answer came after %v, want about %v", d, lim.ClientBodyTimeout)
		}
	})
	t.Run("send_timeout", func(t *testing.T) {
		conn, r := dial()
		io.WriteString(conn, "GET /big HTTP/1.1\r\nHost: a\r\n\r\n")
		time.Sleep(1500 * time.Millisecond) // read nothing: the server's writes stall
		n, _ := io.Copy(io.Discard, r)
		if n >= int64(len(big)) {
			t.Errorf("a client that reads nothing got the whole response: %d bytes", n)
		}
	})
	t.Run("max_header_bytes", func(t *testing.T) {
		conn, r := dial()
		fmt.Fprintf(conn, "GET / HTTP/1.1\r\nHost: a\r\nX-Big: %s\r\n\r\n", strings.Repeat("b", 9<<10))
		resp, err := http.ReadResponse(r, nil)
		if err != nil || resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
			t.Fatalf("a 9 KiB header under an 8 KiB bound: %v %v, want 431", resp, err)
		}
		conn2, r2 := dial()
		fmt.Fprintf(conn2, "GET / HTTP/1.1\r\nHost: a\r\nX-Big: %s\r\n\r\n", strings.Repeat("b", 6<<10))
		if resp, err := http.ReadResponse(r2, nil); err != nil || resp.StatusCode != 200 {
			t.Fatalf("a 6 KiB header under an 8 KiB bound: %v %v, want 200", resp, err)
		}
	})
}

// max_connections: a worker holds at most that many connections of its
// listener; one more waits in the listener's backlog until one closes.
func TestServerMaxConnections(t *testing.T) {
	t.Parallel()
	_, ln := limitedServer(t, engine.Limits{MaxConnections: 2},
		http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") }))
	get := func(conn net.Conn, wait time.Duration) error {
		conn.SetDeadline(time.Now().Add(wait))
		if _, err := io.WriteString(conn, "GET / HTTP/1.1\r\nHost: a\r\n\r\n"); err != nil {
			return err
		}
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err == nil {
			resp.Body.Close()
		}
		return err
	}
	var conns []net.Conn
	for range 3 {
		conn, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		conns = append(conns, conn)
	}
	for i := range 2 {
		if err := get(conns[i], 5*time.Second); err != nil {
			t.Fatalf("connection %d: %v", i+1, err)
		}
	}
	if err := get(conns[2], 500*time.Millisecond); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("a third connection was served (%v) while two are open", err)
	}
	conns[0].Close()
	if resp, err := http.ReadResponse(bufio.NewReader(conns[2]), nil); err != nil {
		// The request written before is served once a slot is free.
		conns[2].SetDeadline(time.Now().Add(5 * time.Second))
		if resp, err = http.ReadResponse(bufio.NewReader(conns[2]), nil); err != nil {
			t.Fatalf("the third connection, once the first closed: %v", err)
		}
		resp.Body.Close()
	} else {
		resp.Body.Close()
	}
}

// A handler whose body Read fails at client_body_timeout answers at once:
// its answer is not held back while what is left of the body is drained
// for a second timeout (the connection closes after it instead).
func TestBodyTimeoutAnsweredAtOnce(t *testing.T) {
	t.Parallel()
	const timeout = time.Second
	answered := make(chan time.Time, 1)
	_, ln := limitedServer(t, engine.Limits{ClientBodyTimeout: timeout}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, err := io.ReadAll(r.Body)
		answered <- time.Now()
		http.Error(w, "body: "+err.Error(), http.StatusRequestTimeout)
	}))
	conn, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * timeout))
	io.WriteString(conn, "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 100\r\n\r\n0123456789") // and no more
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	got := time.Now()
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestTimeout || !resp.Close {
		t.Errorf("%d, close %v: want the handler's 408, closing", resp.StatusCode, resp.Close)
	}
	// Without the fix the answer came a whole timeout after the handler
	// wrote it; half of one is room for a loaded machine.
	if wrote := <-answered; got.Sub(wrote) > timeout/2 {
		t.Errorf("the handler answered at once, the client got it %v later", got.Sub(wrote).Round(time.Millisecond))
	}
}

// send_timeout bounds a wait for the client, not the application: a
// handler that writes a short answer (net/http buffers it) and works on
// for longer than send_timeout before it returns still has its answer
// sent whole. The buffered bytes go out once the handler returns, and
// the client, which reads at once, gets them.
func TestSendTimeoutCountsFromTheWrite(t *testing.T) {
	t.Parallel()
	const timeout = 300 * time.Millisecond
	_, ln := limitedServer(t, engine.Limits{SendTimeout: timeout}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "hello")
		time.Sleep(3 * timeout) // the work after the answer: no write waits meanwhile
	}))
	conn, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	io.WriteString(conn, "GET / HTTP/1.1\r\nHost: a\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("an answer written before the handler worked on: %v", err)
	}
	body, err := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || string(body) != "hello" || err != nil {
		t.Errorf("got %d %q (%v), want 200 \"hello\"", resp.StatusCode, body, err)
	}
}

// A handler that refuses a request with Expect: 100-continue without
// reading its body answers at once, with no 100 Continue before it, and
// closes: the client sends no body for nothing, nor waits for
// client_body_timeout (RFC 9110 §10.1.1).
func TestExpectContinueRefusedAtOnce(t *testing.T) {
	t.Parallel()
	_, ln := limitedServer(t, engine.Limits{ClientBodyTimeout: 5 * time.Second},
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { http.Error(w, "no", http.StatusUnauthorized) }))
	conn, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(3 * time.Second)) // under client_body_timeout
	io.WriteString(conn, "POST / HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nContent-Length: 1000000\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized || !resp.Close {
		t.Errorf("%d, close %v: want the handler's 401 first, closing", resp.StatusCode, resp.Close)
	}
}

// limitedServer serves app with lim and a core of no rules on a listener
// of its own, until the test ends.
func limitedServer(t *testing.T, lim engine.Limits, app http.Handler) (*nethttp.Server, net.Listener) {
	t.Helper()
	return limitedServerWith(t, lim, app, core.Options{})
}

// limitedServerWith is limitedServer with a core made with o.
func limitedServerWith(t *testing.T, lim engine.Limits, app http.Handler, o core.Options) (*nethttp.Server, net.Listener) {
	t.Helper()
	c, err := core.New(shmtest.Private(t, shm.Options{Counters: 64, MaxWorkers: 2}), o)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := nethttp.NewServer(nethttp.ServerOptions{Core: c, Handler: app, Limits: lim, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Shutdown(t.Context()) })
	return srv, ln
}

func isReset(err error) bool { return err != nil && strings.Contains(err.Error(), "connection reset") }
