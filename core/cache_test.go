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
		return serve(c, reqs[0], func(core.Forward) fakeResp { return fakeResp{status: 200} }).get("X-Cache") == "HIT"
	}
	if !hit() {
		t.Fatal("not cached")
	}
	for _, tt := range []struct {
		resp        fakeResp
		invalidates bool
	}{
		{fakeResp{status: 500}, false},
		{fakeResp{status: 404}, false},
		{fakeResp{status: 201, body: []byte("created"), cut: true}, true},
	} {
		post := *reqs[0]
		post.method = "POST"
		ex := c.Begin(&post)
		if ex.Decide() != core.Pass {
			t.Fatal("a POST was answered")
		}
		if ex.Keep() {
			t.Fatal("an unsafe request to a cached path must not outlive its client")
		}
		if r := ex.Head(tt.resp.status, nil); r != nil {
			t.Fatalf("Head replaced the answer: %+v", r)
		}
		var err error
		if tt.resp.cut {
			err = errCut
		}
		ex.Finish(err)
		if hit() == tt.invalidates {
			t.Fatalf("after a POST answered %+v: hit %v", tt.resp, !tt.invalidates)
		}
	}
}
