//go:build linux

package main

// End-to-end tests of tls.cleartext_listen: a cleartext port beside the
// TLS one, served by the same workers over the same region.

import (
	"bufio"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/preforkd/preforkd/internal/tlstest"
)

// clearDaemon is a TLS daemon (a.example) with a cleartext port.
type clearDaemon struct {
	*daemon
	ca    *tlstest.CA
	clear string // the cleartext port's address
}

// tlsKeys are further lines of [tls].
func startClearDaemon(t *testing.T, mode, server, extra string, tlsKeys ...string) *clearDaemon {
	t.Helper()
	cd := &clearDaemon{ca: tlstest.NewCA(t), clear: freeAddr(t)}
	dir := t.TempDir()
	cert, key := cd.ca.Files(t, dir, "a", "a.example")
	cfg := baseServer(2, server) + extra + fmt.Sprintf(`
[tls]
cleartext_listen = %q
cleartext = %q
%s
[[tls.certificate]]
cert = %q
key = %q
`, cd.clear, mode, strings.Join(tlsKeys, "\n"), cert, key)
	cd.daemon = startDaemon(t, daemonOptions{config: noCanary(cfg)})
	return cd
}

// clients are an https client (verifying a.example) and a cleartext one,
// neither following redirects, each connection anew.
func (cd *clearDaemon) clients(t *testing.T) (tlsc, plain *http.Client) {
	noFollow := func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	plain = newClient(t, nil, false)
	plain.CheckRedirect = noFollow
	tlsc = newClient(t, nil, false)
	tlsc.CheckRedirect = noFollow
	tlsc.Transport.(*http.Transport).TLSClientConfig = &tls.Config{ServerName: "a.example", RootCAs: cd.ca.Pool}
	return tlsc, plain
}

// A limit of 3 holds across both ports: exactly 3 of 8 requests, half on
// each, are let through; the cleartext port's application sees
// X-Forwarded-Proto: http through the same rules.
func TestCleartextServeSharesLimitsE2E(t *testing.T) {
	t.Parallel()
	cd := startClearDaemon(t, "serve", "", rule("three", "/u", "gcra", 3, "1h"))
	tlsc, plain := cd.clients(t)
	got := map[string]map[int]int{"https": {}, "http": {}}
	for i := range 8 {
		c, url, scheme := plain, "http://"+cd.clear+"/u", "http"
		if i%2 == 0 {
			c, url, scheme = tlsc, "https://"+cd.addr+"/u", "https"
		}
		r := get(c, url)
		if r.err != nil {
			t.Fatalf("%s: %v", url, r.err)
		}
		got[scheme][r.status]++
	}
	if n := got["https"][200] + got["http"][200]; n != 3 || got["https"][429]+got["http"][429] != 5 {
		t.Errorf("across both ports: %v, want exactly 3 × 200 and 5 × 429", got)
	}
}

// Redirect mode: 308 to https at the TLS port, path and query kept, the
// Host's port dropped; a Host no URL can hold gets 400; the health check
// is answered on the cleartext port.
func TestCleartextRedirectE2E(t *testing.T) {
	t.Parallel()
	cd := startClearDaemon(t, "redirect", `health_path = "/healthz"`, rule("one", "/*", "gcra", 1, "1h"))
	_, plain := cd.clients(t)
	_, tlsPort, _ := net.SplitHostPort(cd.addr)
	for _, host := range []string{"a.example", "a.example:80"} {
		req, _ := http.NewRequest("GET", "http://"+cd.clear+"/a/b?x=1&y=%20z", nil)
		req.Host = host
		resp, err := plain.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		want := "https://a.example:" + tlsPort + "/a/b?x=1&y=%20z"
		if resp.StatusCode != 308 || resp.Header.Get("Location") != want || resp.ContentLength <= 0 {
			t.Errorf("Host %q: %d Location %q length %d, want 308 %q", host, resp.StatusCode, resp.Header.Get("Location"), resp.ContentLength, want)
		}
	}
	// A Host that is no authority, by hand: Go's client refuses to send one.
	conn, err := net.DialTimeout("tcp", cd.clear, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "GET /a HTTP/1.1\r\nHost: a.example/evil\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil || resp.StatusCode != 400 || resp.Header.Get("Location") != "" {
		t.Errorf("a bad Host: %v %v, want 400 without Location", resp, err)
	}
	if r := get(plain, "http://"+cd.clear+"/healthz"); r.status != 200 || string(r.body) != "ok\n" {
		t.Errorf("health check on the cleartext port: %d %q", r.status, r.body)
	}
	// The redirects counted against no rule: the one request is left.
	tlsc, _ := cd.clients(t)
	if r := get(tlsc, "https://"+cd.addr+"/x"); r.status != 200 {
		t.Errorf("on the TLS port after the redirects: %d %v, want the rule's one request", r.status, r.err)
	}
}

// tls.redirect_port: the port the redirect names, for a TLS port the
// clients reach at another one than server.listen's (a container's
// -p 443:8443, a load balancer's port mapping); 443 names none.
func TestCleartextRedirectPortE2E(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ port, want string }{
		{"443", "https://a.example/a?b"},
		{"8443", "https://a.example:8443/a?b"},
	} {
		cd := startClearDaemon(t, "redirect", "", "", "redirect_port = "+tc.port)
		_, plain := cd.clients(t)
		req, _ := http.NewRequest("GET", "http://"+cd.clear+"/a?b", nil)
		req.Host = "a.example"
		resp, err := plain.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 308 || resp.Header.Get("Location") != tc.want {
			t.Errorf("redirect_port = %s: %d Location %q, want 308 %q", tc.port, resp.StatusCode, resp.Header.Get("Location"), tc.want)
		}
	}
}

// onBothPorts requests /p on both ports, each request on a new
// connection, one client on each, until during returns; it returns the
// requests that failed (an error or a status but 200) and the count of
// those served by port.
func (cd *clearDaemon) onBothPorts(tlsc, plain *http.Client, during func()) (failures []string, served map[string]int) {
	var stop atomic.Bool
	var wg sync.WaitGroup
	var mu sync.Mutex
	served = map[string]int{}
	for _, c := range []struct {
		c   *http.Client
		url string
	}{{tlsc, "https://" + cd.addr + "/p"}, {plain, "http://" + cd.clear + "/p"}} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				r := get(c.c, c.url)
				mu.Lock()
				if r.err != nil || r.status != 200 {
					failures = append(failures, fmt.Sprintf("%s: %d %v", c.url, r.status, r.err))
				} else {
					served[c.url]++
				}
				mu.Unlock()
				time.Sleep(5 * time.Millisecond)
			}
		}()
	}
	func() {
		// Stopped also when during fails the test (runtime.Goexit).
		defer func() { stop.Store(true); wg.Wait() }()
		during()
	}()
	return failures, served
}

// max_requests recycles workers that serve both ports: a retiring one
// stops accepting on both, and neither port refuses a connection or
// fails a request meanwhile.
func TestCleartextRecyclingE2E(t *testing.T) {
	t.Parallel()
	cd := startClearDaemon(t, "serve", "max_requests = 20", "")
	tlsc, plain := cd.clients(t)
	from := cd.logs.len()
	failures, served := cd.onBothPorts(tlsc, plain, func() {
		for i := 0; i < 4; i++ {
			if _, _, ok := cd.logs.waitFor(from, 10*time.Second, msgIs("worker recycling")); !ok {
				t.Errorf("no worker recycled; log:\n%s", cd.logs.text())
				return
			}
			from = cd.logs.len()
		}
	})
	if len(failures) > 0 {
		t.Errorf("%d requests failed across recycling: %v", len(failures), failures[:min(len(failures), 5)])
	}
	if served["https://"+cd.addr+"/p"] == 0 || served["http://"+cd.clear+"/p"] == 0 {
		t.Errorf("served %v, want requests on both ports", served)
	}
}

// USR2: the new supervisor inherits both listeners; clients on both
// ports see no refused connection across it, and both answer after.
func TestCleartextUpgradeE2E(t *testing.T) {
	t.Parallel()
	cd := startClearDaemon(t, "serve", "", "")
	tlsc, plain := cd.clients(t)
	var newPID int
	failures, served := cd.onBothPorts(tlsc, plain, func() {
		newPID = upgrade(t, cd.daemon)
		time.Sleep(200 * time.Millisecond)
	})
	if len(failures) > 0 {
		t.Errorf("%d requests failed across the upgrade: %v", len(failures), failures[:min(len(failures), 5)])
	}
	for _, url := range []string{"https://" + cd.addr + "/p", "http://" + cd.clear + "/p"} {
		c := plain
		if strings.HasPrefix(url, "https") {
			c = tlsc
		}
		if r := get(c, url); r.status != 200 {
			t.Errorf("%s after the upgrade: %d %v", url, r.status, r.err)
		}
	}
	t.Logf("served across the upgrade: %v", served)
	stopPID(t, cd.daemon, newPID)
}

// USR2 with a file that drops tls.cleartext_listen: the new supervisor
// closes the socket it inherited, logged at warn, and serves TLS; the
// cleartext port refuses once the old supervisor is gone.
func TestCleartextUpgradeDropsItE2E(t *testing.T) {
	t.Parallel()
	cd := startClearDaemon(t, "redirect", "", "")
	text, err := os.ReadFile(cd.cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	dropped := strings.Replace(string(text), fmt.Sprintf("cleartext_listen = %q\n", cd.clear), "", 1)
	if err := os.WriteFile(cd.cfgPath, []byte(dropped), 0o600); err != nil {
		t.Fatal(err)
	}
	from := cd.logs.len()
	newPID := upgrade(t, cd.daemon)
	if _, l, ok := cd.logs.waitFor(from, 5*time.Second, msgIs("upgrade: the old supervisor's listener serves nothing here: closed")); !ok || l.get("name") != "cleartext" || l.get("level") != "WARN" {
		t.Errorf("no warning of the cleartext socket closed: %v %v; log:\n%s", ok, l.raw, cd.logs.text())
	}
	tlsc, _ := cd.clients(t)
	if r := get(tlsc, "https://"+cd.addr+"/x"); r.status != 200 {
		t.Errorf("the TLS port after the upgrade: %d %v", r.status, r.err)
	}
	if c, err := net.DialTimeout("tcp", cd.clear, time.Second); err == nil {
		c.Close()
		t.Errorf("the cleartext port %s still accepts after an upgrade that dropped it", cd.clear)
	}
	stopPID(t, cd.daemon, newPID)
}

// check refuses tls.cleartext_listen without a certificate, and at
// server.listen's address, as a worker would.
func TestCleartextCheckE2E(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cert, key := tlstest.NewCA(t).Files(t, dir, "a", "a.example")
	certs := fmt.Sprintf("[[tls.certificate]]\ncert = %q\nkey = %q\n", cert, key)
	for _, tc := range []struct{ text, want string }{
		{"[server]\nlisten = \"127.0.0.1:8443\"\n[tls]\ncleartext_listen = \"127.0.0.1:8080\"\n", "tls.cleartext_listen: needs a [[tls.certificate]]"},
		{"[server]\nlisten = \"127.0.0.1:8443\"\n[tls]\ncleartext_listen = \"127.0.0.1:8443\"\n" + certs, "takes server.listen's port"},
	} {
		path := filepath.Join(dir, "preforkd.toml")
		if err := os.WriteFile(path, []byte(tc.text), 0o600); err != nil {
			t.Fatal(err)
		}
		code, out, errs := runBinary(t, "check", "-config", path)
		if code == 0 || !strings.Contains(out+errs, tc.want) {
			t.Errorf("check %q: exit %d, %s%s; want %q", tc.text, code, out, errs, tc.want)
		}
	}
}

// Socket activation with two sockets: the one named cleartext
// (FileDescriptorName=) serves tls.cleartext_listen, passed first here,
// and the other server.listen; neither configured address is bound.
func TestCleartextSocketActivationE2E(t *testing.T) {
	t.Parallel()
	activate := needTool(t, "systemd-socket-activate", "systemd")
	ca := tlstest.NewCA(t)
	dir := t.TempDir()
	cert, key := ca.Files(t, dir, "a", "a.example")
	addrs := freeAddrs(t, 4)
	passedTLS, passedClear, unusedTLS, unusedClear := addrs[0], addrs[1], addrs[2], addrs[3]
	d := &daemon{t: t, addr: passedTLS, cfgPath: filepath.Join(dir, "preforkd.toml"),
		wrapper: []string{activate, "-l", passedClear, "-l", passedTLS, "--fdname=cleartext:preforkd.socket"}}
	cfg := baseServer(2, "") + fmt.Sprintf("\n[tls]\ncleartext_listen = %q\n[[tls.certificate]]\ncert = %q\nkey = %q\n", unusedClear, cert, key)
	if err := os.WriteFile(d.cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	d.start(nil, "run", "-config", d.cfgPath, "-listen", unusedTLS)
	cd := &clearDaemon{daemon: d, ca: ca, clear: passedClear}
	tlsc, plain := cd.clients(t)
	var r result
	for deadline := time.Now().Add(10 * time.Second); ; {
		if r = get(plain, "http://"+passedClear+"/first"); r.err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond) // systemd-socket-activate not listening yet
	}
	_, port, _ := net.SplitHostPort(passedTLS)
	if want := "https://" + passedClear[:strings.LastIndexByte(passedClear, ':')] + ":" + port + "/first"; r.status != 308 || r.header.Get("Location") != want {
		t.Fatalf("the cleartext socket: %d %q %v, want 308 to %s", r.status, r.header.Get("Location"), r.err, want)
	}
	if r := get(tlsc, "https://"+passedTLS+"/x"); r.status != 200 {
		t.Errorf("the TLS socket: %d %v", r.status, r.err)
	}
	for _, a := range []string{unusedTLS, unusedClear} {
		if c, err := net.DialTimeout("tcp", a, time.Second); err == nil {
			c.Close()
			t.Errorf("%s was bound besides the passed sockets", a)
		}
	}
	d.stop()
}

// tls.cleartext and tls.redirect_port do nothing without a
// cleartext_listen, and redirect_port nothing when the cleartext port
// serves: check warns of each, and stays quiet when they take effect.
func TestCleartextNoEffectWarning(t *testing.T) {
	t.Parallel()
	ca := tlstest.NewCA(t)
	cert, key := ca.Files(t, t.TempDir(), "a", "a.example")
	tlsConf := func(keys string) string {
		return baseServer(2, "") + fmt.Sprintf("\n[tls]\n%s\n[[tls.certificate]]\ncert = %q\nkey = %q\n", keys, cert, key)
	}
	clear := "cleartext_listen = \"127.0.0.1:0\"\n"
	for _, tc := range []struct {
		name, cfg string
		want      []string // substrings of the warnings, one each
	}{
		{"serve, no listener", tlsConf(`cleartext = "serve"`), []string{"tls.cleartext has no effect"}},
		{"redirect, no listener", tlsConf(`cleartext = "redirect"`), []string{"tls.cleartext has no effect"}},
		{"redirect_port, no listener", tlsConf(`redirect_port = 8443`), []string{"tls.redirect_port has no effect"}},
		{"both, no tls", baseServer(2, "") + "\n[tls]\ncleartext = \"serve\"\nredirect_port = 8443\n",
			[]string{"tls.cleartext has no effect", "tls.redirect_port has no effect"}},
		{"redirect_port, serving", tlsConf(clear + "cleartext = \"serve\"\nredirect_port = 8443"), []string{"tls.redirect_port has no effect"}},
		{"redirect with listener", tlsConf(clear + "cleartext = \"redirect\"\nredirect_port = 8443"), nil},
		{"serve with listener", tlsConf(clear + `cleartext = "serve"`), nil},
	} {
		code, _, stderr := runBinary(t, "check", "-config", writeConfig(t, tc.cfg))
		if n := strings.Count(stderr, "preforkd check: warning: "); code != 0 || n != len(tc.want) {
			t.Errorf("%s: exit %d, %d warnings, stderr:\n%s\nwant exit 0 and %d", tc.name, code, n, stderr, len(tc.want))
		}
		for _, w := range tc.want {
			if !strings.Contains(stderr, w) || !strings.Contains(stderr, "cleartext_listen") {
				t.Errorf("%s: stderr lacks %q:\n%s", tc.name, w, stderr)
			}
		}
	}
}

// The access log says which port a request came on: the cleartext
// port's redirect is logged with scheme=http, the TLS port's request
// with scheme=https.
func TestCleartextAccessLogScheme(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "access.log")
	cd := startClearDaemon(t, "redirect", "", fmt.Sprintf("\n[log]\naccess = %q\n", path))
	tlsc, plain := cd.clients(t)
	req, _ := http.NewRequest("GET", "http://"+cd.clear+"/onclear", nil)
	req.Host = "a.example"
	if resp, err := plain.Do(req); err != nil || resp.StatusCode != 308 {
		t.Fatalf("cleartext port: %v %v, want 308", resp, err)
	} else {
		resp.Body.Close()
	}
	if r := get(tlsc, "https://"+cd.addr+"/ontls"); r.status != 200 {
		t.Fatalf("TLS port: %d %v", r.status, r.err)
	}
	want := map[string]string{"GET /onclear ": " scheme=http", "GET /ontls ": " scheme=https"}
	for _, l := range accessLines(t, path, 2, 5*time.Second) {
		for req, scheme := range want {
			if strings.Contains(l, req) {
				if !strings.HasSuffix(l, scheme) {
					t.Errorf("logged %q, want it to end with %q", l, scheme)
				}
				delete(want, req)
			}
		}
	}
	if len(want) != 0 {
		t.Errorf("no line for %v", want)
	}
}
