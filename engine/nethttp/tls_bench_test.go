//lint:file-ignore SA1019 x/net's http2.Transport is the client that speaks HTTP/2 over a TLS connection with test-chosen settings; the server under test is x/net's too (server.go).

package nethttp_test

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"testing"

	"golang.org/x/net/http2"
)

// cannedUpstream answers every request on a connection with the same
// small response, reading only up to the end of each request head.
func cannedUpstream(b *testing.B) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { ln.Close() })
	resp := []byte("HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 6\r\n\r\nhello\n")
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				for {
					for {
						line, err := br.ReadSlice('\n')
						if err != nil {
							return
						}
						if len(line) <= 2 {
							break
						}
					}
					if _, err := c.Write(resp); err != nil {
						return
					}
				}
			}()
		}
	}()
	return "http://" + ln.Addr().String()
}

// BenchmarkTLSForward measures a request over TLS, HTTP/1.1 keep-alive
// and HTTP/2, through the core (no rule) and the forwarder to an upstream
// that answers at once: the net/http engine's cost per request on the
// daemon's TLS listener, beside what crypto costs.
func BenchmarkTLSForward(b *testing.B) {
	up := cannedUpstream(b)
	for _, proto := range []string{"h1", "h2"} {
		b.Run(proto, func(b *testing.B) {
			addr, conf, _ := tlsServer(b, up)
			var rt http.RoundTripper = &http.Transport{TLSClientConfig: conf, MaxIdleConnsPerHost: 64}
			if proto == "h2" {
				rt = &http2.Transport{TLSClientConfig: conf}
			}
			c := &http.Client{Transport: rt}
			b.ReportAllocs()
			b.SetParallelism(4)
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					resp, err := c.Get("https://" + addr + "/api/items")
					if err != nil {
						b.Error(err)
						return
					}
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
			})
		})
	}
}
