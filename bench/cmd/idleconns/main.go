// Command idleconns holds idle keep-alive connections to a server: it
// opens -n connections to -addr, sends one request on each and reads its
// response (so that each is a keep-alive client between two requests, as
// a browser's pooled connection is), prints "ready N" and holds them
// until its standard input closes. bench/idle-conns.sh measures what
// those connections cost the server's workers.
package main

import (
	"bufio"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sync"
	"time"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:18590", "server address")
	n := flag.Int("n", 10000, "connections")
	path := flag.String("path", "/", "the request sent on each connection")
	flag.Parse()
	if err := run(*addr, *n, *path); err != nil {
		fmt.Fprintln(os.Stderr, "idleconns:", err)
		os.Exit(1)
	}
}

func run(addr string, n int, path string) error {
	conns := make([]net.Conn, n)
	req := []byte("GET " + path + " HTTP/1.1\r\nHost: bench\r\n\r\n")
	var mu sync.Mutex
	var firstErr error
	var wg sync.WaitGroup
	sem := make(chan struct{}, 64) // no more handshakes at once than a listen backlog takes
	for i := range conns {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			c, err := open(addr, req)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				if firstErr == nil {
					firstErr = fmt.Errorf("connection %d: %w", i, err)
				}
				return
			}
			conns[i] = c
		})
	}
	wg.Wait()
	if firstErr != nil {
		return firstErr
	}
	fmt.Printf("ready %d\n", n)
	io.Copy(io.Discard, os.Stdin) // held until the caller closes our input
	for _, c := range conns {
		c.Close()
	}
	return nil
}

// open connects, sends req and reads its response whole.
func open(addr string, req []byte) (net.Conn, error) {
	c, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		return nil, err
	}
	c.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := c.Write(req); err != nil {
		c.Close()
		return nil, err
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		c.Close()
		return nil, err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.Close {
		c.Close()
		return nil, fmt.Errorf("status %d, close %v: not a keep-alive answer", resp.StatusCode, resp.Close)
	}
	c.SetDeadline(time.Time{})
	return c, nil
}
