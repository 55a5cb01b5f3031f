package main

import (
	"errors"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/preforkd/preforkd/config"
	"github.com/preforkd/preforkd/prefork"
	"github.com/preforkd/preforkd/shm"
)

// The final dump begins once the actions under way have finished, and an
// action after that is refused (503), never answered 200 while the dump
// is written and then lost at the next start.
func TestActionsStopBeforeTheFinalDump(t *testing.T) {
	token := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(token, []byte("0123456789abcdef0123\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	a := &admin{log: slog.New(slog.DiscardHandler)}
	cfg := config.Config{Admin: config.Admin{TokenFile: token}}
	a.status.Store(&prefork.Status{Settings: prefork.Settings{Config: cfg}, Serving: true})
	entered, release := make(chan struct{}), make(chan struct{})
	ran := 0
	h := a.authorize(func(w http.ResponseWriter, _ *http.Request) {
		ran++
		if ran == 1 {
			close(entered)
			<-release
		}
	})
	act := func() *httptest.ResponseRecorder {
		w := httptest.NewRecorder()
		r := httptest.NewRequest(http.MethodPost, "/cache/purge?tag=a", nil)
		r.Header.Set("Authorization", "Bearer 0123456789abcdef0123")
		h.ServeHTTP(w, r)
		return w
	}
	first := make(chan int)
	go func() { first <- act().Code }()
	<-entered
	stopped := make(chan struct{})
	go func() { a.stopActions(); close(stopped) }()
	select {
	case <-stopped:
		t.Fatal("the actions stopped while one was under way")
	case <-time.After(50 * time.Millisecond):
	}
	close(release)
	<-stopped
	if code := <-first; code != http.StatusOK {
		t.Errorf("the action under way: %d, want 200", code)
	}
	if w := act(); w.Code != http.StatusServiceUnavailable || ran != 1 {
		t.Errorf("an action after the stop: %d (ran %d times) %s; want 503, not run", w.Code, ran, w.Body.String())
	}
}

// A binary upgrade whose file drops a unix admin.listen: the new
// supervisor closes the socket it inherited without removing its file,
// which the old supervisor serves on until it hands over (and on, if the
// upgrade fails), and removes it only once it serves.
func TestUpgradeDroppingTheAdminSocketKeepsItsFileUntilServing(t *testing.T) {
	path := filepath.Join(t.TempDir(), "admin.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close() // the old supervisor's
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	f, err := prefork.ListenerFile(ln)
	if err != nil {
		t.Fatal(err)
	}
	var opts prefork.Options
	adminHooks(&opts, config.Config{}, adminInfo{})
	if err := opts.Adopt(map[string]*os.File{"admin": f}); err != nil {
		t.Fatal(err)
	}
	if err := opts.Prepare(nil, slog.New(slog.DiscardHandler)); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(path); err != nil {
		t.Fatalf("the socket the old supervisor serves on, after the new one's start: %v", err)
	}
	opts.OnStatus(prefork.Status{Serving: false})
	if _, err := os.Lstat(path); err != nil {
		t.Fatalf("the socket before the new supervisor serves: %v", err)
	}
	opts.OnStatus(prefork.Status{Serving: true})
	if _, err := os.Lstat(path); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("the socket once the new supervisor serves: %v; want it removed", err)
	}
}

// An action's parameters are checked before it acts: one it does not
// take (a typo) or one given twice that it takes once is a 400 naming
// it, never an action on the first value alone or without the
// misspelled target, answered 200.
func TestActionParamsChecked(t *testing.T) {
	token := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(token, []byte("0123456789abcdef0123\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	r, err := shm.CreatePrivate(shm.Options{Counters: 16, MaxWorkers: 4, Responses: 4, ResponseBytes: 1024, BlockSize: 256})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	a := &admin{log: slog.New(slog.DiscardHandler), region: r}
	cfg := config.Config{Admin: config.Admin{TokenFile: token}}
	a.status.Store(&prefork.Status{Settings: prefork.Settings{Config: cfg}, Serving: true})
	mux := a.mux()
	for _, c := range []struct{ method, target, body, names string }{
		{http.MethodPost, "/ratelimit/login/reset?key=192.0.2.1&key=192.0.2.2", "", `\"key\"`},
		{http.MethodGet, "/ratelimit/login?key=192.0.2.1&kye=192.0.2.2", "", `\"kye\"`},
		{http.MethodDelete, "/idempotency?key=k&by=ip:192.0.2.1&by=ip:192.0.2.2", "", `\"by\"`},
		{http.MethodPost, "/cache/purge?tag=a&kye=/x", "", `\"kye\"`},
		// A pair the query cannot read is not dropped: it may be the
		// second value, or the misspelled target.
		{http.MethodPost, "/ratelimit/login/reset?key=192.0.2.1&key=%zz", "", `%zz`},
		{http.MethodGet, "/ratelimit/login?key=192.0.2.1&k%ye=1", "", `%ye`},
		{http.MethodDelete, "/idempotency?key=k&by=ip:192.0.2.1;by=ip:192.0.2.2", "", `semicolon`},
		{http.MethodPost, "/cache/purge", "tag=a&tags=b", `\"tags\"`},
	} {
		r := httptest.NewRequest(c.method, c.target, strings.NewReader(c.body))
		if c.body != "" {
			r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		}
		r.Header.Set("Authorization", "Bearer 0123456789abcdef0123")
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, r)
		if w.Code != http.StatusBadRequest || !strings.Contains(w.Body.String(), c.names) {
			t.Errorf("%s %s %s: %d %s; want 400 naming %s", c.method, c.target, c.body, w.Code, w.Body.String(), c.names)
		}
	}
}

// Every answer of the admin endpoint is the instance's state at that
// moment: none may be kept by a cache between it and the prober or the
// scraper (a stale "ok" or "ready" hides an instance that went down).
func TestAdminAnswersAreNotStored(t *testing.T) {
	r, err := shm.CreatePrivate(shm.Options{Counters: 16, MaxWorkers: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	a := &admin{log: slog.New(slog.DiscardHandler), region: r}
	a.status.Store(&prefork.Status{Serving: true})
	mux := a.mux()
	for _, path := range []string{"/healthz", "/readyz", "/metrics", "/status", "/nothing"} {
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, httptest.NewRequest(http.MethodGet, path, nil))
		if got := w.Header().Get("Cache-Control"); got != "no-store" {
			t.Errorf("GET %s (%d): Cache-Control %q, want no-store", path, w.Code, got)
		}
	}
}
