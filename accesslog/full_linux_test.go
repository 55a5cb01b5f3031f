package accesslog_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/preforkd/preforkd/accesslog"
	"github.com/preforkd/preforkd/internal/proctest"
)

func init() { roles["fulldisk"] = fullDisk }

// A disk that fills while lines are written ends the file in the middle
// of a line; once there is room again, the next lines are lines of their
// own, not the end of the torn one, so that every line after it parses.
// The child writes under a file size limit (a full disk, as the process
// sees it), then raises it (room made).
func TestLinesAfterAFullDisk(t *testing.T) {
	path := filepath.Join(t.TempDir(), "access.log")
	p := proctest.Start(t, proctest.Options{Role: "fulldisk", Spec: path})
	if line, err := p.Line(10 * time.Second); err != nil || line != "done" {
		t.Fatalf("the child: %q %v", line, err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
	if len(lines) < 2 || !strings.HasSuffix(string(b), "\n") {
		t.Fatalf("the file: %q", b)
	}
	if len(lines[0]) != 100 {
		t.Errorf("the first line has %d bytes, want the 100 of the torn one alone: %q", len(lines[0]), lines[0])
	}
	for _, l := range lines[1:] {
		var e struct {
			RequestID string `json:"request_id"`
		}
		if err := json.Unmarshal([]byte(l), &e); err != nil || !strings.HasPrefix(e.RequestID, "after-") {
			t.Errorf("a line after the full disk: %v: %q", err, l)
		}
	}
	if len(lines) != 3 {
		t.Errorf("%d lines, want the torn one and the 2 after it:\n%s", len(lines), b)
	}
}

// fullDisk logs a line under a file size limit of 100 bytes, less than
// the line, then raises the limit and logs two more.
func fullDisk(c *proctest.Child) error {
	var path string
	if err := c.Spec(&path); err != nil {
		return err
	}
	behind := make(chanWriter, 1) // the writer says the write failed
	l, err := accesslog.New(accesslog.Options{Path: path, Format: accesslog.JSON, FlushEvery: time.Hour,
		Logger: slog.New(slog.NewTextHandler(behind, nil))})
	if err != nil {
		return err
	}
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_FSIZE, &lim); err != nil {
		return err
	}
	if err := unix.Setrlimit(unix.RLIMIT_FSIZE, &unix.Rlimit{Cur: 100, Max: lim.Max}); err != nil {
		return err
	}
	e := entry()
	e.RequestID = []byte("before")
	l.Log(e)
	if err := l.Reopen(); err != nil { // has the writer write it now
		return err
	}
	select {
	case <-behind:
	case <-time.After(5 * time.Second):
		return errors.New("no failed write was reported")
	}
	if err := unix.Setrlimit(unix.RLIMIT_FSIZE, &lim); err != nil {
		return err
	}
	for i := range 2 {
		e.RequestID = fmt.Appendf(nil, "after-%d", i)
		l.Log(e)
	}
	if err := l.Close(); err != nil {
		return err
	}
	return c.Say("done")
}

// chanWriter signals each write.
type chanWriter chan struct{}

func (c chanWriter) Write(p []byte) (int, error) {
	select {
	case c <- struct{}{}:
	default:
	}
	return len(p), nil
}
