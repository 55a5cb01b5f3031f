package redisstore_test

import (
	"io"
	"net"
	"testing"
	"time"

	"github.com/preforkd/preforkd/bucket"
	"github.com/preforkd/preforkd/internal/redistest"
	"github.com/preforkd/preforkd/internal/wiretest"
	"github.com/preforkd/preforkd/redisstore"
)

// A Redis whose connections take 200 ms to open (a TLS handshake over a
// slow link) still gets a sync rule's counts: a flush, whose budget is
// seconds, dials within that budget. The request timeout (25 ms) bounds a
// request's call only; a flush once had it for its dials too, and at a
// worker's drain its last counts were lost.
func TestSyncFlushDialsWithinItsOwnBudget(t *testing.T) {
	t.Parallel()
	srv := redistest.StartWith(t, redistest.Options{TLS: true})
	ca, err := redisstore.ReadCAFile(srv.CAFile)
	if err != nil {
		t.Fatal(err)
	}
	var o redisstore.Options // the request timeout, 25 ms
	o.URL, o.TLS, o.CA = "redis://"+slowToOpen(t, srv.Addr, 200*time.Millisecond)+"/0", true, ca
	r := redisstore.Rule{Rule: bucket.Rule{Name: "sync-slow-dial", Limit: 10, Window: time.Hour, Algorithm: bucket.FixedWindow}, Sync: time.Hour}
	h := newHost(t, srv, 0, o)
	l := h.limiter(t, r)
	for range 3 {
		k := l.Key([]byte("k"))
		if !l.AllowKey(&k, h.region.Now()).Allowed {
			t.Fatal("refused under the limit")
		}
	}
	h.store.Close() // the last flush
	if st := h.store.Stats(h.region.Now()); st.Flushed != 3 {
		t.Fatalf("flushed %d at close, want 3: %+v", st.Flushed, st)
	}
}

// slowToOpen is a TCP relay to addr that holds each new connection for d
// before it carries a byte, as a slow link holds a handshake; it returns
// the relay's address. A relayed connection ends with either side's.
func slowToOpen(t *testing.T, addr string, d time.Duration) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	wiretest.AcceptEach(ln, func(c net.Conn) {
		time.Sleep(d)
		up, err := net.Dial("tcp", addr)
		if err != nil {
			return
		}
		defer up.Close()
		go func() { io.Copy(up, c); up.Close() }()
		io.Copy(c, up)
	})
	return ln.Addr().String()
}
