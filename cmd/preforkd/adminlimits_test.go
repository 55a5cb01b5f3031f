package main

import (
	"bufio"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/preforkd/preforkd/internal/logtest"
)

// The admin listener's limits, in process with short timeouts: a cap on
// open connections (one more is closed at once), and idle, header and
// body timeouts that give the slots back.
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
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := newAdminServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") }), lim, log)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(capListener(ln, lim.maxConns, log)) }()
	t.Cleanup(func() {
		srv.Close()
		<-served
	})

	dial := func() (net.Conn, *bufio.Reader) {
		t.Helper()
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c, bufio.NewReader(c)
	}
	get := func(c net.Conn, r *bufio.Reader) error {
		if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: admin\r\n\r\n"); err != nil {
			return err
		}
		resp, err := http.ReadResponse(r, nil)
		if err != nil {
			return err
		}
		resp.Body.Close()
		return nil
	}
	// closedWithin reports whether the server closed c within d (and how
	// long that took).
	closedWithin := func(r *bufio.Reader, c net.Conn, d time.Duration) (time.Duration, bool) {
		start := time.Now()
		c.SetReadDeadline(start.Add(d))
		_, err := r.ReadByte()
		var ne net.Error
		timedOut := errors.As(err, &ne) && ne.Timeout()
		return time.Since(start), err != nil && !timedOut
	}

	idle, idleR := dial() // a keep-alive client that goes quiet
	if err := get(idle, idleR); err != nil {
		t.Fatal(err)
	}
	silent, silentR := dial() // connects and never sends a header
	over, overR := dial()     // the third: over the cap
	if took, ok := closedWithin(overR, over, 200*time.Millisecond); !ok {
		t.Fatalf("a connection over the cap of %d was still open after %v", lim.maxConns, took)
	}
	if took, ok := closedWithin(silentR, silent, 2*time.Second); !ok || took < 200*time.Millisecond {
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
		t.Errorf("no warning about the refused connection; log:\n%s", logs.String())
	}
}
