package tlsedge_test

import (
	"crypto/tls"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/http2"

	"github.com/preforkd/preforkd/engine"
	"github.com/preforkd/preforkd/internal/logtest"
	"github.com/preforkd/preforkd/internal/wiretest"
)

// A client that makes the server reset the streams it opens (a
// WINDOW_UPDATE of 0 on each, a stream error: CVE-2025-8671, "MadeYouReset")
// starts and abandons a request on each as surely as one that resets them
// itself: it is cut off as a rapid reset is, after a bounded number of
// requests reached the upstream.
func TestServerProvokedResetsAreARapidReset(t *testing.T) {
	var upstream atomic.Int64
	up := wiretest.Application(t, func(w http.ResponseWriter, r *http.Request) {
		upstream.Add(1)
		io.WriteString(w, "ok")
	})
	var logs logtest.Buffer
	addr, conf, _, _ := tlsServerConfig(t, up, engine.Limits{}, slog.New(slog.NewTextHandler(&logs, nil)))
	conf.NextProtos = []string{"h2"}
	c, err := tls.Dial("tcp", addr, conf)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	go io.Copy(io.Discard, c)
	c.SetWriteDeadline(time.Now().Add(10 * time.Second))
	io.WriteString(c, http2.ClientPreface)
	fr := http2.NewFramer(c, c)
	fr.AllowIllegalWrites = true // a WINDOW_UPDATE of 0
	fr.WriteSettings()
	block := []byte{0x82, 0x87, 0x84, 0x41, 0x01, 'a'} // :method GET, :scheme https, :path /, :authority a
	const streams = 5000
	sent := 0
	for ; sent < streams; sent++ {
		id := uint32(2*sent + 1)
		if fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: block, EndStream: true, EndHeaders: true}) != nil ||
			fr.WriteWindowUpdate(id, 0) != nil {
			break
		}
		if sent%50 == 49 {
			time.Sleep(time.Millisecond) // let the server answer: its resets are what counts
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for len(logs.Lines("HTTP/2 client cut off")) == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	lines := logs.Lines("HTTP/2 client cut off")
	if len(lines) == 0 || !strings.Contains(lines[0], "reset") {
		t.Fatalf("%d streams sent, each reset by the server; %d requests reached the upstream; no rapid-reset cut-off logged: %q",
			sent, upstream.Load(), lines)
	}
	if n := upstream.Load(); n > 1000 {
		t.Errorf("%d requests reached the upstream before the cut, want a bounded few", n)
	}
}
