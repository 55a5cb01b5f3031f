package looptest_test

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/preforkd/preforkd/internal/looptest"
)

func TestStop(t *testing.T) {
	l := looptest.Start(t, 0)
	var a, b atomic.Int64
	l.Go(func() { a.Add(1) })
	l.Go(func() { b.Add(1); time.Sleep(time.Millisecond) })
	for a.Load() < 100 || b.Load() < 3 {
		time.Sleep(time.Millisecond)
	}
	l.Stop()
	na, nb := a.Load(), b.Load()
	time.Sleep(10 * time.Millisecond)
	if a.Load() != na || b.Load() != nb {
		t.Fatalf("steps ran after Stop returned: %d→%d, %d→%d", na, a.Load(), nb, b.Load())
	}
	l.Stop() // a second Stop returns too
}

func TestLimit(t *testing.T) {
	l := looptest.Start(t, 20*time.Millisecond)
	var n atomic.Int64
	l.Go(func() { n.Add(1); time.Sleep(time.Millisecond) })
	time.Sleep(200 * time.Millisecond) // no Stop: the limit ends the loop
	after := n.Load()
	time.Sleep(20 * time.Millisecond)
	if after == 0 || n.Load() != after {
		t.Fatalf("the loop with a limit of 20ms: %d steps after 200ms, %d after 220ms", after, n.Load())
	}
}

func TestStoppedWhenTheTestEnds(t *testing.T) {
	var n atomic.Int64
	t.Run("sub", func(t *testing.T) {
		looptest.Start(t, 0).Go(func() { n.Add(1); time.Sleep(time.Millisecond) })
		time.Sleep(5 * time.Millisecond)
	})
	after := n.Load()
	time.Sleep(10 * time.Millisecond)
	if n.Load() != after {
		t.Fatalf("the loop ran on after its test ended: %d→%d", after, n.Load())
	}
}
