//go:build linux

package loop

import (
	"bufio"
	"bytes"
	"io"
	"net/http"
	"net/http/httputil"
	"net/textproto"
	"slices"
	"strings"
	"testing"

	"github.com/preforkd/preforkd/engine"
	"github.com/preforkd/preforkd/route"
)

// The request head's rules, one by one (the conformance tables of package
// proxy run the same requests through every engine end to end).
func TestParseRequestHead(t *testing.T) {
	for _, tc := range []struct {
		name, head string
		bad        *engine.BadRequest
		check      func(t *testing.T, h *head)
	}{
		{name: "a plain GET", head: "GET /a?b=c HTTP/1.1\r\nHost: h\r\n\r\n", check: func(t *testing.T, h *head) {
			if string(h.path.of(h.raw)) != "/a" || string(h.query.of(h.raw)) != "b=c" || string(h.host.of(h.raw)) != "h" || h.close {
				t.Errorf("%+v", h.headInfo)
			}
		}},
		{name: "HTTP/1.0 closes unless it asks", head: "GET / HTTP/1.0\r\n\r\n", check: func(t *testing.T, h *head) {
			if !h.close {
				t.Error("an HTTP/1.0 request keeps its connection")
			}
		}},
		{name: "HTTP/1.0 keep-alive", head: "GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n", check: func(t *testing.T, h *head) {
			if h.close {
				t.Error("an HTTP/1.0 keep-alive request closes")
			}
		}},
		{name: "absolute form", head: "GET HTTP://a.example:81?q HTTP/1.1\r\nHost: b\r\n\r\n", check: func(t *testing.T, h *head) {
			if string(h.host.of(h.raw)) != "a.example:81" || !h.pathSlash || string(h.query.of(h.raw)) != "q" {
				t.Errorf("%+v", h.headInfo)
			}
		}},
		{name: "two spaces in the request line", head: "GET  / HTTP/1.1\r\n\r\n", bad: engine.ErrLine},
		{name: "a space in the target", head: "GET /a b HTTP/1.1\r\n\r\n", bad: engine.ErrLine},
		{name: "a lowercase version", head: "GET / http/1.1\r\n\r\n", bad: engine.ErrLine},
		{name: "HTTP/1.2", head: "GET / HTTP/1.2\r\n\r\n", bad: engine.ErrVersion},
		{name: "a method that is not a token", head: "G(T / HTTP/1.1\r\n\r\n", bad: engine.ErrLine},
		{name: "a signed length", head: "POST / HTTP/1.1\r\nContent-Length: +3\r\n\r\n", bad: engine.ErrLength},
		{name: "a list of lengths", head: "POST / HTTP/1.1\r\nContent-Length: 3, 3\r\n\r\n", bad: engine.ErrLength},
		{name: "the same length twice", head: "POST / HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\n", bad: engine.ErrTwoLengths},
		{name: "a coding under chunked", head: "POST / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", bad: engine.ErrCoding},
		{name: "chunked not last", head: "POST / HTTP/1.1\r\nTransfer-Encoding: chunked, gzip\r\n\r\n", bad: engine.ErrEncoding},
		{name: "chunked in two fields", head: "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n", bad: engine.ErrEncoding},
		{name: "an empty coding", head: "POST / HTTP/1.1\r\nTransfer-Encoding: ,\r\n\r\n", bad: engine.ErrEncoding},
		{name: "two hosts", head: "GET / HTTP/1.1\r\nHost: a\r\nhost: b\r\n\r\n", bad: engine.ErrTwoHosts},
		{name: "a space before the colon", head: "GET / HTTP/1.1\r\nHost : a\r\n\r\n", bad: engine.ErrName},
		{name: "DEL in a value", head: "GET / HTTP/1.1\r\nX: a\x7fb\r\n\r\n", bad: engine.ErrValue},
		{name: "obs-text in a value is kept", head: "GET / HTTP/1.1\r\nHost: a\r\nX: caf\xc3\xa9\r\n\r\n"},
		{name: "asterisk-form for GET", head: "GET * HTTP/1.1\r\n\r\n", bad: engine.ErrLine},
		{name: "HTTP/1.1 without Host", head: "GET / HTTP/1.1\r\nX: 1\r\n\r\n", bad: engine.ErrNoHost},
		{name: "HTTP/1.0 without Host", head: "GET / HTTP/1.0\r\n\r\n"},
		{name: "OPTIONS *", head: "OPTIONS * HTTP/1.1\r\nHost: a\r\n\r\n", check: func(t *testing.T, h *head) {
			if !h.asterisk {
				t.Error("OPTIONS * not recognised")
			}
		}},
		{name: "a scheme other than http", head: "GET https://a/ HTTP/1.1\r\n\r\n", bad: engine.ErrTarget},
		{name: "an upgrade to h2c is none", head: "GET / HTTP/1.1\r\nHost: a\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\n", check: func(t *testing.T, h *head) {
			if h.upgrade {
				t.Error("an upgrade to h2c is tunnelled")
			}
		}},
		{name: "Connection names a field", head: "GET / HTTP/1.1\r\nHost: a\r\nConnection: X-A\r\nX-A: 1\r\nX-B: 2\r\n\r\n", check: func(t *testing.T, h *head) {
			kinds := map[string]engine.FieldKind{}
			for _, f := range h.fields {
				kinds[string(f.name.of(h.raw))] = f.kind
			}
			if kinds["X-A"] != engine.FieldDropped || kinds["X-B"] != engine.FieldOther {
				t.Errorf("kinds %v", kinds)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			end, bad := scanHead([]byte(tc.head), 0)
			if bad != nil || end != len(tc.head) {
				t.Fatalf("scanHead: %d %v", end, bad)
			}
			var h head
			if got := h.parse([]byte(tc.head)); got != tc.bad {
				t.Fatalf("parse: %v, want %v", got, tc.bad)
			}
			if tc.check != nil {
				tc.check(t, &h)
			}
		})
	}
}

// A head is whole at its CRLF CRLF, however it arrives; a bare LF is
// refused wherever it is.
func TestScanHead(t *testing.T) {
	head := "GET / HTTP/1.1\r\nHost: a\r\n\r\nrest"
	for cut := 1; cut < len(head); cut++ {
		end, bad := scanHead([]byte(head[:cut]), 0)
		if want := 0; cut >= len(head)-4 {
			want = len(head) - 4
			if end != want || bad != nil {
				t.Fatalf("cut %d: %d %v, want %d", cut, end, bad, want)
			}
		} else if end != 0 || bad != nil {
			t.Fatalf("cut %d: %d %v, want not yet", cut, end, bad)
		}
		// Scanning on from where a scan that found nothing stopped finds
		// the same end.
		if end != 0 {
			continue
		}
		if end2, _ := scanHead([]byte(head), max(cut-3, 0)); end2 != len(head)-4 {
			t.Fatalf("scanning on from %d: %d", cut, end2)
		}
	}
	for _, h := range []string{"GET / HTTP/1.1\nHost: a\r\n\r\n", "GET / HTTP/1.1\r\nHost: a\n\r\n", "GET / HTTP/1.1\r\nHost: a\r\n\n"} {
		if _, bad := scanHead([]byte(h), 0); bad != engine.ErrBareLF {
			t.Errorf("%q: %v, want a bare LF refused", h, bad)
		}
	}
}

// decodeAll decodes p in pieces of at most step bytes.
func decodeAll(p []byte, step int) (data []byte, rest int, done bool, err error) {
	var d chunkDecoder
	for len(p) > 0 && !done {
		piece := p[:min(step, len(p))]
		for len(piece) > 0 && !done {
			var got []byte
			var n int
			got, n, done, err = d.decode(piece)
			if err != nil {
				return data, 0, false, err
			}
			data = append(data, got...)
			piece = piece[n:]
			p = p[n:]
		}
	}
	return data, len(p), done, nil
}

// trailerOf is a trailer line of n bytes, its CRLF left out.
func trailerOf(n int) string { return "X: " + strings.Repeat("v", n-3) }

func TestChunkDecoder(t *testing.T) {
	for _, tc := range []struct {
		in   string
		data string
		rest int
		err  bool
	}{
		{in: "4\r\nwiki\r\n5;x=y\r\npedia\r\n0\r\n\r\n", data: "wikipedia"},
		{in: "3\r\nabc\r\n0\r\nX-T: 1\r\nX-U: 2\r\n\r\nGET", data: "abc", rest: 3},
		{in: "A \r\n0123456789\r\n0\r\n\r\n", data: "0123456789"},
		{in: "zz\r\nabc\r\n0\r\n\r\n", err: true},
		{in: "3\nabc\r\n0\r\n\r\n", err: true},
		{in: "3\r\nabcd\r\n0\r\n\r\n", err: true},
		{in: "3 4\r\nabc\r\n0\r\n\r\n", err: true},
		{in: "1000000000000000\r\n", err: true},
		{in: "0\r\nX: 1\n\r\n", err: true},
		{in: "-1\r\n", err: true},
		{in: "0\r\n\n", err: true}, // a bare LF ends the trailer
		// A trailer line is a field line, checked as a header line is
		// (and dropped); any field name is taken.
		{in: "0\r\nContent-Type: text/plain\r\n\r\n", data: ""},
		{in: "0\r\nX-T: a\x01b\r\n\r\n", err: true},
		{in: "0\r\nno colon here\r\n\r\n", err: true},
		{in: "0\r\nX-T: a\r\n folded\r\n\r\n", data: ""}, // obs-fold, as net/http and fasthttp take it
		{in: "0\r\n folded\r\n\r\n", err: true},          // a fold with no field before
		{in: "0\r\n:x\r\n\r\n", err: true},
		{in: "0\r\nX T: a\r\n\r\n", err: true},
		// engine.MaxTrailer counts a line's bytes but its CRLF, and the CR
		// of the blank line, as the blocking engines' reader does.
		{in: "0\r\n" + trailerOf(engine.MaxTrailer-1) + "\r\n\r\n", data: ""},
		{in: "0\r\n" + trailerOf(engine.MaxTrailer) + "\r\n\r\n", err: true},
		{in: "0\r\n" + strings.Repeat("X: 1\r\n", (engine.MaxTrailer-1)/4) + "\r\n", data: ""},
		{in: "0\r\n" + strings.Repeat("X: 1\r\n", (engine.MaxTrailer-1)/4+1) + "\r\n", err: true},
		// engine.MaxChunkLine bounds a size line but its CRLF: a body of
		// extensions alone is not read without end, none of it data.
		{in: "1;" + strings.Repeat("x", engine.MaxChunkLine-2) + "\r\nA\r\n0\r\n\r\n", data: "A"},
		{in: "1;" + strings.Repeat("x", engine.MaxChunkLine-1) + "\r\nA\r\n0\r\n\r\n", err: true},
		{in: "1" + strings.Repeat(" ", engine.MaxChunkLine) + "\r\nA\r\n0\r\n\r\n", err: true},
	} {
		for _, step := range []int{1, 2, 3, 7, len(tc.in)} {
			data, rest, done, err := decodeAll([]byte(tc.in), step)
			if tc.err {
				if err == nil {
					t.Errorf("%q in pieces of %d: no error", tc.in, step)
				}
				continue
			}
			if err != nil || !done || string(data) != tc.data || rest != tc.rest {
				t.Errorf("%q in pieces of %d: %q, %d left, done %v, %v", tc.in, step, data, rest, done, err)
			}
		}
	}
}

// acceptedHead is the head the loop reads at the start of b, and its
// bytes, when it takes one: a whole header section that parses, and not
// OPTIONS * (which asks about the server: nothing is forwarded).
func acceptedHead(b []byte) (h head, section []byte, ok bool) {
	end, bad := scanHead(b, 0)
	if bad != nil || end == 0 {
		return h, nil, false
	}
	if h.parse(b[:end]) != nil || h.asterisk {
		return h, nil, false
	}
	return h, b[:end], true
}

// FuzzRequestHead: no head makes the parser fail but by a refusal, and a
// head it accepts goes upstream as a head that parses again the same way,
// with one framing, no field that was refused, and no line of the
// client's that could end it early.
func FuzzRequestHead(f *testing.F) {
	for _, s := range []string{
		"GET /a?b HTTP/1.1\r\nHost: h\r\nX-Forwarded-For: 1.2.3.4\r\n\r\n",
		"POST http://a/b HTTP/1.1\r\nTransfer-Encoding: chunked\r\nConnection: x, upgrade\r\nUpgrade: ws\r\nx: 1\r\n\r\n",
		"PUT /x HTTP/1.0\r\nContent-Length: 12\r\nConnection: keep-alive\r\nExpect: 100-continue\r\n\r\n",
		"OPTIONS * HTTP/1.1\r\n\r\n",
		"GET / HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		h, _, ok := acceptedHead(b)
		if !ok {
			return
		}
		if h.chunked && h.hasLength {
			t.Fatal("both framings accepted")
		}
		r := &request{h: h}
		// The path the core passes on (route.Normalize's forward path):
		// one it refuses is not forwarded.
		_, fwdPath, err := route.Normalize(r.Path())
		if err != nil {
			return
		}
		r.fwd.Path = fwdPath
		r.body.start(&r.h)
		r.body.done = true
		out := r.appendHead(nil, &engine.Target{Authority: "up"})
		oend, obad := scanHead(out, 0)
		if obad != nil || oend != len(out) {
			t.Fatalf("the head sent upstream does not end where it should (%d of %d, %v): %q", oend, len(out), obad, out)
		}
		var h2 head
		if bad := h2.parse(out); bad != nil {
			t.Fatalf("the head sent upstream is refused (%v): %q", bad, out)
		}
		if !bytes.Equal(h2.method.of(h2.raw), h.method.of(h.raw)) {
			t.Fatalf("the method changed: %q", out)
		}
		for _, f := range h2.fields {
			if f.kind == engine.FieldHopByHop || f.kind == engine.FieldDropped || f.kind == engine.FieldExpect {
				t.Fatalf("a field that is not forwarded was: %q in %q", f.name.of(h2.raw), out)
			}
		}
		if h2.chunked {
			t.Fatalf("a body read whole went chunked: %q", out)
		}
		// The upstream, net/http, reads one request from it: the
		// client's method, host, query and end-to-end fields.
		br := bufio.NewReader(bytes.NewReader(out))
		up, err := http.ReadRequest(br)
		if err != nil {
			t.Fatalf("net/http refuses the head sent upstream (%v): %q", err, out)
		}
		if br.Buffered() != 0 || up.ContentLength > 0 {
			t.Fatalf("net/http reads more than one request without a body in %q", out)
		}
		if up.Method != string(h.method.of(h.raw)) || up.URL.RawQuery != string(h.query.of(h.raw)) {
			t.Fatalf("net/http reads %s %q from %q", up.Method, up.URL.RawQuery, out)
		}
		if host := string(h.host.of(h.raw)); host != "" && up.Host != host || host == "" && up.Host != "up" {
			t.Fatalf("net/http reads host %q from %q", up.Host, out)
		}
		want := map[string][]string{}
		for _, f := range h.fields {
			if f.kind == engine.FieldOther {
				name := textproto.CanonicalMIMEHeaderKey(string(f.name.of(h.raw)))
				want[name] = append(want[name], string(f.value.of(h.raw)))
			}
		}
		for name, vs := range want {
			if !slices.Equal(up.Header[name], vs) {
				t.Fatalf("field %s: net/http reads %q, the client sent %q, in %q", name, up.Header[name], vs, out)
			}
		}
	})
}

// FuzzChunked: the decoder gives the same bytes whatever pieces they come
// in, and what it accepts net/http's chunked reader reads the same.
func FuzzChunked(f *testing.F) {
	for _, s := range []string{"4\r\nwiki\r\n5;x=y\r\npedia\r\n0\r\nT: 1\r\n\r\n", "0\r\n\r\n", "1\r\na\r\n",
		// A trailer section at engine.MaxTrailer, counted alike.
		"0\r\n" + strings.Repeat("X: 1\r\n", (engine.MaxTrailer-1)/4) + "\r\n",
		// More after the body than the reader's buffer holds.
		"0\r\n\r\n" + strings.Repeat("x", 16<<10)} {
		f.Add([]byte(s), uint8(1))
	}
	f.Fuzz(func(t *testing.T, b []byte, step uint8) {
		whole, rest, done, err := decodeAll(b, len(b)+1)
		pieces, rest2, done2, err2 := decodeAll(b, int(step%16)+1)
		if (err == nil) != (err2 == nil) || !bytes.Equal(whole, pieces) || rest != rest2 || done != done2 {
			t.Fatalf("whole: %q %d %v %v; in pieces: %q %d %v %v", whole, rest, done, err, pieces, rest2, done2, err2)
		}
		// The blocking engines' reader (engine.ChunkedReader, on a buffer
		// of the upstream pool's size) takes, refuses and leaves the same.
		src := bytes.NewReader(b)
		br := bufio.NewReaderSize(src, 16<<10)
		got, gerr := io.ReadAll(engine.NewChunkedReader(br))
		// What it leaves is what its buffer holds and what it did not read.
		left := br.Buffered() + src.Len()
		// (Where the input is bad and cut short, which fault is seen first
		// may differ: both fail.)
		switch {
		case err != nil && gerr == nil,
			err == nil && done && (gerr != nil || !bytes.Equal(got, whole) || left != rest),
			err == nil && !done && gerr != io.ErrUnexpectedEOF:
			t.Fatalf("the loop: %q rest %d done %v %v; engine.ChunkedReader: %q rest %d %v", whole, rest, done, err, got, left, gerr)
		}
		if err != nil || !done {
			return
		}
		body := b[:len(b)-rest]
		// net/http's reader stops at the last chunk: the trailer is ours.
		last := bytes.LastIndex(body, []byte("0\r\n"))
		if last < 0 || strings.Contains(string(body), "\n\n") {
			return
		}
		got, gerr = io.ReadAll(httputil.NewChunkedReader(bytes.NewReader(body)))
		if gerr == nil && !bytes.Equal(got, whole) {
			t.Fatalf("net/http reads %q, the decoder %q", got, whole)
		}
	})
}
