//lint:file-ignore SA1019 x/net's http2.Transport is the client that speaks HTTP/2 over a TLS connection with test-chosen settings; the server under test is x/net's too (tlsedge.go).
package tlsedge_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"

	"golang.org/x/net/http2"

	"github.com/preforkd/preforkd/engine"
	"github.com/preforkd/preforkd/internal/wiretest"
)

// Over HTTP/1.1 and HTTP/2 on TLS, a server-sent-events stream reaches
// the client as the application sends it: the head before any event, then
// each event, the next written only once the client has read the one
// before (with any buffering, the test times out).
func TestEventStreamOverTLS(t *testing.T) {
	next := make(chan struct{})
	up := wiretest.Application(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(200)
		w.(http.Flusher).Flush()
		for i := range 3 {
			select {
			case <-next:
			case <-r.Context().Done():
				return
			}
			fmt.Fprintf(w, "data: %d\n\n", i)
			w.(http.Flusher).Flush()
		}
	})
	addr, conf, _, _ := tlsServerConfig(t, up, engine.Limits{}, nil)
	h1 := &http.Client{Transport: &http.Transport{TLSClientConfig: conf}, Timeout: 5 * time.Second}
	h2 := &http.Client{Transport: &http2.Transport{TLSClientConfig: conf}, Timeout: 5 * time.Second}
	for name, c := range map[string]*http.Client{"HTTP/1.1": h1, "HTTP/2.0": h2} {
		t.Run(name, func(t *testing.T) {
			resp, err := c.Get("https://" + addr + "/events")
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			if resp.Proto != name {
				t.Errorf("served over %s", resp.Proto)
			}
			events := bufio.NewReader(resp.Body)
			for i := range 3 {
				next <- struct{}{}
				line, err := events.ReadString('\n')
				if want := fmt.Sprintf("data: %d\n", i); line != want || err != nil {
					t.Fatalf("event %d: %q, %v; want %q", i, line, err, want)
				}
				events.ReadString('\n')
			}
		})
	}
}

// An HTTP/2 client that resets its stream mid-stream, between two events,
// has the upstream's connection closed at once (the application's request
// ends), as over HTTP/1.1.
func TestEventStreamResetOverHTTP2(t *testing.T) {
	ended := make(chan struct{})
	up := wiretest.Application(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: 0\n\n")
		w.(http.Flusher).Flush()
		select {
		case <-r.Context().Done():
			close(ended)
		case <-time.After(5 * time.Second):
		}
	})
	addr, conf, _, _ := tlsServerConfig(t, up, engine.Limits{}, nil)
	h2 := &http.Client{Transport: &http2.Transport{TLSClientConfig: conf}, Timeout: 5 * time.Second}
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "GET", "https://"+addr+"/events", nil)
	resp, err := h2.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if line, err := bufio.NewReader(resp.Body).ReadString('\n'); line != "data: 0\n" {
		t.Fatalf("first event %q, %v", line, err)
	}
	cancel() // RST_STREAM
	resp.Body.Close()
	select {
	case <-ended:
	case <-time.After(3 * time.Second):
		t.Error("the application's request still open 3 s after the stream's reset")
	}
}
