//go:build linux

package loop

import (
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"sync"
	"time"

	"github.com/preforkd/preforkd/core"
	"github.com/preforkd/preforkd/engine"
)

// Options configures a [Server]. Zero values are the documented defaults.
type Options struct {
	// Core runs each request (required): rate limits, idempotent replay,
	// the cache, the path the application gets, the statistics.
	Core *core.Core

	// Upstream is the application requests are forwarded to:
	// "http://host[:port]", with an optional path prepended to every
	// request's ("http://app/base": "/x" is forwarded as "/base/x"). The
	// host is resolved when New is called and every 30 seconds after.
	// Exactly one of Upstream and App is set. An https:// upstream is
	// refused: the loop speaks cleartext to the application
	// (package proxy speaks TLS).
	Upstream string
	// App serves the requests itself instead of forwarding them, on the
	// event loop (see [App]).
	App App

	// Limits are the [server] timeouts and limits of the clients
	// (engine.Limits); zero values are the defaults.
	Limits engine.Limits
	// Client is how the application is spoken to (engine.Upstream: the
	// connect and response timeouts, the idle connections kept).
	Client engine.Upstream

	// Loops is how many event loops serve, each on a goroutine of its
	// own with its connections and its upstream pool. 0 means the
	// process's GOMAXPROCS as the first New found it: one for a worker of
	// one CPU. A loop waits for events in epoll_wait holding its P (the
	// Go scheduler's processor), so the process's other goroutines run
	// only once the scheduler's monitor takes that P back, 20 µs to 10 ms
	// later. That is nothing to the waits the core bounds in seconds, but
	// a Redis round trip is bounded by its timeout of tens of
	// milliseconds: with a core that has Redis rules (core.Core.Redis),
	// New raises GOMAXPROCS to Loops+1, and the one more P runs the
	// waiters and their network calls at once. (Without Redis the extra P
	// costs more than it brings: the poller yields the loop's goroutine
	// before each wait, which with an idle P wakes another
	// thread for nothing.)
	Loops int
	// Waiters is how many goroutines finish the decisions that must
	// wait (core.Exchange.NoWait), for every loop together: as many for
	// Redis rules' round trips, the rest of which wait their turn, and as
	// many again for waits on other requests (core.Exchange.LongWait: a
	// duplicate of a request in flight, a cache miss another request
	// fetches), which never wait their turn: with all of those busy, the
	// wait is given up (core.Exchange.GiveUpWait). 0 means 64.
	Waiters int

	// OnResponse, if set, is called once for every response the server
	// sends, with its status (101 for a tunnel), as it begins to send it.
	// It runs on the loop: it must return at once. The Core's own
	// OnResponse (core.Options) is told the responses it counts, which is
	// how a prefork worker watches its recycling limits.
	OnResponse func(status int)

	// Logger receives the server's warnings (rate-limited: at most one a
	// second per kind). They are written by a goroutine of the server's,
	// never from a loop. nil means slog.Default().
	Logger *slog.Logger
}

// DefaultWaiters is Options.Waiters' default.
const DefaultWaiters = 64

// settings are Options checked and with their defaults.
type settings struct {
	Options
	limits engine.Limits
	client engine.Upstream
	target engine.Target // zero with App
}

func (o Options) withDefaults() (settings, error) {
	s := settings{Options: o}
	switch {
	case o.Core == nil:
		return s, errors.New("loop: Options: Core is nil")
	case o.Upstream == "" && o.App == nil:
		return s, errors.New("loop: Options: neither Upstream nor App is set")
	case o.Upstream != "" && o.App != nil:
		return s, errors.New("loop: Options: both Upstream and App are set")
	case o.Upstream != "":
		t, err := parseUpstream(o.Upstream)
		if err != nil {
			return s, err
		}
		s.target = t
	}
	var err error
	if s.limits, err = o.Limits.WithDefaults(); err != nil {
		return s, err
	}
	if s.client, err = o.Client.WithDefaults(); err != nil {
		return s, err
	}
	switch {
	case o.Loops < 0:
		return s, fmt.Errorf("loop: Options.Loops %d is negative", o.Loops)
	case o.Loops == 0:
		s.Loops = cpuShare()
	}
	switch {
	case o.Waiters < 0:
		return s, fmt.Errorf("loop: Options.Waiters %d is negative", o.Waiters)
	case o.Waiters == 0:
		s.Waiters = DefaultWaiters
	}
	if s.Logger == nil {
		s.Logger = slog.Default()
	}
	return s, nil
}

// cpuShare is GOMAXPROCS as the first call found it, before New raised
// it.
var cpuShare = sync.OnceValue(func() int { return runtime.GOMAXPROCS(0) })

// reserveP raises GOMAXPROCS to loops+1, if it is lower.
func reserveP(loops int) {
	cpuShare()
	if runtime.GOMAXPROCS(0) < loops+1 {
		runtime.GOMAXPROCS(loops + 1)
	}
}

// CheckUpstream reports whether s is an upstream New accepts
// (Options.Upstream).
func CheckUpstream(s string) error {
	_, err := parseUpstream(s)
	return err
}

// ErrTLSUpstream is New's error for an https:// upstream.
var ErrTLSUpstream = errors.New("loop: an https:// upstream needs TLS, which the event loop does not speak")

// parseUpstream checks an upstream URL ("http://app:3000/base"): every
// engine's rules (engine.ParseTarget), and http only.
func parseUpstream(s string) (engine.Target, error) {
	t, err := engine.ParseTarget(s)
	switch {
	case err != nil:
		return t, fmt.Errorf("loop: %w", err)
	case t.TLS:
		return engine.Target{}, fmt.Errorf("%w: %q", ErrTLSUpstream, s)
	}
	return t, nil
}

// Timer resolution: every timeout fires within one tick after it is due.
const tick = 25 * time.Millisecond
