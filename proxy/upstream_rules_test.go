package proxy_test

import (
	"testing"
)

// TestHigherMinorResponseReused: a response whose status line says a
// higher minor version than 1 (HTTP/1.2) is read as HTTP/1.1 (RFC 9112
// §2.3): its chunked framing is chunked, and its connection carries the
// next request, on every engine.
func TestHigherMinorResponseReused(t *testing.T) {
	t.Parallel()
	for _, reply := range []string{
		"HTTP/1.2 200 OK\r\nContent-Length: 5\r\n\r\nhello",
		"HTTP/1.2 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
	} {
		eachEngine(t, withNetHTTP(), func(t *testing.T, e storyEngine) {
			const want = `client [200 "hello" whole 200 "second" whole]; upstream connections 1`
			if got := relayOnce(t, e, reply); got != want {
				t.Errorf("%q: %s, want %s", reply, got, want)
			}
		})
	}
}
