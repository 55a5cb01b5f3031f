// Package redistest starts throwaway redis-server processes for tests:
// one per test, on a free loopback port, with its data in the test's
// temporary directory, killed at the test's cleanup.
//
// Without redis-server in PATH a test fails when the environment variable
// CI is set (CI installs it: a missing server must not pass as a skipped
// test) and is skipped with a message otherwise.
package redistest

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

// Server is one redis-server started by a test.
type Server struct {
	tb   testing.TB
	bin  string
	dir  string
	Addr string // 127.0.0.1:port

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{}
	log    *bytes.Buffer
}

// Start starts a redis-server for tb and waits until it answers.
func Start(tb testing.TB) *Server {
	tb.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		msg := "no redis-server in PATH (apt-get install -y redis-server)"
		if os.Getenv("CI") != "" {
			tb.Fatal(msg)
		}
		tb.Skip(msg)
	}
	s := &Server{tb: tb, bin: bin, dir: tb.TempDir()}
	for attempt := 1; ; attempt++ {
		s.Addr = freeAddr(tb)
		err := s.start()
		if err == nil {
			break
		}
		if attempt == 5 {
			tb.Fatal(err)
		}
	}
	tb.Cleanup(s.Kill)
	return s
}

// CallTimeout is the Redis call timeout for tests that count decisions:
// a call on a loaded machine (CI runs the race detector beside these
// tests) may take longer than the 25ms default, and a timeout is not what
// they test. Tests of timeouts keep the default.
const CallTimeout = time.Second

// handedOut holds every address this test process has given a server. A
// killed server's port is free to the kernel, but its test may restart
// it there (Restart): no other test of the process may take it meanwhile.
var handedOut = struct {
	sync.Mutex
	addrs map[string]bool
}{addrs: map[string]bool{}}

func freeAddr(tb testing.TB) string {
	for {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			tb.Fatal(err)
		}
		addr := l.Addr().String()
		l.Close()
		handedOut.Lock()
		taken := handedOut.addrs[addr]
		handedOut.addrs[addr] = true
		handedOut.Unlock()
		if !taken {
			return addr
		}
	}
}

// start runs redis-server on s.Addr and waits for it to answer.
func (s *Server) start() error {
	_, port, _ := net.SplitHostPort(s.Addr)
	log := &bytes.Buffer{}
	cmd := exec.Command(s.bin, "--port", port, "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", s.dir)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("redistest: starting %s: %w", s.bin, err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	s.mu.Lock()
	s.cmd, s.exited, s.log = cmd, exited, log
	s.mu.Unlock()
	c := s.client()
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := c.Ping(context.Background()).Err()
		if err == nil {
			// Whoever answers must be this process, not a server another
			// test (or test binary) started on the port meanwhile.
			return s.checkOwner(c, cmd.Process.Pid, exited)
		}
		select {
		case <-exited:
			return fmt.Errorf("redistest: redis-server exited before answering: %s", log.String())
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			s.Kill()
			return fmt.Errorf("redistest: redis-server on %s did not answer within 10s: %v", s.Addr, err)
		}
	}
}

// checkOwner reports an error when the server answering on s.Addr is not
// process pid; it then waits for pid, which cannot bind the port, to exit.
func (s *Server) checkOwner(c *redis.Client, pid int, exited <-chan struct{}) error {
	info, err := c.Info(context.Background(), "server").Result()
	if err != nil {
		s.Kill()
		return fmt.Errorf("redistest: INFO server on %s: %w", s.Addr, err)
	}
	for _, line := range strings.Split(info, "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "process_id:"); ok {
			if rest == strconv.Itoa(pid) {
				return nil
			}
			s.Kill()
			<-exited
			return fmt.Errorf("redistest: %s is served by another redis-server (pid %s) and ours exited", s.Addr, rest)
		}
	}
	s.Kill()
	return fmt.Errorf("redistest: INFO server on %s names no process_id", s.Addr)
}

func (s *Server) client() *redis.Client {
	return redis.NewClient(&redis.Options{
		Addr: s.Addr, MaxRetries: -1,
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
	})
}

// Client returns a client of the server for the test's own commands.
func (s *Server) Client() *redis.Client {
	c := s.client()
	s.tb.Cleanup(func() { c.Close() })
	return c
}

// URL is the server's redis:// URL.
func (s *Server) URL() string { return "redis://" + s.Addr + "/0" }

// Kill kills the server (SIGKILL) and waits for it to exit.
func (s *Server) Kill() {
	s.mu.Lock()
	cmd, exited := s.cmd, s.exited
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	<-exited
}

// Restart starts the server again on the same address, empty: no data,
// no scripts (as after a failover or SCRIPT FLUSH).
func (s *Server) Restart() {
	s.tb.Helper()
	s.Kill()
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := s.start()
		if err == nil {
			return
		}
		if time.Now().After(deadline) || !strings.Contains(err.Error(), "exited") {
			s.tb.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond) // the port may linger a moment
	}
}

// Calls returns how many times the server ran command cmd (lower case,
// e.g. "evalsha"), from INFO commandstats.
func (s *Server) Calls(cmd string) int64 {
	s.tb.Helper()
	c := s.client()
	defer c.Close()
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		s.tb.Fatalf("redistest: INFO commandstats: %v", err)
	}
	prefix := "cmdstat_" + cmd + ":calls="
	for _, line := range strings.Split(info, "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), prefix); ok {
			n, _ := strconv.ParseInt(rest[:strings.IndexByte(rest, ',')], 10, 64)
			return n
		}
	}
	return 0
}
