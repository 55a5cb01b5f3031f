package nethttp_test

import (
	"bufio"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/preforkd/preforkd/core"
	"github.com/preforkd/preforkd/engine"
)

// What net/http refuses before any handler runs, and what it would take
// or close on without a word, is answered as the other engines answer it:
// problem+json with a Date, counted by status, the connection closed; a
// header line ended by a bare LF is refused at once, even in a section
// read ahead with the request before it; a header section cut short by
// read_header_timeout gets 408.
func TestOwnAnswers(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var counted []int
	var served []string
	count := core.Options{OnResponse: func(status int) {
		mu.Lock()
		counted = append(counted, status)
		mu.Unlock()
	}}
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		served = append(served, r.URL.Path)
		mu.Unlock()
		io.WriteString(w, "ok")
	})
	lim := engine.Limits{ReadHeaderTimeout: 300 * time.Millisecond, MaxHeaderBytes: 8 << 10}
	_, ln := limitedServerWith(t, lim, app, count)

	for _, tc := range []struct {
		name   string
		send   string
		oks    int // responses 200 "ok" before the refusal
		status int
		detail string
		within time.Duration // the refusal comes this soon (0: any time)
	}{
		{name: "a bare LF", send: "GET /x HTTP/1.1\r\nHost: a\nX-A: b\r\n\r\n",
			status: 400, detail: engine.ErrBareLF.Detail, within: 200 * time.Millisecond},
		{name: "a bare LF ending the section", send: "GET /x HTTP/1.1\r\nHost: a\r\n\n",
			status: 400, detail: engine.ErrBareLF.Detail, within: 200 * time.Millisecond},
		{name: "a bare LF in a pipelined section read ahead",
			send: "GET /a HTTP/1.1\r\nHost: a\r\n\r\nGET /x HTTP/1.1\nHost: a\n\n",
			oks:  1, status: 400, detail: engine.ErrBareLF.Detail, within: 200 * time.Millisecond},
		{name: "a bare LF in the third section read ahead",
			send: "GET /a HTTP/1.1\r\nHost: a\r\n\r\nGET /b HTTP/1.1\r\nHost: a\r\n\r\nGET /x HTTP/1.1\nHost: a\n\n",
			oks:  2, status: 400, detail: engine.ErrBareLF.Detail, within: 200 * time.Millisecond},
		{name: "a bare LF read ahead after OPTIONS *",
			send: "OPTIONS * HTTP/1.1\r\nHost: a\r\n\r\nGET /x HTTP/1.1\nHost: a\n\n",
			oks:  1, status: 400, detail: engine.ErrBareLF.Detail, within: 200 * time.Millisecond},
		{name: "a section cut short", send: "GET /x HTTP/1.1\r\nHost: a\r\n",
			status: 408, detail: engine.ErrHeadTimeout.Detail},
		{name: "a section cut short after a request", send: "GET /a HTTP/1.1\r\nHost: a\r\n\r\nGET /x HT",
			oks: 1, status: 408, detail: engine.ErrHeadTimeout.Detail},
		{name: "a section too large", send: "GET /x HTTP/1.1\r\nHost: a\r\nX-Big: " + strings.Repeat("b", 9<<10) + "\r\n\r\n",
			status: 431, detail: engine.ErrTooLarge.Detail},
		{name: "a section one byte over max_header_bytes", send: sized("/x", 8<<10+1),
			status: 431, detail: engine.ErrTooLarge.Detail},
		{name: "a section over max_header_bytes read ahead", send: sized("/a", 8<<10) + sized("/x", 8<<10+1),
			oks: 1, status: 431, detail: engine.ErrTooLarge.Detail},
		{name: "no Host", send: "GET /x HTTP/1.1\r\nX-A: b\r\n\r\n",
			status: 400, detail: "missing required Host header"},
		{name: "HTTP/2.0", send: "GET /x HTTP/2.0\r\nHost: a\r\n\r\n",
			status: 505, detail: engine.ErrVersion.Detail},
		{name: "an unknown expectation", send: "GET /x HTTP/1.1\r\nHost: a\r\nExpect: bar\r\n\r\n",
			status: 417, detail: "an Expect other than 100-continue"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mu.Lock()
			counted, served = nil, nil
			mu.Unlock()
			conn, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			conn.SetDeadline(time.Now().Add(5 * time.Second))
			start := time.Now()
			io.WriteString(conn, tc.send)
			br := bufio.NewReader(conn)
			want := []int{}
			for range tc.oks {
				resp, err := http.ReadResponse(br, nil)
				if err != nil {
					t.Fatal(err)
				}
				io.Copy(io.Discard, resp.Body)
				if resp.StatusCode != 200 {
					t.Fatalf("a good request before the bad one: %d", resp.StatusCode)
				}
				want = append(want, 200)
			}
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatal(err)
			}
			took := time.Since(start)
			var p struct {
				Status int
				Detail string
			}
			if err := json.NewDecoder(resp.Body).Decode(&p); err != nil {
				t.Errorf("the body: %v", err)
			}
			if resp.StatusCode != tc.status || p.Status != tc.status || p.Detail != tc.detail {
				t.Errorf("%d %q (problem status %d), want %d %q", resp.StatusCode, p.Detail, p.Status, tc.status, tc.detail)
			}
			if ct := resp.Header.Get("Content-Type"); ct != "application/problem+json" || len(resp.Header.Values("Date")) != 1 || !resp.Close {
				t.Errorf("Content-Type %q, Date %q, close %v: want problem+json, one Date, Connection: close",
					ct, resp.Header.Values("Date"), resp.Close)
			}
			if tc.within > 0 && took > tc.within {
				t.Errorf("answered after %v, want within %v", took, tc.within)
			}
			if _, err := io.Copy(io.Discard, br); err != nil && !isReset(err) {
				t.Errorf("reading to the close: %v", err)
			}
			want = append(want, tc.status)
			mu.Lock()
			defer mu.Unlock()
			if !slices.Equal(counted, want) {
				t.Errorf("counted %v, want %v", counted, want)
			}
			if slices.Contains(served, "/x") {
				t.Errorf("the refused request reached the handler: %v", served)
			}
		})
	}

	// A connection that sends nothing is closed without a word, counted
	// nowhere.
	t.Run("nothing sent", func(t *testing.T) {
		mu.Lock()
		counted = nil
		mu.Unlock()
		conn, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		conn.SetDeadline(time.Now().Add(5 * time.Second))
		if b, err := io.ReadAll(conn); len(b) != 0 || (err != nil && !isReset(err)) {
			t.Errorf("got %q, %v; want a quiet close", b, err)
		}
		mu.Lock()
		defer mu.Unlock()
		if len(counted) != 0 {
			t.Errorf("counted %v", counted)
		}
	})
}

// sized is a GET of path whose header section is n bytes long, its CRLF
// CRLF included.
func sized(path string, n int) string {
	h := "GET " + path + " HTTP/1.1\r\nHost: a\r\nX-Pad: "
	return h + strings.Repeat("p", n-len(h)-4) + "\r\n\r\n"
}

// max_header_bytes is exact at its smallest too, where net/http's own
// bound (with its 4 KiB of slack) would let a byte more through.
func TestMaxHeaderBytesExact(t *testing.T) {
	t.Parallel()
	lim := engine.Limits{MaxHeaderBytes: engine.MinMaxHeaderBytes}
	_, ln := limitedServer(t, lim, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	for n, want := range map[int]int{lim.MaxHeaderBytes: 200, lim.MaxHeaderBytes + 1: 431} {
		conn, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		conn.SetDeadline(time.Now().Add(5 * time.Second))
		io.WriteString(conn, sized("/", n))
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		conn.Close()
		if err != nil || resp.StatusCode != want {
			t.Errorf("a section of %d bytes: %v %v, want %d", n, resp, err, want)
		}
	}
}
