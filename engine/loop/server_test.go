//go:build linux

package loop_test

import (
	"bufio"
	"crypto/sha256"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/preforkd/preforkd/engine/loop"
	"github.com/preforkd/preforkd/internal/wiretest"
)

// Stories only the event-loop engine tells so far: back-pressure,
// pipelining, a retried stale connection, a dropped body. The stories
// every engine tells (streaming, timeouts, limits, upgrades, the drain)
// are package proxy's, told once over each engine, this one included;
// so are the tables of exchanges (its conformance tests).

func sum(r io.Reader) ([32]byte, int64) {
	h := sha256.New()
	n, _ := io.Copy(h, r)
	var out [32]byte
	copy(out[:], h.Sum(nil))
	return out, n
}

// TestDownloadBackPressure: a client that reads nothing while a large
// body arrives stops the upstream (the engine stops reading it) instead
// of making the engine hold the body: the upstream's writes stall with
// the body far from sent, and the client still gets every byte once it
// reads.
func TestDownloadBackPressure(t *testing.T) {
	t.Parallel()
	const size = 64 << 20
	written := make(chan int64, 1)
	// The kernel grows a socket's buffers up to tcp_rmem's and tcp_wmem's
	// maxima (32 and 4 MiB here, more on other machines): the two ends
	// outside the engine are pinned small, so that what the upstream got
	// to send is the engine's bound and its own sockets' buffers only.
	const pinned = 128 << 10
	up := wiretest.StartUpstream(t, func(req *wiretest.Seen, w *bufio.Writer, c net.Conn) {
		if err := c.(*net.TCPConn).SetWriteBuffer(pinned); err != nil {
			t.Error(err)
		}
		fmt.Fprintf(w, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n", size)
		w.Flush()
		var n int64
		buf := make([]byte, 64<<10)
		r := wiretest.Pattern(size)
		for n < size {
			k, _ := io.ReadFull(r, buf)
			c.SetWriteDeadline(time.Now().Add(time.Second))
			m, err := c.Write(buf[:k])
			n += int64(m)
			if err != nil {
				written <- n
				c.SetWriteDeadline(time.Time{})
				c.Write(buf[m:k])
				io.Copy(c, r)
				return
			}
		}
		written <- n
	})
	addr, _ := serve(t, loop.Options{Upstream: up.URL()})
	c, br := dial(t, addr)
	if err := c.(*net.TCPConn).SetReadBuffer(pinned); err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(time.Minute)) // 64 MiB under the race detector
	io.WriteString(c, "GET /big HTTP/1.1\r\nHost: a\r\n\r\n")
	var n int64
	select {
	case n = <-written:
	case <-time.After(10 * time.Second):
		t.Fatal("the upstream's writes never stalled")
	}
	// What is held between the two sockets: both kernels' buffers and
	// the engine's bound; far from the 64 MiB body.
	if n > 24<<20 {
		t.Errorf("the upstream sent %d MiB to a client that read nothing", n>>20)
	}
	t.Logf("the upstream sent %.1f MiB before its writes stalled", float64(n)/(1<<20))
	resp := readHead(t, br, "GET")
	want, _ := sum(wiretest.Pattern(size))
	if got, m := sum(resp.Body); got != want || m != size {
		t.Errorf("download after the stall: %d bytes, want %d, the same", m, size)
	}
}

// TestNotAListener: Serve needs a socket to accept from.
func TestNotAListener(t *testing.T) {
	s, err := loop.New(loop.Options{Upstream: "http://127.0.0.1:1", Core: configCore(t, ""), Logger: quietLog})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Serve(&fakeListener{}); err == nil || !strings.Contains(err.Error(), "descriptor") {
		t.Errorf("Serve on a listener without a descriptor: %v", err)
	}
}

type fakeListener struct{}

func (fakeListener) Accept() (net.Conn, error) { return nil, net.ErrClosed }
func (fakeListener) Close() error              { return nil }
func (fakeListener) Addr() net.Addr            { return &net.TCPAddr{} }
