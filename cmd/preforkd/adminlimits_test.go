package main

import (
	"bufio"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/preforkd/preforkd/internal/logtest"
)

// serveAdmin serves h as the admin endpoint does, with lim, on a
// loopback listener capped at lim.maxConns, until the test ends.
func serveAdmin(t *testing.T, h http.Handler, lim adminLimits, log *slog.Logger) *cappedListener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	capped := capListener(ln, lim.maxConns, log)
	srv := newAdminServer(h, lim, capped, log)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(capped) }()
	t.Cleanup(func() {
		srv.Close()
		<-served
	})
	return capped
}

// dialAdmin connects to ln, for the test's length.
func dialAdmin(t *testing.T, ln net.Listener) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, bufio.NewReader(c)
}

// The admin listener's limits, in process with short timeouts: a cap on
// open connections, where a new one takes the slot of the one that has
// waited longest for a request and is closed at once only when every
// connection has a request in progress; idle, header and body timeouts
// that give the slots back.
func TestAdminLimits(t *testing.T) {
	t.Parallel()
	lim := adminLimits{
		maxConns:          2,
		readHeaderTimeout: 300 * time.Millisecond,
		readTimeout:       time.Second,
		writeTimeout:      time.Second,
		idleTimeout:       300 * time.Millisecond,
	}
	logs := &logtest.Buffer{}
	log := slog.New(slog.NewTextHandler(logs, nil))
	release := make(chan struct{})
	var releaseOnce sync.Once
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			w.WriteHeader(200)
			w.(http.Flusher).Flush()
			<-release
		}
		io.WriteString(w, "ok")
	})
	capped := serveAdmin(t, h, lim, log)
	// Before the server's close (cleanups run last first).
	t.Cleanup(func() { releaseOnce.Do(func() { close(release) }) })

	dial := func() (net.Conn, *bufio.Reader) {
		t.Helper()
		return dialAdmin(t, capped)
	}
	send := func(c net.Conn, path string) error {
		_, err := io.WriteString(c, "GET "+path+" HTTP/1.1\r\nHost: admin\r\n\r\n")
		return err
	}
	get := func(c net.Conn, r *bufio.Reader) error {
		if err := send(c, "/"); err != nil {
			return err
		}
		resp, err := http.ReadResponse(r, nil)
		if err != nil {
			return err
		}
		_, err = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return err
	}
	// closedWithin reports whether the server closed c within d (and how
	// long that took).
	closedWithin := func(r *bufio.Reader, c net.Conn, d time.Duration) (time.Duration, bool) {
		start := time.Now()
		c.SetReadDeadline(start.Add(d))
		_, err := r.ReadByte()
		var ne net.Error
		timedOut := errors.As(err, &ne) && ne.Timeout()
		c.SetReadDeadline(time.Time{})
		return time.Since(start), err != nil && !timedOut
	}
	// busy starts a request that stays in progress until release.
	busy := func() {
		t.Helper()
		c, r := dial()
		if err := send(c, "/slow"); err != nil {
			t.Fatal(err)
		}
		if _, err := http.ReadResponse(r, nil); err != nil {
			t.Fatal(err)
		}
	}

	busy()
	silent, silentR := dial() // connects and never sends a header
	time.Sleep(10 * time.Millisecond)
	third, thirdR := dial() // over the cap: takes the silent one's slot
	// Closed now, not at the header timeout.
	if took, ok := closedWithin(silentR, silent, 100*time.Millisecond); !ok {
		t.Fatalf("the connection that sent nothing was still open %v after one more came", took)
	}
	if err := get(third, thirdR); err != nil {
		t.Fatalf("a connection over the cap, once it had a slot: %v", err)
	}
	// waitIdle waits until n of the open connections are marked idle:
	// net/http marks one after it wrote the response, which the client
	// may have read first.
	waitIdle := func(n int) {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
			capped.mu.Lock()
			idle := 0
			for c := range capped.open {
				if c.waiting.Load() != 0 {
					idle++
				}
			}
			capped.mu.Unlock()
			if idle >= n {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d keep-alive connections marked idle, want %d", idle, n)
			}
		}
	}
	// third is an idle keep-alive connection now: the next one takes it.
	waitIdle(1)
	fourth, fourthR := dial()
	if took, ok := closedWithin(thirdR, third, 100*time.Millisecond); !ok {
		t.Fatalf("the idle keep-alive connection was still open %v after one more came", took)
	}
	if err := send(fourth, "/slow"); err != nil {
		t.Fatal(err)
	}
	if _, err := http.ReadResponse(fourthR, nil); err != nil {
		t.Fatal(err)
	}
	// Both slots have a request in progress: one more is closed at once.
	over, overR := dial()
	if took, ok := closedWithin(overR, over, 200*time.Millisecond); !ok {
		t.Fatalf("a connection over the cap of %d busy ones was still open after %v", lim.maxConns, took)
	}
	releaseOnce.Do(func() { close(release) })
	// Both slow requests end; their connections wait for the next, and
	// the two below take their slots.
	waitIdle(2)

	idle, idleR := dial() // a keep-alive client that goes quiet
	if err := get(idle, idleR); err != nil {
		t.Fatal(err)
	}
	quiet, quietR := dial() // connects and never sends a header
	if took, ok := closedWithin(quietR, quiet, 2*time.Second); !ok || took < 200*time.Millisecond {
		t.Errorf("a connection that sends no header: closed %v after %v; want at the header timeout, 300ms", ok, took)
	}
	if took, ok := closedWithin(idleR, idle, 2*time.Second); !ok {
		t.Errorf("an idle keep-alive connection still open after %v; want closed at the idle timeout, 300ms", took)
	}
	// The slots are free again.
	again, againR := dial()
	if err := get(again, againR); err != nil {
		t.Fatalf("a request once the held connections were closed: %v", err)
	}
	if !strings.Contains(logs.String(), "admin: connection limit reached") {
		t.Errorf("no warning about the closed connections; log:\n%s", logs.String())
	}
}

// failOnce fails its first Accept with err.
type failOnce struct {
	net.Listener
	once sync.Once
	err  error
}

func (l *failOnce) Accept() (net.Conn, error) {
	var err error
	l.once.Do(func() { err = l.err })
	if err != nil {
		return nil, err
	}
	return l.Listener.Accept()
}

// An accept that fails for a moment (out of memory or buffers) or for
// the connection it took (accept(2) on Linux) does not end the admin
// endpoint: it answers the next connection, and says what failed.
func TestAdminAcceptErrors(t *testing.T) {
	t.Parallel()
	for _, errno := range []syscall.Errno{syscall.EMFILE, syscall.ENOBUFS, syscall.ENOMEM, syscall.EPROTO, syscall.EPERM} {
		t.Run(errno.Error(), func(t *testing.T) {
			t.Parallel()
			logs := &logtest.Buffer{}
			log := slog.New(slog.NewTextHandler(logs, nil))
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			fail := &failOnce{Listener: ln, err: &net.OpError{Op: "accept", Net: "tcp", Err: os.NewSyscallError("accept4", errno)}}
			capped := capListener(fail, 4, log)
			srv := newAdminServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }),
				defaultAdminLimits, capped, log)
			served := make(chan error, 1)
			go func() { served <- srv.Serve(capped) }()
			defer func() {
				srv.Close()
				<-served
			}()
			c := &http.Client{Timeout: 5 * time.Second}
			resp, err := c.Get("http://" + ln.Addr().String() + "/")
			if err != nil {
				t.Fatalf("after an accept failed with %v: %v", errno, err)
			}
			resp.Body.Close()
			if !strings.Contains(logs.String(), "admin: accepting a connection failed") {
				t.Errorf("no warning; log:\n%s", logs.String())
			}
		})
	}
}

// A client that declares a request body and never sends it (a slow POST)
// waits on itself once the endpoint has answered: net/http reads what is
// left of the body to reuse the connection, but the connection holds its
// slot as one between two requests does, so that such clients, whoever
// sends them, cannot keep /metrics from answering.
func TestAdminSlowBodyDoesNotHoldASlot(t *testing.T) {
	t.Parallel()
	lim := defaultAdminLimits
	lim.maxConns = 2
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	handled := make(chan struct{}, lim.maxConns+1)
	ln := serveAdmin(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "ok")
		handled <- struct{}{}
	}), lim, log)
	dial := func() (net.Conn, *bufio.Reader) {
		t.Helper()
		c, r := dialAdmin(t, ln)
		c.SetDeadline(time.Now().Add(3 * time.Second))
		return c, r
	}
	var slow *bufio.Reader
	for range lim.maxConns {
		c, r := dial()
		io.WriteString(c, "POST /metrics HTTP/1.1\r\nHost: admin\r\nContent-Length: 1000\r\n\r\nx")
		<-handled
		slow = r
	}
	// Answered at once, not at the read timeout (10s).
	resp, err := http.ReadResponse(slow, nil)
	if err != nil {
		t.Fatalf("the answer to a request whose body is held back: %v", err)
	}
	resp.Body.Close()
	c, r := dial()
	io.WriteString(c, "GET /metrics HTTP/1.1\r\nHost: admin\r\n\r\n")
	resp, err = http.ReadResponse(r, nil)
	if err != nil {
		t.Fatalf("a scrape while %d clients hold a request body back: %v", lim.maxConns, err)
	}
	resp.Body.Close()
}
