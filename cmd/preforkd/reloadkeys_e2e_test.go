//go:build linux

package main

// End-to-end test of what a reload (HUP) does with each key: one TLS
// daemon with a cleartext port that serves, many reloads, each changing
// keys between two valid values and checking from outside, on both
// ports (the TLS port's net/http engine, the cleartext port's event
// loop), that the new value runs, or that the log names the key and says
// a restart is needed.

import (
	"crypto/tls"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/preforkd/preforkd/internal/tlstest"
)

// reloadKeys is the file of one step: the base configuration with these
// lines added to their tables.
type reloadKeys struct {
	server, log, tls, admin, tail string
}

func TestReloadAppliesKeysE2E(t *testing.T) {
	t.Parallel()
	ca := tlstest.NewCA(t)
	dir := t.TempDir()
	cert, key := ca.Files(t, dir, "a", "a.example")
	clear := freeAddr(t)
	token := filepath.Join(dir, "token")
	if err := os.WriteFile(token, []byte("0123456789abcdef0123\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			time.Sleep(time.Second)
		}
		w.Header().Set("X-App", "yes")
		w.Header().Set("X-Reset", "other")
		fmt.Fprintln(w, "app")
	}))
	t.Cleanup(app.Close)
	file := func(k reloadKeys) string {
		if !strings.Contains(k.server, "workers") {
			k.server += "\nworkers = 1"
		}
		if !strings.Contains(k.tls, "cleartext =") {
			k.tls += "\ncleartext = \"serve\""
		}
		return fmt.Sprintf(`[server]
shutdown_timeout = "5s"
%s
[admin]
listen = "ADMIN_ADDR"
%s
[log]
%s
[table]
counters = 1024

[reload]
canary = false

[tls]
cleartext_listen = %q
%s
[[tls.certificate]]
cert = %q
key = %q
%s`, k.server, k.admin, k.log, clear, k.tls, cert, key, k.tail)
	}
	d := startDaemon(t, daemonOptions{config: file(reloadKeys{}), admin: true})
	plain := newClient(t, nil, false)
	plain.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	tlsc := newClient(t, nil, false)
	tlsc.CheckRedirect = plain.CheckRedirect
	tlsc.Transport.(*http.Transport).TLSClientConfig = &tls.Config{ServerName: "a.example", RootCAs: ca.Pool}
	// both sends a request built by mk to each port and checks its answer.
	both := func(t *testing.T, path string, mk func(*http.Request), check func(port string, r result) string) {
		t.Helper()
		for _, p := range []struct {
			name string
			c    *http.Client
			base string
		}{{"tls", tlsc, "https://" + d.addr}, {"cleartext", plain, "http://" + clear}} {
			req, _ := http.NewRequest(http.MethodGet, p.base+path, nil)
			if mk != nil {
				mk(req)
			}
			res := result{}
			resp, err := p.c.Do(req)
			if err != nil {
				t.Errorf("%s port: %v", p.name, err)
				continue
			}
			res.status, res.header = resp.StatusCode, resp.Header
			resp.Body.Close()
			if why := check(p.name, res); why != "" {
				t.Errorf("%s port: %s", p.name, why)
			}
		}
	}
	lineAfter := func(from int, match func(logLine) bool) bool {
		_, _, ok := d.logs.waitFor(from, 5*time.Second, match)
		return ok
	}
	restartNeeded := func(key string) func(logLine) bool {
		return func(l logLine) bool {
			return strings.Contains(l.msg(), "need a restart") && strings.Contains(l.get("ignored"), key)
		}
	}
	rule := `
[[ratelimit]]
name = "r"
path = "/r/*"
limit = 100
window = "1h"
by = "ip"
`
	upstream := fmt.Sprintf("upstream = %q\n", app.URL)
	limitOne := func(name string) string {
		return fmt.Sprintf("\n[[ratelimit]]\nname = %q\npath = \"/%s\"\nlimit = 1\nwindow = \"1h\"\n", name, name)
	}
	// twice sends two requests to path on each port, the second with
	// X-Forwarded-For: xff (its last digit the port's: the ports share
	// their counts), and wants the second's status.
	twice := func(t *testing.T, path, xff string, want int) {
		t.Helper()
		n := 0
		both(t, path, nil, func(string, result) string { return "" })
		both(t, path, func(r *http.Request) { n++; r.Header.Set("X-Forwarded-For", xff+strconv.Itoa(n)) }, func(port string, r result) string {
			if r.status != want {
				return fmt.Sprintf("second request: %d, want %d", r.status, want)
			}
			return ""
		})
	}
	access := filepath.Join(dir, "access.log")
	steps := []struct {
		name   string
		keys   reloadKeys
		refuse bool // the reload is refused
		check  func(t *testing.T, from int)
	}{
		{"server.upstream", reloadKeys{server: fmt.Sprintf("upstream = %q", app.URL)}, false, func(t *testing.T, _ int) {
			both(t, "/x", nil, func(_ string, r result) string {
				if r.header.Get("X-App") != "yes" {
					return fmt.Sprintf("status %d without the new upstream's field", r.status)
				}
				return ""
			})
		}},
		{"server.headers, request_id, health_path", reloadKeys{server: `headers = "x"
request_id = "X-Trace"
health_path = "/hz"`, tail: rule}, false, func(t *testing.T, _ int) {
			both(t, "/r/1", nil, func(_ string, r result) string {
				if r.header.Get("X-Ratelimit-Limit") != "100" || r.header.Get("Ratelimit-Policy") != "" || r.header.Get("X-Trace") == "" {
					return fmt.Sprintf("fields %v", r.header)
				}
				return ""
			})
			both(t, "/hz", nil, func(_ string, r result) string {
				if r.status != 200 || r.header.Get("X-Ratelimit-Limit") != "" {
					return fmt.Sprintf("health path: %d %v", r.status, r.header)
				}
				return ""
			})
		}},
		{"server.case_sensitive, exempt", reloadKeys{server: `case_sensitive = true
exempt = ["127.0.0.0/8"]`, tail: rule}, false, func(t *testing.T, _ int) {
			both(t, "/r/1", nil, func(_ string, r result) string {
				if r.header.Get("Ratelimit-Policy") != "" {
					return "an exempt client counted"
				}
				return ""
			})
		}},
		{"server.max_header_bytes", reloadKeys{server: `max_header_bytes = "4KiB"`}, false, func(t *testing.T, _ int) {
			both(t, "/x", func(r *http.Request) { r.Header.Set("X-Big", strings.Repeat("a", 6000)) }, func(_ string, r result) string {
				if r.status != http.StatusRequestHeaderFieldsTooLarge {
					return fmt.Sprintf("a 6000-byte field: %d, want 431", r.status)
				}
				return ""
			})
		}},
		{"tls.min_version, tls.cleartext, tls.redirect_port", reloadKeys{tls: `min_version = "1.3"
cleartext = "redirect"
redirect_port = 8443`}, false, func(t *testing.T, _ int) {
			if r := get(plain, "http://"+clear+"/x?a=1"); r.status != http.StatusPermanentRedirect || r.header.Get("Location") != "https://"+hostOf(clear)+":8443/x?a=1" {
				t.Errorf("cleartext port: %d %q, want 308 to port 8443", r.status, r.header.Get("Location"))
			}
			old := newClient(t, nil, false)
			old.Transport.(*http.Transport).TLSClientConfig = &tls.Config{ServerName: "a.example", RootCAs: ca.Pool, MaxVersion: tls.VersionTLS12}
			if r := get(old, "https://"+d.addr+"/x"); r.err == nil {
				t.Errorf("a TLS 1.2 client was served (%d) with min_version = 1.3", r.status)
			}
		}},
		{"log.level, server.max_requests", reloadKeys{log: `level = "debug"`, server: "max_requests = 20"}, false, func(t *testing.T, from int) {
			if !lineAfter(from, func(l logLine) bool { return l.get("level") == "DEBUG" }) {
				t.Error("no debug line after the reload to log.level = debug")
			}
			for range 40 {
				get(plain, "http://"+clear+"/x")
			}
			if !lineAfter(from, func(l logLine) bool { return l.msg() == "worker recycling" }) {
				t.Error("no worker recycled after 40 requests with max_requests = 20")
			}
		}},
		{"server.trusted_proxies", reloadKeys{server: upstream + `trusted_proxies = ["127.0.0.1/32"]`, tail: limitOne("t1") + limitOne("t2")}, false, func(t *testing.T, _ int) {
			twice(t, "/t1", "192.0.2.1", 200)
		}},
		{"server.trusted_proxies back", reloadKeys{server: upstream, tail: limitOne("t1") + limitOne("t2")}, false, func(t *testing.T, _ int) {
			twice(t, "/t2", "192.0.2.2", 429)
		}},
		{"server.shadow", reloadKeys{server: upstream + "shadow = true", tail: limitOne("s1")}, false, func(t *testing.T, _ int) {
			twice(t, "/s1", "192.0.2.3", 200)
		}},
		{"server.reset_header, upstream_timeout, log.access", reloadKeys{server: upstream + `reset_header = "X-Reset"
upstream_timeout = "300ms"`, log: fmt.Sprintf("access = %q", access)}, false, func(t *testing.T, _ int) {
			both(t, "/x", nil, func(_ string, r result) string {
				if r.header.Get("X-Reset") != "" || r.header.Get("X-App") != "yes" {
					return fmt.Sprintf("reset_header not removed: %v", r.header)
				}
				return ""
			})
			both(t, "/slow", nil, func(_ string, r result) string {
				if r.status != http.StatusGatewayTimeout {
					return fmt.Sprintf("an upstream 1 s late: %d, want 504", r.status)
				}
				return ""
			})
			deadline := time.Now().Add(5 * time.Second)
			for {
				b, _ := os.ReadFile(access)
				if strings.Contains(string(b), "scheme=https") && strings.Contains(string(b), "scheme=http\n") {
					break
				}
				if time.Now().After(deadline) {
					t.Errorf("access log: %q, want lines of both ports", b)
					break
				}
				time.Sleep(50 * time.Millisecond)
			}
		}},
		{"restart-only keys", reloadKeys{server: "workers = 2"}, false, func(t *testing.T, from int) {
			if !lineAfter(from, restartNeeded("server.workers")) {
				t.Error("no line saying server.workers needs a restart")
			}
		}},
		{"admin.token_file", reloadKeys{admin: fmt.Sprintf("token_file = %q", token), tail: rule}, false, func(t *testing.T, _ int) {
			req, _ := http.NewRequest(http.MethodGet, "http://"+d.admin+"/ratelimit/r?key=127.0.0.1", nil)
			req.Header.Set("Authorization", "Bearer 0123456789abcdef0123")
			resp, err := plain.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != 200 {
				t.Errorf("an action with the new token: %d, want 200", resp.StatusCode)
			}
		}},
	}
	for _, s := range steps {
		t.Run(s.name, func(t *testing.T) {
			from := reloadTo(d, file(s.keys))
			if s.refuse {
				return
			}
			// Once the reload is announced: the old workers took no
			// connection after they said they stopped accepting, which
			// the announcement waits for (README: READY=1 once every
			// worker runs the new configuration).
			waitReloaded(t, d, from, 15*time.Second)
			s.check(t, from)
		})
	}
	d.stop()
}

// hostOf is the host of a host:port.
func hostOf(addr string) string {
	h, _, _ := strings.Cut(addr, ":")
	return h
}
