package prefork

import (
	"net/netip"
	"os"
	"reflect"
	"slices"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/preforkd/preforkd/bucket"
	"github.com/preforkd/preforkd/config"
	"github.com/preforkd/preforkd/internal/proctest"
)

func TestConfigHandoffRoundTrip(t *testing.T) {
	cfg := config.Config{
		Server: config.Server{
			Listen: "127.0.0.1:9", Workers: 3, Upstream: "http://127.0.0.1:1",
			TrustedProxies: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("2001:db8::/32")},
			IPv6Prefix:     56, ShutdownTimeout: 7 * time.Second, Headers: config.HeadersIETF, MaxRequestBody: 1234,
		},
		Admin:   config.Admin{Listen: "127.0.0.1:10", TokenFile: "/t"},
		Table:   config.Table{Counters: 1024, Responses: 10, ResponseBytes: 4096},
		Persist: config.Persist{Path: "/p", Key: "k", Live: "/dev/shm/x"},
		RateLimits: []config.RateLimit{{
			Name: "login", Path: "/login", Methods: []string{"POST"}, Limit: 5, Window: 5 * time.Minute,
			Algorithm: bucket.FixedWindow, Burst: 2, By: "header:X|ip", Mode: config.Shadow, OnFull: bucket.Closed,
		}},
		Idempotency: []config.Idempotency{{
			Path: "/orders", Methods: []string{"POST"}, Header: "Idempotency-Key", Required: true,
			TTL: time.Hour, Wait: time.Second, By: "ip", MaxBody: 99,
		}},
	}
	f, err := configFile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Write([]byte("x")); err == nil {
		t.Error("the configuration file is writable after sealing")
	}
	for range 2 { // pread: reading twice (two workers) gives the same
		got, err := readConfig(f)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, cfg) {
			t.Fatalf("round trip:\n got %+v\nwant %+v", got, cfg)
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
