package core_test

import (
	"encoding/json"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/preforkd/preforkd/bucket"
	"github.com/preforkd/preforkd/core"
	"github.com/preforkd/preforkd/shm"
)

var madeID = regexp.MustCompile(`^[0-9a-f]{32}$`)

// fieldValues lists the values of the fields called name.
func fieldValues(fs []core.Field, name string) []string {
	var out []string
	for _, f := range fs {
		if strings.EqualFold(f.Name, name) {
			out = append(out, string(f.Value))
		}
	}
	return out
}

// A client's well-formed id is kept and forwarded as sent; a missing,
// malformed or repeated one is replaced by a new id, which the
// application gets in place of the client's. Either way the response
// carries the one id.
func TestRequestIDKeptOrMade(t *testing.T) {
	c, err := core.New(joinedRegion(t, shm.Options{Counters: 64}), core.Options{RequestID: "x-request-id"})
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name string
		kv   []string
		keep string // the id kept; "" when a new one is made
	}{
		{"kept", []string{"X-Request-Id", "abc-123"}, "abc-123"},
		{"visible characters", []string{"X-Request-Id", "a/b:c=d;e~!"}, "a/b:c=d;e~!"},
		{"128 characters", []string{"X-Request-Id", strings.Repeat("r", 128)}, strings.Repeat("r", 128)},
		{"absent", nil, ""},
		{"empty", []string{"X-Request-Id", ""}, ""},
		{"129 characters", []string{"X-Request-Id", strings.Repeat("r", 129)}, ""},
		{"a space", []string{"X-Request-Id", "a b"}, ""},
		{"a quote", []string{"X-Request-Id", `a"b`}, ""},
		{"a control character", []string{"X-Request-Id", "a\x01b"}, ""},
		{"not ASCII", []string{"X-Request-Id", "é"}, ""},
		{"sent twice", []string{"X-Request-Id", "a", "X-Request-Id", "b"}, ""},
	} {
		var fwd core.Forward
		a := serve(c, newReq("GET", "/x", "192.0.2.1", tt.kv...), func(f core.Forward) fakeResp {
			fwd = f
			fwd.Add = append([]core.Field(nil), f.Add...)
			for i := range fwd.Add {
				fwd.Add[i].Value = append([]byte(nil), f.Add[i].Value...)
			}
			return fakeResp{status: 200}
		})
		got := fieldValues(a.header, "X-Request-Id")
		if len(got) != 1 {
			t.Errorf("%s: the response has X-Request-Id %q, want one", tt.name, got)
			continue
		}
		if tt.keep != "" {
			if got[0] != tt.keep || len(fwd.Add) != 0 || fwd.Dropped("X-Request-Id") {
				t.Errorf("%s: response id %q, forward %+v; want %q kept and forwarded as sent", tt.name, got[0], fwd, tt.keep)
			}
			continue
		}
		if !madeID.MatchString(got[0]) {
			t.Errorf("%s: made id %q, want 32 hex digits", tt.name, got[0])
		}
		if add := fieldValues(fwd.Add, "X-Request-Id"); len(add) != 1 || add[0] != got[0] || !fwd.Dropped("x-request-id") {
			t.Errorf("%s: forwarded %+v, want the client's id replaced by %q", tt.name, fwd, got[0])
		}
	}
}

// Made ids do not repeat.
func TestRequestIDUnique(t *testing.T) {
	c, err := core.New(joinedRegion(t, shm.Options{Counters: 64}), core.Options{RequestID: "X-Request-Id"})
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for range 10000 {
		a := serve(c, newReq("GET", "/x", "192.0.2.1"), func(core.Forward) fakeResp { return fakeResp{status: 200} })
		id := a.get("X-Request-Id")
		if seen[id] {
			t.Fatalf("id %q made twice", id)
		}
		seen[id] = true
	}
}

// The core's own answers carry the id: in the header, and in the
// problem+json body as "request_id"; with ids off, neither.
func TestRequestIDInProblems(t *testing.T) {
	rule := core.RateLimit{Rule: bucket.Rule{Name: "one", Limit: 1, Window: time.Hour}, Route: mustRoute(t, "/*")}
	for _, on := range []bool{true, false} {
		o := core.Options{RateLimits: []core.RateLimit{rule}}
		if on {
			o.RequestID = "X-Request-Id"
		}
		c, err := core.New(joinedRegion(t, shm.Options{Counters: 64}), o)
		if err != nil {
			t.Fatal(err)
		}
		ok := func(core.Forward) fakeResp { return fakeResp{status: 200} }
		if a := serve(c, newReq("GET", "/a", "192.0.2.1", "X-Request-Id", "first"), ok); a.status != 200 {
			t.Fatalf("first request: %d", a.status)
		}
		for _, req := range []*fakeReq{
			newReq("GET", "/a", "192.0.2.1", "X-Request-Id", "second"),    // 429
			newReq("GET", "/a%2fb", "192.0.2.2", "X-Request-Id", "third"), // 400: a bad path
		} {
			a := serve(c, req, ok)
			var p struct {
				Status    int     `json:"status"`
				RequestID *string `json:"request_id"`
			}
			if err := json.Unmarshal(a.body, &p); err != nil {
				t.Fatalf("%d body %q: %v", a.status, a.body, err)
			}
			want := req.header["X-Request-Id"][0]
			switch {
			case on && (a.get("X-Request-Id") != want || p.RequestID == nil || *p.RequestID != want):
				t.Errorf("%d: header %q, body %s; want %q in both", a.status, a.get("X-Request-Id"), a.body, want)
			case !on && (a.get("X-Request-Id") != "" || p.RequestID != nil):
				t.Errorf("ids off: %d: header %q, body %s", a.status, a.get("X-Request-Id"), a.body)
			}
		}
	}
}

// A cache hit carries the id of the request it answers, once, never the
// id of the request that filled it (an application that echoes the id
// does not get it stored).
func TestRequestIDCacheHit(t *testing.T) {
	r := joinedRegion(t, shm.Options{Counters: 64, Responses: 64, ResponseBytes: 1 << 20})
	c, err := core.New(r, core.Options{
		RequestID: "X-Request-Id",
		Caches:    core.CacheBlocks(core.Cache{Route: mustRoute(t, "/*", "GET", "HEAD"), TTL: time.Hour, MaxBody: 1 << 20}),
	})
	if err != nil {
		t.Fatal(err)
	}
	echo := func(f core.Forward) fakeResp {
		return fakeResp{status: 200, body: []byte("x"), header: fakeHeader{
			{Name: "Cache-Control", Value: []byte("max-age=600")},
			{Name: "X-Request-Id", Value: []byte("fill")},
		}}
	}
	serve(c, newReq("GET", "/c", "192.0.2.1", "X-Request-Id", "fill"), echo)
	a := serve(c, newReq("GET", "/c", "192.0.2.1", "X-Request-Id", "hit"), echo)
	if a.get("X-Cache") != "HIT" {
		t.Fatalf("not a hit: %+v", a)
	}
	if got := fieldValues(a.header, "X-Request-Id"); len(got) != 1 || got[0] != "hit" {
		t.Errorf("the hit's X-Request-Id %q, want [hit]", got)
	}
}

func TestRequestIDName(t *testing.T) {
	if _, err := core.New(joinedRegion(t, shm.Options{Counters: 64}), core.Options{RequestID: "X Request Id"}); err == nil || !strings.Contains(err.Error(), "RequestID") {
		t.Errorf("a bad header name: %v", err)
	}
}
