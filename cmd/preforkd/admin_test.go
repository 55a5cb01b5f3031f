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
	"testing"
	"time"

	"github.com/preforkd/preforkd/config"
	"github.com/preforkd/preforkd/prefork"
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
