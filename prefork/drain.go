package prefork

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// How a retiring worker lets go of its clients (a reload, or TERM).
//
// The rule, for every HTTP engine a worker runs (net/http here; another
// engine must keep the same rule, and the same graces):
//
//  1. Stop accepting: close this worker's copy of the shared listener. The
//     socket stays open in the other workers, which accept what is queued
//     on it; nothing is refused.
//  2. Tell before leaving: every response that starts from now on carries
//     "Connection: close", and the connection is closed once it is sent.
//     A keep-alive client learns from that response not to send another
//     request on this connection, and opens a new one (served by a worker
//     that stays).
//  3. Never close a connection the client may be writing a request on:
//     a connection with no request in progress is closed only once it has
//     been idle for drainIdleGrace (after a response; the idle time counts
//     from the end of the response, also when that was before the drain)
//     or drainNewGrace (accepted, no request yet: it may be on its way, and
//     net/http's own Shutdown waits as long). Closing an idle connection at
//     once, as http.Server.Shutdown and SetKeepAlivesEnabled(false) do,
//     races with a client that sends its next request at that instant: the
//     request is lost (wrk -c50 counted about one read error per
//     connection and HUP). A client that kept a connection idle for the
//     grace is in the position every server's idle timeout puts it in
//     (RFC 9112 §9.3.1: it retries on a new connection).
//  4. Done when the last connection is closed; at Server.ShutdownTimeout,
//     whatever is left is closed (requests in flight are cut).
const (
	drainIdleGrace = time.Second
	drainNewGrace  = 5 * time.Second
)

// drainWorker applies the rule above to srv, which serves ln, and returns
// the exit code: 0, since the drain was asked for.
func drainWorker(srv *http.Server, ln net.Listener, served <-chan error, conns *connTracker, timeout time.Duration, why string, log *slog.Logger) int {
	log.Info("worker draining", "reason", why, "timeout", timeout)
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	conns.draining.Store(true) // rule 2, for every request that starts now
	ln.Close()                 // rule 1
	// Once Serve has returned, every connection it accepted is tracked.
	select {
	case <-served:
	case <-ctx.Done():
	}
	conns.drain(ctx, drainIdleGrace, drainNewGrace) // rule 3
	// Nothing is left (or the time is up): Shutdown returns at once, or
	// Close cuts the rest (rule 4).
	if err := srv.Shutdown(ctx); err != nil {
		log.Warn("worker drain timed out: closing the remaining connections", "err", err)
		srv.Close()
	}
	return 0
}

// connTracker follows the worker's connections through http.Server's
// ConnState hook, and closes them as the drain rule says.
type connTracker struct {
	draining atomic.Bool // set once: responses carry Connection: close

	mu      sync.Mutex
	conns   map[net.Conn]connInfo
	changed chan struct{} // closed and replaced at every change while draining
}

type connInfo struct {
	state  http.ConnState
	since  time.Time // when it entered state
	closed bool      // closed by the drain; the hook removes it
}

// track is an http.Server ConnState hook.
func (c *connTracker) track(conn net.Conn, st http.ConnState) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.conns == nil {
		c.conns = make(map[net.Conn]connInfo)
		c.changed = make(chan struct{})
	}
	switch st {
	case http.StateClosed, http.StateHijacked:
		delete(c.conns, conn)
	default:
		c.conns[conn] = connInfo{state: st, since: time.Now(), closed: c.conns[conn].closed}
	}
	if c.draining.Load() {
		close(c.changed)
		c.changed = make(chan struct{})
	}
}

// closeWhenDraining wraps h: once the drain began, every response carries
// Connection: close, which makes net/http close the connection after it.
func (c *connTracker) closeWhenDraining(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if c.draining.Load() {
			w.Header().Set("Connection", "close")
		}
		h.ServeHTTP(w, r)
	})
}

// drain closes every connection that has been idle for idleGrace, or new
// for newGrace, until none is left or ctx is done.
func (c *connTracker) drain(ctx context.Context, idleGrace, newGrace time.Duration) {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		left, next, changed := c.closeIdle(time.Now(), idleGrace, newGrace)
		if left == 0 {
			return
		}
		var wake <-chan time.Time
		if !next.IsZero() {
			timer.Reset(time.Until(next))
			wake = timer.C
		}
		select {
		case <-ctx.Done():
			return
		case <-changed:
		case <-wake:
		}
	}
}

// closeIdle closes the connections that are past their grace at now. It
// returns how many connections are left, when the next one will be past
// its grace (zero if none is idle), and a channel closed at the next
// change of state.
func (c *connTracker) closeIdle(now time.Time, idleGrace, newGrace time.Duration) (left int, next time.Time, changed <-chan struct{}) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.changed == nil {
		c.changed = make(chan struct{})
	}
	for conn, ci := range c.conns {
		var grace time.Duration
		switch ci.state {
		case http.StateIdle:
			grace = idleGrace
		case http.StateNew:
			grace = newGrace
		default:
			continue // a request in progress: its response says Connection: close
		}
		if ci.closed {
			continue
		}
		due := ci.since.Add(grace)
		if !now.Before(due) {
			conn.Close() // the server's goroutine sees it and reports StateClosed
			ci.closed = true
			c.conns[conn] = ci
			continue
		}
		if next.IsZero() || due.Before(next) {
			next = due
		}
	}
	return len(c.conns), next, c.changed
}
