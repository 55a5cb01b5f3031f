package ratelimittest_test

import (
	"maps"
	"net/http"
	"testing"

	"github.com/preforkd/preforkd/internal/ratelimittest"
)

func TestFields(t *testing.T) {
	h := http.Header{}
	h.Add("RateLimit-Policy", `"a";q=5;w=60`)
	h.Add("RateLimit-Policy", `"b";q=1;w=1`)
	h.Add("X-RateLimit-Remaining", "4")
	h.Add("Retry-After", "7")
	h.Add("Content-Type", "text/plain")
	want := map[string]string{
		"RateLimit-Policy":      `"a";q=5;w=60 | "b";q=1;w=1`,
		"X-RateLimit-Remaining": "4",
		"Retry-After":           "7",
	}
	if got := ratelimittest.Fields(h); !maps.Equal(got, want) {
		t.Fatalf("Fields: %v, want %v", got, want)
	}
	if got := ratelimittest.Fields(http.Header{"Content-Type": {"x"}}); len(got) != 0 {
		t.Fatalf("Fields of a response without rate-limit fields: %v", got)
	}
}
