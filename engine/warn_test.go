package engine_test

import (
	"testing"
	"time"

	"github.com/preforkd/preforkd/engine"
)

func TestWarnGate(t *testing.T) {
	var g engine.WarnGate
	t0 := time.Unix(1000, 0)
	if held, ok := g.Pass(t0); !ok || held != 0 {
		t.Fatalf("the first warning: %d, %v", held, ok)
	}
	for i := range 3 {
		if _, ok := g.Pass(t0.Add(time.Duration(i+1) * 100 * time.Millisecond)); ok {
			t.Fatalf("warning %d within the second passed", i+2)
		}
	}
	if held, ok := g.Pass(t0.Add(time.Second)); !ok || held != 3 {
		t.Fatalf("a second later: %d held, %v; want 3, true", held, ok)
	}
	if held, ok := g.Pass(t0.Add(2100 * time.Millisecond)); !ok || held != 0 {
		t.Fatalf("the next second: %d held, %v; want 0, true", held, ok)
	}
}

func TestWarnGateArgs(t *testing.T) {
	var g engine.WarnGate
	t0 := time.Unix(1000, 0)
	if args, ok := g.Args(t0, "k", 1); !ok || len(args) != 2 {
		t.Fatalf("the first warning: %v, %v", args, ok)
	}
	if _, ok := g.Args(t0.Add(time.Millisecond), "k", 2); ok {
		t.Fatal("a second warning within the second passed")
	}
	args, ok := g.Args(t0.Add(time.Second), "k", 3)
	if !ok || len(args) != 4 || args[2] != "suppressed" || args[3] != int64(1) {
		t.Fatalf("a second later: %v, %v", args, ok)
	}
}
