package main

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/preforkd/preforkd/config"
)

// README's "Trying it" prints what `make run` (examples/preforkd.toml)
// answers: the codes of seven POSTs to /login, the first lines of the
// next refusal as curl -si | head -12 prints them (in the order the
// engine writes them; a value written … varies), a MISS then a HIT under
// /cacheable/, and the workers' memory on /metrics.
func TestReadmeTryingIt(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, _ := strings.Cut(string(readme), "\n## Trying it\n")
	_, block, _ := strings.Cut(section, "```sh\n")
	block, _, _ = strings.Cut(block, "```")
	// The comment lines that follow each command, without their
	// annotations ("  — why").
	printed := map[string][]string{}
	cmd := ""
	for l := range strings.Lines(block) {
		l = strings.TrimRight(l, "\n")
		out, ok := strings.CutPrefix(l, "# ")
		if !ok {
			cmd = l
			continue
		}
		out, _, _ = strings.Cut(out, " — ")
		printed[cmd] = append(printed[cmd], strings.TrimSpace(out))
	}
	wants := func(prefix string) []string {
		for c, out := range printed {
			if strings.HasPrefix(c, prefix) {
				return out
			}
		}
		t.Fatalf("README's Trying it has no command %q that prints something", prefix)
		return nil
	}

	text, err := os.ReadFile("../../examples/preforkd.toml")
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load("../../examples/preforkd.toml")
	if err != nil {
		t.Fatal(err)
	}
	example := strings.Replace(string(text), `listen = "`+cfg.Admin.Listen+`"`, `listen = "ADMIN_ADDR"`, 1)
	d := startDaemon(t, daemonOptions{config: example, admin: true})
	c := &http.Client{Timeout: 5 * time.Second}

	var codes []string
	for range 7 {
		resp, err := c.Post(d.url("/login"), "", nil)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		codes = append(codes, resp.Status[:3])
	}
	if got, want := strings.Join(codes, " "), wants("for i in $(seq 7)")[0]; got != want {
		t.Errorf("seven POSTs to /login: %s, README says %s", got, want)
	}

	// The eighth, as curl -si sends it, its head as it comes.
	conn, err := net.DialTimeout("tcp", d.addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(5 * time.Second))
	io.WriteString(conn, "POST /login HTTP/1.1\r\nHost: localhost\r\nUser-Agent: curl/8.5.0\r\nAccept: */*\r\n\r\n")
	var head []string
	br := bufio.NewReader(conn)
	for len(head) < 12 {
		l, err := br.ReadString('\n')
		if l = strings.TrimRight(l, "\r\n"); l == "" || err != nil {
			break
		}
		head = append(head, l)
	}
	want := wants("curl -si -X POST localhost:8080/login")
	if len(want) != len(head) {
		t.Errorf("README shows %d lines of head -12, the refusal's head has %d:\n%s", len(want), len(head), strings.Join(head, "\n"))
	}
	for i := range min(len(want), len(head)) {
		w, g := want[i], head[i]
		if v, ok := strings.CutSuffix(w, " …"); ok && strings.HasPrefix(g, v+" ") {
			continue
		}
		if w != g {
			t.Errorf("line %d of the refusal: %q, README says %q", i+1, g, w)
		}
	}

	// X-Ratelimit-Reset is the Unix time Retry-After ends at: a whole
	// Retry-After after Date, or a second more (README "Rate limiting":
	// Date drops the fraction of a second that the reset rounds up).
	fields := map[string]string{}
	for _, l := range head {
		if k, v, ok := strings.Cut(l, ": "); ok {
			fields[k] = v
		}
	}
	date, errDate := http.ParseTime(fields["Date"])
	retry, errRetry := strconv.ParseInt(fields["Retry-After"], 10, 64)
	reset, errReset := strconv.ParseInt(fields["X-Ratelimit-Reset"], 10, 64)
	if errDate != nil || errRetry != nil || errReset != nil {
		t.Errorf("the refusal's Date, Retry-After or X-Ratelimit-Reset does not read: %v %v %v", errDate, errRetry, errReset)
	} else if d := reset - date.Unix(); d != retry && d != retry+1 {
		t.Errorf("X-Ratelimit-Reset %d is %d s after Date %q, want Retry-After %d (or a second more)", reset, d, fields["Date"], retry)
	}

	var xcache []string
	for range 2 {
		resp, err := c.Get(d.url("/cacheable/a"))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		xcache = append(xcache, "X-Cache: "+resp.Header.Get("X-Cache"))
	}
	if got, want := strings.Join(xcache, "\n"), strings.Join(wants("for i in 1 2"), "\n"); got != want {
		t.Errorf("two GETs of /cacheable/a:\n%s\nREADME says:\n%s", got, want)
	}

	resp, err := c.Get("http://" + d.admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	rss := regexp.MustCompile(`(?m)^preforkd_worker_resident_memory_bytes\{worker="\d+"\} [0-9.e+]+$`)
	if n := len(rss.FindAll(page, -1)); n != cfg.Server.Workers {
		t.Errorf("/metrics has %d lines of preforkd_worker_resident_memory_bytes, want one for each of %d workers", n, cfg.Server.Workers)
	}
}
