//go:build linux

package main

import (
	"bytes"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/preforkd/preforkd/internal/tlstest"
)

// h2Stream sends a GET of path with fields on stream id of fr's
// connection and reads the frames until the stream ends: its status and
// body (status 0: the connection ended first).
func h2Stream(t *testing.T, fr *http2.Framer, dec *hpack.Decoder, id uint32, path string, fields ...hpack.HeaderField) (int, string) {
	t.Helper()
	var buf bytes.Buffer
	enc := hpack.NewEncoder(&buf)
	block := headerBlock(enc, &buf, path, fields...)
	// In frames of at most 16 KiB (the default SETTINGS_MAX_FRAME_SIZE).
	first, rest := block[:min(len(block), 16<<10)], block[min(len(block), 16<<10):]
	if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: first, EndStream: true, EndHeaders: len(rest) == 0}); err != nil {
		return 0, err.Error()
	}
	for len(rest) > 0 {
		n := min(len(rest), 16<<10)
		if err := fr.WriteContinuation(id, n == len(rest), rest[:n]); err != nil {
			return 0, err.Error()
		}
		rest = rest[n:]
	}
	status, body := 0, ""
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			return 0, err.Error()
		}
		switch f := f.(type) {
		case *http2.HeadersFrame:
			hs, err := dec.DecodeFull(f.HeaderBlockFragment())
			if err != nil {
				t.Fatal(err)
			}
			if f.StreamID == id {
				for _, h := range hs {
					if h.Name == ":status" {
						fmt.Sscan(h.Value, &status)
					}
				}
				if f.StreamEnded() {
					return status, body
				}
			}
		case *http2.DataFrame:
			if f.StreamID == id {
				body += string(f.Data())
				if f.StreamEnded() {
					return status, body
				}
			}
		case *http2.GoAwayFrame:
			return 0, fmt.Sprintf("GOAWAY %v", f.ErrCode)
		case *http2.RSTStreamFrame:
			if f.StreamID == id {
				return 0, fmt.Sprintf("RST_STREAM %v", f.ErrCode)
			}
		case *http2.SettingsFrame:
			if !f.IsAck() {
				fr.WriteSettingsAck()
			}
		}
	}
}

// max_header_bytes holds over HTTP/2 as over HTTP/1.1: a request whose
// header section, read as its HTTP/1.1 twin, is over it gets the same
// 431 problem, counted, on both protocols, whether its fields are many
// or one long one, and from the same byte on; the HTTP/2 connection
// serves on (no flood was cut off).
func TestHTTP2MaxHeaderBytesE2E(t *testing.T) {
	t.Parallel()
	ca := tlstest.NewCA(t)
	dir := t.TempDir()
	cert, key := ca.Files(t, dir, "a", "a.example")
	cfg := baseServer(1, "max_header_bytes = \"4KiB\"\n") + adminSection +
		fmt.Sprintf("\n[tls]\n[[tls.certificate]]\ncert = %q\nkey = %q\n", cert, key)
	d := startDaemon(t, daemonOptions{config: noCanary(cfg), admin: true})
	td := &tlsDaemon{daemon: d, ca: ca, dir: dir}

	c := td.dial(t, "a.example", &tls.Config{NextProtos: []string{"h2"}})
	defer c.Close()
	if p := c.ConnectionState().NegotiatedProtocol; p != "h2" {
		t.Fatalf("ALPN %q", p)
	}
	c.SetDeadline(time.Now().Add(10 * time.Second))
	io.WriteString(c, http2.ClientPreface)
	fr := http2.NewFramer(c, c)
	fr.WriteSettings()
	dec := hpack.NewDecoder(4096, nil)

	many := make([]hpack.HeaderField, 10)
	for i := range many {
		many[i] = hpack.HeaderField{Name: fmt.Sprintf("x-many-%d", i), Value: strings.Repeat("m", 500)}
	}
	one := []hpack.HeaderField{{Name: "cookie", Value: "c=" + strings.Repeat("o", 4500)}}
	// "GET /head HTTP/1.1\r\nHost: a.example\r\nx-pad: ...\r\n\r\n": 48
	// bytes and the value's.
	pad := func(n int) []hpack.HeaderField {
		return []hpack.HeaderField{{Name: "x-pad", Value: strings.Repeat("w", n-48)}}
	}
	id := uint32(1)
	for _, tc := range []struct {
		name   string
		fields []hpack.HeaderField
		want   int
	}{
		{"many fields over the bound", many, 431},
		{"one field over the bound", one, 431},
		{"a section at the bound", pad(4096), 200},
		{"a section a byte over the bound", pad(4097), 431},
	} {
		status, body := h2Stream(t, fr, dec, id, "/head", tc.fields...)
		id += 2
		if status != tc.want {
			t.Errorf("HTTP/2, %s: %d %q, want %d", tc.name, status, body, tc.want)
		} else if tc.want == 431 && !strings.Contains(body, `"detail":"the request header section is too large"`) {
			t.Errorf("HTTP/2, %s: the body is %q, want the problem HTTP/1.1 gets", tc.name, body)
		}

		// The HTTP/1.1 twin gets the same.
		h1 := td.dial(t, "a.example", &tls.Config{NextProtos: []string{"http/1.1"}})
		var req strings.Builder
		req.WriteString("GET /head HTTP/1.1\r\nHost: a.example\r\n")
		for _, f := range tc.fields {
			fmt.Fprintf(&req, "%s: %s\r\n", f.Name, f.Value)
		}
		req.WriteString("\r\n")
		h1.SetDeadline(time.Now().Add(10 * time.Second))
		io.WriteString(h1, req.String())
		resp, err := http.ReadResponse(bufioReader(h1), nil)
		if err != nil || resp.StatusCode != tc.want {
			t.Errorf("HTTP/1.1, %s: %v %v, want %d", tc.name, resp, err, tc.want)
		}
		h1.Close()
	}
	// Both protocols' 431s are counted.
	admin := newClient(t, nil, false)
	var got float64
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if got = scrapeMetrics(t, admin, d.admin).samples[`preforkd_http_requests_total{code="431"}`]; got == 6 {
			break
		}
	}
	if got != 6 {
		t.Errorf("preforkd_http_requests_total{code=\"431\"} is %v, want 6 (three over each protocol)", got)
	}
	// By then a cut-off client would have been logged.
	if _, l, ok := td.logs.waitFor(0, 0, msgIs("HTTP/2 client cut off")); ok {
		t.Errorf("a client cut off: %s", l.raw)
	}
}
