package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/preforkd/preforkd/internal/redistest"
)

// exactOnHost sends 40 requests for a fresh key to d's /exact at once and
// fails unless exactly 10 pass: Redis decided each of them.
func exactOnHost(t *testing.T, d *daemon, what string) {
	t.Helper()
	// Redis must decide first: during a rotation, a worker of the old
	// generation that dials with the old password fails, which opens the
	// breaker every worker shares (on_unavailable closed: 503) until a
	// probe succeeds. A request on a key of its own probes it.
	probe := newClient(t, nil, false)
	for deadline := time.Now().Add(10 * time.Second); ; {
		r := do(probe, http.MethodGet, d.url("/exact"), http.Header{"X-Key": {"probe-" + what}})
		if r.status == 200 || r.status == 429 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: Redis does not decide: %d", what, r.status)
		}
		time.Sleep(50 * time.Millisecond)
	}
	c := newClient(t, nil, false)
	key := fmt.Sprintf("%s-%d", what, time.Now().UnixNano())
	out := make([]result, 40)
	var wg sync.WaitGroup
	for i := range out {
		wg.Go(func() { out[i] = do(c, http.MethodGet, d.url("/exact"), http.Header{"X-Key": {key}}) })
	}
	wg.Wait()
	if st := statuses(out); st[200] != 10 || st[429] != 30 {
		t.Fatalf("%s: %v (transport error: %s), want exactly 10 × 200 and 30 × 429", what, st, firstErr(out))
	}
}

// redisAuthConfig is a daemon's file with [redis] lines and a rule that
// Redis alone decides (on_unavailable closed: 503 when it cannot).
func redisAuthConfig(redis string) string {
	return `[server]
workers = 2
[admin]
listen = "ADMIN_ADDR"
[reload]
canary = false
[redis]
timeout = "1s"
` + redis + `
[[ratelimit]]
name = "exact"
path = "/exact"
limit = 10
window = "1m"
by = "header:X-Key"
store = "redis"
on_unavailable = "closed"
`
}

// writeSecret writes a password file with mode and returns its path.
func writeSecret(t *testing.T, dir, name, content string, mode os.FileMode) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil {
		t.Fatal(err)
	}
	return p
}

// A Redis that wants a password (requirepass) and has an ACL user: the
// daemon authenticates with username and password_file and its limits
// are exact; the password is nowhere in its log, /status or check. A
// rotated password is taken at a reload; a reload with a world-readable
// file is refused and the running one keeps deciding.
func TestRedisPasswordFile(t *testing.T) {
	t.Parallel()
	srv := redistest.StartWith(t, redistest.Options{Password: "pw-of-default", Users: map[string]string{"limiter": "pw-of-limiter"}})
	dir := t.TempDir()
	pw := writeSecret(t, dir, "redis-password", "pw-of-limiter\n", 0o600)
	cfg := redisAuthConfig(fmt.Sprintf("url = %q\nusername = \"limiter\"\npassword_file = %q", srv.URL(), pw))
	d := startDaemon(t, daemonOptions{admin: true, config: cfg})
	exactOnHost(t, d, "acl-user")

	// The password is in no answer and no log line.
	status := get(newClient(t, nil, false), "http://"+d.admin+"/status")
	code, out, errOut := runBinary(t, "check", "-config", d.cfgPath)
	if code != 0 || !strings.Contains(out, "username=limiter password_file="+pw) {
		t.Errorf("check: %d %s %s", code, out, errOut)
	}
	for what, text := range map[string]string{"/status": string(status.body), "check": out + errOut, "log": d.logs.text()} {
		if strings.Contains(text, "pw-of-") {
			t.Errorf("%s shows the password:\n%s", what, text)
		}
	}

	// Rotation: the user's password changes, then the file, then HUP.
	if err := srv.Client().Do(t.Context(), "ACL", "SETUSER", "limiter", "resetpass", ">pw-of-limiter-2").Err(); err != nil {
		t.Fatal(err)
	}
	writeSecret(t, dir, "redis-password", "pw-of-limiter-2\n", 0o600)
	from := reloadTo(d, cfg)
	waitReloaded(t, d, from, 15*time.Second)
	if _, l, ok := d.logs.waitFor(from, time.Second, msgIs("reload begun")); !ok || !strings.Contains(l.get("keys_changed"), "redis.password_file") {
		t.Errorf("the reload's line does not name the rotated password's key: %v", l.kv)
	}
	// A worker of the old generation that still drains serves its
	// connections' next requests (with Connection: close), dialing Redis
	// with the old password: exactness is for the new generation alone.
	waitRetiredGone(t, d, from)
	exactOnHost(t, d, "rotated")

	// A world-readable file: the reload is refused, with the key's line;
	// the running workers keep the password they have.
	writeSecret(t, dir, "redis-password", "pw-of-limiter-2\n", 0o644)
	from = reloadTo(d, cfg)
	_, l, ok := d.logs.waitFor(from, 10*time.Second, msgIs("reload refused: keeping the running configuration"))
	if !ok || !strings.Contains(l.get("err"), "redis.password_file:") || !strings.Contains(l.get("err"), "every user may read") {
		t.Fatalf("a reload with a world-readable password file: %v", l.kv)
	}
	exactOnHost(t, d, "after-refused-reload")

	// The default user, by requirepass.
	pw0 := writeSecret(t, dir, "default-password", "pw-of-default", 0o400)
	d0 := startDaemon(t, daemonOptions{admin: true, config: redisAuthConfig(fmt.Sprintf("url = %q\npassword_file = %q", srv.URL(), pw0))})
	exactOnHost(t, d0, "default-user")
}

// check refuses a password file that cannot be used, at the line of its
// key, and prints URLs of cluster seeds without their password.
func TestRedisCheckSecrets(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	open := writeSecret(t, dir, "open", "pw", 0o644)
	good := writeSecret(t, dir, "good", "pw", 0o600)
	for _, c := range []struct {
		name, redis, want string
	}{
		{"world-readable", fmt.Sprintf("url = \"redis://127.0.0.1:6379\"\npassword_file = %q", open), ":10: redis.password_file: " + open + " has mode 0644"},
		{"missing", "url = \"redis://127.0.0.1:6379\"\npassword_file = \"" + dir + "/none\"", ":10: redis.password_file: open " + dir + "/none: no such file"},
		{"twice", fmt.Sprintf("url = \"redis://:hunter2@127.0.0.1:6379\"\npassword_file = %q", good), ":10: redis.password_file: given twice: the url has a password"},
		{"sentinel", fmt.Sprintf("sentinel = { master = \"m\", addrs = [\"127.0.0.1:26379\"] }\nsentinel_password_file = %q", open), ":10: redis.sentinel_password_file: "},
		{"ca without tls", fmt.Sprintf("url = \"redis://127.0.0.1:6379\"\nca_file = %q", writeCAFile(t, dir)), ":10: redis.ca_file: a CA is given but TLS is off"},
		{"ca missing", "url = \"rediss://127.0.0.1:6379\"\nca_file = \"" + dir + "/none.pem\"", ":10: redis.ca_file: open "},
		{"success threshold", "url = \"redis://127.0.0.1:6379\"\nsuccess_threshold = 17", ":10: redis.success_threshold: must be between 1 and 16, got 17"},
		{"sentinel username alone", "url = \"redis://127.0.0.1:6379\"\nsentinel_username = \"s\"", ":10: redis.sentinel_username: no sentinel to use it"},
	} {
		path := filepath.Join(dir, c.name+".toml")
		if err := os.WriteFile(path, []byte(strings.ReplaceAll(redisAuthConfig(c.redis), "ADMIN_ADDR", "127.0.0.1:1")), 0o600); err != nil {
			t.Fatal(err)
		}
		code, out, errOut := runBinary(t, "check", "-config", path)
		if code != 2 || !strings.Contains(errOut, path+c.want) || strings.Contains(out+errOut, "hunter2") {
			t.Errorf("%s: exit %d, %s%s\nwant %q", c.name, code, out, errOut, path+c.want)
		}
	}

	path := filepath.Join(dir, "cluster.toml")
	cfg := strings.ReplaceAll(redisAuthConfig(`cluster = ["rediss://:secret@10.0.0.1:6379", "10.0.0.2:6379"]`), "ADMIN_ADDR", "127.0.0.1:1")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := runBinary(t, "check", "-config", path)
	if code != 0 || !strings.Contains(out, " cluster=rediss://:xxxxx@10.0.0.1:6379,10.0.0.2:6379 ") || strings.Contains(out+errOut, "secret") {
		t.Errorf("check of a cluster seed with a password: %d\n%s%s", code, out, errOut)
	}
	if !strings.Contains(out, "success_threshold=3") || !strings.Contains(out, "tls=false") {
		t.Errorf("check does not show the defaults of the new keys:\n%s", out)
	}

	// /status shows the seeds without it, and the log never has it, also
	// when the Redis cannot be reached.
	d := startDaemon(t, daemonOptions{admin: true, config: redisAuthConfig(`cluster = ["rediss://:secret@127.0.0.1:1", "127.0.0.1:2"]`)})
	do(newClient(t, nil, false), http.MethodGet, d.url("/exact"), http.Header{"X-Key": {"k"}})
	r := get(newClient(t, nil, false), "http://"+d.admin+"/status")
	if !strings.Contains(string(r.body), `"cluster":["rediss://:xxxxx@127.0.0.1:1","127.0.0.1:2"]`) || strings.Contains(string(r.body)+d.logs.text(), "secret") {
		t.Errorf("/status of a cluster seed with a password: %s\nlog:\n%s", r.body, d.logs.text())
	}
}

func writeCAFile(t *testing.T, dir string) string {
	p := filepath.Join(dir, "ca.pem")
	redistest.WriteCA(t, p)
	return p
}

// A Redis that serves TLS only: tls = true with its ca_file decides
// exactly; with another CA every request meets on_unavailable, and the
// breaker's log line says the certificate is the reason.
func TestRedisTLS(t *testing.T) {
	t.Parallel()
	srv := redistest.StartWith(t, redistest.Options{TLS: true, Password: "pw-over-tls"})
	dir := t.TempDir()
	pw := writeSecret(t, dir, "pw", "pw-over-tls", 0o600)
	d := startDaemon(t, daemonOptions{admin: true, config: redisAuthConfig(
		fmt.Sprintf("url = %q\ntls = true\nca_file = %q\npassword_file = %q", srv.URL(), srv.CAFile, pw))})
	exactOnHost(t, d, "tls")

	wrong := writeCAFile(t, dir)
	d = startDaemon(t, daemonOptions{admin: true, config: redisAuthConfig(
		fmt.Sprintf("url = %q\ntls = true\nca_file = %q\npassword_file = %q\nbreaker_failures = 2", srv.URL(), wrong, pw))})
	c := newClient(t, nil, false)
	for range 5 {
		if r := do(c, http.MethodGet, d.url("/exact"), http.Header{"X-Key": {"wrong-ca"}}); r.status != 503 {
			t.Fatalf("with a wrong CA: %d, want 503 (on_unavailable closed)", r.status)
		}
	}
	_, l, ok := d.logs.waitFor(0, 5*time.Second, msgIs("redis breaker opened: rules answer by on_unavailable"))
	if !ok || !strings.Contains(l.get("err"), "x509: certificate signed by unknown authority") {
		t.Fatalf("the breaker's line does not say why: %v", l.kv)
	}
	var st map[string]any
	r := get(newClient(t, nil, false), "http://"+d.admin+"/status")
	if err := json.Unmarshal(r.body, &st); err != nil || !strings.Contains(string(r.body), `"state":"open"`) {
		t.Errorf("/status with a wrong CA: %v %s", err, r.body)
	}
}
