package nethttp_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"net/textproto"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/preforkd/preforkd/config"
	"github.com/preforkd/preforkd/shm"
)

// ---- fixtures ----

// region is a heap-backed region (the race detector sees into it) with
// small blocks, so that bodies span many of them.
func region(t testing.TB, records int) *shm.Region {
	t.Helper()
	return newRegion(t, shm.Options{Counters: 8, Responses: records, ResponseBytes: 1 << 16, BlockSize: 256})
}

// orders is the block most tests use: POST /orders, waiting up to 5s.
func orders() config.Idempotency {
	return config.Idempotency{Path: "/orders", Methods: []string{"POST"}, Wait: config.IdemWait(5 * time.Second)}
}

func newMiddleware(t testing.TB, r *shm.Region, next http.Handler, blocks ...config.Idempotency) *handler {
	t.Helper()
	m, err := New(config.Config{Idempotency: blocks}, r, next, Options{})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// counting is a handler that counts its executions and answers with
// answer(n) for the n-th (1-based).
type counting struct {
	n      atomic.Int64
	answer func(n int64, w http.ResponseWriter, r *http.Request)
}

func (c *counting) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n := c.n.Add(1)
	if c.answer != nil {
		c.answer(n, w, r)
		return
	}
	body, _ := io.ReadAll(r.Body)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", "/orders/"+strconv.FormatInt(n, 10))
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"order":%d,"body":%q}`, n, body)
}

func (c *counting) count() int64 { return c.n.Load() }

// answer is one response as a client sees it.
type answer struct {
	status int
	header http.Header
	body   []byte
}

func (a answer) replayed() bool { return a.header.Get("Idempotent-Replayed") == "true" }

// post sends a keyed POST to the middleware directly; key "" sends none.
func post(m http.Handler, path, key, body string, header ...string) answer {
	req := httptest.NewRequest(http.MethodPost, path, strings.NewReader(body))
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	for i := 0; i+1 < len(header); i += 2 {
		if header[i] == ":peer" { // the client's address, not a field
			req.RemoteAddr = header[i+1]
			continue
		}
		req.Header.Add(header[i], header[i+1])
	}
	rec := httptest.NewRecorder()
	m.ServeHTTP(rec, req)
	return answer{rec.Code, rec.Result().Header, rec.Body.Bytes()}
}

// postHTTP sends a keyed POST over a real connection.
func postHTTP(t testing.TB, c *http.Client, url, key, body string) answer {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Error(err)
		return answer{}
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Error(err)
		return answer{}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Error(err)
	}
	return answer{resp.StatusCode, resp.Header, b}
}

type problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail"`
}

// wantProblem checks that a is a complete problem+json answer of status.
func wantProblem(t *testing.T, a answer, status int) problem {
	t.Helper()
	if a.status != status {
		t.Fatalf("status %d, want %d; body %s", a.status, status, a.body)
	}
	if ct := a.header.Get("Content-Type"); ct != "application/problem+json" {
		t.Errorf("Content-Type %q", ct)
	}
	if cc := a.header.Get("Cache-Control"); cc != "no-store" {
		t.Errorf("Cache-Control %q", cc)
	}
	if a.replayed() {
		t.Errorf("a problem marked as replayed")
	}
	var p problem
	if err := json.Unmarshal(a.body, &p); err != nil {
		t.Fatalf("body %q: %v", a.body, err)
	}
	if p.Status != status || p.Type == "" || p.Title == "" || p.Detail == "" {
		t.Fatalf("problem %+v", p)
	}
	for _, internal := range []string{"shm", "table", "record", "worker", "futex"} {
		if strings.Contains(p.Detail, internal) {
			t.Errorf("detail %q speaks of internals (%q)", p.Detail, internal)
		}
	}
	return p
}

func wantRetryAfter(t *testing.T, a answer) {
	t.Helper()
	n, err := strconv.Atoi(a.header.Get("Retry-After"))
	if err != nil || n < 1 {
		t.Fatalf("Retry-After %q", a.header.Get("Retry-After"))
	}
}

// ---- the stories ----

// 1. Twenty identical keyed POSTs at once: the handler runs once, and all
// twenty get the same bytes, the late ones marked as replayed.
func TestParallelDuplicatesRunOnce(t *testing.T) {
	h := &counting{answer: func(n int64, w http.ResponseWriter, r *http.Request) {
		time.Sleep(50 * time.Millisecond) // the duplicates arrive while it runs
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"order":%d,"at":%d}`, n, time.Now().UnixNano())
	}}
	m := newMiddleware(t, region(t, 64), h, orders())
	srv := httptest.NewServer(m)
	defer srv.Close()
	c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}

	answers := make([]answer, 20)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range answers {
		wg.Go(func() {
			<-start
			answers[i] = postHTTP(t, c, srv.URL+"/orders", `"order-1"`, `{"item":42}`)
		})
	}
	close(start)
	wg.Wait()
	if h.count() != 1 {
		t.Fatalf("handler ran %d times", h.count())
	}
	originals := 0
	for i, a := range answers {
		if a.status != http.StatusCreated || !bytes.Equal(a.body, answers[0].body) {
			t.Fatalf("answer %d: %d %q, want 201 %q", i, a.status, a.body, answers[0].body)
		}
		if !a.replayed() {
			originals++
		}
	}
	if originals != 1 {
		t.Fatalf("%d answers without Idempotent-Replayed, want 1", originals)
	}
	if st := m.IdemStats(); st.Executions != 1 || st.Replays != 19 {
		t.Fatalf("stats %+v", st)
	}
}

// 2. The same key with another body is refused and runs nothing; the
// record is unchanged, so the original body still replays.
func TestMismatch(t *testing.T) {
	h := &counting{}
	m := newMiddleware(t, region(t, 64), h, orders())
	first := post(m, "/orders", "k", `{"item":1}`)
	if first.status != http.StatusCreated {
		t.Fatalf("first: %d", first.status)
	}
	for _, other := range []struct{ path, body, ct string }{
		{"/orders", `{"item":2}`, ""},
		{"/orders?coupon=1", `{"item":1}`, ""},
		{"/orders", `{"item":1} `, ""},
		{"/orders", ``, ""},
		// The same bytes as another media type are another request.
		{"/orders", `{"item":1}`, "application/x-www-form-urlencoded"},
		// The same request to another host (one application serving
		// its tenants by name) is another request.
		{"http://tenant-b.example/orders", `{"item":1}`, ""},
	} {
		var a answer
		if other.ct != "" {
			a = post(m, other.path, "k", other.body, "Content-Type", other.ct)
		} else {
			a = post(m, other.path, "k", other.body)
		}
		wantProblem(t, a, http.StatusUnprocessableEntity)
	}
	// Another method under the same key, with a block that covers it.
	m2 := newMiddleware(t, region(t, 64), h, config.Idempotency{Path: "/orders", Wait: config.IdemWait(time.Second)})
	post(m2, "/orders", "k2", "x")
	req := httptest.NewRequest(http.MethodPatch, "/orders", strings.NewReader("x"))
	req.Header.Set("Idempotency-Key", "k2")
	rec := httptest.NewRecorder()
	m2.ServeHTTP(rec, req)
	wantProblem(t, answer{rec.Code, rec.Result().Header, rec.Body.Bytes()}, http.StatusUnprocessableEntity)

	if h.count() != 2 {
		t.Fatalf("handler ran %d times, want 2 (one per key)", h.count())
	}
	again := post(m, "/orders", "k", `{"item":1}`)
	if again.status != http.StatusCreated || !again.replayed() || !bytes.Equal(again.body, first.body) {
		t.Fatalf("original again: %d %q replayed=%v", again.status, again.body, again.replayed())
	}
	if st := m.IdemStats(); st.Mismatches != 6 || st.Executions != 1 {
		t.Fatalf("stats %+v", st)
	}
}

// A namespace header sent twice is refused (400), never charged as one
// client and served as the other; nothing runs.
func TestRepeatedNamespaceHeader(t *testing.T) {
	h := &counting{}
	m := newMiddleware(t, region(t, 64), h, orders())
	a := post(m, "/orders", "k", "x", "Authorization", "Bearer a", "Authorization", "Bearer b")
	p := wantProblem(t, a, http.StatusBadRequest)
	if !strings.Contains(p.Detail, "Authorization") {
		t.Fatalf("detail %q does not name the header", p.Detail)
	}
	if h.count() != 0 {
		t.Fatalf("the handler ran %d times", h.count())
	}
}

// 3. The same key from two clients is two requests.
func TestKeysArePerClient(t *testing.T) {
	h := &counting{}
	m := newMiddleware(t, region(t, 64), h, orders()) // by = header:Authorization|ip
	alice := post(m, "/orders", "k", "x", "Authorization", "Bearer alice")
	bob := post(m, "/orders", "k", "x", "Authorization", "Bearer bob")
	anon := post(m, "/orders", "k", "x") // by ip: 192.0.2.1, httptest's
	if h.count() != 3 || alice.replayed() || bob.replayed() || anon.replayed() {
		t.Fatalf("%d executions for three clients", h.count())
	}
	if again := post(m, "/orders", "k", "x", "Authorization", "Bearer bob"); !again.replayed() || !bytes.Equal(again.body, bob.body) {
		t.Fatalf("bob's retry: %q, want bob's %q", again.body, bob.body)
	}
	if h.count() != 3 {
		t.Fatalf("%d executions", h.count())
	}

	// by = ip: two addresses, and the same address with any Authorization.
	h2 := &counting{}
	byIP := orders()
	byIP.By = "ip"
	m2 := newMiddleware(t, region(t, 64), h2, byIP)
	for _, addr := range []string{"198.51.100.1:1000", "198.51.100.2:1000", "198.51.100.1:2000"} {
		req := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader("x"))
		req.RemoteAddr = addr
		req.Header.Set("Idempotency-Key", "k")
		req.Header.Set("Authorization", addr)
		m2.ServeHTTP(httptest.NewRecorder(), req)
	}
	if h2.count() != 2 {
		t.Fatalf("by ip: %d executions for two addresses", h2.count())
	}
}

// 4. A 500 is not stored: the retry runs again and gets the 201, which
// later retries replay with its Location.
func TestServerErrorIsNotStored(t *testing.T) {
	for _, status := range []int{http.StatusInternalServerError, http.StatusBadGateway, http.StatusRequestTimeout, http.StatusTooManyRequests} {
		t.Run(strconv.Itoa(status), func(t *testing.T) {
			h := &counting{answer: func(n int64, w http.ResponseWriter, r *http.Request) {
				if n == 1 {
					http.Error(w, "try again", status)
					return
				}
				w.Header().Set("Location", "/orders/77")
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusCreated)
				io.WriteString(w, `{"order":77}`)
			}}
			m := newMiddleware(t, region(t, 64), h, orders())
			if a := post(m, "/orders", "k", "x"); a.status != status || a.replayed() {
				t.Fatalf("first: %d", a.status)
			}
			second := post(m, "/orders", "k", "x")
			if second.status != http.StatusCreated || second.replayed() || h.count() != 2 {
				t.Fatalf("retry: %d replayed=%v after %d executions", second.status, second.replayed(), h.count())
			}
			for range 3 {
				a := post(m, "/orders", "k", "x")
				if a.status != http.StatusCreated || !a.replayed() || a.header.Get("Location") != "/orders/77" ||
					a.header.Get("Content-Type") != "application/json" || !bytes.Equal(a.body, second.body) {
					t.Fatalf("later retry: %d %v %q", a.status, a.header, a.body)
				}
			}
			if h.count() != 2 {
				t.Fatalf("%d executions", h.count())
			}
			if st := m.IdemStats(); st.Released != 1 || st.Executions != 2 || st.Replays != 3 {
				t.Fatalf("stats %+v", st)
			}
		})
	}
}

// 5. Replays are byte-exact over the wire: an empty 204, a binary body
// with NUL bytes, a body over many blocks, and a body without a
// Content-Type (sniffed once, the same for the original and the replays).
func TestReplayIsByteExact(t *testing.T) {
	binary := bytes.Repeat([]byte{0, 0xff, 0, 'a', 0, '\n', 0x80}, 11)
	many := make([]byte, 40_000) // 162 blocks of 256 bytes (248 of data)
	for i := range many {
		many[i] = byte(i * 7)
	}
	tests := []struct {
		name   string
		status int
		ct     string // "" leaves it unset; "-" suppresses sniffing
		body   []byte
	}{
		{"empty 204", http.StatusNoContent, "", nil},
		{"empty 200", http.StatusOK, "", nil},
		{"empty 201 with a type", http.StatusCreated, "application/json", nil},
		{"binary with NULs", http.StatusOK, "application/octet-stream", binary},
		{"many blocks", http.StatusAccepted, "application/octet-stream", many},
		{"sniffed", http.StatusOK, "", []byte("<html><body>hello</body></html>")},
		{"no type, no sniffing", http.StatusOK, "-", []byte("<html><body>hello</body></html>")},
		{"a 4xx is stored", http.StatusNotFound, "text/plain", []byte("no such product")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := &counting{answer: func(n int64, w http.ResponseWriter, r *http.Request) {
				switch tt.ct {
				case "":
				case "-":
					w.Header()["Content-Type"] = nil
				default:
					w.Header().Set("Content-Type", tt.ct)
				}
				w.WriteHeader(tt.status)
				for b := tt.body; len(b) > 0; { // in pieces, as a proxy copies
					n := min(len(b), 1000)
					w.Write(b[:n])
					b = b[n:]
				}
			}}
			m := newMiddleware(t, region(t, 64), h, orders())
			srv := httptest.NewServer(m)
			defer srv.Close()
			first := postHTTP(t, srv.Client(), srv.URL+"/orders", "k", "x")
			for i := range 3 {
				a := postHTTP(t, srv.Client(), srv.URL+"/orders", "k", "x")
				if a.status != first.status || !bytes.Equal(a.body, first.body) || !bytes.Equal(a.body, tt.body) {
					t.Fatalf("replay %d: %d, %d bytes; original %d, %d bytes; want %d bytes", i, a.status, len(a.body), first.status, len(first.body), len(tt.body))
				}
				if a.header.Get("Content-Type") != first.header.Get("Content-Type") || !a.replayed() {
					t.Fatalf("replay %d: Content-Type %q, original %q, replayed=%v", i, a.header.Get("Content-Type"), first.header.Get("Content-Type"), a.replayed())
				}
			}
			if h.count() != 1 {
				t.Fatalf("%d executions", h.count())
			}
		})
	}
}

// 6. With every record taken, a new key gets 503 and never runs.
func TestTableFull(t *testing.T) {
	h := &counting{}
	m := newMiddleware(t, region(t, 8), h, orders())
	for i := range 8 {
		if a := post(m, "/orders", fmt.Sprint("k", i), "x"); a.status != http.StatusCreated {
			t.Fatalf("key %d: %d", i, a.status)
		}
	}
	for i := 8; i < 12; i++ {
		a := post(m, "/orders", fmt.Sprint("k", i), "x")
		wantProblem(t, a, http.StatusServiceUnavailable)
		wantRetryAfter(t, a)
	}
	if h.count() != 8 {
		t.Fatalf("%d executions with 8 records", h.count())
	}
	// The stored ones still replay.
	if a := post(m, "/orders", "k3", "x"); !a.replayed() {
		t.Fatalf("k3: %d", a.status)
	}
	if st := m.IdemStats(); st.Full != 4 || st.Executions != 8 {
		t.Fatalf("stats %+v", st)
	}
}

// A worker whose identity was retired while it runs (reaped as dead)
// reserves nothing: 503, as for a full table, without an error line per
// request.
func TestRetiredWorker(t *testing.T) {
	var logs bytes.Buffer
	r := region(t, 8)
	h := &counting{}
	m, err := New(config.Config{Idempotency: []config.Idempotency{orders()}}, r, h,
		Options{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	r.ReapAll() // a new supervisor took the region over
	a := post(m, "/orders", "k", "x")
	wantProblem(t, a, http.StatusServiceUnavailable)
	if h.count() != 0 || logs.Len() != 0 {
		t.Fatalf("%d executions; logged:\n%s", h.count(), logs.String())
	}
}

// 7. A response over max_body reaches the client whole but is not stored:
// retries get 409 and nothing runs twice.
func TestResponseOverMaxBody(t *testing.T) {
	big := bytes.Repeat([]byte("0123456789"), 100)
	h := &counting{answer: func(n int64, w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		for i := 0; i < len(big); i += 100 {
			w.Write(big[i : i+100])
		}
	}}
	blk := orders()
	blk.MaxBody = 300
	m := newMiddleware(t, region(t, 64), h, blk)
	first := post(m, "/orders", "k", "x")
	if first.status != http.StatusCreated || !bytes.Equal(first.body, big) {
		t.Fatalf("original: %d, %d bytes", first.status, len(first.body))
	}
	for range 3 {
		wantProblem(t, post(m, "/orders", "k", "x"), http.StatusConflict)
	}
	if h.count() != 1 {
		t.Fatalf("%d executions", h.count())
	}
	if st := m.IdemStats(); st.Unreplayable != 1 || st.Conflicts != 3 {
		t.Fatalf("stats %+v", st)
	}
}

// 8. Keys are validated strictly, before anything is read or run.
func TestKeyValidation(t *testing.T) {
	h := &counting{}
	required := orders()
	required.Path = "/payments"
	required.Required = true
	m := newMiddleware(t, region(t, 64), h, orders(), required)
	tests := []struct {
		name   string
		path   string
		values []string // nil: no header
		detail string
	}{
		{"required and missing", "/payments", nil, "needs"},
		{"empty", "/orders", []string{""}, "empty"},
		{"empty string", "/orders", []string{`""`}, "empty"},
		{"too long", "/orders", []string{strings.Repeat("a", 256)}, "255"},
		{"control character", "/orders", []string{"\"a\x01b\""}, "control"},
		{"two lines", "/orders", []string{"a", "a"}, "exactly one"},
		{"a list", "/orders", []string{`"a", "b"`}, "exactly one"},
		{"malformed", "/orders", []string{`"abc`}, "quoted string"},
		{"parameters", "/orders", []string{`"abc";v=1`}, "quoted string"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := httptest.NewRequest(http.MethodPost, tt.path, strings.NewReader("x"))
			if tt.values != nil {
				req.Header["Idempotency-Key"] = tt.values
			}
			rec := httptest.NewRecorder()
			m.ServeHTTP(rec, req)
			p := wantProblem(t, answer{rec.Code, rec.Result().Header, rec.Body.Bytes()}, http.StatusBadRequest)
			if !strings.Contains(p.Detail, tt.detail) || !strings.Contains(p.Detail, "Idempotency-Key") {
				t.Fatalf("detail %q, want it to say %q", p.Detail, tt.detail)
			}
		})
	}
	if h.count() != 0 {
		t.Fatalf("the handler ran %d times for malformed keys", h.count())
	}
	// Not required: no header, no idempotency; every request runs.
	for range 2 {
		if a := post(m, "/orders", "", "x"); a.status != http.StatusCreated || a.replayed() {
			t.Fatalf("unkeyed: %d", a.status)
		}
	}
	// A quoted key and the bare token are the same key.
	post(m, "/orders", `"same-key"`, "x")
	if a := post(m, "/orders", `same-key`, "x"); !a.replayed() {
		t.Fatalf("bare spelling of a quoted key ran again")
	}
	if h.count() != 3 {
		t.Fatalf("%d executions", h.count())
	}
	if st := m.IdemStats(); st.Invalid != uint64(len(tests)) {
		t.Fatalf("stats %+v", st)
	}
}

// 9. A duplicate of an original that runs longer than `wait` gets 409 with
// Retry-After; once the original completes, a retry replays it.
func TestWaitTimeout(t *testing.T) {
	release, started := make(chan struct{}), make(chan struct{})
	h := &counting{answer: func(n int64, w http.ResponseWriter, r *http.Request) {
		close(started)
		<-release
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "done")
	}}
	blk := orders()
	blk.Wait = config.IdemWait(100 * time.Millisecond)
	m := newMiddleware(t, region(t, 64), h, blk)
	done := make(chan answer)
	go func() { done <- post(m, "/orders", "k", "x") }()
	<-started
	t0 := time.Now()
	a := post(m, "/orders", "k", "x")
	if waited := time.Since(t0); waited < time.Duration(blk.Wait) {
		t.Fatalf("gave up after %v, before the wait of %v", waited, blk.Wait)
	}
	wantProblem(t, a, http.StatusConflict)
	wantRetryAfter(t, a)
	close(release)
	if orig := <-done; orig.status != http.StatusCreated {
		t.Fatalf("original: %d", orig.status)
	}
	if a := post(m, "/orders", "k", "x"); !a.replayed() || string(a.body) != "done" {
		t.Fatalf("after completion: %d %q", a.status, a.body)
	}
	if h.count() != 1 {
		t.Fatalf("%d executions", h.count())
	}

	// wait = 0: no waiting at all.
	blk.Wait = 0
	release, started = make(chan struct{}), make(chan struct{})
	h.n.Store(0)
	m0 := newMiddleware(t, region(t, 64), h, blk)
	go func() { done <- post(m0, "/orders", "k", "x") }()
	<-started
	wantProblem(t, post(m0, "/orders", "k", "x"), http.StatusConflict)
	close(release)
	<-done
}

// postWithWaiters posts the original keyed POST to m and, once its
// handler has started, n duplicates of it; it returns when all n wait for
// the original. The answers arrive on orig and dups.
func postWithWaiters(m *handler, started <-chan struct{}, n int) (orig, dups <-chan answer) {
	o, d := make(chan answer, 1), make(chan answer, n)
	go func() { o <- post(m, "/orders", "k", "x") }()
	<-started
	for range n {
		go func() { d <- post(m, "/orders", "k", "x") }()
	}
	for m.IdemStats().Waits < uint64(n) {
		time.Sleep(time.Millisecond)
	}
	return o, d
}

// A duplicate that waits gets the original's response as soon as it
// completes.
func TestWaiterReplaysOriginal(t *testing.T) {
	release, started := make(chan struct{}), make(chan struct{})
	h := &counting{answer: func(n int64, w http.ResponseWriter, r *http.Request) {
		close(started)
		<-release
		w.Header().Set("Location", "/orders/9")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "created 9")
	}}
	m := newMiddleware(t, region(t, 64), h, orders())
	orig, dups := postWithWaiters(m, started, 3)
	close(release)
	o := <-orig
	for range 3 {
		d := <-dups
		if d.status != http.StatusCreated || !d.replayed() || !bytes.Equal(d.body, o.body) || d.header.Get("Location") != "/orders/9" {
			t.Fatalf("waiter: %d %q %v", d.status, d.body, d.header)
		}
	}
	if h.count() != 1 {
		t.Fatalf("%d executions", h.count())
	}
}

// When the original fails (5xx), one of its waiters runs the request.
func TestWaitersRerunAfterRelease(t *testing.T) {
	release, started := make(chan struct{}), make(chan struct{}, 10)
	h := &counting{answer: func(n int64, w http.ResponseWriter, r *http.Request) {
		started <- struct{}{}
		if n == 1 {
			<-release
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusCreated)
		fmt.Fprint(w, "run ", n)
	}}
	m := newMiddleware(t, region(t, 64), h, orders())
	orig, dups := postWithWaiters(m, started, 4)
	close(release)
	if o := <-orig; o.status != http.StatusServiceUnavailable {
		t.Fatalf("original: %d", o.status)
	}
	replayed := 0
	for range 4 {
		d := <-dups
		if d.status != http.StatusCreated || string(d.body) != "run 2" {
			t.Fatalf("waiter: %d %q", d.status, d.body)
		}
		if d.replayed() {
			replayed++
		}
	}
	if h.count() != 2 || replayed != 3 {
		t.Fatalf("%d executions, %d replays", h.count(), replayed)
	}
}

// brokenClient is a ResponseWriter whose connection is gone.
type brokenClient struct {
	header http.Header
	status int
	writes int
}

func (b *brokenClient) Header() http.Header { return b.header }
func (b *brokenClient) WriteHeader(code int) {
	if b.status == 0 {
		b.status = code
	}
}
func (b *brokenClient) Write(p []byte) (int, error) {
	b.writes++
	return 0, errors.New("write: broken pipe")
}

// 10. A client that disconnects mid-request: the handler runs to the end
// (its context is not cancelled, its writes do not fail) and the response
// is stored for the retry.
func TestClientDisconnectStillStores(t *testing.T) {
	started, proceed := make(chan struct{}), make(chan struct{})
	var handlerErr atomic.Value
	h := &counting{answer: func(n int64, w http.ResponseWriter, r *http.Request) {
		close(started)
		<-proceed
		if err := r.Context().Err(); err != nil {
			handlerErr.Store(fmt.Sprint("context: ", err))
		}
		w.WriteHeader(http.StatusCreated)
		for i := range 5 {
			if _, err := fmt.Fprintf(w, "part %d;", i); err != nil {
				handlerErr.Store(fmt.Sprint("write: ", err))
			}
		}
		if err := http.NewResponseController(w).Flush(); err != nil {
			handlerErr.Store(fmt.Sprint("flush: ", err))
		}
	}}
	m := newMiddleware(t, region(t, 64), h, orders())
	ctx, cancel := context.WithCancel(context.Background())
	req := httptest.NewRequestWithContext(ctx, http.MethodPost, "/orders", strings.NewReader("x"))
	req.Header.Set("Idempotency-Key", "k")
	client := &brokenClient{header: http.Header{}}
	served := make(chan struct{})
	go func() {
		defer close(served)
		m.ServeHTTP(client, req)
	}()
	<-started
	cancel() // the client hangs up
	close(proceed)
	<-served
	if e := handlerErr.Load(); e != nil {
		t.Fatalf("the handler saw the disconnect: %v", e)
	}
	if client.writes != 1 {
		t.Fatalf("%d writes to a broken connection, want 1 (then stop)", client.writes)
	}
	a := post(m, "/orders", "k", "x")
	if !a.replayed() || a.status != http.StatusCreated || string(a.body) != "part 0;part 1;part 2;part 3;part 4;" {
		t.Fatalf("retry: %d %q replayed=%v", a.status, a.body, a.replayed())
	}
	if h.count() != 1 {
		t.Fatalf("%d executions", h.count())
	}
}

// A handler that panics (a proxy aborting mid-body) releases its
// reservation: the panic goes on, and the retry runs.
func TestPanicReleases(t *testing.T) {
	h := &counting{answer: func(n int64, w http.ResponseWriter, r *http.Request) {
		if n == 1 {
			w.WriteHeader(http.StatusOK)
			io.WriteString(w, "half a bo")
			panic(http.ErrAbortHandler)
		}
		io.WriteString(w, "whole body")
	}}
	m := newMiddleware(t, region(t, 64), h, orders())
	func() {
		defer func() {
			if p := recover(); p != http.ErrAbortHandler {
				t.Fatalf("recovered %v, want the handler's panic", p)
			}
		}()
		post(m, "/orders", "k", "x")
	}()
	if a := post(m, "/orders", "k", "x"); a.replayed() || string(a.body) != "whole body" || h.count() != 2 {
		t.Fatalf("retry after a panic: %q replayed=%v, %d executions", a.body, a.replayed(), h.count())
	}
}

// Requests the middleware does not key reach the handler as they came:
// the same body, and a ResponseWriter that only notes the status (for the
// statistics) over the same one: it flushes, hijacks and unwraps to it,
// so that streaming and http.ResponseController work as without it.
func TestPassthroughIsUntouched(t *testing.T) {
	var sent http.ResponseWriter // the writer the request came with
	var same bool                // the handler got it, or a writer over it
	var gotBody io.ReadCloser
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { same, gotBody = passedThrough(w, sent), r.Body })
	m := newMiddleware(t, region(t, 64), next, orders())
	for _, tt := range []struct{ method, path, key string }{
		{"POST", "/orders", ""},       // no key, not required
		{"GET", "/orders", "k"},       // method not covered
		{"POST", "/payments", "k"},    // path not covered
		{"POST", "/orders/1", "k"},    // exact path: nothing below
		{"POST", "/", "k"},            //
		{"PATCH", "/orders", "other"}, // methods = ["POST"]
	} {
		req := httptest.NewRequest(tt.method, tt.path, strings.NewReader("x"))
		if tt.key != "" {
			req.Header.Set("Idempotency-Key", tt.key)
		}
		w := httptest.NewRecorder()
		sent, same = w, false
		m.ServeHTTP(w, req)
		if !same || gotBody != req.Body {
			t.Fatalf("%s %s: the handler got another writer or body", tt.method, tt.path)
		}
	}
	// No blocks at all.
	none, err := New(config.Config{}, region(t, 8), next, Options{})
	if err != nil {
		t.Fatal(err)
	}
	w := httptest.NewRecorder()
	req := httptest.NewRequest("POST", "/orders", nil)
	req.Header.Set("Idempotency-Key", "k")
	sent, same = w, false
	none.ServeHTTP(w, req)
	if !same {
		t.Fatal("no blocks: another writer")
	}
}

// The original streams: what the handler flushes reaches the client before
// the handler returns.
func TestOriginalStreams(t *testing.T) {
	proceed := make(chan struct{})
	h := &counting{answer: func(n int64, w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "event: one\n\n")
		w.(http.Flusher).Flush()
		<-proceed
		io.WriteString(w, "event: two\n\n")
	}}
	m := newMiddleware(t, region(t, 64), h, orders())
	srv := httptest.NewServer(m)
	defer srv.Close()
	var once sync.Once
	unblock := func() { once.Do(func() { close(proceed) }) }
	defer unblock() // before srv.Close, which waits for the handler
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/orders", strings.NewReader("x"))
	req.Header.Set("Idempotency-Key", "stream")
	c := &http.Client{Timeout: 5 * time.Second} // a recorder that does not flush fails, not hangs
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	first := make([]byte, len("event: one\n\n"))
	if _, err := io.ReadFull(resp.Body, first); err != nil || string(first) != "event: one\n\n" {
		t.Fatalf("first event: %q %v", first, err)
	}
	unblock()
	rest, _ := io.ReadAll(resp.Body)
	if string(rest) != "event: two\n\n" {
		t.Fatalf("rest %q", rest)
	}
	a := postHTTP(t, srv.Client(), srv.URL+"/orders", "stream", "x")
	if !a.replayed() || string(a.body) != "event: one\n\nevent: two\n\n" || a.header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("replay %q %v", a.body, a.header)
	}
}

// Bodies over server.max_request_body get 413, and at most max+1 bytes
// are read, whether the length is announced or not.
func TestRequestBodyLimit(t *testing.T) {
	h := &counting{}
	m, err := New(config.Config{Server: config.Server{MaxRequestBody: 1000}, Idempotency: []config.Idempotency{orders()}}, region(t, 64), h, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if a := post(m, "/orders", "ok", strings.Repeat("x", 1000)); a.status != http.StatusCreated {
		t.Fatalf("1000 bytes: %d", a.status)
	}
	wantProblem(t, post(m, "/orders", "big", strings.Repeat("x", 1001)), http.StatusRequestEntityTooLarge)
	for _, size := range []int{1000, 1 << 20} {
		body := &countingReader{r: strings.NewReader(strings.Repeat("x", size))}
		req := httptest.NewRequest(http.MethodPost, "/orders", body)
		req.ContentLength = -1 // chunked
		req.Header.Set("Idempotency-Key", fmt.Sprint("chunked-", size))
		rec := httptest.NewRecorder()
		m.ServeHTTP(rec, req)
		if size <= 1000 {
			if rec.Code != http.StatusCreated || !strings.Contains(rec.Body.String(), strings.Repeat("x", size)) {
				t.Fatalf("chunked %d bytes: %d", size, rec.Code)
			}
			continue
		}
		wantProblem(t, answer{rec.Code, rec.Result().Header, rec.Body.Bytes()}, http.StatusRequestEntityTooLarge)
		if body.n > 1001 {
			t.Fatalf("read %d bytes of a body limited to 1000", body.n)
		}
	}
	if h.count() != 2 {
		t.Fatalf("%d executions", h.count())
	}
}

type countingReader struct {
	r io.Reader
	n int
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}

// A stored response lives for ttl of the region's clock, then the key runs
// again.
func TestTTL(t *testing.T) {
	var now atomic.Int64
	h := &counting{}
	blk := orders()
	blk.TTL = time.Hour
	m, err := New(config.Config{Idempotency: []config.Idempotency{blk}}, region(t, 64), h,
		Options{Now: func() time.Duration { return time.Duration(now.Load()) }})
	if err != nil {
		t.Fatal(err)
	}
	post(m, "/orders", "k", "x")
	now.Store(int64(time.Hour - time.Nanosecond))
	if a := post(m, "/orders", "k", "x"); !a.replayed() {
		t.Fatal("not replayed within the ttl")
	}
	now.Store(int64(time.Hour))
	if a := post(m, "/orders", "k", "x"); a.replayed() || h.count() != 2 {
		t.Fatalf("after the ttl: replayed=%v, %d executions", a.replayed(), h.count())
	}
}

// A handler that hijacks the connection has run, but what it sent is
// unknown: its retries get 409, never a second execution.
func TestHijackIsUnreplayable(t *testing.T) {
	h := &counting{answer: func(n int64, w http.ResponseWriter, r *http.Request) {
		conn, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			t.Error(err)
			return
		}
		defer conn.Close()
		brw.WriteString("HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nhi")
		brw.Flush()
	}}
	m := newMiddleware(t, region(t, 64), h, orders())
	srv := httptest.NewServer(m)
	defer srv.Close()
	if a := postHTTP(t, srv.Client(), srv.URL+"/orders", "k", "x"); a.status != http.StatusOK || string(a.body) != "hi" {
		t.Fatalf("original: %d %q", a.status, a.body)
	}
	a := postHTTP(t, srv.Client(), srv.URL+"/orders", "k", "x")
	if a.status != http.StatusConflict || h.count() != 1 {
		t.Fatalf("retry: %d, %d executions", a.status, h.count())
	}
}

// Informational responses (103 Early Hints) go through; the final status
// is what is stored.
func TestInformationalPassesThrough(t *testing.T) {
	h := &counting{answer: func(n int64, w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Link", "</style.css>; rel=preload")
		w.WriteHeader(http.StatusEarlyHints)
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "made")
	}}
	m := newMiddleware(t, region(t, 64), h, orders())
	srv := httptest.NewServer(m)
	defer srv.Close()
	var hints atomic.Int32
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/orders", strings.NewReader("x"))
	req.Header.Set("Idempotency-Key", "k")
	req = req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{
		Got1xxResponse: func(code int, _ textproto.MIMEHeader) error {
			if code == http.StatusEarlyHints {
				hints.Add(1)
			}
			return nil
		},
	}))
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated || hints.Load() != 1 {
		t.Fatalf("original: %d, %d early hints", resp.StatusCode, hints.Load())
	}
	if a := postHTTP(t, srv.Client(), srv.URL+"/orders", "k", "x"); a.status != http.StatusCreated || !a.replayed() || string(a.body) != "made" {
		t.Fatalf("replay: %d %q", a.status, a.body)
	}
}

// passedThrough reports whether got is w, or a writer over w that keeps
// its powers: Flush, Hijack, and Unwrap to w.
func passedThrough(got, w http.ResponseWriter) bool {
	if got == w {
		return true
	}
	u, ok := got.(interface{ Unwrap() http.ResponseWriter })
	_, flushes := got.(http.Flusher)
	_, hijacks := got.(http.Hijacker)
	return ok && u.Unwrap() == w && flushes && hijacks
}

// A client that holds max_records records gets 429 (problem+json,
// quota-exceeded, Retry-After) for new keys; its stored responses still
// replay, and another client's keyed request runs exactly once. A
// released reservation (a 5xx) gives its room back.
func TestMaxRecords(t *testing.T) {
	h := &counting{answer: func(n int64, w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Fail") != "" {
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "order %d", n)
	}}
	m := newMiddleware(t, region(t, 256), h, orders()) // 256 records: max_records defaults to 16
	alice := func(key string, header ...string) answer {
		return post(m, "/orders", key, "x", append([]string{"Authorization", "Bearer alice"}, header...)...)
	}
	for i := range 40 {
		a := alice(fmt.Sprint("a", i))
		switch {
		case i < 16 && a.status != http.StatusCreated:
			t.Fatalf("alice's key %d: %d %s", i, a.status, a.body)
		case i >= 16:
			p := wantProblem(t, a, http.StatusTooManyRequests)
			if a.header.Get("Retry-After") != "60" || !strings.Contains(p.Type, "quota-exceeded") || !strings.Contains(p.Detail, "16 requests") {
				t.Fatalf("alice's key %d: Retry-After %q, %+v", i, a.header.Get("Retry-After"), p)
			}
		}
	}
	if h.count() != 16 {
		t.Fatalf("%d executions for alice's 16 records", h.count())
	}
	if a := alice("a3"); !a.replayed() {
		t.Fatalf("alice's stored key: %d %s", a.status, a.body)
	}
	// Bob is another client: alice's address is capped too.
	bob := post(m, "/orders", "a3", "x", "Authorization", "Bearer bob", ":peer", "192.0.2.2:1234")
	if bob.status != http.StatusCreated || bob.replayed() || h.count() != 17 {
		t.Fatalf("bob: %d %s, %d executions", bob.status, bob.body, h.count())
	}
	if again := post(m, "/orders", "a3", "x", "Authorization", "Bearer bob", ":peer", "192.0.2.2:1234"); !again.replayed() || !bytes.Equal(again.body, bob.body) {
		t.Fatalf("bob's retry: %d %s", again.status, again.body)
	}
	if st := m.IdemStats(); st.Capped != 24 || st.Full != 0 || st.Executions != 17 {
		t.Fatalf("stats %+v", st)
	}

	// Carol's 5xx are released: she never reaches her maximum of 3.
	few := orders()
	few.MaxRecords = 3
	h.n.Store(0)
	m = newMiddleware(t, region(t, 256), h, few)
	for i := range 10 {
		a := post(m, "/orders", fmt.Sprint("c", i), "x", "Authorization", "Bearer carol", "X-Fail", "1")
		if a.status != http.StatusInternalServerError {
			t.Fatalf("carol's failing key %d: %d %s", i, a.status, a.body)
		}
	}
	for i := range 4 {
		a := post(m, "/orders", fmt.Sprint("d", i), "x", "Authorization", "Bearer carol")
		if want := http.StatusCreated; i == 3 {
			wantProblem(t, a, http.StatusTooManyRequests)
		} else if a.status != want {
			t.Fatalf("carol's key %d: %d %s", i, a.status, a.body)
		}
	}
}
