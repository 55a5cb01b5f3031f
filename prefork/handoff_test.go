//go:build linux

package prefork

import (
	"bytes"
	"io"
	"log/slog"
	"os"
	"reflect"
	"slices"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/preforkd/preforkd/internal/proctest"
)

func TestSettingsHandoffRoundTrip(t *testing.T) {
	sent := Settings{
		ShutdownTimeout: 7 * time.Second,
		Canary: Canary{
			Off: true, Window: 3 * time.Second, MinRequests: 9, MaxErrorDelta: 1.5, Inconclusive: InconclusiveAbort,
		},
		MaxRequests: 1234,
		MaxRSS:      64 << 20,
		// Any bytes: not only JSON, not only UTF-8.
		Payload:  []byte("{\"rules\":[]}\x00\xff\xfe"),
		Config:   struct{ Secret string }{"s3cret"},
		LogAttrs: []slog.Attr{slog.String("changed", "nothing")},
	}
	f, err := settingsFile(sent)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Write([]byte("x")); err == nil {
		t.Error("the settings file is writable after sealing")
	}
	// What a worker gets: everything but the supervisor's own Config and
	// LogAttrs, which are never sent.
	want := sent
	want.Config, want.LogAttrs = nil, nil
	for range 2 { // pread: reading twice (two workers) gives the same
		got, err := readSettings(f)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("round trip:\n got %+v\nwant %+v", got, want)
		}
	}
	b, err := io.ReadAll(io.NewSectionReader(f, 0, 1<<20))
	if err != nil || bytes.Contains(b, []byte("s3cret")) || bytes.Contains(b, []byte("changed")) {
		t.Errorf("the workers' file holds the supervisor's Config or LogAttrs (%v):\n%s", err, b)
	}
}

func TestWorkerEnviron(t *testing.T) {
	in := []string{"PATH=/bin", "NOTIFY_SOCKET=/run/x", "PREFORKD_WORKER=3", "PREFORKD_NAME=app", "HOME=/root"}
	got := workerEnviron(in, 1<<20)
	if want := []string{"PATH=/bin", "HOME=/root", "GOMAXPROCS=1"}; !slices.Equal(got, want) {
		t.Errorf("got %q, want %q", got, want)
	}
	got = workerEnviron(append(in, "GOMAXPROCS=7"), 2)
	if want := []string{"PATH=/bin", "HOME=/root", "GOMAXPROCS=7"}; !slices.Equal(got, want) {
		t.Errorf("a user's GOMAXPROCS: got %q, want %q", got, want)
	}
}

// The socket's non-blocking mode is shared by every worker: starting a
// worker must not clear it (the listener's own File would, and a worker's
// drain would then hang in Close behind a blocking accept).
func TestListenerStaysNonBlockingAcrossStarts(t *testing.T) {
	_, f := workerListener(t)
	if err := proctest.Start(t, proctest.Options{Role: "exit", Files: []*os.File{f}}).Wait(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	flags, err := unix.FcntlInt(f.Fd(), unix.F_GETFL, 0)
	if err != nil {
		t.Fatal(err)
	}
	if flags&unix.O_NONBLOCK == 0 {
		t.Fatal("the listening socket is in blocking mode after a start")
	}
}
