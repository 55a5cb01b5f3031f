package core_test

import (
	"testing"

	"github.com/preforkd/preforkd/core"
)

// An unsafe request invalidates its URL by the status the application
// answered, even when its body then broke off (the application did it);
// it asks the engine for the status and fields only (max 0), not to
// outlive its client.
func TestCacheInvalidationByStatus(t *testing.T) {
	c, reqs := cacheCore(t, 1)
	hit := func() bool {
		ex := c.Begin(reqs[0])
		defer ex.Release()
		return ex.Decide() == core.Respond
	}
	if !hit() {
		t.Fatal("not cached")
	}
	for _, tt := range []struct {
		rec         core.Recorded
		invalidates bool
	}{
		{core.Recorded{Status: 500}, false},
		{core.Recorded{Status: 404}, false},
		{core.Recorded{Status: 201, Failed: true}, true},
	} {
		post := *reqs[0]
		post.method = "POST"
		ex := c.Begin(&post)
		if ex.Decide() != core.Pass {
			t.Fatal("a POST was answered")
		}
		if max, ok := ex.Record(); !ok || max != 0 {
			t.Fatalf("Record() = %d, %v; want 0, true", max, ok)
		}
		rec := tt.rec
		ex.Complete(&rec)
		ex.Release()
		if hit() == tt.invalidates {
			t.Fatalf("after a POST answered %+v: hit %v", tt.rec, !tt.invalidates)
		}
	}
}
