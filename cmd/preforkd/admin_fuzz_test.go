package main

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"testing"

	"github.com/preforkd/preforkd/config"
	"github.com/preforkd/preforkd/prefork"
	"github.com/preforkd/preforkd/shm"
)

// FuzzActionQuery: a key action goes past its parameter check only with
// a query that reads whole and holds key once and nothing else; anything
// else is a 400.
func FuzzActionQuery(f *testing.F) {
	for _, s := range []string{"key=192.0.2.1", "key=1&key=2", "kye=1", "key=%zz", "key=1;x=2", "key=1&x", "key=192.0.2.1&key=%zz", "key=192.0.2.1;key=192.0.2.2", "", "key", "key=ip%3A192.0.2.1"} {
		f.Add(s)
	}
	token := filepath.Join(f.TempDir(), "token")
	if err := os.WriteFile(token, []byte("0123456789abcdef0123\n"), 0o600); err != nil {
		f.Fatal(err)
	}
	r, err := shm.CreatePrivate(shm.Options{Counters: 16, MaxWorkers: 4, Responses: 4, ResponseBytes: 1024, BlockSize: 256})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { r.Close() })
	a := &admin{log: slog.New(slog.DiscardHandler), region: r}
	a.status.Store(&prefork.Status{Settings: prefork.Settings{Config: config.Config{Admin: config.Admin{TokenFile: token}}}, Serving: true})
	mux := a.mux()
	f.Fuzz(func(t *testing.T, raw string) {
		u := &url.URL{Path: "/ratelimit/login/reset", RawQuery: raw}
		req, err := http.NewRequest(http.MethodPost, "http://admin"+u.RequestURI(), nil)
		if err != nil || req.URL.RawQuery != raw {
			return // not a query a request line carries
		}
		req.Header.Set("Authorization", "Bearer 0123456789abcdef0123")
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, req)
		if w.Code == http.StatusBadRequest {
			return
		}
		// Past the check (no control here: a 503).
		q, err := url.ParseQuery(raw)
		if err != nil || len(q) != 1 || len(q["key"]) != 1 || q.Get("key") == "" {
			t.Fatalf("?%s: %d %s; want a 400", raw, w.Code, w.Body)
		}
	})
}
