// Package redistest starts throwaway redis-server processes for tests:
// one per test (or a Cluster of them, cluster.go), on free loopback ports,
// with their data in the test's temporary directory, killed at the test's
// cleanup. A server may require a password or ACL users, and may serve
// TLS only, with a certificate from a CA the test makes (tls.go).
//
// Without redis-server (or, for a Cluster, redis-cli) in PATH a test fails
// when the environment variable CI is set (CI installs it: a missing
// server must not pass as a skipped test) and is skipped with a message
// otherwise.
package redistest

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/preforkd/preforkd/internal/tlstest"
)

// Server is one redis-server started by a test.
type Server struct {
	tb   testing.TB
	bin  string
	dir  string
	o    Options
	Addr string // 127.0.0.1:port (the TLS port, with Options.TLS)
	// BusAddr is the Cluster bus's address, with Options.Cluster.
	BusAddr string
	// CAFile is the PEM of the CA that issued the server's certificate,
	// with Options.TLS.
	CAFile string
	// ca issued certFile, the server's certificate (keyFile its key),
	// with Options.TLS.
	ca                *tlstest.CA
	certFile, keyFile string

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{}
	log    *bytes.Buffer
}

// Options change the server StartWith runs; the zero value is Start's.
type Options struct {
	// Password is required of every client (requirepass): the default
	// user's.
	Password string
	// Users are ACL users, by name with their password, each allowed
	// every command and key.
	Users map[string]string
	// TLS serves TLS only, with a certificate for 127.0.0.1 and localhost
	// issued by a CA of the test's (Server.CAFile); clients need none.
	TLS bool
	// Cluster starts the server in cluster mode, with a bus port of its
	// own (Server.BusAddr); StartCluster makes a Cluster of such servers.
	Cluster bool
	// Sentinel starts a Sentinel (redis-server --sentinel) that watches
	// this master, under the name "mymaster"; Password is then the
	// Sentinel's own, and the master's is MasterPassword.
	Sentinel       *Server
	MasterPassword string
	// Args are more arguments of redis-server, after the others.
	Args []string
}

// Start starts a redis-server for tb and waits until it answers.
func Start(tb testing.TB) *Server {
	tb.Helper()
	return StartWith(tb, Options{})
}

// StartWith starts a redis-server with o for tb and waits until it
// answers.
func StartWith(tb testing.TB, o Options) *Server {
	tb.Helper()
	s := &Server{tb: tb, bin: need(tb, "redis-server"), dir: tb.TempDir(), o: o}
	if o.TLS {
		s.makeCerts()
	}
	for attempt := 1; ; attempt++ {
		s.Addr = freeAddr(tb)
		if o.Cluster {
			s.BusAddr = freeAddr(tb)
		}
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

// need returns the path of program, or ends the test: failed under CI,
// skipped elsewhere.
func need(tb testing.TB, program string) string {
	tb.Helper()
	bin, err := exec.LookPath(program)
	if err != nil {
		msg := "no " + program + " in PATH (apt-get install -y redis-server, which brings redis-cli)"
		if os.Getenv("CI") != "" {
			tb.Fatal(msg)
		}
		tb.Skip(msg)
	}
	return bin
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
	args := []string{"--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", s.dir}
	if m := s.o.Sentinel; m != nil {
		// A Sentinel rewrites its configuration file: it must have one.
		conf := filepath.Join(s.dir, "sentinel.conf")
		mhost, mport, _ := net.SplitHostPort(m.Addr)
		text := fmt.Sprintf("sentinel monitor mymaster %s %s 1\nsentinel down-after-milliseconds mymaster 1000\n", mhost, mport)
		if s.o.MasterPassword != "" {
			text += fmt.Sprintf("sentinel auth-pass mymaster %s\n", s.o.MasterPassword)
		}
		if err := os.WriteFile(conf, []byte(text), 0o600); err != nil {
			return fmt.Errorf("redistest: %w", err)
		}
		args = []string{conf, "--sentinel", "--port", port, "--bind", "127.0.0.1", "--dir", s.dir}
	}
	if s.o.TLS {
		args[1] = "0"
		args = append(args, "--tls-port", port, "--tls-auth-clients", "no",
			"--tls-cert-file", s.certFile, "--tls-key-file", s.keyFile,
			"--tls-ca-cert-file", s.CAFile)
	}
	if s.o.Password != "" {
		args = append(args, "--requirepass", s.o.Password)
	}
	for name, pass := range s.o.Users {
		args = append(args, "--user", name, "on", ">"+pass, "~*", "&*", "+@all")
	}
	if s.o.Cluster {
		_, bus, _ := net.SplitHostPort(s.BusAddr)
		args = append(args, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-port", bus)
	}
	args = append(args, s.o.Args...)
	cmd := exec.Command(s.bin, args...)
	cmd.Stdout, cmd.Stderr = log, log
	ownGroup(cmd)
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
	o := &redis.Options{
		Addr: s.Addr, MaxRetries: -1, Password: s.o.Password,
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
	}
	if s.o.TLS {
		o.TLSConfig = &tls.Config{RootCAs: s.ca.Pool}
	}
	return redis.NewClient(o)
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
	killGroup(cmd)
	<-exited
}

// Freeze stops the server (SIGSTOP) until the test ends, or until the
// function it returns is called: a Redis that accepts connections and
// answers nothing (a hung host, a paused VM, a network that drops the
// replies).
func (s *Server) Freeze() (thaw func()) {
	s.mu.Lock()
	cmd := s.cmd
	s.mu.Unlock()
	if cmd == nil {
		s.tb.Fatal("redistest: Freeze of a server that is not running")
	}
	stopGroup(cmd, true)
	var once sync.Once
	thaw = func() { once.Do(func() { stopGroup(cmd, false) }) }
	s.tb.Cleanup(thaw)
	return thaw
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

// Alive reports whether the server runs (it was not killed, or was
// restarted).
func (s *Server) Alive() bool {
	s.mu.Lock()
	exited := s.exited
	s.mu.Unlock()
	select {
	case <-exited:
		return false
	default:
		return true
	}
}

// info is INFO section (or CLUSTER INFO, for section "cluster") as a
// map; empty when the server does not answer.
func (s *Server) info(section string) map[string]string {
	out := map[string]string{}
	if !s.Alive() {
		return out
	}
	c := s.client()
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	var text string
	var err error
	if section == "cluster" {
		text, err = c.ClusterInfo(ctx).Result()
	} else {
		text, err = c.Info(ctx, section).Result()
	}
	if err != nil {
		return out
	}
	for _, line := range strings.Split(text, "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), ":"); ok {
			out[k] = v
		}
	}
	return out
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
