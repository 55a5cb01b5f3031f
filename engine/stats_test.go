package engine_test

import (
	"testing"

	"github.com/preforkd/preforkd/engine"
)

func TestCountersStats(t *testing.T) {
	var c engine.Counters
	c.Accepted.Add(1)
	c.BadRequests.Add(2)
	c.UpstreamErrors.Add(3)
	c.UpstreamTimeouts.Add(4)
	c.UpstreamAborts.Add(5)
	want := engine.Stats{Accepted: 1, Open: 7, BadRequests: 2, UpstreamErrors: 3, UpstreamTimeouts: 4, UpstreamAborts: 5}
	if got := c.Stats(7); got != want {
		t.Errorf("Stats(7) = %+v, want %+v", got, want)
	}
}
