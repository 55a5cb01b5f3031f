package main

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// The persistence story against the built binary: state that survives a
// graceful restart, a window that elapses while down, a live region that
// survives kill -9 of the whole process tree, dumps that are refused with
// their reason while the server still starts, and stored responses kept
// or dropped by persist.key.

// persistConfig is a two-worker configuration with body appended.
func persistConfig(body string) string {
	return "[server]\nworkers = 2\nshutdown_timeout = \"5s\"\n" + body
}

func TestPersistEndToEnd(t *testing.T) {
	t.Run("limited client stays limited across a restart", func(t *testing.T) {
		dump := filepath.Join(t.TempDir(), "dump")
		cfg := persistConfig(fmt.Sprintf(`
[persist]
path = %q
[[ratelimit]]
name = "login"
path = "/login"
limit = 3
window = "1m"
`, dump))
		c := newClient(t, nil, false)
		d := startDaemon(t, daemonOptions{config: cfg})
		for i := 0; i < 3; i++ {
			if r := do(c, "POST", d.url("/login"), nil); r.status != 200 {
				t.Fatalf("request %d: %d %v", i+1, r.status, r.err)
			}
		}
		r := do(c, "POST", d.url("/login"), nil)
		before, _ := strconv.Atoi(r.header.Get("Retry-After"))
		if r.status != 429 || before < 1 {
			t.Fatalf("4th: %d, Retry-After %q", r.status, r.header.Get("Retry-After"))
		}
		down := time.Now()
		d.stop()
		if !strings.Contains(d.logs.text(), `msg="dump written"`) {
			t.Fatalf("no dump written:\n%s", d.logs.text())
		}
		d = startDaemon(t, daemonOptions{config: cfg})
		downtime := time.Since(down)
		r = do(c, "POST", d.url("/login"), nil)
		after, _ := strconv.Atoi(r.header.Get("Retry-After"))
		// The same Retry-After, less the seconds spent down (rounding up
		// on both sides allows one second).
		if r.status != 429 || after > before || after < before-int(downtime.Seconds())-1 {
			t.Fatalf("after restart: %d, Retry-After %d (before %d, down %v)", r.status, after, before, downtime)
		}
		if !strings.Contains(d.logs.text(), `msg="persist: dump loaded"`) {
			t.Fatalf("dump not loaded:\n%s", d.logs.text())
		}
		if _, err := os.Stat(dump); err == nil {
			t.Fatal("the dump was not consumed by the load")
		}
		d.stop()
	})

	t.Run("a start refused after the load keeps the dump", func(t *testing.T) {
		dir := t.TempDir()
		admin := freeAddr(t)
		cfg := persistConfig(fmt.Sprintf(`
[admin]
listen = %q
[persist]
path = %q
[[ratelimit]]
name = "login"
path = "/login"
limit = 3
window = "1h"
`, admin, filepath.Join(dir, "dump")))
		c := newClient(t, nil, false)
		d := startDaemon(t, daemonOptions{config: cfg})
		for range 3 {
			do(c, "POST", d.url("/login"), nil)
		}
		d.stop()
		// Something else holds the admin address: the next start is
		// refused, after the region was made.
		held, err := net.Listen("tcp", admin)
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(dir, "refused.toml")
		os.WriteFile(path, []byte(cfg), 0o600)
		code, _, stderr := runBinary(t, "run", "-config", path, "-listen", freeAddr(t))
		held.Close()
		if code != 1 || !strings.Contains(stderr, "admin: listen") {
			t.Fatalf("start with the admin address taken: exit %d\n%s", code, stderr)
		}
		// Nothing was lost: the client is still limited.
		d = startDaemon(t, daemonOptions{config: cfg})
		if r := do(c, "POST", d.url("/login"), nil); r.status != 429 {
			t.Errorf("after the refused start: %d, want 429 (the dump was lost)\n%s", r.status, d.logs.text())
		}
		d.stop()
	})

	t.Run("a window that elapsed while down is served again", func(t *testing.T) {
		cfg := persistConfig(fmt.Sprintf(`
[persist]
path = %q
[[ratelimit]]
name = "w"
path = "/w"
limit = 2
window = "2s"
algorithm = "fixed-window"
`, filepath.Join(t.TempDir(), "dump")))
		c := newClient(t, nil, false)
		d := startDaemon(t, daemonOptions{config: cfg})
		for i := 0; i < 2; i++ {
			get(c, d.url("/w"))
		}
		if r := get(c, d.url("/w")); r.status != 429 {
			t.Fatalf("3rd in the window: %d", r.status)
		}
		d.stop()
		time.Sleep(2100 * time.Millisecond) // the window ends while nothing runs
		d = startDaemon(t, daemonOptions{config: cfg})
		if r := get(c, d.url("/w")); r.status != 200 {
			t.Fatalf("after the window elapsed during downtime: %d", r.status)
		}
		d.stop()
	})

	t.Run("live region survives kill -9 of the whole tree", func(t *testing.T) {
		live := liveRegionPath(t)
		cfg := persistConfig(fmt.Sprintf(`
[persist]
live = %q
[[ratelimit]]
name = "api"
path = "/api/*"
limit = 40
window = "1h"
algorithm = "fixed-window"
`, live))
		c := newClient(t, nil, false)
		d := startDaemon(t, daemonOptions{config: cfg})
		// 25 allowed under concurrent load from 5 goroutines.
		var wg sync.WaitGroup
		var ok atomic.Int32
		for range 5 {
			wg.Go(func() {
				for range 5 {
					if get(c, d.url("/api/x")).status == 200 {
						ok.Add(1)
					}
				}
			})
		}
		wg.Wait()
		if ok.Load() != 25 {
			t.Fatalf("%d allowed before the crash, want 25", ok.Load())
		}
		// A second supervisor on the same live region refuses to start.
		second := filepath.Join(t.TempDir(), "second.toml")
		os.WriteFile(second, []byte(fmt.Sprintf("[persist]\nlive = %q\n", live)), 0o600)
		if out, err := exec.Command(preforkdBinary(t), "run", "-config", second, "-listen", freeAddr(t)).CombinedOutput(); err == nil || !strings.Contains(string(out), "in use") {
			t.Fatalf("second supervisor on the live region: %v\n%s", err, out)
		}
		// kill -9 of the supervisor; its workers die with it (and are
		// checked for by kill).
		d.kill()
		d = startDaemon(t, daemonOptions{config: cfg})
		allowed := 0
		for range 20 {
			if get(c, d.url("/api/x")).status == 200 {
				allowed++
			}
		}
		if allowed != 15 {
			t.Fatalf("after kill -9 and restart: %d allowed, want exactly the 15 left", allowed)
		}
		d.stop()
	})

	t.Run("refused dumps name their reason and the server serves", func(t *testing.T) {
		for _, tc := range []struct {
			name    string
			prepare func(path string)
			reason  string
		}{
			{"empty file", func(p string) { os.WriteFile(p, nil, 0o600) }, "truncated"},
			{"garbage", func(p string) { os.WriteFile(p, []byte("not a dump, not at all, really not"), 0o600) }, "bad magic"},
			// A directory at the path is refused at start instead: no dump
			// could ever replace it (TestPersistDirCheckedAtStart).
		} {
			t.Run(tc.name, func(t *testing.T) {
				dump := filepath.Join(t.TempDir(), "dump")
				tc.prepare(dump)
				d := startDaemon(t, daemonOptions{config: persistConfig(fmt.Sprintf("[persist]\npath = %q\n", dump))})
				if r := get(newClient(t, nil, false), d.url("/")); r.status != 200 {
					t.Fatalf("server does not serve: %d %v", r.status, r.err)
				}
				if !strings.Contains(d.logs.text(), tc.reason) {
					t.Fatalf("no log line naming %q:\n%s", tc.reason, d.logs.text())
				}
				d.signal(syscall.SIGTERM)
				d.wait(15 * time.Second)
			})
		}
	})

	t.Run("stored responses survive a restart under the same persist.key only", func(t *testing.T) {
		var executions atomic.Int32
		up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			n := executions.Add(1)
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Location", "/orders/"+strconv.Itoa(int(n)))
			w.WriteHeader(201)
			fmt.Fprintf(w, `{"execution":%d}`, n)
		}))
		defer up.Close()
		dump := filepath.Join(t.TempDir(), "dump")
		config := func(key string) string {
			return persistConfig(fmt.Sprintf(`upstream = %q
[table]
responses = 64
response_bytes = "1MiB"
[persist]
path = %q
key = %q
[[idempotency]]
path = "/orders"
`, up.URL, dump, key))
		}
		c := newClient(t, nil, false)
		post := func(d *daemon) result {
			return send(c, "POST", d.url("/orders"), http.Header{"Idempotency-Key": {`"order-1"`}}, `{"item":1}`)
		}
		d := startDaemon(t, daemonOptions{config: config("v1")})
		first := post(d)
		if first.status != 201 || executions.Load() != 1 {
			t.Fatalf("first: %d %v, %d executions", first.status, first.err, executions.Load())
		}
		d.stop()
		d = startDaemon(t, daemonOptions{config: config("v1")})
		r := post(d)
		if r.status != 201 || string(r.body) != string(first.body) || r.header.Get("Idempotent-Replayed") != "true" ||
			r.header.Get("Location") != "/orders/1" || executions.Load() != 1 {
			t.Fatalf("same persist.key: %d %q %v, %d executions", r.status, r.body, r.header, executions.Load())
		}
		d.stop()
		d = startDaemon(t, daemonOptions{config: config("v2")})
		if r := post(d); r.status != 201 || executions.Load() != 2 || string(r.body) == string(first.body) {
			t.Fatalf("other persist.key: %d %q, %d executions (want a new execution)", r.status, r.body, executions.Load())
		}
		if !strings.Contains(d.logs.text(), "persist") {
			t.Fatalf("no log line about the dropped responses:\n%s", d.logs.text())
		}
		d.stop()
	})
}

// A stored gzip response is replayed after a restart with its
// Content-Encoding: without it the body the client gets cannot be read.
func TestPersistReplayKeepsContentEncoding(t *testing.T) {
	var executions atomic.Int32
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write([]byte(`{"order":1}`))
	zw.Close()
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		executions.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Encoding", "gzip")
		w.WriteHeader(201)
		w.Write(gz.Bytes())
	}))
	defer up.Close()
	dump := filepath.Join(t.TempDir(), "dump")
	cfg := persistConfig(fmt.Sprintf(`upstream = %q
[table]
responses = 64
response_bytes = "1MiB"
[persist]
path = %q
key = "v1"
[[idempotency]]
path = "/orders"
`, up.URL, dump))
	c := newClient(t, nil, false)
	post := func(d *daemon) result {
		return send(c, "POST", d.url("/orders"), http.Header{"Idempotency-Key": {`"order-1"`}, "Accept-Encoding": {"gzip"}}, `{"item":1}`)
	}
	d := startDaemon(t, daemonOptions{config: cfg})
	if r := post(d); r.status != 201 || r.header.Get("Content-Encoding") != "gzip" {
		t.Fatalf("first: %d %v %v", r.status, r.err, r.header)
	}
	if r := post(d); r.header.Get("Idempotent-Replayed") != "true" || r.header.Get("Content-Encoding") != "gzip" {
		t.Fatalf("replay before the restart: %d %v", r.status, r.header)
	}
	d.stop()
	d = startDaemon(t, daemonOptions{config: cfg})
	defer d.stop()
	r := post(d)
	if r.status != 201 || r.header.Get("Idempotent-Replayed") != "true" || executions.Load() != 1 {
		t.Fatalf("after the restart: %d %v, %d executions", r.status, r.header, executions.Load())
	}
	if r.header.Get("Content-Encoding") != "gzip" || !bytes.Equal(r.body, gz.Bytes()) {
		t.Fatalf("replay after the restart: Content-Encoding %q, body %q: want the gzip body with its coding",
			r.header.Get("Content-Encoding"), r.body)
	}
}
