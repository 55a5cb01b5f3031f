package logtest_test

import (
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/preforkd/preforkd/internal/logtest"
)

// Writes from many goroutines all arrive whole (the race detector checks
// the locking).
func TestConcurrentWrites(t *testing.T) {
	var b logtest.Buffer
	log := slog.New(slog.NewTextHandler(&b, nil))
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 100 {
				log.Info("tick", "g", g, "i", i)
				_ = b.String()
			}
		})
	}
	wg.Wait()
	if n := len(b.Lines("tick")); n != 800 {
		t.Fatalf("%d lines, want 800:\n%s", n, b.String())
	}
}

// Lines picks a message by its whole msg field, quoted or not, and
// nothing else.
func TestLines(t *testing.T) {
	var b logtest.Buffer
	log := slog.New(slog.NewTextHandler(&b, nil))
	log.Info("ready", "n", 1)
	log.Info("ready now", "n", 2)
	log.Info("not ready", "n", 3)
	log.Warn("ready", "n", 4)
	log.Info("other", "note", `msg=ready`, "n", 5)
	log.Info("ready")
	log.Info("readyish", "n", 6)
	for _, tc := range []struct {
		msg  string
		want []int // the n of each line, 0 for none
	}{
		{"ready", []int{1, 4, 0}},
		{"ready now", []int{2}},
		{"not ready", []int{3}},
		{"readyish", []int{6}},
		{"absent", nil},
	} {
		var got []int
		for _, l := range b.Lines(tc.msg) {
			if strings.HasSuffix(l, " ") || strings.HasSuffix(l, "\n") {
				t.Errorf("Lines(%q): line %q not trimmed", tc.msg, l)
			}
			_, n, _ := strings.Cut(l, " n=")
			v, _ := strconv.Atoi(n)
			got = append(got, v)
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("Lines(%q) are those of n=%v, want %v:\n%s", tc.msg, got, tc.want, b.String())
		}
	}
}
