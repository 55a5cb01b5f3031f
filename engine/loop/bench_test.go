//go:build linux

package loop_test

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"runtime"
	"testing"

	"github.com/preforkd/preforkd/core"
	"github.com/preforkd/preforkd/engine/loop"
	"github.com/preforkd/preforkd/internal/wiretest"
)

// BenchmarkProxy measures the engine with the core per proxied request,
// over loopback: a client that writes a canned request and reads the
// canned-size response, and an upstream that answers every request with
// the same bytes. Neither allocates per request, so allocs/op is the
// engine's and the core's: 0, rules on or off, and for the in-process
// application.
func BenchmarkProxy(b *testing.B) {
	up := cannedUpstream(b)
	for _, bc := range []struct {
		name  string
		rules bool
		app   bool
	}{
		{"proxy/rules=off", false, false},
		{"proxy/rules=on", true, false},
		{"app/rules=on", true, true},
	} {
		b.Run(bc.name, func(b *testing.B) {
			// New raises GOMAXPROCS by one (see Options.Loops): back as it
			// was once the server is closed.
			procs := runtime.GOMAXPROCS(0)
			b.Cleanup(func() { runtime.GOMAXPROCS(procs) })
			o := loop.Options{Upstream: "http://" + up}
			if bc.app {
				o = loop.Options{App: func(w *loop.AppResponse, r *loop.AppRequest) { w.Write(okBody) }}
			}
			if bc.rules {
				o.Core = benchCore(b)
			}
			addr, _ := serve(b, o)
			b.ReportAllocs()
			b.SetParallelism(4)
			b.RunParallel(func(pb *testing.PB) {
				c, err := net.Dial("tcp", addr)
				if err != nil {
					b.Error(err)
					return
				}
				defer c.Close()
				br := bufio.NewReaderSize(c, 4096)
				req := []byte("GET /api/items?id=7 HTTP/1.1\r\nHost: bench.example\r\nUser-Agent: bench\r\nAccept: */*\r\n\r\n")
				for pb.Next() {
					if _, err := c.Write(req); err != nil {
						b.Error(err)
						return
					}
					if err := skipResponse(br); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}

var okBody = []byte("ok\n")

// benchCore is a core with one rule by client address that never
// refuses, built as a worker builds it.
func benchCore(b *testing.B) *core.Core {
	return configCore(b, "[table]\ncounters = 1024\n[[ratelimit]]\nname = \"api\"\npath = \"/api/*\"\nlimit = 1048575\nwindow = \"2s\"\nby = \"ip\"\n")
}

// cannedUpstream answers every request on a connection with the same
// response, without parsing more than the end of the request head.
func cannedUpstream(b testing.TB) string {
	ln := listen(b)
	resp := []byte("HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 3\r\n\r\nok\n")
	wiretest.AcceptEach(ln, func(c net.Conn) {
		buf := make([]byte, 16<<10)
		have := 0
		for {
			n, err := c.Read(buf[have:])
			if err != nil {
				return
			}
			have += n
			for {
				i := bytes.Index(buf[:have], []byte("\r\n\r\n"))
				if i < 0 {
					break
				}
				copy(buf, buf[i+4:have])
				have -= i + 4
				if _, err := c.Write(resp); err != nil {
					return
				}
			}
		}
	})
	return ln.Addr().String()
}

// skipResponse reads one response with a Content-Length without
// allocating.
func skipResponse(br *bufio.Reader) error {
	length := -1
	for {
		line, err := br.ReadSlice('\n')
		if err != nil {
			return err
		}
		if len(line) <= 2 {
			break
		}
		const cl = "content-length:"
		if len(line) > len(cl) && bytes.EqualFold(line[:len(cl)], []byte(cl)) {
			length = 0
			for _, c := range bytes.TrimSpace(line[len(cl):]) {
				length = length*10 + int(c-'0')
			}
		}
	}
	if length < 0 {
		return io.ErrUnexpectedEOF
	}
	_, err := br.Discard(length)
	return err
}
