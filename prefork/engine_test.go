//go:build linux

package prefork

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
	"golang.org/x/sys/unix"

	"github.com/preforkd/preforkd/proxy"
)

// testFastEngine is the engine of the test workers with envTestEngine
// "fast": testFastApp served by the fast engine (package proxy), with the
// worker's core in front of it, as an embedding fasthttp program (Fiber's
// app.Handler(), say) builds it.
func testFastEngine(w *Worker) (Engine, error) {
	c, _, err := testCore(w)
	if err != nil {
		return nil, err
	}
	deferClosingLines(w)
	s, err := proxy.New(proxy.Options{App: testFastApp(w), Core: c, Logger: w.Logger})
	if err != nil {
		return nil, err
	}
	return s, nil
}

// testFastApp is the fasthttp application of the fast test workers.
func testFastApp(w *Worker) fasthttp.RequestHandler {
	pid := os.Getpid()
	return func(ctx *fasthttp.RequestCtx) {
		switch string(ctx.Path()) {
		case "/slow":
			d, _ := time.ParseDuration(string(ctx.QueryArgs().Peek("d")))
			time.Sleep(d)
			fmt.Fprint(ctx, "done")
		default:
			fmt.Fprintf(ctx, "fast %d %d", pid, w.Index)
		}
	}
}

// TestFastEngine runs workers whose Engine is the fast engine in a
// supervisor process of their own: the application is served with the
// worker's core in front, and TERM drains it by the rule: the request in
// flight finishes, its response (sent after the drain began) says
// Connection: close, what the worker deferred runs, and every worker
// exits 0.
func TestFastEngine(t *testing.T) {
	cfg := testConfig(2, testRule{Name: "login", Path: "/login", Limit: 2, Window: time.Minute, By: "ip"})
	sup := startSupervisorProcess(t, "", cfg, envTestEngine+"=fast")
	url := "http://" + sup.addr

	get := func(path string) (int, http.Header, string) {
		t.Helper()
		resp, err := client.Get(url + path)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header, string(body)
	}
	if code, _, body := get("/x"); code != 200 || !strings.HasPrefix(body, "fast ") {
		t.Fatalf("GET /x: %d %q, want the fast application", code, body)
	}
	var codes []int
	for range 3 {
		code, h, _ := get("/login")
		codes = append(codes, code)
		if h.Get("RateLimit-Policy") == "" {
			t.Errorf("a response of a rule's route without RateLimit-Policy: %v", h)
		}
	}
	if fmt.Sprint(codes) != "[200 200 429]" {
		t.Errorf("/login three times: %v, want [200 200 429]", codes)
	}

	// A kept-alive connection, so that Connection: close comes from the
	// worker's drain and not from the client.
	keepAlive := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{}}
	defer keepAlive.CloseIdleConnections()
	resp, err := keepAlive.Get(url + "/x")
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.Close {
		t.Fatal("Connection: close before the drain")
	}

	// TERM: the request in flight finishes, then everything exits 0.
	slow := make(chan string, 1)
	go func() {
		resp, err := keepAlive.Get(url + "/slow?d=2s")
		if err != nil {
			slow <- err.Error()
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		slow <- fmt.Sprintf("%d %s close=%v", resp.StatusCode, b, resp.Close)
	}()
	time.Sleep(200 * time.Millisecond) // the request is in the handler
	if err := sup.Signal(unix.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if got := <-slow; got != "200 done close=true" {
		t.Errorf("the request in flight at TERM: %s, want 200 done with Connection: close", got)
	}
	if err := sup.Wait(10 * time.Second); err != nil {
		t.Errorf("supervisor after TERM: %v", err)
	}
	// Every line, the workers' too, is read once nobody holds stderr.
	if !sup.logs.WaitEnd(10 * time.Second) {
		t.Fatal("the supervisor's stderr is still open 10s after it exited")
	}
	exits := sup.logs.all("worker exited")
	if len(exits) != 2 {
		t.Errorf("%d worker exits logged, want 2", len(exits))
	}
	for _, e := range exits {
		if e.attrs["status"] != "exit status 0" {
			t.Errorf("worker %v: %v, want exit status 0", e.attrs["pid"], e.attrs["status"])
		}
	}
	closing := map[int][]int{} // by pid, in order
	for _, r := range sup.logs.all("test worker closing") {
		closing[r.int("pid")] = append(closing[r.int("pid")], r.int("n"))
	}
	for _, pid := range sup.logs.pids("worker started") {
		if fmt.Sprint(closing[pid]) != "[2 1]" {
			t.Errorf("worker %d ran its deferred functions %v, want [2 1]: once each, the last first", pid, closing[pid])
		}
	}
	if len(closing) != 2 {
		t.Errorf("deferred functions ran in %d processes, want the 2 workers: %v", len(closing), closing)
	}
}

// deferClosingLines has what the worker is asked to close run once it
// has drained, the last asked first: each says so on stderr, as a line of
// the supervisor's JSON log ("test worker closing", its pid and n, 1 or 2).
func deferClosingLines(w *Worker) {
	for _, n := range []int{1, 2} {
		w.Defer(func() error {
			fmt.Fprintf(os.Stderr, "{\"msg\":\"test worker closing\",\"pid\":%d,\"n\":%d}\n", os.Getpid(), n)
			return nil
		})
	}
}
