package engine_test

import (
	"strings"
	"testing"

	"github.com/preforkd/preforkd/engine"
)

// HeadScan over reads as they come: a bare LF in the section being read
// is refused at once; one in the bytes read ahead after a section is
// refused at the next section's start only when the request had no body
// (they were that next section, not a body).
func TestHeadScan(t *testing.T) {
	for _, tc := range []struct {
		name     string
		reads    []string
		bodyless bool // the request whose section the first read ends
		bareLF   bool // a read reports a bare LF
		refuse   bool // the next section is refused at its start
	}{
		{name: "whole", reads: []string{"GET / HTTP/1.1\r\nHost: a\r\n\r\n"}},
		{name: "bare LF", reads: []string{"GET / HTTP/1.1\nHost: a\r\n\r\n"}, bareLF: true},
		{name: "CR and LF in two reads", reads: []string{"GET / HTTP/1.1\r", "\nHost: a\r\n\r\n"}},
		{name: "a body is not checked", reads: []string{"POST / HTTP/1.1\r\nContent-Length: 3\r\n\r\na\nb"}},
		{name: "the next section read ahead", reads: []string{"GET / HTTP/1.1\r\n\r\nGET /b HTTP/1.1\r\nHost: a\n\n"}, bodyless: true, refuse: true},
		{name: "a body read ahead", reads: []string{"POST / HTTP/1.1\r\nContent-Length: 3\r\n\r\na\nb"}, refuse: false},
		{name: "a good section read ahead", reads: []string{"GET / HTTP/1.1\r\n\r\nGET /b HTTP/1.1\r", "\nHost: a\r\n\r\n"}, bodyless: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var h engine.HeadScan
			h.Start()
			bare := false
			for _, r := range tc.reads {
				bare = bare || h.Scan([]byte(r))
			}
			h.Bodyless = tc.bodyless
			h.Start()
			if bare != tc.bareLF || h.Refuse() != tc.refuse {
				t.Errorf("bare LF %v, next refused %v; want %v, %v", bare, h.Refuse(), tc.bareLF, tc.refuse)
			}
		})
	}
}

// Sections pipelined in one read are followed one by one: each is taken
// for the section awaited once the request before it proved bodyless,
// with its length and its bare LF; after a request with a body, what was
// read ahead is dropped (it may be that body).
func TestHeadScanPipelined(t *testing.T) {
	const a, b = "GET /a HTTP/1.1\r\nHost: a\r\n\r\n", "GET /b HTTP/1.1\r\nHost: a\r\n\r\n"
	const bad = "GET /x HTTP/1.1\nHost: a\n\n"
	var h engine.HeadScan
	h.Start()
	if h.Scan([]byte(a + b + bad)) {
		t.Fatal("a bare LF reported in a section read ahead")
	}
	if h.Len() != len(a) || h.Begun() {
		t.Fatalf("the first section: %d bytes, begun %v", h.Len(), h.Begun())
	}
	h.Bodyless = true
	h.Start()
	if h.Refuse() || h.Len() != len(b) {
		t.Fatalf("the second section: refused %v, %d bytes", h.Refuse(), h.Len())
	}
	h.Bodyless = true
	h.Start()
	if !h.Refuse() || h.Len() != len(bad) {
		t.Fatalf("the third section: refused %v, %d bytes; want refused", h.Refuse(), h.Len())
	}

	// The same, but the second request has a body: the third "section"
	// may be that body.
	h = engine.HeadScan{}
	h.Start()
	h.Scan([]byte(a + b + bad))
	h.Bodyless = true
	h.Start()
	h.Start() // Bodyless not set: a body followed
	if h.Refuse() || h.Len() != 0 || h.Begun() {
		t.Fatalf("after a body: refused %v, %d bytes, begun %v; want a fresh section", h.Refuse(), h.Len(), h.Begun())
	}
	// An empty line before a request line is not a section's end.
	h = engine.HeadScan{}
	h.Start()
	h.Scan([]byte(a))
	h.Bodyless = true
	h.Start()
	h.Scan([]byte("\r\nGET /c HTTP/1.1\r\n"))
	if !h.Begun() {
		t.Fatal("a section begun by an empty line taken for a whole one")
	}
}

// What is read ahead is followed only so far: 64 sections, or 64 KiB
// (a body, most likely). Past that nothing is checked, and nothing is
// refused that was not seen.
func TestHeadScanAheadBounds(t *testing.T) {
	const ok = "GET / HTTP/1.1\r\n\r\n"
	var h engine.HeadScan
	h.Start()
	h.Scan([]byte(ok + strings.Repeat(ok, 64) + "GET /x HTTP/1.1\nHost: a\n\n"))
	for i := range 64 {
		h.Bodyless = true
		h.Start()
		if h.Refuse() || h.Len() != len(ok) {
			t.Fatalf("section %d read ahead: refused %v, %d bytes", i+2, h.Refuse(), h.Len())
		}
	}
	h.Bodyless = true
	h.Start()
	if h.Refuse() || h.Len() != 0 {
		t.Fatalf("the section past 64 read ahead: refused %v, %d bytes; want it unchecked", h.Refuse(), h.Len())
	}

	// A long body read ahead: past 64 KiB it is not followed, and a
	// section after it in the same read is not taken for the next.
	h = engine.HeadScan{}
	h.Start()
	h.Scan([]byte("POST / HTTP/1.1\r\nContent-Length: 70000\r\n\r\n" + strings.Repeat("x", 70000) + "GET /x HTTP/1.1\nHost: a\n\n"))
	h.Start() // the request had a body
	if h.Refuse() || h.Len() != 0 || h.Begun() {
		t.Fatalf("after a body: refused %v, %d bytes", h.Refuse(), h.Len())
	}
}

// HeadScan notes a section's framing lines however reads cut them: both
// Content-Length and Transfer-Encoding, Transfer-Encoding in HTTP/1.0,
// or a folded line is a refusal, after empty lines before the request
// line too (net/http drops them after a POST); one of them alone, a name
// that only begins like one, or one in a body or the request line is not.
func TestHeadScanFraming(t *testing.T) {
	for _, tc := range []struct {
		head string
		want *engine.BadRequest
	}{
		{"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n", engine.ErrCLTE},
		{"POST / HTTP/1.1\r\ntransfer-ENCODING: chunked\r\nCONTENT-length:3\r\n\r\n", engine.ErrCLTE},
		{"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n", engine.ErrEncoding10},
		{"\r\nPOST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n", engine.ErrEncoding10},
		{"\r\n\r\nPOST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n", engine.ErrEncoding10},
		{"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", nil},
		{"POST / HTTP/1.0\r\nContent-Length: 3\r\n\r\n", nil},
		{"POST / HTTP/1.1\r\nContent-Length: 3\r\nX-Transfer-Encoding: chunked\r\nTransfer-Encodings: x\r\n\r\n", nil},
		{"POST /Transfer-Encoding: HTTP/1.0\r\nContent-Length: 3\r\n\r\n", nil},
		{"GET / HTTP/1.1\r\nX-A: b\r\n c\r\n\r\n", engine.ErrObsFold},
		{"GET / HTTP/1.1\r\nX-A: b\r\n\tc\r\n\r\n", engine.ErrObsFold},
		{"GET / HTTP/1.1\r\nX-A: b c\t\r\n\r\n", nil},
	} {
		for _, cut := range []int{1, 7, len(tc.head)} {
			var h engine.HeadScan
			h.Start()
			for rest := tc.head; rest != ""; {
				n := min(cut, len(rest))
				h.Scan([]byte(rest[:n]))
				rest = rest[n:]
			}
			if got := h.Framing(); got != tc.want {
				t.Errorf("%q in reads of %d: %v, want %v", tc.head, cut, got, tc.want)
			}
		}
	}
	// A body read with its section is not one of its lines.
	var h engine.HeadScan
	h.Start()
	h.Scan([]byte("POST / HTTP/1.1\r\nContent-Length: 24\r\n\r\nTransfer-Encoding: x\r\n\r\n"))
	if got := h.Framing(); got != nil {
		t.Errorf("a body like a framing line: %v", got)
	}
}
