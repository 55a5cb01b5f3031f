//lint:file-ignore SA1019 x/net's http2.Transport is the client that speaks HTTP/2 over a TLS connection with test-chosen settings; the server under test is x/net's too (tlsedge.go).

package tlsedge_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"testing"
	"time"

	"golang.org/x/net/http2"

	"github.com/preforkd/preforkd/config"
	"github.com/preforkd/preforkd/core"
	"github.com/preforkd/preforkd/engine"
	"github.com/preforkd/preforkd/internal/shmtest"
	"github.com/preforkd/preforkd/internal/waitfor"
	"github.com/preforkd/preforkd/internal/wiretest"
	"github.com/preforkd/preforkd/metrics"
	"github.com/preforkd/preforkd/shm"
)

// A large cached body over HTTP/2 is sent a piece at a time, as over
// HTTP/1.1, while the connection's other streams go on: whole, and whole
// as it was when its entry is evicted mid-body (the worker's copy).
func TestLargeHitOverHTTP2(t *testing.T) {
	const size = 7 << 20 // more than the client's stream window (4 MiB)
	pattern := func(path string) []byte {
		b, _ := io.ReadAll(wiretest.Pattern(size))
		for i := range b {
			b[i] ^= path[len(path)-1]
		}
		return b
	}
	up := wiretest.Application(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/small" {
			io.WriteString(w, "small")
			return
		}
		w.Header().Set("Cache-Control", "max-age=600")
		w.Header().Set("Content-Length", fmt.Sprint(size))
		w.Write(pattern(r.URL.Path))
	})
	// Room for one entry: the second's fill evicts the first.
	c, region := configCore(t, "[table]\ncounters = 64\nresponses = 64\nresponse_bytes = \"12MiB\"\n[[cache]]\npath = \"/big/*\"\nmax_body = \"8MiB\"\n")
	addr, conf, _, _ := tlsServerCore(t, c, up, engine.Limits{}, nil)
	h2 := &http.Client{Transport: &http2.Transport{TLSClientConfig: conf}, Timeout: 20 * time.Second}
	get := func(path string) (*http.Response, bool) {
		t.Helper()
		reused := false
		trace := &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) { reused = i.Reused }}
		req, _ := http.NewRequestWithContext(httptrace.WithClientTrace(context.Background(), trace), "GET", "https://"+addr+path, nil)
		resp, err := h2.Do(req)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		return resp, reused
	}
	whole := func(path, x string) {
		t.Helper()
		resp, _ := get(path)
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != 200 || x != "" && resp.Header.Get("X-Cache") != x || !bytes.Equal(body, pattern(path)) {
			t.Fatalf("GET %s: %d %s, %d bytes, %v", path, resp.StatusCode, resp.Header.Get("X-Cache"), len(body), err)
		}
	}
	stored := func(path string) {
		t.Helper()
		if !waitfor.Cond(5*time.Second, func() bool {
			req, _ := http.NewRequest("HEAD", "https://"+addr+path, nil)
			resp, err := h2.Do(req)
			if err != nil {
				return false
			}
			resp.Body.Close()
			return resp.Header.Get("X-Cache") == "HIT"
		}) {
			t.Fatalf("%s was not stored", path)
		}
	}
	whole("/big/a", "")
	stored("/big/a")
	whole("/big/a", "HIT")

	// A stream whose client reads part of the body and pauses.
	resp, _ := get("/big/a")
	if resp.Header.Get("X-Cache") != "HIT" {
		t.Fatalf("X-Cache %s, want HIT", resp.Header.Get("X-Cache"))
	}
	got := make([]byte, 64<<10)
	if _, err := io.ReadFull(resp.Body, got); err != nil {
		t.Fatal(err)
	}
	// Another stream on the connection meanwhile.
	small, reused := get("/small")
	b, _ := io.ReadAll(small.Body)
	small.Body.Close()
	if string(b) != "small" || !reused {
		t.Fatalf("another stream while one pauses: %q, on the same connection %v", b, reused)
	}
	whole("/big/b", "") // its fill takes /big/a's blocks
	stored("/big/b")
	rest, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	got = append(got, rest...)
	if err != nil || !bytes.Equal(got, pattern("/big/a")) {
		t.Errorf("%d bytes (%v) came of the body whose entry was evicted, want it whole as it was", len(got), err)
	}
	if n := metrics.Total(region, metrics.CacheCutSends, 0); n != 0 {
		t.Errorf("preforkd_cache_cut_sends_total %d, want 0", n)
	}
	// The connection goes on.
	resp, reused = get("/big/b")
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || !bytes.Equal(body, pattern("/big/b")) || !reused {
		t.Errorf("after it: %d bytes, %v, on the same connection %v", len(body), err, reused)
	}
}

// configCore is a core of the configuration toml over a private region
// (its statistics included), and that region.
func configCore(t *testing.T, toml string) (*core.Core, *shm.Region) {
	t.Helper()
	cfg, err := config.Parse([]byte(toml), "t")
	if err != nil {
		t.Fatal(err)
	}
	o, err := cfg.CoreOptions()
	if err != nil {
		t.Fatal(err)
	}
	so := cfg.RegionOptions()
	metrics.Geometry(&so, 8)
	region := shmtest.Private(t, so)
	c, err := core.New(region, o)
	if err != nil {
		t.Fatal(err)
	}
	return c, region
}
