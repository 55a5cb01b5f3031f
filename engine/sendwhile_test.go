package engine_test

import (
	"bufio"
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/preforkd/preforkd/engine"
)

// upstreamConn returns the two ends of a loopback TCP connection: the
// proxy's and the upstream's.
func upstreamConn(t *testing.T) (proxy, upstream net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		accepted <- c
	}()
	proxy, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	upstream = <-accepted
	if upstream == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { proxy.Close(); upstream.Close() })
	return proxy, upstream
}

func readHead(c net.Conn) func() error {
	br := bufio.NewReader(c)
	return func() error {
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		line, err := br.ReadString('\n')
		if err == nil && line != "HTTP/1.1 200 OK\r\n" {
			err = errors.New("head " + line)
		}
		return err
	}
}

// A whole body, then the answer: the connection may serve again.
func TestSendWhileReadingWhole(t *testing.T) {
	p, u := upstreamConn(t)
	sent := make(chan struct{})
	go func() {
		b := make([]byte, 5)
		if _, err := io.ReadFull(u, b); err == nil && string(b) == "hello" {
			// An answer that comes once the sender is done: one that
			// overtakes it is an early one.
			<-sent
			time.Sleep(100 * time.Millisecond)
			_, _ = u.Write([]byte("HTTP/1.1 200 OK\r\n"))
		}
	}()
	reuse, err := engine.SendWhileReading(p,
		func() error {
			defer close(sent)
			return engine.SendBody(p, nil, []byte("he"), strings.NewReader("llo"), 5)
		}, readHead(p), nil)
	if err != nil || !reuse {
		t.Fatalf("reuse %v, err %v", reuse, err)
	}
}

// An upstream that answers before the whole body: the rest is not sent,
// and the connection is not reused.
func TestSendWhileReadingEarlyAnswer(t *testing.T) {
	p, u := upstreamConn(t)
	got := make(chan int64, 1)
	go func() {
		_, _ = u.Write([]byte("HTTP/1.1 200 OK\r\n"))
		n, _ := io.Copy(io.Discard, u) // up to the proxy's end of the body
		got <- n
	}()
	body := &endless{}
	reuse, err := engine.SendWhileReading(p,
		func() error { return engine.SendBody(p, nil, nil, body, -1) }, readHead(p), nil)
	if err != nil || reuse {
		t.Fatalf("reuse %v, err %v", reuse, err)
	}
	select {
	case <-got: // the sender stopped: the upstream saw the end
	case <-time.After(10 * time.Second):
		t.Fatal("the body went on after the answer")
	}
}

// A client whose body fails: the upstream gets the end at once (it
// does not wait for the rest), and the client's error comes first.
func TestSendWhileReadingClientFails(t *testing.T) {
	p, u := upstreamConn(t)
	go func() { _, _ = io.Copy(io.Discard, u) }() // an upstream that waits for the whole body
	start := time.Now()
	reuse, err := engine.SendWhileReading(p,
		func() error {
			return engine.SendBody(p, []byte("POST / HTTP/1.1\r\n\r\n"), nil, strings.NewReader("hel"), 5)
		}, readHead(p), nil)
	var be *engine.BodyReadError
	if !errors.As(err, &be) || !errors.Is(err, io.ErrUnexpectedEOF) || reuse {
		t.Fatalf("reuse %v, err %v; want a BodyReadError", reuse, err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("took %v: the read waited for the upstream", d)
	}
}

// endless is a body that never ends.
type endless struct{}

func (*endless) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = 'x'
	}
	return len(p), nil
}

// A body that could not be sent whole to an upstream that answered
// anyway: the answer stands, and the connection is not reused.
func TestSendWhileReadingWriteFails(t *testing.T) {
	p, u := upstreamConn(t)
	failed := make(chan struct{})
	go func() {
		<-failed
		time.Sleep(50 * time.Millisecond) // the sender's error is in first
		_, _ = u.Write([]byte("HTTP/1.1 200 OK\r\n"))
	}()
	reuse, err := engine.SendWhileReading(p,
		func() error {
			close(failed)
			return io.ErrClosedPipe
		}, readHead(p), nil)
	if err != nil || reuse {
		t.Fatalf("reuse %v, err %v", reuse, err)
	}
}

// An upstream that answers while the client pauses mid-body: stop ends
// the sender's wait for the client at once, and the answer goes.
func TestSendWhileReadingStopsAPausedClient(t *testing.T) {
	p, u := upstreamConn(t)
	go func() {
		_, _ = u.Write([]byte("HTTP/1.1 200 OK\r\n"))
		_, _ = io.Copy(io.Discard, u)
	}()
	body := &paused{stopped: make(chan struct{})}
	done := make(chan error, 1)
	go func() {
		reuse, err := engine.SendWhileReading(p,
			func() error {
				return engine.SendBody(p, []byte("POST / HTTP/1.1\r\n\r\n"), []byte("first"), body, 1<<20)
			},
			readHead(p), body.stop)
		if err == nil && reuse {
			err = errors.New("the connection is to be reused")
		}
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the answer waited for the paused client")
	}
}

// paused is a client body that sends nothing more until it is stopped.
type paused struct {
	stopped chan struct{}
	once    sync.Once
}

func (b *paused) Read([]byte) (int, error) {
	<-b.stopped
	return 0, os.ErrDeadlineExceeded
}

func (b *paused) stop() { b.once.Do(func() { close(b.stopped) }) }
