package tlsedge_test

import (
	"crypto/tls"
	"log/slog"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http2"

	"github.com/preforkd/preforkd/engine"
	"github.com/preforkd/preforkd/internal/logtest"
)

// A client that breaks HTTP/2 on purpose (a frame the protocol forbids,
// a GOAWAY with an error code) makes net/http log a line per connection:
// as for a failed handshake, which a client also makes at will, at most
// one a second reaches the log, so that a client cannot fill the log.
func TestClientHTTP2ErrorsReachTheLogAtMostOnceASecond(t *testing.T) {
	var out logtest.Buffer
	addr, conf, _, _ := tlsServerConfig(t, okUpstream(t), engine.Limits{}, slog.New(slog.NewTextHandler(&out, nil)))
	conf = conf.Clone()
	conf.NextProtos = []string{"h2"}
	const conns = 12
	start := time.Now()
	for i := range conns {
		c, err := tls.Dial("tcp", addr, conf)
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(5 * time.Second))
		c.Write([]byte(http2.ClientPreface))
		fr := http2.NewFramer(c, c)
		fr.WriteSettings()
		switch i % 3 {
		case 0:
			fr.WriteRawFrame(http2.FrameData, 0, 0, []byte("x")) // on stream 0: PROTOCOL_ERROR
		case 1:
			fr.WriteRawFrame(http2.FramePing, 0, 0, []byte("abc")) // FRAME_SIZE_ERROR
		case 2:
			fr.WriteGoAway(0, http2.ErrCodeInternal, []byte("bye"))
			fr.WritePing(false, [8]byte{1}) // its ack comes after the GOAWAY was read
		}
		for { // until the server's GOAWAY, or it closes
			f, err := fr.ReadFrame()
			if err != nil || f.Header().Type == http2.FrameGoAway || f.Header().Type == http2.FramePing {
				break
			}
		}
		c.Close()
	}
	took := time.Since(start)
	time.Sleep(100 * time.Millisecond) // the last connection's line
	var lines []string
	for l := range strings.Lines(out.String()) {
		if strings.Contains(l, "http2") {
			lines = append(lines, l)
		}
	}
	if max := 1 + int(took/time.Second); len(lines) == 0 || len(lines) > max {
		t.Errorf("%d lines for %d connections a client broke in %v, want 1 to %d:\n%s", len(lines), conns, took, max, strings.Join(lines, ""))
	}
}
