//go:build linux

package main

import (
	"bytes"
	"crypto/tls"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/preforkd/preforkd/internal/tlstest"
	"github.com/preforkd/preforkd/internal/wiretest"
)

// What reaches the application through a TLS listener is one
// unambiguous HTTP/1.1 request the rules saw, or nothing: an HTTP/2
// stream whose :method would split the upstream's request line, or whose
// content-length its DATA do not have, and an HTTP/1.1 request framed
// two ways, with a request after its body, are each refused 400 by the
// built daemon and never forwarded.
func TestTLSMalformedNeverReachesTheUpstreamE2E(t *testing.T) {
	t.Parallel()
	up := wiretest.StartUpstream(t, nil)
	td := &tlsDaemon{ca: tlstest.NewCA(t), dir: t.TempDir()}
	td.aCert, td.aKey = td.ca.Files(t, td.dir, "a", "a.example")
	cfg := baseServer(1, fmt.Sprintf("upstream = %q", up.URL())) + fmt.Sprintf(`
[tls]
[[tls.certificate]]
cert = %q
key = %q
`, td.aCert, td.aKey)
	td.daemon = startDaemon(t, daemonOptions{config: noCanary(cfg)})
	stream := func(fields ...string) string {
		c := td.dial(t, "a.example", &tls.Config{NextProtos: []string{"h2"}})
		defer c.Close()
		c.SetDeadline(time.Now().Add(10 * time.Second))
		switch status, _, err := wiretest.H2Stream(c, fields, nil); {
		case err != nil:
			return err.Error()
		case status == "":
			return "reset"
		default:
			return status
		}
	}
	get := []string{":scheme", "https", ":authority", "a.example", ":path", "/p"}
	if got := stream(append([]string{":method", "GET /admin?"}, get...)...); got != "400" {
		t.Errorf(":method %q: %s, want 400", "GET /admin?", got)
	}
	if got := stream(append([]string{":method", "POST"}, append(get, "content-length", "5")...)...); got != "400" {
		t.Errorf("content-length 5 on a stream its headers end: %s, want 400", got)
	}
	c := td.dial(t, "a.example", &tls.Config{NextProtos: []string{"http/1.1"}})
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	io.WriteString(c, "POST /p HTTP/1.1\r\nHost: a.example\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"+
		"GET /smuggled HTTP/1.1\r\nHost: a.example\r\n\r\n")
	if got, _ := io.ReadAll(c); !bytes.HasPrefix(got, []byte("HTTP/1.1 400 ")) || bytes.Count(got, []byte("HTTP/1.1 ")) != 1 {
		t.Errorf("Content-Length and Transfer-Encoding over TLS: %q, want one 400, then the connection closed", got)
	}
	for _, s := range up.Requests() {
		t.Errorf("the upstream got %q", s.Line)
	}
	if got := stream(append([]string{":method", "GET"}, get...)...); got != "200" {
		t.Errorf("a well-formed stream: %s, want 200", got)
	}
}
