package proxy_test

import (
	"testing"

	"github.com/preforkd/preforkd/proxy"
)

// FuzzRequest feeds the fast engine's request parser whatever a client
// could send on one connection, read by fasthttp as the server reads it,
// and checks what the parser promises (proxy.CheckRequest): no request
// with both Content-Length and Transfer-Encoding goes on; the head sent
// upstream is one request to net/http, with the client's method, path and
// fields but the hop-by-hop ones; the core sees what the upstream gets.
// The seeds are the conformance table's requests (the smuggling vectors
// among them), each alone and followed by the request it pipelines.
func FuzzRequest(f *testing.F) {
	for _, x := range exchanges {
		send := x.send
		if !x.raw {
			send = crlf(send)
		}
		f.Add([]byte(send))
		if x.then != "" {
			f.Add([]byte(send + crlf(x.then)))
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		proxy.CheckRequest(t, data)
	})
}

// CheckRequest forwards what the conformance suite sees forwarded over a
// real connection: its model of the server is the server.
func TestCheckRequestForwardsAsTheServer(t *testing.T) {
	for _, x := range exchanges {
		send := x.send
		if !x.raw {
			send = crlf(send)
		}
		w := x
		if x.fastHTTP != nil {
			w = *x.fastHTTP // the fast engine's own behaviour, which CheckRequest models
		}
		if x.then != "" && !w.closed {
			send += crlf(x.then)
		}
		want := w.upCount
		if want == 0 && w.upLine != "" {
			want = 1
		}
		if got := proxy.CheckRequest(t, []byte(send)); got != want {
			t.Errorf("%s: %d requests forwarded, want %d", x.name, got, want)
		}
	}
}
