package proxy_test

import (
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/preforkd/preforkd/engine"
)

// The timeouts of a server that was idle a while are as long as those of
// a busy one, on every engine. The event loop sleeps when nothing is due
// soon, its wheel's clock stopped: the first event after catches the
// clock up before it arms a timeout, which would otherwise be counted
// from when the loop fell asleep and fire at once. And a timeout armed
// before the sleep wakes it.
func TestTimeoutsAfterIdleness(t *testing.T) {
	t.Parallel()
	eachEngine(t, withNetHTTP(), func(t *testing.T, e storyEngine) {
		up := startUpstream(t, nil)
		addr := e.serve(t, storyOptions{Upstream: up.URL(),
			Limits: engine.Limits{ReadHeaderTimeout: 300 * time.Millisecond, IdleTimeout: 1500 * time.Millisecond}}).Addr
		kept, keptBR := dial(t, addr)
		roundTrip(t, kept, keptBR, "GET / HTTP/1.1\r\nHost: a\r\n\r\n")
		idle := time.Now()
		c, br := dial(t, addr)
		roundTrip(t, c, br, "GET / HTTP/1.1\r\nHost: a\r\n\r\n")
		time.Sleep(700 * time.Millisecond) // nothing happens

		start := time.Now()
		resp, _ := roundTrip(t, c, br, "GET / HTTP/1.1\r\nHost: a\r\nX-Slow: ")
		if resp.StatusCode != http.StatusRequestTimeout {
			t.Errorf("a head that never ends after idleness: status %d, want 408", resp.StatusCode)
		}
		if took := time.Since(start); took < 250*time.Millisecond || took > 5*time.Second {
			t.Errorf("a head that never ends after idleness: 408 after %v, want about 300ms", took)
		}

		b, err := io.ReadAll(keptBR)
		if err != nil || len(b) != 0 {
			t.Errorf("the idle connection: read %q, %v; want a quiet close", b, err)
		}
		if took := time.Since(idle); took < 1400*time.Millisecond || took > 5*time.Second {
			t.Errorf("the idle connection closed after %v, want about 1.5s", took)
		}
	})
}
