package main

import (
	"context"
	"encoding/binary"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/preforkd/preforkd/config"
	"github.com/preforkd/preforkd/prefork"
)

// A token file that systemd's LoadCredential= wrote: root-owned, mode
// 0400, and an ACL entry that lets the service's user read it, which
// makes the mode read 0440. It is accepted; an ACL that lets anyone else
// read it is not, nor a group-readable file without an ACL.
func TestTokenFileACL(t *testing.T) {
	dir, err := os.MkdirTemp("/dev/shm", "preforkd-acl-") // tmpfs: POSIX ACLs
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	self := uint32(os.Geteuid())
	other := uint32(65534)
	if self == other {
		other = 65533
	}
	type entry struct {
		tag, perm uint16
		id        uint32
	}
	acl := func(es ...entry) []byte {
		b := binary.LittleEndian.AppendUint32(nil, aclVersion)
		for _, e := range es {
			b = binary.LittleEndian.AppendUint16(b, e.tag)
			b = binary.LittleEndian.AppendUint16(b, e.perm)
			b = binary.LittleEndian.AppendUint32(b, e.id)
		}
		return b
	}
	const r, none, anyone = 4, 0, 0xffffffff
	for _, tc := range []struct {
		name string
		mode os.FileMode
		acl  []byte
		ok   bool
	}{
		{"credential: the service's user by ACL", 0o400, acl(entry{aclUserObj, r, anyone}, entry{aclUser, r, self}, entry{aclGroupObj, none, anyone}, entry{aclMask, r, anyone}, entry{aclOther, none, anyone}), true},
		{"ACL: another user may read", 0o400, acl(entry{aclUserObj, r, anyone}, entry{aclUser, r, other}, entry{aclGroupObj, none, anyone}, entry{aclMask, r, anyone}, entry{aclOther, none, anyone}), false},
		{"ACL: the group may read", 0o400, acl(entry{aclUserObj, r, anyone}, entry{aclUser, r, self}, entry{aclGroupObj, r, anyone}, entry{aclMask, r, anyone}, entry{aclOther, none, anyone}), false},
		{"ACL: a named group may read", 0o400, acl(entry{aclUserObj, r, anyone}, entry{aclGroupObj, none, anyone}, entry{aclGroup, r, 100}, entry{aclMask, r, anyone}, entry{aclOther, none, anyone}), false},
		{"no ACL, group-readable", 0o440, nil, false},
		{"no ACL, 0600", 0o600, nil, true},
	} {
		path := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "_"))
		if err := os.WriteFile(path, []byte("0123456789abcdef0123\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(path, tc.mode); err != nil {
			t.Fatal(err)
		}
		if tc.acl != nil {
			if err := unix.Setxattr(path, aclXattr, tc.acl, 0); err != nil {
				if errors.Is(err, unix.EOPNOTSUPP) && os.Getenv("CI") == "" {
					t.Skipf("no POSIX ACLs on %s: %v", dir, err)
				}
				t.Fatalf("%s: setting the ACL: %v", tc.name, err)
			}
		}
		fi, _ := os.Stat(path)
		_, err := readToken(path)
		if (err == nil) != tc.ok {
			t.Errorf("%s (mode %v): readToken: %v, want accepted %v", tc.name, fi.Mode().Perm(), err, tc.ok)
		}
	}
}

// The admin endpoint serves from before the supervisor's first status
// snapshot, which holds the running configuration's token file: an
// action then is told to try again (503), not that actions are off (403,
// "set admin.token_file"), which the configuration may well set.
func TestActionBeforeTheFirstStatus(t *testing.T) {
	a := &admin{log: slog.New(slog.DiscardHandler)}
	ran := false
	h := a.authorize(func(http.ResponseWriter, *http.Request) { ran = true })
	w := httptest.NewRecorder()
	r := httptest.NewRequest(http.MethodPost, "/ratelimit/login/reset?key=192.0.2.1", nil)
	r.Header.Set("Authorization", "Bearer 0123456789abcdef0123")
	h.ServeHTTP(w, r)
	if ran || w.Code != http.StatusServiceUnavailable || w.Header().Get("Retry-After") == "" || strings.Contains(w.Body.String(), "token_file") {
		t.Errorf("an action before the first status: %d (ran %v) Retry-After %q %s; want 503 with Retry-After",
			w.Code, ran, w.Header().Get("Retry-After"), w.Body.String())
	}
}

// countingHandler counts the log lines at or above level.
type countingHandler struct {
	level slog.Level
	n     *atomic.Int64
}

func (h countingHandler) Enabled(_ context.Context, l slog.Level) bool { return l >= h.level }
func (h countingHandler) Handle(context.Context, slog.Record) error    { h.n.Add(1); return nil }
func (h countingHandler) WithAttrs([]slog.Attr) slog.Handler           { return h }
func (h countingHandler) WithGroup(string) slog.Handler                { return h }

// A token file that became unusable after the start (rewritten with
// mode 0644, or removed) refuses every action with 503 and says why in
// the log; whoever reaches the endpoint, token or not, must not be able
// to write a log line per request with it: the line is written at most
// once a second, as for wrong tokens.
func TestUnusableTokenFileLogsAtMostOnceASecond(t *testing.T) {
	token := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(token, []byte("0123456789abcdef0123\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(token, 0o644); err != nil {
		t.Fatal(err)
	}
	var lines atomic.Int64
	a := &admin{log: slog.New(countingHandler{slog.LevelWarn, &lines})}
	a.status.Store(&prefork.Status{Settings: prefork.Settings{Config: config.Config{Admin: config.Admin{TokenFile: token}}}, Serving: true})
	h := a.authorize(func(http.ResponseWriter, *http.Request) { t.Error("an action ran with an unusable token file") })
	start := time.Now()
	const requests = 50
	for range requests {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest(http.MethodPost, "/ratelimit/login/reset?key=192.0.2.1", nil))
		if w.Code != http.StatusServiceUnavailable {
			t.Fatalf("an action with a 0644 token file: %d %s, want 503", w.Code, w.Body.String())
		}
	}
	// One line for the first request, and one more for each second the
	// requests took beyond it.
	if most := int64(1 + time.Since(start)/time.Second); lines.Load() > most {
		t.Errorf("%d requests with an unusable token file wrote %d log lines, want at most %d", requests, lines.Load(), most)
	}
	if lines.Load() == 0 {
		t.Error("an unusable token file was not logged")
	}
}

// Authorization is a field a request has once (RFC 9110 §11.6.2): with two
// of them, which one was meant cannot be told, and an intermediary may
// have added either. Such a request is refused (401) whichever of the two
// holds the token, never authorized by the first field alone.
func TestTwoAuthorizationFieldsAreRefused(t *testing.T) {
	const right = "Bearer 0123456789abcdef0123"
	token := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(token, []byte("0123456789abcdef0123\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	a := &admin{log: slog.New(slog.DiscardHandler)}
	a.status.Store(&prefork.Status{Settings: prefork.Settings{Config: config.Config{Admin: config.Admin{TokenFile: token}}}, Serving: true})
	for _, c := range []struct {
		name   string
		fields []string
		want   int
	}{
		{"the token", []string{right}, http.StatusOK},
		{"the token, then another", []string{right, "Bearer 0123456789abcdef-wrong"}, http.StatusUnauthorized},
		{"another, then the token", []string{"Bearer 0123456789abcdef-wrong", right}, http.StatusUnauthorized},
		{"the token twice", []string{right, right}, http.StatusUnauthorized},
		{"the token, then an empty field", []string{right, ""}, http.StatusUnauthorized},
	} {
		ran := false
		h := a.authorize(func(http.ResponseWriter, *http.Request) { ran = true })
		r := httptest.NewRequest(http.MethodPost, "/ratelimit/login/reset?key=192.0.2.1", nil)
		r.Header["Authorization"] = c.fields
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if code := map[bool]int{true: http.StatusOK, false: w.Code}[ran]; code != c.want {
			t.Errorf("%s: %d (ran %v) %s, want %d", c.name, w.Code, ran, w.Body.String(), c.want)
		}
	}
}
