package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Two workers of at most two connections each: /metrics shows every
// connection in its state, the accepted ones, each worker reaching its
// bound, and the upstream's response times; a worker killed with its
// connections open leaves no state behind once its clients are gone, and
// promtool accepts the page.
func TestConnectionMetricsEndToEnd(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	var once sync.Once
	free := func() { once.Do(func() { close(release) }) }
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/hold" {
			<-release
		}
		time.Sleep(30 * time.Millisecond)
		io.WriteString(w, "ok")
	}))
	t.Cleanup(up.Close)
	t.Cleanup(free)
	cfg := baseServer(2, fmt.Sprintf("upstream = %q\nmax_connections = 2\nread_header_timeout = \"60s\"\nidle_timeout = \"60s\"", up.URL)) + adminSection
	d := startDaemon(t, daemonOptions{config: cfg, admin: true})
	admin := newClient(t, nil, true)

	dial := func() (net.Conn, *bufio.Reader) {
		c, err := net.Dial("tcp", d.addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c, bufio.NewReader(c)
	}
	request := func(c net.Conn, br *bufio.Reader, path string) {
		t.Helper()
		fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: a\r\n\r\n", path)
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		resp, err := http.ReadResponse(br, nil)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("GET %s: %v %v", path, resp, err)
		}
		io.Copy(io.Discard, resp.Body)
	}
	want := func(when string, w map[string]float64) page {
		t.Helper()
		var p page
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			p = scrapeMetrics(t, admin, d.admin)
			var off []string
			for s, v := range w {
				if p.samples[s] != v {
					off = append(off, fmt.Sprintf("%s = %v, want %v", s, p.samples[s], v))
				}
			}
			if len(off) == 0 {
				return p
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s:\n%s", when, strings.Join(off, "\n"))
			}
		}
	}
	const (
		reading  = `preforkd_connections{state="reading"}`
		writing  = `preforkd_connections{state="writing"}`
		idle     = `preforkd_connections{state="idle"}`
		accepted = "preforkd_connections_accepted_total"
		reached  = "preforkd_connections_max_reached_total"
		upCount  = "preforkd_upstream_response_duration_seconds_count"
	)

	// Four connections fill both workers (a worker at its bound leaves
	// the queue to the other): one new, one at the upstream, two kept
	// alive after a request.
	first, _ := dial()
	held, heldBr := dial()
	fmt.Fprint(held, "GET /hold HTTP/1.1\r\nHost: a\r\n\r\n")
	a, aBr := dial()
	request(a, aBr, "/a")
	b, bBr := dial()
	request(b, bBr, "/b")
	p := want("four open", map[string]float64{reading: 1, writing: 1, idle: 2, accepted: 4, reached: 2, upCount: 2})
	if types := p.types["preforkd_connections"]; types != "gauge" {
		t.Errorf("preforkd_connections is a %q, want a gauge", types)
	}
	if sum := p.samples["preforkd_upstream_response_duration_seconds_sum"]; sum < 0.06 {
		t.Errorf("upstream time sum %v, want at least the application's 2×30ms", sum)
	}
	if n := p.samples[`preforkd_upstream_response_duration_seconds_bucket{le="0.025"}`]; n != 0 {
		t.Errorf("%v upstream times under 25ms, want none: the application takes 30ms", n)
	}
	promtoolCheck(t, p.raw)

	// A fifth waits in the listen queue: no worker has room.
	fifth, fifthBr := dial()
	fmt.Fprint(fifth, "GET /fifth HTTP/1.1\r\nHost: a\r\n\r\n")
	time.Sleep(200 * time.Millisecond)
	want("a fifth waits", map[string]float64{reading: 1, writing: 1, idle: 2, accepted: 4, reached: 2})

	// kill -9 a worker with its two connections: the supervisor reaps it
	// and its replacement takes the fifth.
	var st struct {
		Workers []struct {
			PID int `json:"pid"`
		} `json:"workers"`
	}
	if r := get(admin, "http://"+d.admin+"/status"); json.Unmarshal(r.body, &st) != nil || len(st.Workers) != 2 {
		t.Fatalf("/status: %s", r.body)
	}
	from := d.logs.len()
	if err := syscall.Kill(st.Workers[0].PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if _, _, ok := d.logs.waitFor(from, 10*time.Second, msgIs("worker started")); !ok {
		t.Fatal("no replacement was started")
	}
	fifth.SetReadDeadline(time.Now().Add(10 * time.Second))
	if resp, err := http.ReadResponse(fifthBr, nil); err != nil || resp.StatusCode != 200 {
		t.Fatalf("the fifth, once a worker had room: %v %v", resp, err)
	}
	free()
	held.SetReadDeadline(time.Now().Add(10 * time.Second))
	http.ReadResponse(heldBr, nil) // answered, or cut by the kill
	for _, c := range []net.Conn{first, held, a, b, fifth} {
		c.Close()
	}
	// Every client gone: no state is left, the killed worker's included
	// (its row's counters were folded into the totals, its gauges
	// dropped), and the counters kept what they counted (the replacement
	// took one connection: it never reached its bound).
	p = want("every client gone", map[string]float64{reading: 0, writing: 0, idle: 0, accepted: 5, reached: 2})
	promtoolCheck(t, p.raw)
}
