package waitfor

import (
	"context"
	"sync/atomic"
	"testing"
	"time"
)

func TestCond(t *testing.T) {
	var set atomic.Bool
	time.AfterFunc(20*time.Millisecond, func() { set.Store(true) })
	if !Cond(5*time.Second, set.Load) {
		t.Fatal("a condition made true was not seen")
	}
	if Cond(10*time.Millisecond, func() bool { return false }) {
		t.Fatal("a condition never true was reported held")
	}
}

func TestUntil(t *testing.T) {
	var set atomic.Bool
	time.AfterFunc(20*time.Millisecond, func() { set.Store(true) })
	if !Until(context.Background(), set.Load) {
		t.Fatal("a condition made true was not seen")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	if Until(ctx, func() bool { return false }) {
		t.Fatal("a condition never true was reported held")
	}
}
