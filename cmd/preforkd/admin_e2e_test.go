package main

// End-to-end tests of the admin endpoint: health and readiness, the
// bearer token of the actions, resetting a client.

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

const adminSection = "\n[admin]\nlisten = \"ADMIN_ADDR\"\n"

// /readyz answers 200 once the workers are ready, 503 within 100 ms of
// TERM, and 503 (never 200) until the supervisor exits, which a request in
// flight delays; /healthz answers 200 throughout.
func TestReadyzDuringDrain(t *testing.T) {
	t.Parallel()
	entered := make(chan struct{}, 1)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		entered <- struct{}{}
		time.Sleep(time.Second)
		fmt.Fprint(w, "slow done")
	}))
	t.Cleanup(up.Close)
	d := startDaemon(t, daemonOptions{config: baseServer(2, fmt.Sprintf("upstream = %q", up.URL)) + adminSection, admin: true})
	c := newClient(t, nil, true)
	// The supervisor publishes its snapshot a moment after it logs
	// "ready": /readyz follows within a second.
	for _, path := range []string{"/readyz", "/healthz"} {
		r := get(c, "http://"+d.admin+path)
		for deadline := time.Now().Add(time.Second); r.status != 200 && time.Now().Before(deadline); {
			time.Sleep(10 * time.Millisecond)
			r = get(c, "http://"+d.admin+path)
		}
		if r.status != 200 {
			t.Fatalf("%s after the ready line: %d %q %v, want 200", path, r.status, r.body, r.err)
		}
	}
	go get(newClient(t, nil, false), d.url("/slow"))
	select {
	case <-entered:
	case <-time.After(5 * time.Second):
		t.Fatal("the slow request did not reach the upstream")
	}

	termAt := time.Now()
	d.signal(syscall.SIGTERM)
	var flipped time.Duration
	var after []int // statuses after the flip
	for {
		select {
		case <-d.exited:
		default:
			r := get(c, "http://"+d.admin+"/readyz")
			switch {
			case flipped == 0 && r.status == http.StatusServiceUnavailable:
				flipped = time.Since(termAt)
				if !strings.Contains(string(r.body), "draining") {
					t.Errorf("/readyz while draining says %q", r.body)
				}
			case flipped != 0 && r.err == nil:
				after = append(after, r.status)
			}
			if h := get(c, "http://"+d.admin+"/healthz"); flipped != 0 && h.err == nil && h.status != 200 {
				t.Errorf("/healthz during the drain: %d, want 200", h.status)
			}
			time.Sleep(5 * time.Millisecond)
			continue
		}
		break
	}
	if flipped == 0 || flipped > 100*time.Millisecond {
		t.Fatalf("/readyz answered 503 %v after TERM (0: never); want within 100ms", flipped)
	}
	if time.Since(termAt) < 700*time.Millisecond {
		t.Errorf("the supervisor exited %v after TERM: the request in flight did not hold the drain open", time.Since(termAt))
	}
	for _, s := range after {
		if s != http.StatusServiceUnavailable {
			t.Fatalf("/readyz after the flip answered %v; want 503 until exit", after)
		}
	}
	t.Logf("/readyz: 503 %v after TERM, then %d answers of 503 until exit", flipped, len(after))
}

// writeToken writes a token file of mode perm and returns its path.
func writeToken(t *testing.T, perm os.FileMode, token string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "admin.token")
	if err := os.WriteFile(path, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, perm); err != nil {
		t.Fatal(err)
	}
	return path
}

// The admin actions need the token of admin.token_file: a daemon without
// one answers 403, a wrong or missing token gets 401, the right one
// inspects a client and resets it, after which the client's next request
// passes. A token file others can read refuses the start.
func TestAdminToken(t *testing.T) {
	t.Parallel()
	const token = "0123456789abcdef-right-token"
	tokenPath := writeToken(t, 0o600, token)
	cfg := baseServer(2, "") + adminSection + fmt.Sprintf("token_file = %q\n", tokenPath) + rule("login", "/login", "gcra", 2, "1h") +
		"\n[[idempotency]]\npath = \"/orders\"\nby = \"ip\"\nmax_body = \"4KiB\"\n"
	d := startDaemon(t, daemonOptions{config: cfg, admin: true})
	admin := newClient(t, nil, false)
	action := func(method, path, tok string) result {
		h := http.Header{}
		if tok != "" {
			h.Set("Authorization", "Bearer "+tok)
		}
		return do(admin, method, "http://"+d.admin+path, h)
	}

	ip := freshClientIP()
	client := newClient(t, ip, false)
	for i := range 2 {
		if r := do(client, http.MethodPost, d.url("/login"), nil); r.status != 200 {
			t.Fatalf("login %d: %d %v", i+1, r.status, r.err)
		}
	}
	if r := do(client, http.MethodPost, d.url("/login"), nil); r.status != 429 {
		t.Fatalf("third login: %d, want 429", r.status)
	}

	key := "/ratelimit/login?key=" + ip.String()
	for _, tc := range []struct{ name, tok string }{{"no token", ""}, {"wrong token", "0123456789abcdef-wrong-token"}, {"prefix of the token", token[:20]}} {
		r := action(http.MethodGet, key, tc.tok)
		if r.status != http.StatusUnauthorized || !strings.HasPrefix(r.header.Get("WWW-Authenticate"), "Bearer") {
			t.Errorf("%s: %d %q, want 401 with WWW-Authenticate: Bearer", tc.name, r.status, r.body)
		}
		if strings.Contains(string(r.body), token) {
			t.Errorf("%s: the answer shows the token: %s", tc.name, r.body)
		}
	}
	if r := action(http.MethodPost, "/ratelimit/login/reset?key="+ip.String(), "nope-nope-nope-nope"); r.status != http.StatusUnauthorized {
		t.Errorf("reset with a wrong token: %d, want 401", r.status)
	}
	if r := do(client, http.MethodPost, d.url("/login"), nil); r.status != 429 {
		t.Fatalf("after refused resets, the client's login: %d, want 429 still", r.status)
	}

	r := action(http.MethodGet, key, token)
	var st struct {
		Rule, Element     string
		Stored, Limited   bool
		Limit, Remaining  int64
		RetryAfterSeconds int64 `json:"retry_after_seconds"`
	}
	if err := json.Unmarshal(r.body, &st); r.status != 200 || err != nil {
		t.Fatalf("GET %s: %d %s %v", key, r.status, r.body, err)
	}
	if st.Rule != "login" || st.Element != "ip" || !st.Stored || !st.Limited || st.Limit != 2 || st.Remaining != 0 || st.RetryAfterSeconds < 1 {
		t.Errorf("state of the limited client: %+v", st)
	}
	for _, tc := range []struct {
		path string
		want int
	}{
		{"/ratelimit/nope?key=" + ip.String(), 404},
		{"/ratelimit/login", 400},
		{"/ratelimit/login?key=header:X-Api-Key:abc", 400}, // login counts by ip
	} {
		if r := action(http.MethodGet, tc.path, token); r.status != tc.want {
			t.Errorf("GET %s: %d %s, want %d", tc.path, r.status, r.body, tc.want)
		}
	}
	if r := action(http.MethodPost, "/ratelimit/login/reset?key=ip:"+ip.String(), token); r.status != 200 || !strings.Contains(string(r.body), `"reset":true`) {
		t.Fatalf("reset: %d %s", r.status, r.body)
	}
	if r := do(client, http.MethodPost, d.url("/login"), nil); r.status != 200 {
		t.Errorf("the client's login after the reset: %d, want 200", r.status)
	}

	// A stored response dropped: the retry runs again.
	order := func() result {
		return do(client, http.MethodPost, d.url("/orders"), http.Header{"Idempotency-Key": {`"order-7"`}})
	}
	if r := order(); r.status != 200 || r.header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("first order: %d %v", r.status, r.header)
	}
	if r := order(); r.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry: not replayed: %d %v", r.status, r.header)
	}
	forget := "/idempotency?key=%22order-7%22&by=ip:" + ip.String()
	if r := action(http.MethodDelete, forget, "0123456789abcdef-wrong-token"); r.status != http.StatusUnauthorized {
		t.Errorf("DELETE with a wrong token: %d", r.status)
	}
	if r := action(http.MethodDelete, forget, token); r.status != 200 || !strings.Contains(string(r.body), `"deleted":1`) {
		t.Fatalf("DELETE %s: %d %s", forget, r.status, r.body)
	}
	if r := action(http.MethodDelete, forget, token); r.status != http.StatusNotFound {
		t.Errorf("DELETE again: %d %s, want 404", r.status, r.body)
	}
	if r := order(); r.status != 200 || r.header.Get("Idempotent-Replayed") != "" {
		t.Errorf("retry after the DELETE: replayed (%v), want it to run again", r.header)
	}

	// A reload that drops the token file turns the actions off.
	noToken := strings.Replace(cfg, fmt.Sprintf("token_file = %q\n", tokenPath), "", 1)
	waitReloaded(t, d, reloadTo(d, noToken), 15*time.Second)
	if r := action(http.MethodGet, key, token); r.status != http.StatusForbidden {
		t.Errorf("with no token file: %d %s, want 403", r.status, r.body)
	}
	d.stop()

	// A token file group or others can read: refused at start, and by check.
	loose := writeToken(t, 0o644, token)
	path := filepath.Join(t.TempDir(), "loose.toml")
	if err := os.WriteFile(path, []byte(baseServer(1, "")+"\n[admin]\nlisten = \"127.0.0.1:2\"\n"+fmt.Sprintf("token_file = %q\n", loose)), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"run", "-config", path, "-listen", "127.0.0.1:1"}, {"check", "-config", path}} {
		code, _, stderr := runBinary(t, args...)
		if code != 2 || !strings.Contains(stderr, "admin.token_file") || !strings.Contains(stderr, "0644") || !strings.Contains(stderr, "chmod 600") {
			t.Errorf("preforkd %s with a 0644 token file: exit %d, stderr %q; want 2 and a message naming the mode and the fix", args[0], code, stderr)
		}
	}
}
