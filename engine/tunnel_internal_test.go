package engine

import (
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/preforkd/preforkd/internal/clocktest"
)

// tcpPair is the two ends of a TCP connection on 127.0.0.1.
func tcpPair(t *testing.T) (a, b net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if a, err = net.Dial("tcp", ln.Addr().String()); err != nil {
		t.Fatal(err)
	}
	if b, err = ln.Accept(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}

// A tunnel's idle timeout counts the time both sides were quiet, whatever
// the wall clock does meanwhile: stepped forward, it must not cut a
// tunnel that carried bytes a moment ago; stepped back, it must not keep
// an idle one open for the size of the step.
func TestTunnelIdleTimeoutIgnoresWallClockSteps(t *testing.T) {
	if !clocktest.Works() {
		t.Fatal("time.Time's layout is not the one clocktest knows: internal/clocktest needs updating")
	}
	const timeout = time.Second
	for _, step := range []time.Duration{time.Hour, -time.Hour} {
		t.Run(step.String(), func(t *testing.T) {
			var by atomic.Int64
			tunnelNow = func() time.Time { return clocktest.Stepped(time.Duration(by.Load())) }
			defer func() { tunnelNow = time.Now }()
			clientPeer, client := tcpPair(t)
			upPeer, up := tcpPair(t)
			done := make(chan struct{})
			go func() {
				defer close(done)
				Tunnel(client, client, up, up, timeout, timeout)
			}()
			// The upstream speaks once, before the client side's read
			// times out; then the wall clock is stepped.
			time.Sleep(timeout * 8 / 10)
			if _, err := upPeer.Write([]byte("x")); err != nil {
				t.Fatal(err)
			}
			var b [1]byte
			_ = clientPeer.SetReadDeadline(time.Now().Add(5 * time.Second))
			if _, err := io.ReadFull(clientPeer, b[:]); err != nil {
				t.Fatal(err)
			}
			got := time.Now()
			by.Store(int64(step))
			_ = clientPeer.SetReadDeadline(time.Now().Add(timeout + 3*time.Second))
			_, err := clientPeer.Read(b[:])
			lived := time.Since(got)
			switch {
			case err != io.EOF:
				t.Errorf("the tunnel was still open %v after its last bytes (timeout %v): %v", lived, timeout, err)
			case lived < timeout/2:
				t.Errorf("the tunnel was cut %v after it carried bytes (timeout %v)", lived, timeout)
			}
			upPeer.Close()
			clientPeer.Close()
			<-done
		})
	}
}
