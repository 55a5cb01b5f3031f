//go:build linux

package loop_test

import (
	"bufio"
	"net"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/preforkd/preforkd/engine/loop"
)

// A loop waits for events once per round of events: a proxied request
// on a connection that sends the next one only after its answer is two
// rounds (the request, the upstream's response), and so two epoll_wait
// calls. gnet's poller, which the loop ran on before, polled once more
// without waiting after every round that found events and waited only
// when that found nothing: an empty epoll_wait more per round most of
// the time, 3.1 to 3.5 calls a request here.
func TestOneEpollWaitPerRound(t *testing.T) {
	_, s, roundTrip := oneLoopClient(t)
	roundTrip() // the connection to the upstream made
	const n = 400
	before, start := loop.PollerWaits(s), time.Now()
	for range n {
		roundTrip()
	}
	waits := loop.PollerWaits(s) - before
	// 2 a request, and the wheel's ticks (one each 25 ms) besides, which
	// a loaded machine makes more of.
	ticks := uint64(time.Since(start)/(25*time.Millisecond)) + 2
	if perReq := float64(waits-min(waits, ticks)) / n; perReq > 2.5 {
		t.Errorf("%d epoll_wait calls for %d requests (%d ticks): %.2f a request, want 2 (one a round)", waits, n, ticks, perReq)
	} else {
		t.Logf("%d epoll_wait calls for %d requests (%d ticks): %.2f a request", waits, n, ticks, perReq)
	}
}

// A client's urgent byte (TCP out-of-band data, which no HTTP client
// sends and the loop does not read) does not keep the loop polling: the
// loop asks for no EPOLLPRI, which stays up, level triggered, until the
// byte is read, and would make every epoll_wait return at once.
func TestUrgentByteIgnored(t *testing.T) {
	c, s, roundTrip := oneLoopClient(t)
	roundTrip()
	rc, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var serr error
	if err := rc.Control(func(fd uintptr) { serr = unix.Sendto(int(fd), []byte{'x'}, unix.MSG_OOB, nil) }); err != nil || serr != nil {
		t.Fatal(err, serr)
	}
	time.Sleep(50 * time.Millisecond) // the byte came
	before := loop.PollerWaits(s)
	time.Sleep(200 * time.Millisecond)
	// Eight ticks at most in 200 ms, and a few wake-ups besides.
	if waits := loop.PollerWaits(s) - before; waits > 50 {
		t.Errorf("%d epoll_wait calls in 200 ms after an urgent byte: the loop spins", waits)
	}
	// The connection serves on.
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	roundTrip()
}

// oneLoopClient is a server of one loop in front of a canned upstream,
// a connection to it, and a request and its response on that connection.
func oneLoopClient(t *testing.T) (net.Conn, *loop.Server, func()) {
	t.Helper()
	up := cannedUpstream(t)
	addr, s := serve(t, loop.Options{Upstream: "http://" + up, Loops: 1})
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	br := bufio.NewReader(c)
	req := []byte("GET / HTTP/1.1\r\nHost: a\r\n\r\n")
	return c, s, func() {
		t.Helper()
		if _, err := c.Write(req); err != nil {
			t.Fatal(err)
		}
		if err := skipResponse(br); err != nil {
			t.Fatal(err)
		}
	}
}
