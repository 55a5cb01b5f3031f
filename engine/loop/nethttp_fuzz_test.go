//go:build linux

package loop

import (
	"bufio"
	"bytes"
	"net/http"
	"net/url"
	"testing"

	"github.com/preforkd/preforkd/route"
)

// FuzzRequestHeadNetHTTP holds the loop's request parser to net/http's,
// which the other engines' paths and most upstreams trust: a head the
// loop accepts, net/http reads too, with the same method, target,
// version, host and framing. (The loop may refuse more: it is the
// stricter of the two.)
func FuzzRequestHeadNetHTTP(f *testing.F) {
	for _, s := range []string{
		"GET /a?b HTTP/1.1\r\nHost: h\r\nX-Forwarded-For: 1.2.3.4\r\n\r\n",
		"POST http://a/b HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n",
		"PUT /x HTTP/1.0\r\nContent-Length: 12\r\nConnection: keep-alive\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: h\r\nContent-Length: 007\r\n\r\n",
		"DELETE /%41?q#x HTTP/1.1\r\nHost: h:80\r\nA:\t b \r\n\r\n",
		"GET http://h?x HTTP/1.1\r\nHost: y\r\n\r\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		h, section, ok := acceptedHead(b)
		if !ok {
			return
		}
		if _, _, err := route.Normalize((&request{h: h}).Path()); err != nil {
			return // the core refuses the path (route's FuzzNormalize)
		}
		if host := string(h.host.of(h.raw)); h.absolute {
			// An authority net/http reads otherwise (userinfo, a
			// fragment) or not at all: the core checks it, as it checks
			// a Host field (core's FuzzHostProblem).
			if u, err := url.Parse("http://" + host + "/"); err != nil || u.Host != host || u.User != nil {
				return
			}
		}
		req, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(section)))
		if err != nil {
			t.Fatalf("the loop accepts what net/http refuses (%v): %q", err, section)
		}
		switch {
		case req.Method != string(h.method.of(h.raw)):
			t.Fatalf("method %q, net/http %q: %q", h.method.of(h.raw), req.Method, section)
		case req.RequestURI != string(h.target.of(h.raw)):
			t.Fatalf("target %q, net/http %q: %q", h.target.of(h.raw), req.RequestURI, section)
		case req.ProtoMajor != 1 || req.ProtoMinor != int(h.minor):
			t.Fatalf("version 1.%d, net/http %d.%d: %q", h.minor, req.ProtoMajor, req.ProtoMinor, section)
		case req.Host != string(h.host.of(h.raw)):
			t.Fatalf("host %q, net/http %q: %q", h.host.of(h.raw), req.Host, section)
		case h.chunked != (len(req.TransferEncoding) == 1 && req.TransferEncoding[0] == "chunked"):
			t.Fatalf("chunked %v, net/http %q: %q", h.chunked, req.TransferEncoding, section)
		case h.hasLength && req.ContentLength != h.length,
			!h.hasLength && !h.chunked && req.ContentLength != 0:
			t.Fatalf("length %v %d, net/http %d: %q", h.hasLength, h.length, req.ContentLength, section)
		case h.close != req.Close:
			t.Fatalf("close %v, net/http %v: %q", h.close, req.Close, section)
		}
	})
}
