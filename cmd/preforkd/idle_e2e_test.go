//go:build linux

package main

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"testing"
	"time"
)

// An idle worker of the event loop sleeps: with a keep-alive connection
// open and nothing asked, it spends no CPU, as the other engines and
// nginx do. Its loops woke 40 times a second each to move their timer
// wheels on, due timer or not: 4% of a CPU, 12 ticks in 3 s. The bound
// is 1% of the interval, which a wake-up per tick exceeds fourfold.
func TestIdleLoopWorkerSleeps(t *testing.T) {
	t.Parallel()
	d := startDaemon(t, daemonOptions{config: noCanary(baseServer(1, `engine = "loop"`))})
	pids := d.workerPIDs()
	if len(pids) != 1 {
		t.Fatalf("workers %v, want one", pids)
	}
	c, err := net.DialTimeout("tcp", d.addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprint(c, "GET / HTTP/1.1\r\nHost: a.example\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Close {
		t.Fatalf("status %d, close %v: want 200 kept alive", resp.StatusCode, resp.Close)
	}
	const idle = 3 * time.Second
	time.Sleep(200 * time.Millisecond) // what follows the answer settles
	before := cpuTicks(t, pids[0])
	time.Sleep(idle)
	spent := cpuTicks(t, pids[0]) - before
	if most := int(idle / time.Second * clockTicks / 100); spent > most {
		t.Errorf("an idle worker with one keep-alive connection spent %d clock ticks of CPU in %v; want at most %d (1%%)", spent, idle, most)
	}
}
