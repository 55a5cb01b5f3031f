package engine_test

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/preforkd/preforkd/engine"
)

func TestResponseHead(t *testing.T) {
	type want struct {
		status          int
		length          int64 // -1: none
		chunked, closes bool
		passed          string // the fields passed on, "name=value;..."
		date            bool   // a Date passed on: the server adds none
	}
	for _, tc := range []struct {
		name, head string
		err        error
		want       want
	}{
		{name: "a length", head: "HTTP/1.1 200 OK\r\nContent-Length: 3\r\nX-A: 1\r\n",
			want: want{status: 200, length: 3, passed: "X-A=1"}},
		{name: "chunked", head: "HTTP/1.1 200 OK\r\nTransfer-Encoding: Chunked\r\n",
			want: want{status: 200, length: -1, chunked: true}},
		{name: "another coding under chunked", head: "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n", err: engine.ErrRespCoding},
		{name: "a coding but chunked last", head: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, gzip\r\n", err: engine.ErrRespCoding},
		{name: "chunked twice, in two fields", head: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n", err: engine.ErrRespCoding},
		{name: "an empty Transfer-Encoding", head: "HTTP/1.1 200 OK\r\nTransfer-Encoding:\r\n", err: engine.ErrRespCoding},
		{name: "an empty Transfer-Encoding beside chunked", head: "HTTP/1.1 200 OK\r\nTransfer-Encoding:\r\nTransfer-Encoding: chunked\r\n", err: engine.ErrRespCoding},
		{name: "Transfer-Encoding in HTTP/1.0", head: "HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\n", err: engine.ErrRespCoding},
		{name: "Transfer-Encoding overrides Content-Length, and the connection ends", head: "HTTP/1.1 200 OK\r\nContent-Length: 9\r\nTransfer-Encoding: chunked\r\n",
			want: want{status: 200, length: -1, chunked: true, closes: true}},
		{name: "no framing field: a 204 keeps the connection", head: "HTTP/1.1 204 No Content\r\nDate: x\r\n",
			want: want{status: 204, length: -1, passed: "Date=x", date: true}},
		{name: "a Date that Connection names is dropped: the server adds its own", head: "HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: date\r\nDate: x\r\n",
			want: want{status: 200, length: 0}},
		{name: "HTTP/1.0 closes", head: "HTTP/1.0 200 OK\r\nContent-Length: 0\r\n",
			want: want{status: 200, length: 0, closes: true}},
		{name: "HTTP/1.0 keep-alive keeps", head: "HTTP/1.0 200 OK\r\nContent-Length: 0\r\nConnection: keep-alive\r\n",
			want: want{status: 200, length: 0}},
		{name: "Connection: close", head: "HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: Close\r\n",
			want: want{status: 200, length: 0, closes: true}},
		{name: "fields Connection names are dropped, with the hop-by-hop ones", head: "HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: x-a, upgrade\r\nX-A: 1\r\nKeep-Alive: 5\r\nUpgrade: ws\r\nX-B: 2\r\nProxy-Authenticate: y\r\n",
			want: want{status: 200, length: 0, passed: "X-B=2"}},
		{name: "a 101 passes Upgrade (the server sends its own Connection)", head: "HTTP/1.1 101 Switching Protocols\r\nConnection: upgrade, close\r\nUpgrade: ws\r\n",
			want: want{status: 101, length: -1, closes: true, passed: "Upgrade=ws"}},
		{name: "a 101 without Upgrade", head: "HTTP/1.1 101 Switching Protocols\r\nConnection: upgrade\r\n", err: engine.ErrRespSwitch},
		{name: "a 101 with an empty Upgrade", head: "HTTP/1.1 101 Switching Protocols\r\nConnection: upgrade\r\nUpgrade: ,\r\n", err: engine.ErrRespSwitch},
		{name: "no reason", head: "HTTP/1.1 200\r\nContent-Length: 0\r\n", want: want{status: 200, length: 0}},
		{name: "status 099", head: "HTTP/1.1 099 x\r\n", err: engine.ErrRespStatus},
		{name: "status 600", head: "HTTP/1.1 600 x\r\n", err: engine.ErrRespStatus},
		{name: "two digits", head: "HTTP/1.1 20 x\r\n", err: engine.ErrRespLine},
		{name: "HTTP/2", head: "HTTP/2.0 200 OK\r\n", err: engine.ErrRespLine},
		{name: "a control character in the reason", head: "HTTP/1.1 200 O\x00K\r\n", err: engine.ErrRespLine},
		{name: "no space after the status", head: "HTTP/1.1 200OK\r\n", err: engine.ErrRespLine},
		{name: "obs-fold", head: "HTTP/1.1 200 OK\r\nX-A: 1\r\n 2\r\n", err: engine.ErrRespField},
		{name: "a space before the colon", head: "HTTP/1.1 200 OK\r\nX-A : 1\r\n", err: engine.ErrRespField},
		{name: "no colon", head: "HTTP/1.1 200 OK\r\nX-A\r\n", err: engine.ErrRespField},
		{name: "a control character in a value", head: "HTTP/1.1 200 OK\r\nX-A: a\x01b\r\n", err: engine.ErrRespField},
		{name: "a repeated Content-Length, even the same", head: "HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 3\r\n", err: engine.ErrRespLength},
		{name: "a Content-Length list", head: "HTTP/1.1 200 OK\r\nContent-Length: 3, 3\r\n", err: engine.ErrRespLength},
		{name: "a signed Content-Length", head: "HTTP/1.1 200 OK\r\nContent-Length: +3\r\n", err: engine.ErrRespLength},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, err := engine.ParseResponseHead([]byte(tc.head+"\r\n"), nil)
			if err != tc.err {
				t.Fatalf("err %v, want %v", err, tc.err)
			}
			if err != nil {
				return
			}
			got := want{status: h.Status, length: -1, chunked: h.Chunked, closes: h.Close, date: h.HasDate}
			if h.HasLength {
				got.length = h.Length
			}
			var passed []string
			for i := range h.Fields {
				if f := &h.Fields[i]; h.Passed(f) {
					passed = append(passed, string(f.Name.Of(h.Raw))+"="+string(f.Value.Of(h.Raw)))
				}
			}
			got.passed = strings.Join(passed, ";")
			if got != tc.want {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

// FuzzResponseHead: a response head is refused or accepted, never a
// panic; an accepted one has a status a client can be given and one
// framing at most.
func FuzzResponseHead(f *testing.F) {
	for _, s := range []string{
		"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nConnection: close, X-A\r\nX-A: 1\r\n\r\n",
		"HTTP/1.1 101 Switching Protocols\r\nUpgrade: ws\r\nConnection: upgrade\r\n\r\n",
		"HTTP/1.0 304 Not Modified\r\nTransfer-Encoding: chunked\r\nContent-Length: 9\r\n\r\n",
		"HTTP/1.1 099 x\r\n\r\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		// What the engines give Parse: a whole head, every line ended by
		// CRLF (a bare LF is refused before).
		end := bytes.Index(b, []byte("\r\n\r\n"))
		if end < 0 || bytes.Count(b[:end+4], []byte("\n")) != bytes.Count(b[:end+4], []byte("\r\n")) {
			return
		}
		h, err := engine.ParseResponseHead(b[:end+4], nil)
		if err != nil {
			return
		}
		if h.Status < 100 || h.Status > 599 {
			t.Fatalf("status %d accepted", h.Status)
		}
		if h.HasLength && h.Encoded {
			t.Fatal("a length with a transfer coding")
		}
		if h.Encoded && !h.Chunked && !h.Close {
			t.Fatal("a body up to the close on a connection kept")
		}
		h.Each(func(name, value []byte) {
			if bytes.ContainsAny(name, "\r\n:") || bytes.ContainsAny(value, "\r\n") {
				t.Fatalf("a field passed on with a line end: %q: %q", name, value)
			}
		})
	})
}

// An upstream's Keep-Alive timeout bounds how long its connection may
// wait idle for the next request, a margin short of it: the next request
// must not reach the upstream just as it closes the connection (Node.js
// closes after 5 s, with Keep-Alive: timeout=5), which a request that is
// not retried (a POST) would get as a 502.
func TestResponseHeadKeepAlive(t *testing.T) {
	for _, tc := range []struct {
		fields  string
		idleFor time.Duration // 0: the pool's own bound
		closes  bool
	}{
		{"", 0, false},
		{"Keep-Alive: timeout=5\r\n", 4 * time.Second, false},
		{"Keep-Alive: timeout=5, max=1000\r\n", 4 * time.Second, false},
		{"keep-alive: MAX=3 , Timeout=30\r\n", 29 * time.Second, false},
		{"Keep-Alive: timeout=\"5\"\r\n", 4 * time.Second, false},
		{"Keep-Alive: timeout=1\r\n", 500 * time.Millisecond, false},
		{"Keep-Alive: timeout=0\r\n", 0, true},  // kept for no time at all
		{"Keep-Alive: timeout=x\r\n", 0, false}, // no number: no bound
		{"Keep-Alive: timeout=-5\r\n", 0, false},
		{"Keep-Alive: timeout=5.5\r\n", 0, false},
		{"Keep-Alive: timeout=99999999999999999999\r\n", 0, false},
		{"Keep-Alive: timeout=5\r\nKeep-Alive: timeout=3\r\n", 2 * time.Second, false}, // the shorter
		{"Keep-Alive: mytimeout=5\r\n", 0, false},
		{"Keep-Alive: 5\r\n", 0, false},
		{"Connection: keep-alive\r\nKeep-Alive: timeout=10\r\n", 9 * time.Second, false},
	} {
		h, err := engine.ParseResponseHead([]byte("HTTP/1.1 200 OK\r\nContent-Length: 0\r\n"+tc.fields+"\r\n"), nil)
		if err != nil {
			t.Fatalf("%q: %v", tc.fields, err)
		}
		if h.IdleFor != tc.idleFor || h.Close != tc.closes {
			t.Errorf("%q: idle for %v, close %v; want %v, %v", tc.fields, h.IdleFor, h.Close, tc.idleFor, tc.closes)
		}
	}
}

// BenchmarkParseResponseHead parses nginx's head for a small keep-alive
// response, as the loop does for every response it relays.
func BenchmarkParseResponseHead(b *testing.B) {
	head := []byte("HTTP/1.1 200 OK\r\nServer: nginx/1.26.3\r\nDate: Sat, 05 Dec 2026 02:40:25 GMT\r\n" +
		"Content-Type: text/plain\r\nContent-Length: 6\r\nConnection: keep-alive\r\n\r\n")
	var fields [16]engine.Field
	b.ReportAllocs()
	for b.Loop() {
		if h, err := engine.ParseResponseHead(head, fields[:0]); err != nil || h.Length != 6 {
			b.Fatal(err)
		}
	}
}
