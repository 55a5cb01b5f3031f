package main

import (
	"log/slog"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/preforkd/preforkd/internal/clocktest"
)

// The admin listener's connection that has waited longest for a request
// is the one that gives its slot to a new connection, whatever the wall
// clock did while they waited: stepped back, it must not make a
// connection that just went idle look older than one that has held its
// slot since before the step.
func TestAdminLongestWaitingIgnoresWallClockSteps(t *testing.T) {
	if !clocktest.Works() {
		t.Fatal("time.Time's layout is not the one clocktest knows: internal/clocktest needs updating")
	}
	var by atomic.Int64
	adminNow = func() time.Time { return clocktest.Stepped(time.Duration(by.Load())) }
	defer func() { adminNow = time.Now }()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	capped := capListener(ln, 2, slog.New(slog.DiscardHandler))
	defer capped.Close()
	accept := func() *cappedConn {
		t.Helper()
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		sc, err := capped.Accept()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { sc.Close() })
		return sc.(*cappedConn)
	}
	oldest := accept()
	time.Sleep(10 * time.Millisecond)
	by.Store(int64(-time.Hour))
	newer := accept()
	accept() // over the cap: takes the oldest's slot
	capped.mu.Lock()
	defer capped.mu.Unlock()
	if _, ok := capped.open[oldest]; ok {
		t.Errorf("the connection waiting since before the step kept its slot")
	}
	if _, ok := capped.open[newer]; !ok {
		t.Errorf("the connection that began waiting after the step lost its slot")
	}
}
