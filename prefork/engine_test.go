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

	"github.com/preforkd/preforkd/config"
	"github.com/preforkd/preforkd/proxy"
)

// testFastHandler is the application of the test workers with
// Options.FastHandler.
func testFastHandler(w *Worker) (fasthttp.RequestHandler, error) {
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
	}, nil
}

// TestFastHandler runs workers with Options.FastHandler in a supervisor
// process of their own: the application is served by the fast engine with
// the worker's core in front, and TERM drains it.
func TestFastHandler(t *testing.T) {
	cfg := testConfig(2, config.RateLimit{Name: "login", Path: "/login", Limit: 2, Window: time.Minute, By: "ip"})
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

	// TERM: the request in flight finishes, then everything exits 0.
	slow := make(chan string, 1)
	go func() {
		resp, err := client.Get(url + "/slow?d=1s")
		if err != nil {
			slow <- err.Error()
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		slow <- fmt.Sprintf("%d %s", resp.StatusCode, b)
	}()
	time.Sleep(200 * time.Millisecond) // the request is in the handler
	if err := sup.Signal(unix.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if got := <-slow; got != "200 done" {
		t.Errorf("the request in flight at TERM: %s", got)
	}
	if err := sup.Wait(10 * time.Second); err != nil {
		t.Errorf("supervisor after TERM: %v", err)
	}
	// Every line, the workers' too, is read once nobody holds stderr.
	if !sup.logs.WaitEnd(10 * time.Second) {
		t.Fatal("the supervisor's stderr is still open 10s after it exited")
	}
	for _, e := range sup.logs.all("worker exited") {
		if e.attrs["status"] != "exit status 0" {
			t.Errorf("worker %v: %v, want exit status 0", e.attrs["pid"], e.attrs["status"])
		}
	}
}

// TestFastEngineDrainsByTheRule: the fast engine's drain graces are the
// retiring worker's (drain.go), which the net/http path applies.
func TestFastEngineDrainsByTheRule(t *testing.T) {
	if proxy.DefaultDrainIdleGrace != drainIdleGrace || proxy.DefaultDrainNewGrace != drainNewGrace {
		t.Errorf("proxy drains with graces %v (idle) and %v (new), the worker rule says %v and %v",
			proxy.DefaultDrainIdleGrace, proxy.DefaultDrainNewGrace, drainIdleGrace, drainNewGrace)
	}
}
