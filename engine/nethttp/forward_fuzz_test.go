package nethttp

import (
	"bufio"
	"bytes"
	"net/http"
	"testing"
)

// Whatever an upstream answers, reading its head neither panics nor
// takes a status outside 100-599, and a body's framing is one of the
// three.
func FuzzReadResponseHead(f *testing.F) {
	f.Add([]byte("HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: keep-alive, X-A\r\nX-A: 1\r\n\r\nok"))
	f.Add([]byte("HTTP/1.1 103 Early\r\nLink: <x>\r\n\r\nHTTP/1.0 204 No\r\nTransfer-Encoding: gzip, chunked\r\n\r\n"))
	f.Fuzz(func(t *testing.T, in []byte) {
		h := http.Header{}
		hd, err := readResponseHead(bufio.NewReaderSize(bytes.NewReader(in), 16<<10), h, nil)
		if err != nil {
			return
		}
		if hd.status < 100 || hd.status > 599 || hd.length < -2 {
			t.Fatalf("head %+v", hd)
		}
		for k := range h {
			if hopByHop(k) && !hd.upgrade {
				t.Fatalf("hop-by-hop field %s kept", k)
			}
		}
	})
}
