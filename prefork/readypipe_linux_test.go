package prefork

import (
	"context"
	"io"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/preforkd/preforkd/shm"
)

// TestRecycleRequestReadByAnOlderSupervisor: what a worker past a
// recycling limit writes on its readiness pipe stays readable by a
// supervisor of a build without stoppedMsg (a reload starts the build
// deployed on disk under the running supervisor): the ready byte, then
// whole recycle requests of recycleMsgLen bytes; the stopped word only
// once told to drain, as the pipe's last, short, message.
func TestRecycleRequestReadByAnOlderSupervisor(t *testing.T) {
	region, err := shm.CreatePrivate(shm.Options{Counters: 64, MaxWorkers: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer region.Close()
	if err := region.Join(1); err != nil {
		t.Fatal(err)
	}
	r, wr, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer wr.Close()
	l := &limits{}
	l.state.Store(limitsTripped)
	w := &Worker{Region: region, limits: l}
	closed := make(chan struct{}) // the listener, closed at the limit
	recycle := make(chan []byte, 1)
	term := make(chan os.Signal, 1)
	type result struct {
		why string
		ok  bool
	}
	done := make(chan result, 1)
	go func() {
		why, _, ok := serveUntilTold(context.Background(), w, wr, nil, func() error { <-closed; return nil }, recycle, term, nil, quietLog())
		done <- result{why, ok}
	}()
	read := func(n int) []byte {
		t.Helper()
		b := make([]byte, n)
		_ = r.SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.ReadFull(r, b); err != nil {
			t.Fatalf("reading %d bytes of the readiness pipe: %v", n, err)
		}
		return b
	}
	if b := read(1); b[0] != 1 {
		t.Fatalf("ready byte %d", b[0])
	}
	// The limit trips: the listener closes (Serve returns), then the
	// request reaches the worker's loop. Serve's goroutine gets a moment
	// to say what it says.
	close(closed)
	time.Sleep(100 * time.Millisecond)
	recycle <- encodeRecycle(recycleRequests, 10, 10)
	if ev, err := decodeRecycle(1, read(recycleMsgLen)); err != nil || ev.reason != "max_requests" {
		t.Fatalf("an older supervisor reads %+v, %v: want the recycle request", ev, err)
	}
	term <- syscall.SIGTERM
	if res := <-done; !res.ok || res.why != "TERM" {
		t.Fatalf("serveUntilTold: %+v", res)
	}
	if b := read(1); b[0] != stoppedMsg {
		t.Fatalf("after TERM the worker said %d, want stoppedMsg", b[0])
	}
}
