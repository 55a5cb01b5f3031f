//go:build linux

package loop_test

import (
	"io"
	"net"
	"testing"
	"time"

	"github.com/preforkd/preforkd/engine"
	"github.com/preforkd/preforkd/engine/loop"
)

// A timeout armed just after the loop was held up (an App that took its
// time, a CPU it did not get) counts from when it was armed, not from
// the last tick the loop saw: the wheel's ticks wait for their task,
// which runs after the round's events, so a connection accepted and read
// in that round would otherwise find its read_header_timeout partly
// spent. Here the App holds the loop for 400 ms while a second client
// connects and sends half a head; read_header_timeout is 300 ms from its
// first bytes, which the loop reads after the App returned.
func TestTimeoutArmedAfterTheLoopWasHeldUp(t *testing.T) {
	t.Parallel()
	const hold, timeout = 400 * time.Millisecond, 300 * time.Millisecond
	held := make(chan time.Time, 1)
	addr, _ := serve(t, loop.Options{Loops: 1,
		Limits: engine.Limits{ReadHeaderTimeout: timeout, IdleTimeout: 5 * time.Second},
		App: func(w *loop.AppResponse, r *loop.AppRequest) {
			if r.Path() == "/hold" {
				time.Sleep(hold) // on the loop: nothing else of it runs
				held <- time.Now()
			}
			w.WriteString("ok")
		}})
	a, abr := dial(t, addr)
	io.WriteString(a, "GET /hold HTTP/1.1\r\nHost: a\r\n\r\n")
	time.Sleep(hold / 4) // the App holds the loop
	b, bbr := dial(t, addr)
	io.WriteString(b, "GET / HTTP/1.1\r\nHost: a\r\n") // half a head
	if resp, _ := readResponse(t, abr, "GET"); resp.StatusCode != 200 {
		t.Fatalf("/hold: %d", resp.StatusCode)
	}
	end := <-held
	b.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err := bbr.ReadByte()
	closed := time.Since(end)
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatal("half a head: still open 5s on (read_header_timeout 300ms)")
	}
	if closed < timeout-10*time.Millisecond { // the clocks' reading, not the wheel's ticks
		t.Errorf("half a head read once the loop was free: closed %v after, want read_header_timeout (%v) at least", closed.Round(time.Millisecond), timeout)
	}
}
