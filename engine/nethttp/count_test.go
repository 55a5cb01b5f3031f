package nethttp_test

import (
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/preforkd/preforkd/core"
	"github.com/preforkd/preforkd/engine/nethttp"
	"github.com/preforkd/preforkd/shm"
)

// The status each response is counted with (core.Options.OnResponse, the
// statistics) is the one the client got: the one sent, 200 for a handler
// that wrote without one or wrote nothing, the 101 of an upgrade, and 500
// for a handler that panicked before sending anything.
func TestResponsesCountedAsSent(t *testing.T) {
	var mu sync.Mutex
	var counted []int
	mux := http.NewServeMux()
	mux.HandleFunc("/503", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(503) })
	mux.HandleFunc("/write", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") })
	mux.HandleFunc("/nothing", func(http.ResponseWriter, *http.Request) {})
	mux.HandleFunc("/early-hints", func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusEarlyHints)
		w.WriteHeader(http.StatusBadGateway)
	})
	mux.HandleFunc("/panic", func(http.ResponseWriter, *http.Request) { panic("boom") })
	mux.HandleFunc("/abort-after-headers", func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush() // the assertion a handler makes must hold
		panic(http.ErrAbortHandler)
	})
	mux.HandleFunc("/controller", func(w http.ResponseWriter, _ *http.Request) {
		rc := http.NewResponseController(w)
		if err := rc.SetWriteDeadline(time.Now().Add(time.Second)); err != nil {
			w.WriteHeader(599)
			return
		}
		io.Copy(w, strings.NewReader("through ReadFrom"))
	})
	mux.HandleFunc("/hijack", func(w http.ResponseWriter, _ *http.Request) {
		conn, rw, err := w.(http.Hijacker).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		rw.WriteString("HTTP/1.1 204 No Content\r\n\r\n")
		rw.Flush()
	})
	c, err := core.New(newRegion(t, shm.Options{Counters: 64}), core.Options{OnResponse: func(status int) {
		mu.Lock()
		counted = append(counted, status)
		mu.Unlock()
	}})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(nethttp.New(c, mux, nethttp.Options{}))
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the panics are on purpose
	srv.Start()
	defer srv.Close()

	for _, tc := range []struct {
		path   string
		status int // what the client sees; 0 = a transport error
		count  int
	}{
		{"/503", 503, 503},
		{"/write", 200, 200},
		{"/nothing", 200, 200},
		{"/early-hints", 502, 502},
		{"/panic", 0, 500},
		{"/abort-after-headers", 200, 200},
		{"/controller", 200, 200},
		{"/hijack", 204, 101},
	} {
		client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
		resp, err := client.Get(srv.URL + tc.path) // a new connection each: a GET is never retried
		got := 0
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			got = resp.StatusCode
		}
		if got != tc.status {
			t.Errorf("%s: client got %d (%v), want %d", tc.path, got, err, tc.status)
		}
		deadline := time.Now().Add(2 * time.Second)
		for {
			mu.Lock()
			n := len(counted)
			mu.Unlock()
			if n > 0 || time.Now().After(deadline) {
				break
			}
			time.Sleep(time.Millisecond)
		}
		mu.Lock()
		if !slices.Equal(counted, []int{tc.count}) {
			t.Errorf("%s: counted %v, want [%d]", tc.path, counted, tc.count)
		}
		counted = nil
		mu.Unlock()
	}
}

// Counting a response passed through allocates nothing.
func TestCountingDoesNotAllocate(t *testing.T) {
	c, err := core.New(newRegion(t, shm.Options{Counters: 64}), core.Options{OnResponse: func(int) {}})
	if err != nil {
		t.Fatal(err)
	}
	h := nethttp.New(c, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(204) }), nethttp.Options{})
	rec := httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodGet, "/", nil)
	h.ServeHTTP(rec, req) // warm the pools
	if n := testing.AllocsPerRun(100, func() { h.ServeHTTP(rec, req) }); n != 0 {
		t.Errorf("%v allocations per request", n)
	}
}

// accessFunc is a core.AccessLog that calls itself.
type accessFunc func(e *core.AccessEntry)

func (f accessFunc) Log(e *core.AccessEntry) { f(e) }

// The application a Handler wraps is the request's upstream: its time is
// logged from when it gets the request (core.Exchange.Sending) to its
// head, as the other engines log an application's; one the core answered
// has none.
func TestHandlerLogsTheApplicationsTime(t *testing.T) {
	lines := make(chan core.AccessEntry, 2)
	c, err := core.New(newRegion(t, shm.Options{Counters: 64}), core.Options{
		AccessLog: accessFunc(func(e *core.AccessEntry) { lines <- *e })})
	if err != nil {
		t.Fatal(err)
	}
	app := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		time.Sleep(20 * time.Millisecond)
		io.WriteString(w, "ok")
	})
	srv := httptest.NewServer(nethttp.New(c, app, nethttp.Options{}))
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/a")
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	select {
	case e := <-lines:
		if e.Status != 200 || e.Upstream < 20*time.Millisecond || e.Upstream > e.Duration {
			t.Errorf("logged %d with upstream time %v of %v, want the application's 20ms", e.Status, e.Upstream, e.Duration)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no access log entry")
	}
}
