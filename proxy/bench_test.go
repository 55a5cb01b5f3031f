package proxy_test

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"path/filepath"
	"testing"

	"github.com/valyala/fasthttp"

	"github.com/preforkd/preforkd/accesslog"
	"github.com/preforkd/preforkd/core"
	"github.com/preforkd/preforkd/engine"
	"github.com/preforkd/preforkd/proxy"
)

// BenchmarkProxy measures the engine with its core adapter per proxied
// request, over loopback: a client that writes a canned request and reads
// the canned-size response, and an upstream that answers every request
// with the same bytes. Neither allocates per request, so allocs/op is the
// engine's (and the core's, with rules on).
func BenchmarkProxy(b *testing.B) {
	up := cannedUpstream(b)
	for _, bc := range []struct {
		name   string
		rules  bool
		app    bool
		access bool
		// nethttp: the net/http engine forwarding by itself (what the
		// daemon's TLS listeners serve with), in cleartext.
		nethttp bool
	}{
		{"proxy/rules=off", false, false, false, false},
		{"proxy/rules=on", true, false, false, false},
		{"proxy/rules=on/access=on", true, false, true, false},
		{"app/rules=on", true, true, false, false},
		{"nethttp/proxy/rules=on", true, false, false, true},
	} {
		b.Run(bc.name, func(b *testing.B) {
			var addr string
			switch o := (proxy.Options{Upstream: "http://" + up}); {
			case bc.nethttp:
				ln := listen(b)
				s := netHTTPForwarder(b, benchCore(b, bc.access), "http://"+up, engine.Limits{})
				served := make(chan error, 1)
				go func() { served <- s.Serve(ln) }()
				stopAtCleanup(b, s, served)
				addr = ln.Addr().String()
			default:
				if bc.app {
					o = proxy.Options{App: func(ctx *fasthttp.RequestCtx) { ctx.Response.SetBodyRaw(okBody) }}
				}
				if bc.rules {
					o.Core = benchCore(b, bc.access)
				}
				addr, _ = serve(b, o)
			}
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
// refuses, built as a worker builds it: over a region with the daemon's
// statistics, so that the rule is counted per worker, as it is there.
func benchCore(b *testing.B, access bool) *core.Core {
	const rules = "[table]\ncounters = 1024\n[[ratelimit]]\nname = \"api\"\npath = \"/api/*\"\nlimit = 1048575\nwindow = \"2s\"\nby = \"ip\"\n"
	if !access {
		return configCore(b, rules, nil)
	}
	// With the access log on, as a worker writes it: to a file, in the
	// combined format, buffered.
	l, err := accesslog.New(accesslog.Options{Path: filepath.Join(b.TempDir(), "access.log")})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { l.Close() })
	return configCoreWith(b, rules, func(o *core.Options) { o.AccessLog = l })
}

// cannedUpstream answers every request on a connection with the same
// response, without parsing more than the end of the request head.
func cannedUpstream(b *testing.B) string {
	ln := listen(b)
	resp := []byte("HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 3\r\n\r\nok\n")
	acceptEach(ln, func(c net.Conn) {
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

// skipResponse reads one response with a Content-Length (the canned and
// the demo ones) without allocating.
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
