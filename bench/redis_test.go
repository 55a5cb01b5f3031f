package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/preforkd/preforkd/bucket"
)

// redisGCRA is one GCRA decision in one script. KEYS[1] the key; ARGV now,
// the emission interval t and the capacity tau (µs). It returns {1, requests
// remaining} when allowed, {0, µs until a retry can pass} when refused: what
// the rate-limit headers need. A refusal writes nothing; an allowed request
// stores the new theoretical arrival time, expiring when the key is as fresh
// again.
const redisGCRA = `
local now = tonumber(ARGV[1])
local t = tonumber(ARGV[2])
local tau = tonumber(ARGV[3])
local tat = tonumber(redis.call('GET', KEYS[1]) or 0)
if tat < now then tat = now end
local nxt = tat + t
if nxt - now > tau then
	return {0, nxt - tau - now}
end
redis.call('SET', KEYS[1], nxt, 'PX', math.floor((nxt - now) / 1000) + 1)
return {1, math.floor((tau - (nxt - now)) / t)}
`

// redisDecider runs redisGCRA with EVALSHA: one round trip per decision.
type redisDecider struct {
	rdb    *redis.Client
	sha    string
	t, tau int64
}

// openRedis starts a throwaway redis-server for tb (stopped by its cleanup)
// and loads the script.
func openRedis(tb testing.TB, rule bucket.Rule) (decider, error) {
	addr, err := startRedis(tb)
	if err != nil {
		return nil, err
	}
	rdb := redis.NewClient(&redis.Options{
		Addr:                     addr,
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
	})
	tb.Cleanup(func() { rdb.Close() })
	sha, err := rdb.ScriptLoad(context.Background(), redisGCRA).Result()
	if err != nil {
		return nil, fmt.Errorf("redis: loading the GCRA script: %w", err)
	}
	t, tau := gcraParams(rule)
	return &redisDecider{rdb: rdb, sha: sha, t: t, tau: tau}, nil
}

func (d *redisDecider) decide(key string) (bool, error) {
	now := time.Now().UnixMicro()
	res, err := d.rdb.EvalSha(context.Background(), d.sha, []string{key}, now, d.t, d.tau).Int64Slice()
	if err != nil {
		return false, err
	}
	if len(res) != 2 {
		return false, fmt.Errorf("redis: GCRA script returned %v", res)
	}
	return res[0] == 1, nil
}

// startRedis runs redis-server on a free loopback port, without persistence,
// until tb's cleanup kills it, and returns its address once it answers.
func startRedis(tb testing.TB) (string, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		msg := "no redis-server in PATH (apt-get install -y redis-server)"
		if os.Getenv("CI") != "" {
			return "", errors.New(msg) // CI installs it: missing, it fails
		}
		return "", skipError{msg}
	}
	port, err := freePort()
	if err != nil {
		return "", err
	}
	var log bytes.Buffer
	cmd := exec.Command(bin,
		"--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", tb.TempDir())
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		return "", fmt.Errorf("redis: starting %s: %w", bin, err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	tb.Cleanup(func() {
		cmd.Process.Kill()
		<-exited
	})

	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	probe := redis.NewClient(&redis.Options{
		Addr:                     addr,
		MaxRetries:               -1,
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
	})
	defer probe.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := probe.Ping(context.Background()).Err()
		if err == nil {
			return addr, nil
		}
		select {
		case werr := <-exited:
			exited <- werr // for the cleanup
			return "", fmt.Errorf("redis: redis-server exited (%v) before answering: %s", werr, log.Bytes())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("redis: redis-server on %s did not answer within 10s: %v", addr, err)
		}
	}
}

// freePort asks the kernel for a loopback port that is free now. Another
// process may take it before redis-server binds it; the start then fails
// with a clear message rather than measuring the wrong server.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("redis: finding a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
