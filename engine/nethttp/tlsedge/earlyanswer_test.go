package tlsedge_test

import (
	"bytes"
	"io"
	"log/slog"
	"net/http"
	"testing"

	"github.com/preforkd/preforkd/engine"
	"github.com/preforkd/preforkd/internal/logtest"
	"github.com/preforkd/preforkd/internal/wiretest"
)

// A client whose uploads are answered before their bodies are read (a 413 of
// the upstream's) keeps sending the DATA frames already under way when the
// server closes the stream, and the server answers each with a
// RST_STREAM of STREAM_CLOSED. Those frames are no error of the client's
// (RFC 9113 §5.4.2 has them ignored): a client that uploads again and
// again is not cut off as a rapid reset.
func TestEarlyAnsweredUploadsAreNoRapidReset(t *testing.T) {
	up := wiretest.Application(t, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusRequestEntityTooLarge) // without reading the body
	})
	var logs logtest.Buffer
	addr, conf, _, _ := tlsServerConfig(t, up, engine.Limits{}, slog.New(slog.NewTextHandler(&logs, nil)))
	tr := &http.Transport{TLSClientConfig: conf, Protocols: new(http.Protocols)}
	tr.Protocols.SetHTTP2(true) // HTTP/2 only: the streams are the point
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	body := make([]byte, 8<<20) // more than the upstream takes
	for i := range 150 {
		resp, err := client.Post("https://"+addr+"/upload", "application/octet-stream", bytes.NewReader(body))
		if err != nil {
			t.Fatalf("upload %d: %v (cut off: %q)", i, err, logs.Lines("HTTP/2 client cut off"))
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusRequestEntityTooLarge {
			t.Fatalf("upload %d: status %d, want 413", i, resp.StatusCode)
		}
	}
	if lines := logs.Lines("HTTP/2 client cut off"); len(lines) > 0 {
		t.Fatalf("a client whose uploads were answered early was cut off: %q", lines)
	}
}
