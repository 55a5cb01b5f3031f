package main

import (
	"bufio"
	"fmt"
	"io"
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

// peDaemon is one preforkd process with its log.
type peDaemon struct {
	cmd  *exec.Cmd
	addr string
	mu   sync.Mutex
	log  strings.Builder
	done chan struct{}
}

func peStart(t *testing.T, bin, conf, addr string) *peDaemon {
	t.Helper()
	d := &peDaemon{addr: addr, done: make(chan struct{})}
	d.cmd = exec.Command(bin, "run", "-config", conf)
	stderr, err := d.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(d.done)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			d.mu.Lock()
			d.log.WriteString(sc.Text() + "\n")
			d.mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		if d.cmd.ProcessState == nil {
			d.cmd.Process.Kill()
			d.cmd.Wait()
		}
	})
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(d.text(), `msg=ready`) {
		if time.Now().After(deadline) {
			t.Fatalf("preforkd did not become ready:\n%s", d.text())
		}
		time.Sleep(20 * time.Millisecond)
	}
	return d
}

func (d *peDaemon) text() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.log.String()
}

// stop sends TERM and waits for a clean exit.
func (d *peDaemon) stop(t *testing.T) {
	t.Helper()
	d.cmd.Process.Signal(syscall.SIGTERM)
	exited := make(chan error, 1)
	go func() { exited <- d.cmd.Wait() }()
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("preforkd exited with %v:\n%s", err, d.text())
		}
	case <-time.After(15 * time.Second):
		t.Fatalf("preforkd did not exit after TERM:\n%s", d.text())
	}
	<-d.done
}

// workerPIDs lists the pids of the "worker started" lines.
func (d *peDaemon) workerPIDs() []int {
	var pids []int
	for _, line := range strings.Split(d.text(), "\n") {
		if strings.Contains(line, `msg="worker started"`) {
			for _, f := range strings.Fields(line) {
				if v, ok := strings.CutPrefix(f, "pid="); ok {
					if pid, err := strconv.Atoi(v); err == nil {
						pids = append(pids, pid)
					}
				}
			}
		}
	}
	return pids
}

func peAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

func peRequest(t *testing.T, method, url string, header map[string]string, body string) (int, http.Header, string) {
	t.Helper()
	req, _ := http.NewRequest(method, url, strings.NewReader(body))
	for k, v := range header {
		req.Header.Set(k, v)
	}
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(b)
}

func peBuild(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "preforkd")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	return bin
}

func peConfig(t *testing.T, dir, addr, body string) string {
	t.Helper()
	conf := filepath.Join(dir, "preforkd.toml")
	if err := os.WriteFile(conf, []byte(fmt.Sprintf("[server]\nlisten = %q\nworkers = 2\nshutdown_timeout = \"5s\"\n%s", addr, body)), 0o600); err != nil {
		t.Fatal(err)
	}
	return conf
}

func TestPersistEndToEnd(t *testing.T) {
	bin := peBuild(t)

	t.Run("limited client stays limited across a restart", func(t *testing.T) {
		dir, addr := t.TempDir(), peAddr(t)
		conf := peConfig(t, dir, addr, fmt.Sprintf(`
[persist]
path = %q
[[ratelimit]]
name = "login"
path = "/login"
limit = 3
window = "1m"
`, filepath.Join(dir, "dump")))
		d := peStart(t, bin, conf, addr)
		for i := 0; i < 3; i++ {
			if code, _, _ := peRequest(t, "POST", "http://"+addr+"/login", nil, ""); code != 200 {
				t.Fatalf("request %d: %d", i+1, code)
			}
		}
		code, h, _ := peRequest(t, "POST", "http://"+addr+"/login", nil, "")
		before, _ := strconv.Atoi(h.Get("Retry-After"))
		if code != 429 || before < 1 {
			t.Fatalf("4th: %d, Retry-After %q", code, h.Get("Retry-After"))
		}
		down := time.Now()
		d.stop(t)
		if !strings.Contains(d.text(), `msg="dump written"`) {
			t.Fatalf("no dump written:\n%s", d.text())
		}
		d = peStart(t, bin, conf, addr)
		downtime := time.Since(down)
		code, h, _ = peRequest(t, "POST", "http://"+addr+"/login", nil, "")
		after, _ := strconv.Atoi(h.Get("Retry-After"))
		// The same Retry-After, less the seconds spent down (rounding up
		// on both sides allows one second).
		if code != 429 || after > before || after < before-int(downtime.Seconds())-1 {
			t.Fatalf("after restart: %d, Retry-After %d (before %d, down %v):\n%s", code, after, before, downtime, d.text())
		}
		if !strings.Contains(d.text(), `msg="persist: dump loaded"`) {
			t.Fatalf("dump not loaded:\n%s", d.text())
		}
		if _, err := os.Stat(filepath.Join(dir, "dump")); err == nil {
			t.Fatal("the dump was not consumed by the load")
		}
		d.stop(t)
	})

	t.Run("a window that elapsed while down is served again", func(t *testing.T) {
		dir, addr := t.TempDir(), peAddr(t)
		conf := peConfig(t, dir, addr, fmt.Sprintf(`
[persist]
path = %q
[[ratelimit]]
name = "w"
path = "/w"
limit = 2
window = "2s"
algorithm = "fixed-window"
`, filepath.Join(dir, "dump")))
		d := peStart(t, bin, conf, addr)
		for i := 0; i < 2; i++ {
			peRequest(t, "GET", "http://"+addr+"/w", nil, "")
		}
		if code, _, _ := peRequest(t, "GET", "http://"+addr+"/w", nil, ""); code != 429 {
			t.Fatalf("3rd in the window: %d", code)
		}
		d.stop(t)
		time.Sleep(2100 * time.Millisecond) // the window ends while nothing runs
		d = peStart(t, bin, conf, addr)
		if code, _, _ := peRequest(t, "GET", "http://"+addr+"/w", nil, ""); code != 200 {
			t.Fatalf("after the window elapsed during downtime: %d", code)
		}
		d.stop(t)
	})

	t.Run("live region survives kill -9 of the whole tree", func(t *testing.T) {
		dir, addr := t.TempDir(), peAddr(t)
		live := filepath.Join("/dev/shm", fmt.Sprintf("preforkd-test-%d-%d", os.Getpid(), time.Now().UnixNano()))
		t.Cleanup(func() { os.Remove(live); os.Remove(live + ".lock") })
		conf := peConfig(t, dir, addr, fmt.Sprintf(`
[persist]
live = %q
[[ratelimit]]
name = "api"
path = "/api/*"
limit = 40
window = "1h"
algorithm = "fixed-window"
`, live))
		d := peStart(t, bin, conf, addr)
		// 25 allowed under concurrent load from 5 clients.
		var wg sync.WaitGroup
		var ok atomic.Int32
		for g := 0; g < 5; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < 5; i++ {
					if code, _, _ := peRequest(t, "GET", "http://"+addr+"/api/x", nil, ""); code == 200 {
						ok.Add(1)
					}
				}
			}()
		}
		wg.Wait()
		if ok.Load() != 25 {
			t.Fatalf("%d allowed before the crash, want 25", ok.Load())
		}
		// A second supervisor on the same live region refuses to start.
		if out, err := exec.Command(bin, "run", "-config", peConfig(t, t.TempDir(), peAddr(t), fmt.Sprintf("[persist]\nlive = %q\n", live))).CombinedOutput(); err == nil || !strings.Contains(string(out), "in use") {
			t.Fatalf("second supervisor on the live region: %v\n%s", err, out)
		}
		workers := d.workerPIDs()
		d.cmd.Process.Signal(syscall.SIGKILL)
		d.cmd.Wait()
		for _, pid := range workers {
			syscall.Kill(pid, syscall.SIGKILL)
		}
		<-d.done
		d = peStart(t, bin, conf, addr)
		allowed := 0
		for i := 0; i < 20; i++ {
			if code, _, _ := peRequest(t, "GET", "http://"+addr+"/api/x", nil, ""); code == 200 {
				allowed++
			}
		}
		if allowed != 15 {
			t.Fatalf("after kill -9 and restart: %d allowed, want exactly the 15 left:\n%s", allowed, d.text())
		}
		d.stop(t)
	})

	t.Run("refused dumps name their reason and the server serves", func(t *testing.T) {
		for _, tc := range []struct {
			name    string
			prepare func(path string)
			reason  string
		}{
			{"empty file", func(p string) { os.WriteFile(p, nil, 0o600) }, "truncated"},
			{"garbage", func(p string) { os.WriteFile(p, []byte("not a dump, not at all, really not"), 0o600) }, "bad magic"},
			{"directory", func(p string) { os.Mkdir(p, 0o700) }, "dump"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				dir, addr := t.TempDir(), peAddr(t)
				dump := filepath.Join(dir, "dump")
				tc.prepare(dump)
				conf := peConfig(t, dir, addr, fmt.Sprintf("[persist]\npath = %q\n", dump))
				d := peStart(t, bin, conf, addr)
				if code, _, _ := peRequest(t, "GET", "http://"+addr+"/", nil, ""); code != 200 {
					t.Fatalf("server does not serve: %d", code)
				}
				if !strings.Contains(d.text(), tc.reason) {
					t.Fatalf("no log line naming %q:\n%s", tc.reason, d.text())
				}
				d.cmd.Process.Signal(syscall.SIGTERM)
				d.cmd.Wait()
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
		dir, addr := t.TempDir(), peAddr(t)
		config := func(key string) string {
			return peConfig(t, dir, addr, fmt.Sprintf(`upstream = %q
[table]
responses = 64
response_bytes = "1MiB"
[persist]
path = %q
key = %q
[[idempotency]]
path = "/orders"
`, up.URL, filepath.Join(dir, "dump"), key))
		}
		post := func() (int, http.Header, string) {
			return peRequest(t, "POST", "http://"+addr+"/orders", map[string]string{"Idempotency-Key": `"order-1"`}, `{"item":1}`)
		}
		d := peStart(t, bin, config("v1"), addr)
		code, _, first := post()
		if code != 201 || executions.Load() != 1 {
			t.Fatalf("first: %d, %d executions", code, executions.Load())
		}
		d.stop(t)
		d = peStart(t, bin, config("v1"), addr)
		code, h, body := post()
		if code != 201 || body != first || h.Get("Idempotent-Replayed") != "true" || h.Get("Location") != "/orders/1" || executions.Load() != 1 {
			t.Fatalf("same persist.key: %d %q %v, %d executions", code, body, h, executions.Load())
		}
		d.stop(t)
		d = peStart(t, bin, config("v2"), addr)
		if code, _, body := post(); code != 201 || executions.Load() != 2 || body == first {
			t.Fatalf("other persist.key: %d %q, %d executions (want a new execution)", code, body, executions.Load())
		}
		if !strings.Contains(d.text(), "persist") {
			t.Fatalf("no log line about the dropped responses:\n%s", d.text())
		}
		d.stop(t)
	})
}
