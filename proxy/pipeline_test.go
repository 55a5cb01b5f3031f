package proxy_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/preforkd/preforkd/engine"
	"github.com/preforkd/preforkd/internal/wiretest"
)

// A request pipelined behind a large response to a client that reads
// nothing for a while is answered once that response went out, on every
// engine. (The event loop once left it when the response ended with more
// than highWater of it still to write: it waited for the client's next
// bytes, then was closed at read_header_timeout, unanswered.) Where the
// end falls depends on the socket buffers, so each engine gets many
// sizes, twice (once with -short, as under the race detector, where
// the two rounds' half a gigabyte relayed costs a minute and a half):
// without the loop's fix, a third to a half of the runs met the stall.
//
// Not parallel with the package's other tests: its hundreds of large
// responses would load the machine under their timing bounds (the
// slowloris cut-off).
func TestPipelinedAfterALargeResponse(t *testing.T) {
	piece := []byte(strings.Repeat("x", 64<<10))
	ln := listen(t)
	wiretest.AcceptEach(ln, func(c net.Conn) {
		br := bufio.NewReader(c)
		for {
			req, err := http.ReadRequest(br)
			if err != nil {
				return
			}
			var n int
			if _, err := fmt.Sscanf(req.URL.RawQuery, "n=%d", &n); err != nil {
				io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nsmall")
				continue
			}
			fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n", n*len(piece))
			for range n {
				time.Sleep(3 * time.Millisecond)
				c.Write(piece)
			}
		}
	})
	eachEngine(t, withNetHTTP(), func(t *testing.T, e storyEngine) {
		r := e.serve(t, storyOptions{Upstream: "http://" + ln.Addr().String(), Limits: engine.Limits{ReadHeaderTimeout: 2 * time.Second}})
		rounds := 2
		if testing.Short() {
			rounds = 1
		}
		for range rounds { // every size at once, each on its own connection
			errs := make(chan error, 49)
			for n := 48; n <= 96; n++ {
				go func() { errs <- pipelined(r.Addr, n, len(piece)) }()
			}
			for range 49 {
				if err := <-errs; err != nil {
					t.Error(err)
				}
			}
		}
	})
}

// pipelined sends a request for n pieces and one after it, reads nothing
// for a while, then reads both answers.
func pipelined(addr string, n, piece int) error {
	d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		return rc.Control(func(fd uintptr) { syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) })
	}}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	fmt.Fprintf(c, "GET /big?n=%d HTTP/1.1\r\nHost: a\r\n\r\nGET /small HTTP/1.1\r\nHost: a\r\n\r\n", n)
	time.Sleep(time.Duration(n)*4*time.Millisecond + 100*time.Millisecond) // reading nothing meanwhile
	// A stall is bytes that stop coming, not a slow machine: each read
	// gets its own deadline. (With the loop's old stall, the pipelined
	// answer never came and the connection closed at
	// read_header_timeout, well within it.)
	br := bufio.NewReader(stallReader{c, 10 * time.Second})
	for i, want := range []int{n * piece, 5} {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			return fmt.Errorf("n=%d, response %d: %v", n, i, err)
		}
		b, err := io.ReadAll(resp.Body)
		if err != nil || len(b) != want {
			return fmt.Errorf("n=%d, response %d: %d bytes, %v; want %d", n, i, len(b), err, want)
		}
	}
	return nil
}

// stallReader reads c with a deadline of its own for each read.
type stallReader struct {
	c     net.Conn
	stall time.Duration
}

func (r stallReader) Read(p []byte) (int, error) {
	r.c.SetReadDeadline(time.Now().Add(r.stall))
	return r.c.Read(p)
}
