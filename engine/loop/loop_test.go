//go:build linux

package loop

import (
	"testing"
)

// The bound of max_connections is reached when that many connections
// are in, not when that many slots are taken: every loop polls the
// listener, and one whose accept finds nothing (another loop took the
// connection) held a slot meanwhile. TestConnectionStates met this one
// run in a few: max_connections_reached counted at five of six.
func TestMaxConnectionsReachedCountsConnectionsIn(t *testing.T) {
	s := &Server{}
	s.o.limits.MaxConnections = 3
	if !s.takeSlot() || s.connIn() {
		t.Fatal("the first connection: refused, or the bound reached")
	}
	if !s.takeSlot() { // loop B, whose accept will find nothing
		t.Fatal("the second slot refused")
	}
	if !s.takeSlot() { // loop A, which takes the connection
		t.Fatal("the third slot refused")
	}
	if s.takeSlot() {
		t.Fatal("a fourth slot taken over the bound")
	}
	if s.connIn() {
		t.Fatal("the bound reached with two connections in")
	}
	s.slotBack() // loop B's accept failed
	if !s.takeSlot() || !s.connIn() {
		t.Fatal("the third connection in: refused, or the bound not reached")
	}
	s.connClosed()
	if got, open := s.in.Load(), s.open.Load(); got != 2 || open != 2 {
		t.Fatalf("%d in, %d slots after a close; want 2, 2", got, open)
	}
}
