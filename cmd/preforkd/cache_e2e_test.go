package main

// The response cache against the built daemon: 4 workers in
// front of an upstream that this test runs and that counts its calls.

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// cacheOrigin is the application: it counts calls per path and answers
// each path its own way (see serve).
type cacheOrigin struct {
	addr  string
	mu    sync.Mutex
	calls map[string]int
	inm   map[string][]string // the If-None-Match each path was asked with
	down  atomic.Bool         // answer every request 503
	srv   *httptest.Server
}

func startCacheOrigin(t *testing.T) *cacheOrigin {
	o := &cacheOrigin{calls: map[string]int{}, inm: map[string][]string{}}
	o.srv = httptest.NewServer(http.HandlerFunc(o.serve))
	t.Cleanup(o.srv.Close)
	o.addr = o.srv.Listener.Addr().String()
	return o
}

func (o *cacheOrigin) count(path string) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.calls[path]
}

// bigBody is a 4 KiB body naming the call.
func bigBody(path string, n int) string {
	head := fmt.Sprintf("%s call %d\n", path, n)
	return head + strings.Repeat("x", 4096-len(head))
}

func (o *cacheOrigin) serve(w http.ResponseWriter, r *http.Request) {
	o.mu.Lock()
	o.calls[r.URL.Path]++
	n := o.calls[r.URL.Path]
	o.inm[r.URL.Path] = append(o.inm[r.URL.Path], r.Header.Get("If-None-Match"))
	o.mu.Unlock()
	h := w.Header()
	if o.down.Load() {
		w.WriteHeader(http.StatusServiceUnavailable)
		return
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.WriteHeader(http.StatusCreated)
		return
	}
	h.Set("Content-Type", "text/plain")
	switch r.URL.Path {
	case "/slow":
		time.Sleep(300 * time.Millisecond) // the other misses arrive meanwhile
		h.Set("Cache-Control", "max-age=60")
	case "/nostore":
		h.Set("Cache-Control", "max-age=60, no-store")
	case "/private":
		h.Set("Cache-Control", "private, max-age=60")
	case "/cookie":
		h.Set("Cache-Control", "max-age=60")
		h.Set("Set-Cookie", "session=1")
	case "/error":
		// An error status is stored only with explicit freshness.
		w.WriteHeader(http.StatusInternalServerError)
	case "/reval":
		// Fresh for a second, then revalidated: a 304 to its ETag.
		if r.Header.Get("If-None-Match") == `"reval-1"` {
			h.Set("Cache-Control", "max-age=600")
			h.Set("X-Validated", strconv.Itoa(n))
			w.WriteHeader(http.StatusNotModified)
			return
		}
		h.Set("Cache-Control", "max-age=1")
		h.Set("Etag", fmt.Sprintf(`"reval-%d"`, n))
	case "/targeted":
		// For every other cache, no-store; for this one, fresh.
		h.Set("Cache-Control", "no-store")
		h.Set("Preforkd-Cache-Control", "max-age=600")
	case "/vary":
		h.Set("Cache-Control", "max-age=60")
		h.Set("Vary", "Accept-Encoding")
		fmt.Fprintf(w, "encoding %q call %d", r.Header.Get("Accept-Encoding"), n)
		return
	case "/star":
		h.Set("Cache-Control", "max-age=60")
		h.Set("Vary", "*")
	case "/sie":
		h.Set("Cache-Control", "max-age=1, stale-if-error=600")
	case "/events":
		// An event stream that looks cacheable: one event, then nothing
		// until the client (or the test) goes.
		h.Set("Content-Type", "text/event-stream")
		h.Set("Cache-Control", "max-age=60")
		fmt.Fprint(w, "data: 0\n\n")
		w.(http.Flusher).Flush()
		<-r.Context().Done()
		return
	default:
		h.Set("Cache-Control", "max-age=60")
		h.Set("Etag", fmt.Sprintf(`"%s-%d"`, r.URL.Path, n))
		h.Set("Cache-Tag", "page, "+strings.TrimPrefix(r.URL.Path, "/")+"/%2F")
	}
	fmt.Fprint(w, bigBody(r.URL.Path, n))
}

// cacheConfig is 4 workers in front of o with one cache block over every
// path, the admin endpoint and its token, and extra appended.
func cacheConfig(t *testing.T, o *cacheOrigin, extra string) (cfg, token string) {
	token = "cache-test-token-0123456789"
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf(`[server]
workers = 4
upstream = "http://%s"
shutdown_timeout = "5s"

[admin]
listen = "ADMIN_ADDR"
token_file = %q

[table]
counters = 1024
responses = 512
response_bytes = "8MiB"

[[cache]]
path = "/*"
%s`, o.addr, tokenFile, extra), token
}

// purge sends POST /cache/purge with the query q, with the token or not.
func purge(t *testing.T, d *daemon, q url.Values, token string) result {
	t.Helper()
	h := http.Header{}
	if token != "" {
		h.Set("Authorization", "Bearer "+token)
	}
	return do(newClient(t, nil, false), http.MethodPost, "http://"+d.admin+"/cache/purge?"+q.Encode(), h)
}

func xcache(r result) string { return r.header.Get("X-Cache") }

// getAs is a GET with the Host field host: the same site whatever port a
// restarted daemon listens on (the cache's key has the Host).
func getAs(c *http.Client, url, host string) result {
	res := result{start: time.Now()}
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		res.err = err
		return res
	}
	req.Host = host
	resp, err := c.Do(req)
	if err != nil {
		res.err = err
		return res
	}
	defer resp.Body.Close()
	res.body, res.err = io.ReadAll(resp.Body)
	res.status, res.header, res.end = resp.StatusCode, resp.Header, time.Now()
	return res
}

func TestCacheE2E(t *testing.T) {
	t.Run("hits", parallel(cacheTestHits))
	t.Run("semantics", parallel(cacheTestSemantics))
	t.Run("persistence", parallel(cacheTestPersistence))
	t.Run("revalidation after a restart", parallel(cacheTestRevalidationPersists))
	t.Run("streams", parallel(cacheTestStreams))
}

// An event stream is never stored, and holds no other subscriber back:
// with lock_timeout at a minute, four subscribers over four workers each
// get their first event at once, each from the application.
func cacheTestStreams(t *testing.T) {
	o := startCacheOrigin(t)
	cfg, _ := cacheConfig(t, o, "lock_timeout = \"60s\"\n")
	d := startDaemon(t, daemonOptions{config: cfg, admin: true})
	c := newClient(t, nil, false) // a connection per request: any worker
	c.Timeout = 10 * time.Second
	for i := range 4 {
		resp, err := c.Get(d.url("/events"))
		if err != nil {
			t.Fatalf("subscriber %d: %v", i, err)
		}
		defer resp.Body.Close()
		line, err := bufio.NewReader(resp.Body).ReadString('\n')
		if line != "data: 0\n" || resp.Header.Get("X-Cache") != "MISS" {
			t.Fatalf("subscriber %d: %q, %v, X-Cache %q", i, line, err, resp.Header.Get("X-Cache"))
		}
	}
	if n := o.count("/events"); n != 4 {
		t.Errorf("the application served %d subscribers, want 4", n)
	}
}

// A stale entry restored from the dump is revalidated with its ETag (a
// 304 refreshes it, the stored body is served), and an entry stored by
// preforkd's own targeted field is still a hit after the restart, the
// field still kept from clients.
func cacheTestRevalidationPersists(t *testing.T) {
	o := startCacheOrigin(t)
	dump := filepath.Join(t.TempDir(), "dump")
	cfg, _ := cacheConfig(t, o, fmt.Sprintf("\n[persist]\npath = %q\nkey = \"v1\"\n", dump))
	c := newClient(t, nil, false)
	d := startDaemon(t, daemonOptions{config: cfg, admin: true})
	reval, targeted := getAs(c, d.url("/reval"), "site.test"), getAs(c, d.url("/targeted"), "site.test")
	if xcache(reval) != "MISS" || xcache(targeted) != "MISS" || targeted.header.Get("Preforkd-Cache-Control") != "" {
		t.Fatalf("before the restart: %q %q %v", xcache(reval), xcache(targeted), targeted.header)
	}
	d.stop()
	time.Sleep(time.Until(reval.end.Add(1100 * time.Millisecond))) // /reval is stale

	d = startDaemon(t, daemonOptions{config: cfg, admin: true})
	r := getAs(c, d.url("/reval"), "site.test")
	if xcache(r) != "REVALIDATED" || !bytes.Equal(r.body, reval.body) || r.header.Get("X-Validated") != "2" || r.header.Get("Etag") != `"reval-1"` {
		t.Fatalf("/reval after the restart: %d %q X-Validated %q, same body %v", r.status, xcache(r), r.header.Get("X-Validated"), bytes.Equal(r.body, reval.body))
	}
	if r := getAs(c, d.url("/reval"), "site.test"); xcache(r) != "HIT" || r.header.Get("X-Validated") != "2" {
		t.Fatalf("/reval refreshed: %q", xcache(r))
	}
	o.mu.Lock()
	inm := fmt.Sprint(o.inm["/reval"])
	o.mu.Unlock()
	if inm != `[ "reval-1"]` {
		t.Fatalf("/reval was asked with If-None-Match %s, want none then the stored ETag", inm)
	}
	r = getAs(c, d.url("/targeted"), "site.test")
	if xcache(r) != "HIT" || !bytes.Equal(r.body, targeted.body) || r.header.Get("Preforkd-Cache-Control") != "" || r.header.Get("Cache-Control") != "no-store" {
		t.Fatalf("/targeted after the restart: %q %v", xcache(r), r.header)
	}
	if n := o.count("/targeted"); n != 1 {
		t.Fatalf("/targeted fetched %d times", n)
	}
}

// 100 requests over 4 workers: one fetch, 99 hits, the same bytes, an Age
// that rises; 50 concurrent misses for another URL: one fetch.
func cacheTestHits(t *testing.T) {
	o := startCacheOrigin(t)
	cfg, _ := cacheConfig(t, o, "")
	d := startDaemon(t, daemonOptions{config: cfg, admin: true})
	c := newClient(t, nil, false) // a connection per request: any worker

	var mu sync.Mutex
	var all []result
	first := get(c, d.url("/page"))
	if first.status != 200 || xcache(first) != "MISS" || len(first.body) != 4096 {
		t.Fatalf("first: %d %q %d bytes", first.status, xcache(first), len(first.body))
	}
	var wg sync.WaitGroup
	for g := range 3 {
		wg.Go(func() {
			for i := range 33 {
				time.Sleep(time.Duration(70+g) * time.Millisecond) // 99 hits over about 2.3 s
				r := get(c, d.url("/page"))
				mu.Lock()
				all = append(all, r)
				mu.Unlock()
				_ = i
			}
		})
	}
	wg.Wait()
	if n := o.count("/page"); n != 1 {
		t.Fatalf("%d fetches for 100 requests, want 1", n)
	}
	sort.Slice(all, func(i, j int) bool { return all[i].start.Before(all[j].start) })
	for i, r := range all {
		if r.err != nil || r.status != 200 || xcache(r) != "HIT" || !bytes.Equal(r.body, first.body) {
			t.Fatalf("request %d: %v %d %q, same bytes %v", i+2, r.err, r.status, xcache(r), bytes.Equal(r.body, first.body))
		}
	}
	age := func(r result) int { n, _ := strconv.Atoi(r.header.Get("Age")); return n }
	for i := range all {
		for j := range i {
			if all[j].end.Before(all[i].start) && age(all[i]) < age(all[j]) {
				t.Fatalf("Age went down: %d then %d", age(all[j]), age(all[i]))
			}
		}
	}
	if a, z := age(all[0]), age(all[len(all)-1]); a > 1 || z < 2 {
		t.Fatalf("Age from %d to %d over %v, want 0..1 to at least 2", a, z, all[len(all)-1].start.Sub(all[0].start))
	}

	// 50 misses at once.
	rs := burst(c, d.url("/slow"), 50)
	xc := map[string]int{}
	for _, r := range rs {
		if r.err != nil || r.status != 200 || string(r.body) != bigBody("/slow", 1) {
			t.Fatalf("a concurrent miss: %v %d %.20q", r.err, r.status, r.body)
		}
		xc[xcache(r)]++
	}
	if n := o.count("/slow"); n != 1 || xc["MISS"] != 1 || xc["HIT"] != 49 {
		t.Fatalf("%d fetches for 50 concurrent misses (want 1); X-Cache %v", n, xc)
	}

	// The workers' counts, summed by the supervisor (a request is counted
	// once its response went out: the page may lag a moment).
	want := []string{
		`preforkd_cache_requests_total{result="hit"} 148`,
		`preforkd_cache_requests_total{result="miss"} 2`,
		`preforkd_cache_fills_total{result="stored"} 2`,
		`preforkd_cache_sent_bytes_total 606208`, // 148 × 4096
	}
	deadline := time.Now().Add(3 * time.Second)
	for {
		page := string(get(c, "http://"+d.admin+"/metrics").body)
		missing := ""
		for _, w := range want {
			if !strings.Contains(page, w+"\n") {
				missing = w
			}
		}
		if missing == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/metrics lacks %q:\n%s", missing, page)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// What is not stored, Vary, 304, invalidation, purges and stale-if-error.
func cacheTestSemantics(t *testing.T) {
	o := startCacheOrigin(t)
	cfg, token := cacheConfig(t, o, "")
	d := startDaemon(t, daemonOptions{config: cfg, admin: true})
	c := newClient(t, nil, false)

	for _, tt := range []struct {
		path string
		hdr  http.Header
	}{
		{"/nostore", nil}, {"/private", nil}, {"/cookie", nil}, {"/error", nil}, {"/star", nil},
		{"/auth", http.Header{"Authorization": {"Bearer user-1"}}},
	} {
		for i := range 3 {
			if r := do(c, http.MethodGet, d.url(tt.path), tt.hdr); r.err != nil || xcache(r) != "MISS" {
				t.Fatalf("%s request %d: %v X-Cache %q", tt.path, i+1, r.err, xcache(r))
			}
		}
		if n := o.count(tt.path); n != 3 {
			t.Fatalf("%s: %d fetches for 3 requests, want 3 (never stored)", tt.path, n)
		}
	}

	// Two variants of one URL, each stored apart.
	for range 3 {
		for _, enc := range []string{"gzip", "br"} {
			r := do(c, http.MethodGet, d.url("/vary"), http.Header{"Accept-Encoding": {enc}})
			if !strings.HasPrefix(string(r.body), fmt.Sprintf("encoding %q", enc)) {
				t.Fatalf("%s got %q (%s)", enc, r.body, xcache(r))
			}
		}
	}
	if n := o.count("/vary"); n != 2 {
		t.Fatalf("/vary: %d fetches, want 2", n)
	}

	// 304 from the cache to the stored ETag; the upstream is not asked.
	get(c, d.url("/etag"))
	r := do(c, http.MethodGet, d.url("/etag"), http.Header{"If-None-Match": {`"/etag-1"`}})
	if r.status != 304 || len(r.body) != 0 || xcache(r) != "HIT" || o.count("/etag") != 1 {
		t.Fatalf("conditional: %d, %d bytes, %q, %d fetches", r.status, len(r.body), xcache(r), o.count("/etag"))
	}

	// A successful POST invalidates the URL.
	get(c, d.url("/doc"))
	if r := get(c, d.url("/doc")); xcache(r) != "HIT" {
		t.Fatalf("/doc before the POST: %q", xcache(r))
	}
	if r := do(c, http.MethodPost, d.url("/doc"), nil); r.status != 201 {
		t.Fatalf("POST: %d", r.status)
	}
	if r := get(c, d.url("/doc")); xcache(r) != "MISS" || string(r.body) != bigBody("/doc", 3) {
		t.Fatalf("/doc after the POST: %q %.16q", xcache(r), r.body)
	}

	// Purge by tag: without the token, 401 and nothing purged; with it,
	// the next requests in every worker miss.
	get(c, d.url("/tagged"))
	if r := purge(t, d, url.Values{"tag": {"tagged/%2F"}}, ""); r.status != 401 {
		t.Fatalf("purge without the token: %d %s", r.status, r.body)
	}
	if r := purge(t, d, url.Values{"tag": {"tagged/%2F"}}, "wrong-token-0123456789"); r.status != 401 {
		t.Fatalf("purge with a wrong token: %d", r.status)
	}
	if r := get(c, d.url("/tagged")); xcache(r) != "HIT" {
		t.Fatalf("after the refused purges: %q", xcache(r))
	}
	// The tag as sent, "tagged/%2F": its own bytes purge it, not a decoding.
	if r := purge(t, d, url.Values{"tag": {"tagged//"}}, token); r.status != 200 {
		t.Fatalf("purge: %d %s", r.status, r.body)
	}
	if r := get(c, d.url("/tagged")); xcache(r) != "HIT" {
		t.Fatalf("a decoded tag purged the entry: %q", xcache(r))
	}
	if r := purge(t, d, url.Values{"tag": {"tagged/%2F"}}, token); r.status != 200 || !strings.Contains(string(r.body), `"purged_tags":1`) {
		t.Fatalf("purge: %d %s", r.status, r.body)
	}
	rs := burst(c, d.url("/tagged"), 8)
	for _, r := range rs {
		if string(r.body) != bigBody("/tagged", 2) {
			t.Fatalf("after the purge: %s %.20q", xcache(r), r.body)
		}
	}
	if n := o.count("/tagged"); n != 2 {
		t.Fatalf("/tagged: %d fetches, want 2", n)
	}
	// By URL: the path and query as a client sends them.
	get(c, d.url("/byurl?a=1"))
	if r := purge(t, d, url.Values{"key": {"/byurl?a=1"}}, token); r.status != 200 {
		t.Fatalf("purge by key: %d %s", r.status, r.body)
	}
	if r := get(c, d.url("/byurl?a=1")); xcache(r) != "MISS" {
		t.Fatalf("after the purge by key: %q", xcache(r))
	}
	if r := purge(t, d, url.Values{"key": {"/ok", "no-slash"}, "tag": {"page"}}, token); r.status != 400 {
		t.Fatalf("a bad key: %d %s", r.status, r.body)
	}
	if r := get(c, d.url("/byurl?a=1")); xcache(r) != "HIT" {
		t.Fatalf("a refused purge purged the tag: %q", xcache(r))
	}
	// Two tag purges went through (the decoded tag's too), one by key,
	// one invalidation by the POST.
	page := string(get(c, "http://"+d.admin+"/metrics").body)
	for _, w := range []string{`preforkd_cache_purges_total{by="tag"} 2`, `preforkd_cache_purges_total{by="url"} 2`} {
		if !strings.Contains(page, w+"\n") {
			t.Fatalf("/metrics lacks %q:\n%s", w, page)
		}
	}

	// stale-if-error: the upstream fails, the stale response is sent.
	get(c, d.url("/sie"))
	time.Sleep(1100 * time.Millisecond) // max-age=1 runs out
	o.down.Store(true)
	r = get(c, d.url("/sie"))
	if r.status != 200 || xcache(r) != "STALE" || string(r.body) != bigBody("/sie", 1) {
		t.Fatalf("upstream failing: %d %q %.16q", r.status, xcache(r), r.body)
	}
	o.srv.Close() // and now unreachable
	r = get(c, d.url("/sie"))
	if r.status != 200 || xcache(r) != "STALE" || string(r.body) != bigBody("/sie", 1) {
		t.Fatalf("upstream down: %d %q %.16q", r.status, xcache(r), r.body)
	}
	if r := get(c, d.url("/never")); r.status != 502 {
		t.Fatalf("upstream down, nothing stored: %d", r.status)
	}
}

// TERM and a restart under the same persist.key: hits with the same
// bytes, and a purge after the restart reaches a restored entry. Under
// another persist.key: misses, and the counters are kept.
func cacheTestPersistence(t *testing.T) {
	o := startCacheOrigin(t)
	dump := filepath.Join(t.TempDir(), "dump")
	persistAt := func(key string) string {
		cfg, _ := cacheConfig(t, o, fmt.Sprintf(`
[persist]
path = %q
key = %q

[[ratelimit]]
name = "limited"
path = "/limited"
limit = 2
window = "1h"
`, dump, key))
		return cfg
	}
	cfg, token := cacheConfig(t, o, "")
	_ = cfg
	c := newClient(t, nil, false)
	d := startDaemon(t, daemonOptions{config: persistAt("v1"), admin: true})
	// /b is stored after a purge of its tag: it records the generation
	// after it, which the restart must restore with it (else it would
	// look purged).
	if r := purge(t, d, url.Values{"tag": {"b/%2F"}}, token); r.status != 200 {
		t.Fatalf("purge: %d %s", r.status, r.body)
	}
	a, b := getAs(c, d.url("/a"), "site.test"), getAs(c, d.url("/b"), "site.test")
	for range 2 {
		getAs(c, d.url("/limited"), "site.test")
	}
	if r := getAs(c, d.url("/limited"), "site.test"); r.status != 429 {
		t.Fatalf("the limit before the restart: %d", r.status)
	}
	d.stop()
	if code, out, _ := runBinary(t, "inspect", dump); code != 0 || !strings.Contains(out, "3 cached responses (0 expired at dump)") || !strings.Contains(out, "1 tag generations") {
		t.Fatalf("inspect: exit %d\n%s", code, out)
	}

	d = startDaemon(t, daemonOptions{config: persistAt("v1"), admin: true})
	for _, want := range []result{a, b} {
		path := "/" + strings.Fields(string(want.body))[0][1:]
		r := getAs(c, d.url(path), "site.test")
		if xcache(r) != "HIT" || !bytes.Equal(r.body, want.body) || r.header.Get("Etag") != want.header.Get("Etag") {
			t.Fatalf("%s after the restart: %q, same bytes %v", path, xcache(r), bytes.Equal(r.body, want.body))
		}
	}
	if r := purge(t, d, url.Values{"tag": {"a/%2F"}}, token); r.status != 200 {
		t.Fatalf("purge: %d %s", r.status, r.body)
	}
	if r := getAs(c, d.url("/a"), "site.test"); xcache(r) != "MISS" {
		t.Fatalf("a restored entry after a purge: %q", xcache(r))
	}
	if r := getAs(c, d.url("/b"), "site.test"); xcache(r) != "HIT" {
		t.Fatalf("another restored entry after the purge: %q", xcache(r))
	}
	d.stop()

	d = startDaemon(t, daemonOptions{config: persistAt("v2"), admin: true})
	if r := getAs(c, d.url("/b"), "site.test"); xcache(r) != "MISS" {
		t.Fatalf("under another persist.key: %q", xcache(r))
	}
	if r := getAs(c, d.url("/limited"), "site.test"); r.status != 429 {
		t.Fatalf("the counters under another persist.key: %d", r.status)
	}
	if !strings.Contains(d.logs.text(), "cache refused: persist key changed") {
		t.Fatalf("no log line for the dropped cache:\n%s", d.logs.text())
	}
}
