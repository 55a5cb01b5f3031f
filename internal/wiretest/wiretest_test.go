package wiretest_test

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/preforkd/preforkd/internal/wiretest"
)

func TestPattern(t *testing.T) {
	a, err := io.ReadAll(wiretest.Pattern(1000))
	if err != nil || len(a) != 1000 {
		t.Fatalf("%d bytes, %v; want 1000", len(a), err)
	}
	b, _ := io.ReadAll(wiretest.Pattern(1000))
	if !bytes.Equal(a, b) {
		t.Error("two patterns of the same length differ")
	}
	// Read in small pieces, the bytes are the same.
	var small bytes.Buffer
	buf := make([]byte, 7)
	for r := wiretest.Pattern(1000); ; {
		n, err := r.Read(buf)
		small.Write(buf[:n])
		if err != nil {
			break
		}
	}
	if !bytes.Equal(a, small.Bytes()) {
		t.Error("the pattern depends on the size of the reads")
	}
	if !bytes.Equal(a[:4], []byte{0, 7, 224, 39}) {
		t.Errorf("the pattern starts % x, want 00 07 e0 27", a[:4])
	}
	distinct := map[byte]bool{}
	for _, c := range a {
		distinct[c] = true
	}
	if len(distinct) != 16 || !bytes.Equal(a[:16], a[16:32]) {
		t.Errorf("%d distinct byte values in 1000 bytes, want a cycle of 16", len(distinct))
	}
}

// listen returns the address of a loopback listener whose connections
// AcceptEach hands to handle; it is closed when the test ends.
func listen(t *testing.T, handle func(net.Conn)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	wiretest.AcceptEach(ln, handle)
	return ln.Addr().String()
}

func TestAcceptEach(t *testing.T) {
	closed := make(chan struct{})
	addr := listen(t, func(c net.Conn) {
		io.WriteString(c, "hi")
		// A handler that blocks does not hold up the next connection.
		<-closed
	})
	for range 2 {
		_, br := wiretest.Dial(t, addr, 5*time.Second)
		if b, err := br.Peek(2); err != nil || string(b) != "hi" {
			t.Fatalf("%q, %v", b, err)
		}
	}
	close(closed)
	// When handle returns, the connection is closed.
	addr = listen(t, func(c net.Conn) {})
	_, br := wiretest.Dial(t, addr, 5*time.Second)
	if _, err := br.ReadByte(); err != io.EOF {
		t.Errorf("read after the handler returned: %v, want EOF", err)
	}
}

func TestDial(t *testing.T) {
	addr := listen(t, func(c net.Conn) { io.WriteString(c, "hello\n") })
	_, br := wiretest.Dial(t, addr, 5*time.Second)
	if line, err := br.ReadString('\n'); err != nil || line != "hello\n" {
		t.Fatalf("%q, %v", line, err)
	}
	// The deadline holds: a read on a silent connection ends.
	silent := listen(t, func(c net.Conn) { io.Copy(io.Discard, c) })
	_, br = wiretest.Dial(t, silent, 100*time.Millisecond)
	start := time.Now()
	if _, err := br.ReadByte(); err == nil || time.Since(start) > 5*time.Second {
		t.Fatalf("read on a silent connection: %v after %v", err, time.Since(start))
	}
}

func TestTrickle(t *testing.T) {
	r, w := net.Pipe()
	defer r.Close()
	done := make(chan struct{})
	go func() {
		defer close(done)
		wiretest.Trickle(w, "abc", 50*time.Millisecond)
		w.Close()
	}()
	br := bufio.NewReader(r)
	var got []byte
	var at []time.Time
	for {
		b, err := br.ReadByte()
		if err != nil {
			break
		}
		got, at = append(got, b), append(at, time.Now())
	}
	<-done
	if string(got) != "abc" {
		t.Fatalf("%q, want abc", got)
	}
	for i := 1; i < len(at); i++ {
		if gap := at[i].Sub(at[i-1]); gap < 40*time.Millisecond {
			t.Errorf("bytes %d and %d %v apart, want about 50ms", i-1, i, gap)
		}
	}

	// A closed connection ends it at once.
	r2, w2 := net.Pipe()
	r2.Close()
	start := time.Now()
	wiretest.Trickle(w2, "abcdef", time.Second)
	if took := time.Since(start); took > 500*time.Millisecond {
		t.Errorf("Trickle on a closed connection returned after %v", took)
	}
}

func TestSlowloris(t *testing.T) {
	const head = "GET / HTTP/1.1\r\nHost: a\r\n"
	var heads, open atomic.Int64
	allIn := make(chan struct{})
	// The server reads each head, holds every connection until it has
	// read all 20 heads and a little longer, then closes them.
	addr := listen(t, func(c net.Conn) {
		open.Add(1)
		defer open.Add(-1)
		buf := make([]byte, len(head))
		if _, err := io.ReadFull(c, buf); err != nil || string(buf) != head {
			return
		}
		if heads.Add(1) == 20 {
			close(allIn)
		}
		select {
		case <-allIn:
			time.Sleep(50 * time.Millisecond)
		case <-time.After(5 * time.Second):
		}
	})
	stop := wiretest.SamplePeak(time.Millisecond, open.Load)
	start := time.Now()
	wiretest.Slowloris(addr, 20, head, 10*time.Second)
	peak := stop()
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("Slowloris returned after %v, not when the server closed the connections", took)
	}
	if heads.Load() != 20 {
		t.Errorf("the server read %d whole heads, want 20", heads.Load())
	}
	if peak != 20 {
		t.Errorf("peak %d open connections, want 20", peak)
	}
	// Against a server that never closes, the timeout ends it.
	silent := listen(t, func(c net.Conn) { io.Copy(io.Discard, c) })
	start = time.Now()
	wiretest.Slowloris(silent, 3, "GET / HTTP/1.1\r\n", 200*time.Millisecond)
	if took := time.Since(start); took < 150*time.Millisecond || took > 5*time.Second {
		t.Errorf("Slowloris against a silent server returned after %v, want about 200ms", took)
	}
}

func TestSamplePeak(t *testing.T) {
	var n atomic.Int64
	values := []int64{3, 9, 4, 1}
	stop := wiretest.SamplePeak(time.Millisecond, func() int64 {
		i := n.Add(1) - 1
		return values[min(i, int64(len(values)-1))]
	})
	for n.Load() < int64(len(values)) {
		time.Sleep(time.Millisecond)
	}
	if got := stop(); got != 9 {
		t.Errorf("peak %d, want 9", got)
	}
	calls := n.Load()
	time.Sleep(10 * time.Millisecond)
	if n.Load() != calls {
		t.Error("sample still called after stop")
	}
	if got := stop(); got != 9 {
		t.Errorf("a second stop: %d, want 9", got)
	}
}
