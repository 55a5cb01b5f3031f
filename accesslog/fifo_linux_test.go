package accesslog_test

import (
	"bufio"
	"encoding/json"
	"os"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/preforkd/preforkd/accesslog"
)

// Workers that share a FIFO (a log shipper's) write whole lines into it:
// a pipe takes a write whole only up to PIPE_BUF, and what a worker
// writes past that may be split around another worker's lines. Logs on
// one FIFO, of the smallest capacity, each write a burst far over it at
// once; every line the reader gets is one of theirs, whole. Which writer
// a pipe's room goes to is the scheduler's: a few rounds.
func TestFIFOLinesWhole(t *testing.T) {
	path := newFIFO(t)
	r := readFIFO(t, path)
	// One page: every wait for room is a chance for another writer.
	if _, err := unix.FcntlInt(r.Fd(), unix.F_SETPIPE_SZ, os.Getpagesize()); err != nil {
		t.Fatal(err)
	}
	r.SetReadDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(r)
	for round := range 5 {
		if bad := fifoRound(t, path, br); len(bad) > 0 {
			for _, l := range bad {
				t.Errorf("round %d: not a whole line: %.400q", round, l)
			}
			return
		}
	}
}

// fifoRound has 3 logs on path write 1000 lines each at once, and
// returns the first lines read from br that are not whole.
func fifoRound(t *testing.T, path string, br *bufio.Reader) (bad []string) {
	const logs, perLog = 3, 1000
	var wg sync.WaitGroup
	for w := range logs {
		l, err := accesslog.New(accesslog.Options{Path: path, Format: accesslog.JSON, FlushEvery: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		e := entry()
		e.Worker = w
		for range perLog {
			l.Log(e)
		}
		wg.Go(func() { l.Close() }) // writes its burst now
	}
	defer wg.Wait()
	for range logs * perLog {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("read from the FIFO: %v", err)
		}
		var e struct{ Worker int }
		if json.Unmarshal([]byte(line), &e) != nil && len(bad) < 3 {
			bad = append(bad, line)
		}
	}
	return bad
}
