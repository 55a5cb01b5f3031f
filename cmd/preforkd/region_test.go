package main

import (
	"strings"
	"testing"

	"github.com/preforkd/preforkd/config"
	"github.com/preforkd/preforkd/shm"
)

// A configuration that only limits rates gets a region without the
// response table: at most 20 MiB with the default [table] (it was 87 MiB
// with the table's default 64 MiB pool and 16384 records); a block that
// stores responses brings the table. A region made without it refuses a
// configuration with such a block: a reload cannot add it.
func TestRegionWithoutResponseTable(t *testing.T) {
	rates := config.Default()
	rates.Server.Workers = 8
	rates.RateLimits = []config.RateLimit{{Name: "login", Path: "/login", Limit: 5, Window: 60e9}}
	size := func(cfg config.Config) int64 {
		t.Helper()
		o := cfg.RegionOptions()
		o.MaxWorkers = 2*cfg.Server.WorkerCount() + 2 // as the supervisor sizes it
		n, err := o.Size()
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := size(rates); n > 20<<20 {
		t.Errorf("a region for rate limits only is %.1f MiB, want at most 20 MiB", float64(n)/(1<<20))
	}
	zeroWorkers := rates
	zeroWorkers.Server.Workers = 0
	t.Logf("rates only: %.1f MiB with 8 workers, %.1f MiB with workers = 0 (%d here)",
		float64(size(rates))/(1<<20), float64(size(zeroWorkers))/(1<<20), zeroWorkers.Server.WorkerCount())

	cached := rates
	cached.Caches = []config.Cache{{Path: "/c/*"}}
	cached = cached.WithDefaults()
	if n := size(cached); n < size(rates)+64<<20 {
		t.Errorf("a region with a [[cache]] block is %.1f MiB, want the 64 MiB block pool in it", float64(n)/(1<<20))
	}

	r, err := shm.Create(rates.RegionOptions())
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if g := r.Geometry(); g.Responses != 0 || g.ResponseBytes != 0 {
		t.Fatalf("region for rates only: %d records, %d bytes of blocks", g.Responses, g.ResponseBytes)
	}
	if err := fitsRegion(r, rates); err != nil {
		t.Errorf("the region's own configuration: %v", err)
	}
	err = fitsRegion(r, cached)
	if err == nil || !strings.Contains(err.Error(), "restart") {
		t.Errorf("a [[cache]] block on a region without a response table: %v, want an error that says to restart", err)
	}
}
