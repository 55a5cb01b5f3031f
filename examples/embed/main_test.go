package main

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// TestEmbed builds the example, runs it as a real supervisor with two
// workers, checks the login limit and its reset, and stops it with TERM.
func TestEmbed(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: an end-to-end test of the built example")
	}
	bin := filepath.Join(t.TempDir(), "embed")
	// go test puts the go command it runs as first in PATH.
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "-listen", "127.0.0.1:0", "-workers", "2")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}

	// Follow the log: the listen address, the workers' pids, readiness.
	var (
		mu      sync.Mutex
		addr    string
		workers []int
		lines   []string
	)
	ready := make(chan struct{})
	var readyOnce sync.Once
	listenRe := regexp.MustCompile(`msg="supervisor started".* listen=(\S+)`)
	workerRe := regexp.MustCompile(`msg="worker started" pid=(\d+)`)
	readyRe := regexp.MustCompile(`msg=ready\b`)
	var readers sync.WaitGroup
	readers.Go(func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			line := sc.Text()
			mu.Lock()
			lines = append(lines, line)
			if m := listenRe.FindStringSubmatch(line); m != nil {
				addr = m[1]
			}
			if m := workerRe.FindStringSubmatch(line); m != nil {
				pid, _ := strconv.Atoi(m[1])
				workers = append(workers, pid)
			}
			mu.Unlock()
			if readyRe.MatchString(line) {
				readyOnce.Do(func() { close(ready) })
			}
		}
	})
	defer func() {
		cmd.Process.Kill() // after a failure; a no-op once it exited
		readers.Wait()     // the log ends when the example and its workers are gone
		if t.Failed() {
			mu.Lock()
			t.Logf("log:\n%s", strings.Join(lines, "\n"))
			mu.Unlock()
		}
	}()
	select {
	case <-ready:
	case <-time.After(15 * time.Second):
		t.Fatal("the example did not become ready")
	}
	mu.Lock()
	base := "http://" + addr
	mu.Unlock()

	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	var retryAfter string
	login := func(password string) int {
		t.Helper()
		resp, err := client.PostForm(base+"/login", url.Values{"password": {password}})
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		retryAfter = resp.Header.Get("Retry-After")
		return resp.StatusCode
	}
	// What the comment at the top of main.go says: two failures, a
	// success that forgives them, then the full allowance of three, and
	// the limit, which refuses the right password too, for 20 s at most.
	want := []struct {
		password string
		status   int
	}{
		{"wrong", 401}, {"wrong", 401}, {"correct", 200},
		{"wrong", 401}, {"wrong", 401}, {"wrong", 401},
		{"wrong", 429}, {"correct", 429},
	}
	for i, w := range want {
		if got := login(w.password); got != w.status {
			t.Fatalf("attempt %d (%s): %d, want %d", i+1, w.password, got, w.status)
		}
	}
	if s, err := strconv.Atoi(retryAfter); err != nil || s < 1 || s > 20 {
		t.Errorf("the refused right password: Retry-After %q, want 1 to 20 seconds", retryAfter)
	}

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("after TERM: %v, want exit status 0", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(workers) != 2 {
		t.Fatalf("%d workers started, want 2", len(workers))
	}
	for _, pid := range workers {
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err == nil {
			t.Errorf("worker %d outlived the example", pid)
		}
	}
}
