// Package ratelimittest picks the rate-limit fields out of a response, for
// tests that compare the headers a limiter sent.
package ratelimittest

import (
	"net/http"
	"strings"
)

// names are the fields Fields picks: the IETF and X- rate-limit fields,
// and Retry-After.
var names = []string{"RateLimit-Policy", "RateLimit", "X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset", "Retry-After"}

// Fields returns the rate-limit and refusal fields of h that are present,
// by name; the values of a field sent more than once are joined with " | ".
func Fields(h http.Header) map[string]string {
	out := map[string]string{}
	for _, k := range names {
		if vs := h.Values(k); len(vs) > 0 {
			out[k] = strings.Join(vs, " | ")
		}
	}
	return out
}
