package proxy

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/preforkd/preforkd/core"
	"github.com/preforkd/preforkd/engine"
)

// Options configures a [Server]. Zero values are the documented defaults,
// which are nginx's where nginx has the same setting.
type Options struct {
	// Upstream is the application requests are forwarded to:
	// "http://host[:port]" or "https://host[:port]" (its certificate
	// verified for host), with an optional path that is prepended to every
	// request's ("http://app/base": "/x" is forwarded as "/base/x").
	// Exactly one of Upstream and App is set.
	Upstream string
	// App serves the requests itself instead of forwarding them (the
	// demo application, a fasthttp application embedded in a worker). It
	// runs after the Core let the request through, with the path the
	// Core forwards, X-Forwarded-Proto and -Host as a forward writes them
	// (never the client's), and an absolute-form target's authority as
	// its Host; what it writes to ctx.Response is sent with the Core's
	// fields added.
	App fasthttp.RequestHandler

	// OnResponse, if set, is called once for every request the server
	// answers, with the response's status (101 for a tunnel), when its
	// handler ends and before the response is written to the client (a
	// streamed body follows). With a Core, the Core's own OnResponse
	// (core.Options) is told the same, which is how a prefork worker
	// watches its recycling limits.
	OnResponse func(status int)

	// Core runs each request (required): rate limits, idempotent replay,
	// the cache, the path the application gets, the statistics. A core
	// without rules lets every request through.
	Core *core.Core

	// Limits bound what clients may hold of the server: the [server]
	// timeouts and limits every engine honours (package engine), zero
	// values being the defaults. MaxConnections bounds the connections of
	// each listener the Server serves.
	engine.Limits
	// Client is how the upstream is spoken to (package engine): connect
	// timeout (502 past it), response timeout (504 past it, and between
	// two reads of its body and two writes of the request), idle
	// keep-alive connections kept; zero values are the defaults.
	Client engine.Upstream

	// DrainIdleGrace is how long Shutdown lets a keep-alive connection
	// stay open once idle (counted from the end of its last response), so
	// that a request already on its way is served (with Connection:
	// close) rather than met by a closed socket. 0 means 1s.
	DrainIdleGrace time.Duration
	// DrainNewGrace is the same for a connection that has not sent a
	// request yet, counted from its accept. 0 means 5s.
	DrainNewGrace time.Duration

	// Logger receives the warnings (rate-limited: at most one line a
	// second per kind, with a count of those suppressed). nil means
	// slog.Default().
	Logger *slog.Logger
}

// MinMaxHeaderBytes is the smallest MaxHeaderBytes (engine's).
const MinMaxHeaderBytes = engine.MinMaxHeaderBytes

// withDefaults validates o and fills in its defaults; up is the parsed
// Upstream (zero with App).
func (o Options) withDefaults() (_ Options, up engine.Target, err error) {
	if o.Core == nil {
		return o, up, errors.New("proxy: Options: Core is nil")
	}
	switch {
	case o.Upstream == "" && o.App == nil:
		return o, up, errors.New("proxy: Options: neither Upstream nor App is set")
	case o.Upstream != "" && o.App != nil:
		return o, up, errors.New("proxy: Options: both Upstream and App are set")
	case o.Upstream != "":
		if up, err = engine.ParseTarget(o.Upstream); err != nil {
			return o, up, fmt.Errorf("proxy: %w", err)
		}
	}
	// The limits are every engine's (package engine): their defaults and
	// checks are written there, once.
	if o.Limits, err = o.Limits.WithDefaults(); err != nil {
		return o, up, fmt.Errorf("proxy: Options: %w", err)
	}
	if o.Client, err = o.Client.WithDefaults(); err != nil {
		return o, up, fmt.Errorf("proxy: Options: %w", err)
	}
	switch {
	case o.DrainIdleGrace < 0, o.DrainNewGrace < 0:
		return o, up, errors.New("proxy: Options: a drain grace is negative")
	case o.DrainIdleGrace == 0:
		o.DrainIdleGrace = engine.DrainIdleGrace
	}
	if o.DrainNewGrace == 0 {
		o.DrainNewGrace = engine.DrainNewGrace
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o, up, nil
}

// CheckUpstream reports whether s is an upstream New accepts
// (Options.Upstream): every engine's rules (engine.ParseTarget).
func CheckUpstream(s string) error {
	_, err := engine.ParseTarget(s)
	return err
}
