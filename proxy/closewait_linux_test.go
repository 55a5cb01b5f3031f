package proxy_test

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"
)

// Idle connections to the upstream that the upstream closes are closed
// soon after on every engine, not left in CLOSE_WAIT until
// upstream_idle_timeout (60s): 8 clients at once leave 8 idle upstream
// connections, which an upstream closes after 200ms of idleness.
func TestUpstreamClosedIdleConnectionsClosed(t *testing.T) {
	t.Parallel()
	eachEngine(t, withNetHTTP(), func(t *testing.T, e storyEngine) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		app := &http.Server{IdleTimeout: 200 * time.Millisecond,
			Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })}
		go app.Serve(ln)
		t.Cleanup(func() { app.Close() })
		addr := e.serve(t, storyOptions{Upstream: "http://" + ln.Addr().String()}).Addr

		client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 8}}
		defer client.CloseIdleConnections()
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() {
				for range 20 {
					resp, err := client.Get("http://" + addr + "/")
					if err != nil {
						t.Error(err)
						return
					}
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
			})
		}
		wg.Wait()
		time.Sleep(500 * time.Millisecond) // the upstream closes them after 200ms
		n := 0
		for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			if n = closeWaits(t, ln.Addr().String()); n == 0 {
				return
			}
		}
		t.Errorf("%d connections to the upstream in CLOSE_WAIT 3s after it closed them", n)
	})
}

// closeWaits counts this process's TCP connections to addr in CLOSE_WAIT
// (state 08 in /proc/net/tcp).
func closeWaits(t *testing.T, addr string) int {
	t.Helper()
	table, err := os.ReadFile("/proc/net/tcp")
	if err != nil {
		t.Fatal(err)
	}
	a, err := net.ResolveTCPAddr("tcp4", addr)
	if err != nil {
		t.Fatal(err)
	}
	ip := a.IP.To4()
	remote := fmt.Sprintf("%02X%02X%02X%02X:%04X", ip[3], ip[2], ip[1], ip[0], a.Port)
	n := 0
	for _, line := range strings.Split(string(table), "\n")[1:] {
		if f := strings.Fields(line); len(f) > 3 && f[2] == remote && f[3] == "08" {
			n++
		}
	}
	return n
}
