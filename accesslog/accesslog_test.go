package accesslog_test

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/preforkd/preforkd/accesslog"
	"github.com/preforkd/preforkd/core"
)

var at = time.Date(2026, 10, 10, 13, 55, 36, 123456789, time.FixedZone("", 2*3600))

func entry() *core.AccessEntry {
	return &core.AccessEntry{
		Time: at, Client: netip.MustParseAddr("192.0.2.7"), Method: "GET", Path: "/a", Query: "b=1",
		Proto: "HTTP/1.1", Status: 200, Bytes: 2326, Duration: 4211 * time.Microsecond, Upstream: 3105 * time.Microsecond,
		Cache: "MISS", RequestID: []byte("5f0c"), UserAgent: "curl/8.5.0", Worker: 2, Scheme: "https",
	}
}

// memLog is a Log on a file in a test directory, with its path.
func memLog(t *testing.T, f accesslog.Format) (*accesslog.Log, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "access.log")
	l, err := accesslog.New(accesslog.Options{Path: path, Format: f, FlushEvery: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l, path
}

func read(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestFormats(t *testing.T) {
	refused := entry()
	refused.Status, refused.Bytes, refused.Upstream, refused.Rule, refused.Cache, refused.UserAgent = 429, 187, -1, "login", "", ""
	odd := entry()
	odd.Path, odd.Query, odd.UserAgent, odd.Referer, odd.RequestID = `/q"\`, "", "a\x01é", "https://x/", nil
	odd.Client, odd.Scheme = netip.Addr{}, ""
	absolute := entry() // the target as sent stands for Path and Query
	absolute.Target = `http://h/a?b="1"`
	for _, tt := range []struct {
		f    accesslog.Format
		e    *core.AccessEntry
		want string
	}{
		{accesslog.Combined, entry(),
			`192.0.2.7 - - [10/Oct/2026:13:55:36 +0200] "GET /a?b=1 HTTP/1.1" 200 2326 "-" "curl/8.5.0" request_id=5f0c request_time=0.004 upstream_time=0.003 rule=- cache=MISS worker=2 scheme=https` + "\n"},
		{accesslog.Combined, refused,
			`192.0.2.7 - - [10/Oct/2026:13:55:36 +0200] "GET /a?b=1 HTTP/1.1" 429 187 "-" "-" request_id=5f0c request_time=0.004 upstream_time=- rule=login cache=- worker=2 scheme=https` + "\n"},
		{accesslog.Combined, odd,
			`- - - [10/Oct/2026:13:55:36 +0200] "GET /q\x22\x5C HTTP/1.1" 200 2326 "https://x/" "a\x01\xC3\xA9" request_id=- request_time=0.004 upstream_time=0.003 rule=- cache=MISS worker=2 scheme=-` + "\n"},
		{accesslog.Combined, absolute,
			`192.0.2.7 - - [10/Oct/2026:13:55:36 +0200] "GET http://h/a?b=\x221\x22 HTTP/1.1" 200 2326 "-" "curl/8.5.0" request_id=5f0c request_time=0.004 upstream_time=0.003 rule=- cache=MISS worker=2 scheme=https` + "\n"},
		{accesslog.JSON, absolute,
			`{"time":"2026-10-10T13:55:36.123+02:00","client":"192.0.2.7","method":"GET","target":"http://h/a?b=\"1\"","protocol":"HTTP/1.1","scheme":"https","status":200,"bytes":2326,"duration":0.004211,"upstream_time":0.003105,"rule":null,"cache":"MISS","request_id":"5f0c","worker":2,"referer":null,"user_agent":"curl/8.5.0"}` + "\n"},
		{accesslog.JSON, entry(),
			`{"time":"2026-10-10T13:55:36.123+02:00","client":"192.0.2.7","method":"GET","target":"/a?b=1","protocol":"HTTP/1.1","scheme":"https","status":200,"bytes":2326,"duration":0.004211,"upstream_time":0.003105,"rule":null,"cache":"MISS","request_id":"5f0c","worker":2,"referer":null,"user_agent":"curl/8.5.0"}` + "\n"},
		{accesslog.JSON, refused,
			`{"time":"2026-10-10T13:55:36.123+02:00","client":"192.0.2.7","method":"GET","target":"/a?b=1","protocol":"HTTP/1.1","scheme":"https","status":429,"bytes":187,"duration":0.004211,"upstream_time":null,"rule":"login","cache":null,"request_id":"5f0c","worker":2,"referer":null,"user_agent":null}` + "\n"},
		{accesslog.JSON, odd,
			`{"time":"2026-10-10T13:55:36.123+02:00","client":null,"method":"GET","target":"/q\"\\","protocol":"HTTP/1.1","scheme":null,"status":200,"bytes":2326,"duration":0.004211,"upstream_time":0.003105,"rule":null,"cache":"MISS","request_id":null,"worker":2,"referer":"https://x/","user_agent":"a\u0001\u00c3\u00a9"}` + "\n"},
	} {
		l, path := memLog(t, tt.f)
		l.Log(tt.e)
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		got := read(t, path)
		if got != tt.want {
			t.Errorf("%v:\n got %s\nwant %s", tt.f, got, tt.want)
		}
		if tt.f == accesslog.JSON && !json.Valid([]byte(got)) {
			t.Errorf("not valid JSON: %s", got)
		}
	}
}

// Lines wait in memory, never longer than FlushEvery; Close writes the
// rest.
func TestFlush(t *testing.T) {
	path := filepath.Join(t.TempDir(), "access.log")
	l, err := accesslog.New(accesslog.Options{Path: path, FlushEvery: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	l.Log(entry())
	deadline := time.Now().Add(5 * time.Second)
	for read(t, path) == "" {
		if time.Now().After(deadline) {
			t.Fatal("the line was not written within 5s of a 50ms flush interval")
		}
		time.Sleep(10 * time.Millisecond)
	}

	l2, path2 := memLog(t, accesslog.Combined) // an hour between flushes
	for range 3 {
		l2.Log(entry())
	}
	if got := read(t, path2); got != "" {
		t.Fatalf("written before its time: %q", got)
	}
	l2.Close()
	if n := strings.Count(read(t, path2), "\n"); n != 3 {
		t.Errorf("Close wrote %d lines, want 3", n)
	}
	l2.Log(entry()) // after Close: dropped, no panic
}

// After a rotation renames the file, Reopen sends the next lines to a new
// file at the path; the old one has every line before.
func TestReopen(t *testing.T) {
	l, path := memLog(t, accesslog.Combined)
	l.Log(entry())
	if err := os.Rename(path, path+".1"); err != nil {
		t.Fatal(err)
	}
	l.Log(entry())
	if err := l.Reopen(); err != nil {
		t.Fatal(err)
	}
	l.Log(entry())
	l.Close()
	if a, b := strings.Count(read(t, path+".1"), "\n"), strings.Count(read(t, path), "\n"); a != 2 || b != 1 {
		t.Errorf("rotated file %d lines, new file %d; want 2 and 1", a, b)
	}
	if st, err := os.Stat(path); err != nil || st.Mode().Perm() != 0o640 {
		t.Errorf("new file: %v %v, want mode 0640", st, err)
	}
}

// Past MaxPending waiting bytes, lines are dropped and counted, and the
// log says so once they are written.
func TestDropped(t *testing.T) {
	path := filepath.Join(t.TempDir(), "access.log")
	var logged bytes.Buffer
	l, err := accesslog.New(accesslog.Options{Path: path, FlushEvery: time.Hour, MaxPending: 1000,
		Logger: slog.New(slog.NewTextHandler(&logged, nil))})
	if err != nil {
		t.Fatal(err)
	}
	line := len(read(t, path)) // 0; a line is about 200 bytes
	for range 20 {
		l.Log(entry())
	}
	l.Close()
	written := strings.Count(read(t, path), "\n")
	if written+int(l.Dropped()) != 20 || l.Dropped() == 0 || written == 0 {
		t.Errorf("written %d, dropped %d of 20 (pending at most 1000 bytes)", written, l.Dropped())
	}
	_ = line
}

// writeSizes records the size of every write.
type writeSizes struct {
	mu    sync.Mutex
	sizes []int
	buf   bytes.Buffer
}

func (w *writeSizes) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.sizes = append(w.sizes, len(p))
	return w.buf.Write(p)
}

// To standard error, shared by every process, writes are whole lines of
// at most 4 KiB (what a pipe writes whole).
func TestStderrPieces(t *testing.T) {
	w := &writeSizes{}
	l, err := accesslog.New(accesslog.Options{Path: accesslog.Stderr, FlushEvery: time.Hour, Stderr: w})
	if err != nil {
		t.Fatal(err)
	}
	for range 200 {
		l.Log(entry())
	}
	l.Close()
	if n := strings.Count(w.buf.String(), "\n"); n != 200 {
		t.Fatalf("%d lines", n)
	}
	if len(w.sizes) < 2 {
		t.Errorf("%d writes for %d bytes", len(w.sizes), w.buf.Len())
	}
	at := 0
	for _, n := range w.sizes {
		piece := w.buf.Bytes()[at : at+n]
		at += n
		if n > 4096 || piece[len(piece)-1] != '\n' {
			t.Errorf("a write of %d bytes ending %q", n, piece[len(piece)-1])
		}
	}
}

func TestNewErrors(t *testing.T) {
	if _, err := accesslog.New(accesslog.Options{}); err == nil {
		t.Error("no path accepted")
	}
	if _, err := accesslog.New(accesslog.Options{Path: filepath.Join(t.TempDir(), "missing", "a.log")}); err == nil {
		t.Error("a path in a missing directory accepted")
	}
	if err := accesslog.Check(filepath.Join(t.TempDir(), "missing", "a.log")); err == nil {
		t.Error("Check accepted a path in a missing directory")
	}
	// Check leaves nothing behind (a check run as root would leave a
	// root-owned log the service's user cannot open), and judges a file
	// that exists by opening it.
	dir := t.TempDir()
	if err := accesslog.Check(filepath.Join(dir, "a.log")); err != nil {
		t.Fatal(err)
	}
	if left, _ := os.ReadDir(dir); len(left) != 0 {
		t.Errorf("Check left %v behind", left)
	}
	ro := filepath.Join(dir, "ro.log")
	os.WriteFile(ro, nil, 0o400)
	if err := accesslog.Check(ro); err == nil && os.Geteuid() != 0 {
		t.Error("Check accepted a file it cannot write")
	}
	var f accesslog.Format
	if err := f.UnmarshalText([]byte("common")); err == nil {
		t.Error("format common accepted")
	}
}

func BenchmarkLog(b *testing.B) {
	for _, f := range []accesslog.Format{accesslog.Combined, accesslog.JSON} {
		b.Run(f.String(), func(b *testing.B) {
			path := filepath.Join(b.TempDir(), "access.log")
			l, err := accesslog.New(accesslog.Options{Path: path, Format: f})
			if err != nil {
				b.Fatal(err)
			}
			defer l.Close()
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				e := entry()
				for pb.Next() {
					e.Time = time.Now()
					l.Log(e)
				}
			})
		})
	}
}
