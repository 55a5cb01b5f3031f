package wiretest

import (
	"bufio"
	"io"
	"net"
	"sync"
	"testing"
	"time"
)

// Dial connects to addr with timeout as the deadline of the whole
// exchange; the connection is closed when the test ends.
func Dial(t testing.TB, addr string, timeout time.Duration) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(timeout))
	return c, bufio.NewReader(c)
}

// AcceptEach serves every connection ln accepts with handle, each on a
// goroutine of its own, until ln is closed; a connection is closed when
// handle returns. It is the other end for a client that writes by hand.
func AcceptEach(ln net.Listener, handle func(c net.Conn)) {
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				handle(c)
			}()
		}
	}()
}

// Pattern returns n bytes that are not all alike, the same ones on every
// call: a body to compare end to end. The bytes repeat every 16.
func Pattern(n int64) io.Reader { return io.LimitReader(&pattern{}, n) }

type pattern struct{ x byte }

func (p *pattern) Read(b []byte) (int, error) {
	for i := range b {
		b[i] = p.x
		p.x = p.x*31 + 7
	}
	return len(b), nil
}

// Trickle writes body to w one byte at a time, interval apart, and stops
// at the first error (the server closed the connection).
func Trickle(w io.Writer, body string, interval time.Duration) {
	for i := range len(body) {
		if i > 0 {
			time.Sleep(interval)
		}
		if _, err := io.WriteString(w, body[i:i+1]); err != nil {
			return
		}
	}
}

// Slowloris opens n connections to addr at once and writes head, a
// request that never ends, on each; it returns once the server has closed
// every one of them, or each has been open for timeout. A connection that
// cannot be opened is left out.
func Slowloris(addr string, n int, head string, timeout time.Duration) {
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			c, err := net.Dial("tcp", addr)
			if err != nil {
				return
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(timeout))
			io.WriteString(c, head)
			io.Copy(io.Discard, c) // until the server closes it
		})
	}
	wg.Wait()
}

// SamplePeak calls sample every interval, on a goroutine of its own,
// until stop is called; stop waits for that goroutine and returns the
// largest value sample returned, or 0 if none was larger.
func SamplePeak(interval time.Duration, sample func() int64) (stop func() int64) {
	quit, done := make(chan struct{}), make(chan struct{})
	var peak int64
	go func() {
		defer close(done)
		for {
			select {
			case <-quit:
				return
			case <-time.After(interval):
			}
			peak = max(peak, sample())
		}
	}()
	var once sync.Once
	return func() int64 {
		once.Do(func() { close(quit) })
		<-done
		return peak
	}
}
