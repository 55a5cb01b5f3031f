package redisstore_test

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/preforkd/preforkd/bucket"
	"github.com/preforkd/preforkd/internal/logtest"
	"github.com/preforkd/preforkd/internal/redistest"
	"github.com/preforkd/preforkd/redisstore"
)

// exactly10 decides 40 requests of one key under a limit of 10 a minute
// through h and fails unless exactly 10 pass.
func exactly10(t *testing.T, h *host, name string) {
	t.Helper()
	exactly10key(t, h, name, "client")
}

// exactly10key is exactly10 for the key id.
func exactly10key(t *testing.T, h *host, name, id string) {
	t.Helper()
	l := h.limiter(t, rule(name, bucket.GCRA, 10, time.Minute))
	allowed := 0
	for range 40 {
		refused, _, err := h.decide(t, id, l)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if !refused {
			allowed++
		}
	}
	if allowed != 10 {
		t.Fatalf("%s: %d of 40 allowed, want exactly 10", name, allowed)
	}
}

// A server that wants a password, and an ACL user: the Store
// authenticates with Username and Password (one of them read from a file),
// and decides exactly; a wrong password is an error that says so.
func TestAuthPasswordAndUser(t *testing.T) {
	t.Parallel()
	srv := redistest.StartWith(t, redistest.Options{Password: "s3cret-default", Users: map[string]string{"limiter": "s3cret-user"}})
	path := filepath.Join(t.TempDir(), "password")
	if err := os.WriteFile(path, []byte("s3cret-default\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	pw, err := redisstore.ReadPasswordFile(path)
	if err != nil {
		t.Fatal(err)
	}
	o := counting
	o.URL, o.Password = srv.URL(), pw
	exactly10(t, newHost(t, srv, 0, o), "default-user")

	o.Username, o.Password = "limiter", "s3cret-user"
	exactly10(t, newHost(t, srv, 0, o), "acl-user")

	// The same through cluster-style and URL credentials.
	o = counting
	o.URL = "redis://limiter:s3cret-user@" + srv.Addr + "/0"
	exactly10(t, newHost(t, srv, 0, o), "url-user")

	o = counting
	o.URL, o.Username, o.Password = srv.URL(), "limiter", "wrong"
	h := newHost(t, srv, 0, o)
	_, _, err = h.decide(t, "client", h.limiter(t, rule("wrong", bucket.GCRA, 10, time.Minute)))
	if !errors.Is(err, redisstore.ErrUnavailable) || !strings.Contains(err.Error(), "WRONGPASS") {
		t.Fatalf("a wrong password: %v, want ErrUnavailable saying WRONGPASS", err)
	}
	o.Password = ""
	o.Username = ""
	h = newHost(t, srv, 0, o)
	_, _, err = h.decide(t, "client", h.limiter(t, rule("none", bucket.GCRA, 10, time.Minute)))
	if !errors.Is(err, redisstore.ErrUnavailable) || !strings.Contains(err.Error(), "NOAUTH") {
		t.Fatalf("no password: %v, want ErrUnavailable saying NOAUTH", err)
	}
}

// A server that serves TLS only: TLS with its CA decides exactly; with
// another CA, or without TLS, every call fails, and the breaker's log
// says why.
func TestTLS(t *testing.T) {
	t.Parallel()
	srv := redistest.StartWith(t, redistest.Options{TLS: true, Password: "tls-pass"})
	ca, err := redisstore.ReadCAFile(srv.CAFile)
	if err != nil {
		t.Fatal(err)
	}
	o := counting
	o.URL, o.Password, o.TLS, o.CA = srv.URL(), "tls-pass", true, ca
	exactly10(t, newHost(t, srv, 0, o), "tls")

	o.URL, o.TLS = "rediss://"+srv.Addr+"/0", false // rediss:// sets TLS
	exactly10(t, newHost(t, srv, 0, o), "rediss")

	wrong := filepath.Join(t.TempDir(), "other-ca.pem")
	redistest.WriteCA(t, wrong)
	if o.CA, err = redisstore.ReadCAFile(wrong); err != nil {
		t.Fatal(err)
	}
	var logs logtest.Buffer
	o.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	o.Breaker = redisstore.Breaker{Failures: 1, Backoff: time.Hour}
	h := newHost(t, srv, 0, o)
	_, _, err = h.decide(t, "client", h.limiter(t, rule("wrong-ca", bucket.GCRA, 10, time.Minute)))
	if !errors.Is(err, redisstore.ErrUnavailable) || !strings.Contains(err.Error(), "certificate signed by unknown authority") {
		t.Fatalf("another CA: %v, want a certificate error", err)
	}
	opened := logs.Lines("redis breaker opened: rules answer by on_unavailable")
	if len(opened) != 1 || !strings.Contains(opened[0], "unknown authority") {
		t.Fatalf("the breaker's log does not say why: %q", logs.String())
	}

	o = counting
	o.URL, o.Password = srv.URL(), "tls-pass" // no TLS
	h = newHost(t, srv, 0, o)
	if _, _, err := h.decide(t, "client", h.limiter(t, rule("plain", bucket.GCRA, 10, time.Minute))); !errors.Is(err, redisstore.ErrUnavailable) {
		t.Fatalf("plain text to a TLS server: %v", err)
	}
}

// No password reaches a message: a URL's, a seed's, or Options printed by
// mistake (with fmt or slog's text; JSON encodes a Secret as its value,
// which is how a configuration travels to the workers).
func TestSecretsNeverPrinted(t *testing.T) {
	o := redisstore.Options{
		Cluster:  []string{"rediss://app:hunter2@10.0.0.1:6379", "10.0.0.2:6379"},
		Password: "hunter3",
		Sentinel: redisstore.Sentinel{Password: "hunter4"},
	}
	var logs logtest.Buffer
	slog.New(slog.NewTextHandler(&logs, nil)).Info("options", "o", o, "password", o.Password)
	slog.New(slog.NewJSONHandler(&logs, nil)).Info("options", "password", o.Password, "sentinel", o.Sentinel.Password)
	for _, s := range []string{fmt.Sprint(o), fmt.Sprintf("%+v", o), fmt.Sprintf("%#v", o), logs.String(), o.Validate().Error()} {
		for _, secret := range []string{"hunter3", "hunter4"} {
			if strings.Contains(s, secret) {
				t.Errorf("printed %s: %s", secret, s)
			}
		}
	}
	for _, c := range []struct{ in, want string }{
		{"rediss://:hunter2@h:1", "rediss://:xxxxx@h:1"},
		{"redis://app:hunter2@h:1/0", "redis://app:xxxxx@h:1/0"},
		{"redis://:hun%zzter2@h:1", "redis://xxxxx@h:1"},
		{"app:hunter2@h:1", "xxxxx@h:1"},
		{"10.0.0.1:6379", "10.0.0.1:6379"},
		{"redis://h:1", "redis://h:1"},
		// A '#' or '?' in a password makes a URL whose fragment or
		// query holds the rest of it: url.Parse takes it, and no
		// userinfo is seen.
		{"redis://:2024#hunter2@h:1", "redis://xxxxx@h:1"},
		{"redis://:2024?hunter2@h:1", "redis://xxxxx@h:1"},
	} {
		if got := redisstore.RedactURL(c.in); got != c.want {
			t.Errorf("RedactURL(%q) = %q, want %q", c.in, got, c.want)
		}
	}
	// Errors about an address do not quote its password either.
	for _, seeds := range [][]string{{"rediss://:hunter2@h:1/3"}, {"rediss://:hunter2@h"}, {"app:hunter2@h:1"}, {"http://:hunter2@h:1"}} {
		err := redisstore.Options{Cluster: seeds}.Validate()
		if err == nil || strings.Contains(err.Error(), "hunter2") {
			t.Errorf("cluster %q: %v", seeds, err)
		}
	}
}

// How the options become go-redis's: credentials from the options or from
// URLs, given once; TLS from tls or rediss://; the CA only with TLS.
func TestClientOptions(t *testing.T) {
	ca, err := os.ReadFile(writeTestCA(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		o    redisstore.Options
		want string // the options as go-redis gets them, or the error
	}{
		{"url", redisstore.Options{URL: "redis://u:p@h:1/2"}, "addrs=[h:1] user=u pass=p db=2 tls=false"},
		{"url and a password file", redisstore.Options{URL: "redis://h:1", Username: "u", Password: "p"}, "addrs=[h:1] user=u pass=p db=0 tls=false"},
		{"url with a password and a password file", redisstore.Options{URL: "redis://:p@h:1", Password: "p"}, "error: Password: given twice"},
		{"url with a user and a username", redisstore.Options{URL: "redis://u:p@h:1", Username: "v"}, "error: Username: given twice"},
		{"rediss", redisstore.Options{URL: "rediss://h:1"}, "addrs=[h:1] user= pass= db=0 tls=true"},
		{"tls with a CA", redisstore.Options{URL: "redis://h:1", TLS: true, CA: ca}, "addrs=[h:1] user= pass= db=0 tls=true ca"},
		{"a CA without TLS", redisstore.Options{URL: "redis://h:1", CA: ca}, "error: CA: a CA is given but TLS is off"},
		{"a CA that is none", redisstore.Options{URL: "redis://h:1", TLS: true, CA: []byte("nope")}, "error: CA: no PEM certificate"},
		{"cluster seeds", redisstore.Options{Cluster: []string{"rediss://u:p@a:1", "b:2", "redis://u:p@c:3/0"}},
			"cluster addrs=[a:1 b:2 c:3] user=u pass=p db=0 tls=true"},
		{"cluster seeds and a password file", redisstore.Options{Cluster: []string{"a:1"}, Username: "u", Password: "p", TLS: true},
			"cluster addrs=[a:1] user=u pass=p db=0 tls=true"},
		{"cluster seeds that disagree", redisstore.Options{Cluster: []string{"redis://:p@a:1", "redis://:q@b:2"}}, "error: Cluster: the seeds disagree on the password"},
		{"cluster seed with a database", redisstore.Options{Cluster: []string{"redis://a:1/1"}}, "error: Cluster: address"},
		{"cluster seed with options", redisstore.Options{Cluster: []string{"redis://a:1?dial_timeout=1s"}}, "error: Cluster: address"},
		{"cluster seed without a port", redisstore.Options{Cluster: []string{"a"}}, "error: Cluster: address"},
		{"sentinel", redisstore.Options{Sentinel: redisstore.Sentinel{Master: "m", Addrs: []string{"redis://su:sp@s:1", "t:2"}}, Username: "u", Password: "p"},
			"sentinel m addrs=[s:1 t:2] user=u pass=p db=0 tls=false sentinel=su/sp"},
		{"sentinel password file", redisstore.Options{Sentinel: redisstore.Sentinel{Master: "m", Addrs: []string{"s:1"}, Username: "su", Password: "sp"}},
			"sentinel m addrs=[s:1] user= pass= db=0 tls=false sentinel=su/sp"},
		{"sentinel password without a sentinel", redisstore.Options{URL: "redis://h:1", Sentinel: redisstore.Sentinel{Password: "sp"}},
			"error: Sentinel.Password: no sentinel to use it"},
	} {
		u, err := redisstore.ClientOptions(c.o)
		got := ""
		if err != nil {
			got = "error: " + strings.TrimPrefix(err.Error(), "redisstore: ")
		} else {
			if u.IsClusterMode {
				got = "cluster "
			}
			if u.MasterName != "" {
				got = "sentinel " + u.MasterName + " "
			}
			got += fmt.Sprintf("addrs=%v user=%s pass=%s db=%d tls=%v", u.Addrs, u.Username, u.Password, u.DB, u.TLSConfig != nil)
			if u.TLSConfig != nil && u.TLSConfig.RootCAs != nil {
				got += " ca"
			}
			if u.SentinelUsername != "" || u.SentinelPassword != "" {
				got += " sentinel=" + u.SentinelUsername + "/" + u.SentinelPassword
			}
		}
		if !strings.HasPrefix(got, c.want) {
			t.Errorf("%s: %s\n want %s", c.name, got, c.want)
		}
	}
}

// A password file: its content without one final newline, refused when
// every user may read or write it, when empty, or of several lines; a CA
// file holds a certificate.
func TestPasswordFile(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	for _, c := range []struct {
		name, content string
		mode          os.FileMode
		want          string // the password, or "error: " and part of the message
	}{
		{"plain", "pass word", 0o600, "pass word"},
		{"newline", "pw\n", 0o400, "pw"},
		{"crlf", "pw\r\n", 0o640, "pw"},
		{"world-readable", "pw", 0o644, "error: every user may read or write"},
		{"world-writable", "pw", 0o602, "error: every user may read or write"},
		{"empty", "\n", 0o600, "error: is empty"},
		{"two lines", "a\nb\n", 0o600, "error: several lines"},
		{"long", strings.Repeat("x", 5000), 0o600, "error: longer than"},
	} {
		got, err := redisstore.ReadPasswordFile(write(c.name, c.content, c.mode))
		s := string(got)
		if err != nil {
			s = "error: " + err.Error()
			if strings.Contains(s, c.content) && c.content != "\n" {
				t.Errorf("%s: the error shows the content: %v", c.name, err)
			}
		}
		if !strings.Contains(s, strings.TrimPrefix(c.want, "error: ")) || strings.HasPrefix(c.want, "error: ") != (err != nil) {
			t.Errorf("%s: %q, want %q", c.name, s, c.want)
		}
	}
	if _, err := redisstore.ReadPasswordFile(filepath.Join(dir, "missing")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a missing file: %v", err)
	}
	if _, err := redisstore.ReadPasswordFile(dir); err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Errorf("a directory: %v", err)
	}
	if _, err := redisstore.ReadCAFile(write("ca", "not a certificate", 0o644)); err == nil || !strings.Contains(err.Error(), "no PEM certificate") {
		t.Errorf("a CA file without a certificate: %v", err)
	}
	if _, err := redisstore.ReadCAFile(writeTestCA(t)); err != nil {
		t.Errorf("a CA file: %v", err)
	}
}

func writeTestCA(t *testing.T) string {
	p := filepath.Join(t.TempDir(), "ca.pem")
	redistest.WriteCA(t, p)
	return p
}

// A Sentinel that wants a password of its own, watching a master that
// wants another: the Store asks the Sentinel with Sentinel.Password and
// the master with Password, and decides exactly; without the Sentinel's
// password it cannot find the master.
func TestSentinelAuth(t *testing.T) {
	t.Parallel()
	master := redistest.StartWith(t, redistest.Options{Password: "pw-of-master"})
	sentinel := redistest.StartWith(t, redistest.Options{Sentinel: master, Password: "pw-of-sentinel", MasterPassword: "pw-of-master"})
	o := counting
	o.Sentinel = redisstore.Sentinel{Master: "mymaster", Addrs: []string{sentinel.Addr}, Password: "pw-of-sentinel"}
	o.Password = "pw-of-master"
	exactly10(t, newHost(t, master, 0, o), "sentinel")

	o.Sentinel.Password = ""
	h := newHost(t, master, 0, o)
	if _, _, err := h.decide(t, "client", h.limiter(t, rule("no-sentinel-password", bucket.GCRA, 10, time.Minute))); !errors.Is(err, redisstore.ErrUnavailable) {
		t.Fatalf("without the Sentinel's password: %v", err)
	}
}
