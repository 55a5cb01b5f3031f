//go:build linux

package loop_test

import (
	"bufio"
	"net"
	"testing"
	"time"

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
	up := cannedUpstream(t)
	addr, s := serve(t, loop.Options{Upstream: "http://" + up, Loops: 1})
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	br := bufio.NewReader(c)
	req := []byte("GET / HTTP/1.1\r\nHost: a\r\n\r\n")
	roundTrip := func() {
		if _, err := c.Write(req); err != nil {
			t.Fatal(err)
		}
		if err := skipResponse(br); err != nil {
			t.Fatal(err)
		}
	}
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
