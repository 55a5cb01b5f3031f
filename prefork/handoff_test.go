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
		DrainDelay:      2 * time.Second,
		UpgradeTimeout:  11 * time.Second,
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
	// Every field is set, so that one handoffFields leaves out fails the
	// round trip: a field added to Settings must be set here too.
	var zeros []string
	var walk func(prefix string, v reflect.Value)
	walk = func(prefix string, v reflect.Value) {
		for i := range v.NumField() {
			f, name := v.Field(i), prefix+v.Type().Field(i).Name
			if f.Kind() == reflect.Struct {
				walk(name+".", f)
			} else if f.IsZero() {
				zeros = append(zeros, name)
			}
		}
	}
	walk("", reflect.ValueOf(sent))
	if len(zeros) > 0 {
		t.Fatalf("set every field of the Settings sent: %v are zero", zeros)
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

func TestSettingsHandoffRefusesDamage(t *testing.T) {
	good := Settings{MaxRequests: 5, Payload: []byte("x")}.appendHandoff(nil)
	if s, err := parseHandoff(good); err != nil || s.MaxRequests != 5 || string(s.Payload) != "x" {
		t.Fatalf("the good encoding: %+v, %v", s, err)
	}
	// A field of another build is passed over; one not sent is zero.
	if s, err := parseHandoff([]byte("max_workers 5\nmax_requests 7\n\n")); err != nil || s.MaxRequests != 7 || s.MaxRSS != 0 {
		t.Fatalf("with a field of another build: %+v, %v", s, err)
	}
	for _, bad := range []string{
		"",                            // nothing
		"max_requests 5\n",            // no end to the fields
		"max_requests five\n\n",       // not a number
		"max_requests\n\n",            // no value
		"canary_inconclusive 300\n\n", // out of range
		`{"ShutdownTimeout":1}`,       // JSON, from an older supervisor
		"canary_off maybe\n\npayload", // not a bool
	} {
		if s, err := parseHandoff([]byte(bad)); err == nil {
			t.Errorf("%q decoded as %+v", bad, s)
		}
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

// FuzzSettingsHandoff: any bytes decode or are refused, never panic, and
// what decodes encodes back to what decodes the same.
func FuzzSettingsHandoff(f *testing.F) {
	f.Add(Settings{MaxRSS: 1 << 30, Canary: Canary{MaxErrorDelta: 0.5}, Payload: []byte("{}")}.appendHandoff(nil))
	f.Add([]byte("max_requests 5\n\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := parseHandoff(b)
		if err != nil {
			return
		}
		again, err := parseHandoff(s.appendHandoff(nil))
		if err != nil || !reflect.DeepEqual(again, s) && !(s.Canary.MaxErrorDelta != s.Canary.MaxErrorDelta) {
			t.Fatalf("%q decoded as %+v, which re-encoded decodes as %+v, %v", b, s, again, err)
		}
	})
}
