package engine_test

import (
	"net/netip"
	"testing"

	"github.com/preforkd/preforkd/engine"
)

func TestForwardedFor(t *testing.T) {
	peer := netip.MustParseAddr("192.0.2.9")
	for _, tc := range []struct {
		chain []string
		peer  netip.Addr
		want  string
	}{
		{nil, peer, "X-Forwarded-For: 192.0.2.9\r\n"},
		{[]string{"198.51.100.1"}, peer, "X-Forwarded-For: 198.51.100.1, 192.0.2.9\r\n"},
		{[]string{"198.51.100.1, 198.51.100.2", "", "203.0.113.7"}, peer, "X-Forwarded-For: 198.51.100.1, 198.51.100.2, 203.0.113.7, 192.0.2.9\r\n"},
		{[]string{"198.51.100.1"}, netip.Addr{}, "X-Forwarded-For: 198.51.100.1\r\n"},
		{[]string{""}, netip.Addr{}, "X-Forwarded-For: \r\n"},
		{nil, netip.MustParseAddr("2001:db8::1"), "X-Forwarded-For: 2001:db8::1\r\n"},
	} {
		x := engine.BeginForwardedFor([]byte("GET / HTTP/1.1\r\n"))
		for _, v := range tc.chain {
			x.Add(v)
		}
		if got := string(x.End(tc.peer)); got != "GET / HTTP/1.1\r\n"+tc.want {
			t.Errorf("%q, %v: %q, want %q", tc.chain, tc.peer, got, tc.want)
		}
	}
}

func TestAppendField(t *testing.T) {
	b := engine.AppendField(nil, "Host", "a.example")
	b = engine.AppendField(b, "X-B", []byte("b"))
	b = engine.AppendLength(b, 1234567890123)
	if want := "Host: a.example\r\nX-B: b\r\nContent-Length: 1234567890123\r\n"; string(b) != want {
		t.Errorf("%q, want %q", b, want)
	}
}

func TestRetryable(t *testing.T) {
	for _, tc := range []struct {
		method string
		key    bool
		want   bool
	}{
		{"GET", false, true}, {"HEAD", false, true}, {"PUT", false, true}, {"DELETE", false, true},
		{"OPTIONS", false, true}, {"TRACE", false, true},
		{"POST", false, false}, {"PATCH", false, false}, {"get", false, false},
		{"POST", true, true}, {"PATCH", true, true},
	} {
		if got := engine.Retryable(tc.method, tc.key); got != tc.want {
			t.Errorf("Retryable(%q, key %v) = %v, want %v", tc.method, tc.key, got, tc.want)
		}
		if got := engine.Retryable([]byte(tc.method), tc.key); got != tc.want {
			t.Errorf("Retryable([]byte %q, key %v) = %v, want %v", tc.method, tc.key, got, tc.want)
		}
	}
}
