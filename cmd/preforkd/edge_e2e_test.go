package main

// End-to-end tests of "At the edge on its own" (README): request ids, the
// access log, health on the data port, nginx's signals, the binary
// upgrade, socket activation, TLS and HTTP/2, against the built daemon.

import (
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"
)

var madeRequestID = regexp.MustCompile(`^[0-9a-f]{32}$`)

// The request id: a client's well-formed one is kept, a missing or
// malformed one replaced; the application gets the one the client gets
// back, and a refusal names it in its body and in its log line.
func TestRequestIDE2E(t *testing.T) {
	t.Parallel()
	up := startUpstreamProcess(t)
	d := startDaemon(t, daemonOptions{config: baseServer(2, fmt.Sprintf("upstream = %q", "http://"+up)) +
		rule("one", "/limited", "gcra", 1, "1h")})
	c := newClient(t, nil, true)

	for _, tc := range []struct {
		name, sent string
		keep       bool
	}{
		{"kept", "trace-7f3a", true},
		{"absent", "", false},
		{"malformed", "a b", false},
		{"too long", strings.Repeat("x", 129), false},
	} {
		h := http.Header{}
		if tc.sent != "" {
			h.Set("X-Request-Id", tc.sent)
		}
		r := do(c, "GET", d.url("/request-id"), h)
		if r.err != nil || r.status != 200 {
			t.Fatalf("%s: %d %v", tc.name, r.status, r.err)
		}
		got := r.header.Values("X-Request-Id")
		if len(got) != 1 || string(r.body) != got[0] {
			t.Errorf("%s: the client got %q, the application %q: want one and the same", tc.name, got, r.body)
			continue
		}
		if tc.keep && got[0] != tc.sent || !tc.keep && !madeRequestID.MatchString(got[0]) {
			t.Errorf("%s: sent %q, id %q", tc.name, tc.sent, got[0])
		}
	}

	if r := do(c, "GET", d.url("/limited"), http.Header{"X-Request-Id": {"first"}}); r.status != 200 {
		t.Fatalf("first request to the rule: %d %v", r.status, r.err)
	}
	from := d.logs.len()
	r := do(c, "GET", d.url("/limited"), http.Header{"X-Request-Id": {"refused-1"}})
	var p struct {
		RequestID string `json:"request_id"`
	}
	if err := json.Unmarshal(r.body, &p); err != nil || r.status != 429 || p.RequestID != "refused-1" || r.header.Get("X-Request-Id") != "refused-1" {
		t.Errorf("refusal: %d %q %s, want 429 naming refused-1 in its header and body", r.status, r.header.Get("X-Request-Id"), r.body)
	}
	if _, l, ok := d.logs.waitFor(from, 5*time.Second, msgIs("request refused")); !ok || l.get("request_id") != "refused-1" {
		t.Errorf("refusal log line %q, want request_id=refused-1", l.raw)
	}
}
