package engine

import (
	"fmt"
	"time"
)

// Limits bound what a client may hold of a worker: the [server] keys
// read_header_timeout, idle_timeout, client_body_timeout, send_timeout,
// max_header_bytes and max_connections. Zero values are the defaults,
// which are nginx's where nginx has the same setting.
type Limits struct {
	// ReadHeaderTimeout bounds the reading of a request's header section,
	// from its first byte (from the accept, on a new connection): the
	// slowloris bound. 0 means 10s.
	ReadHeaderTimeout time.Duration
	// IdleTimeout is how long a keep-alive connection may wait for its
	// next request. 0 means 75s.
	IdleTimeout time.Duration
	// ClientBodyTimeout bounds the wait between two reads of a request
	// body (nginx's client_body_timeout); a client that stalls longer gets
	// 408 from an engine that forwards, while an application's handler
	// gets a timeout error from the body's Read and answers as it
	// decides. 0 means 60s.
	ClientBodyTimeout time.Duration
	// SendTimeout bounds the wait between two writes to a client (nginx's
	// send_timeout); a client that reads nothing for longer is
	// disconnected. 0 means 60s.
	SendTimeout time.Duration
	// MaxHeaderBytes bounds the request line and header section together;
	// a larger one gets 431. 0 means 64 KiB; 4 KiB..1 MiB.
	MaxHeaderBytes int
	// MaxConnections bounds the client connections a worker has open at
	// once on a listener (the daemon's workers serve one); at the bound it
	// stops accepting until one closes (the other workers on the shared
	// listener accept meanwhile). 0 means no bound.
	MaxConnections int
}

// Defaults of Limits.
const (
	DefaultReadHeaderTimeout = 10 * time.Second
	DefaultIdleTimeout       = 75 * time.Second
	DefaultClientBodyTimeout = 60 * time.Second
	DefaultSendTimeout       = 60 * time.Second
	DefaultMaxHeaderBytes    = 64 << 10

	// MinMaxHeaderBytes is the smallest MaxHeaderBytes: a request line and
	// the usual headers must fit.
	MinMaxHeaderBytes = 4 << 10
	// MaxMaxHeaderBytes is the largest MaxHeaderBytes (net/http's default
	// bound): the fasthttp engine gives each connection a read buffer of
	// MaxHeaderBytes, so a larger bound is memory a worker takes per
	// client, up to more than it can have.
	MaxMaxHeaderBytes = 1 << 20
)

// FieldError is a setting an engine refuses: Field names it as the field
// of its struct ("IdleTimeout"), Key as the configuration file's key
// ("idle_timeout"), so that a caller can point at either.
type FieldError struct {
	Field, Key, Msg string
}

func (e *FieldError) Error() string { return "engine: " + e.Field + " (" + e.Key + "): " + e.Msg }

// duration is one duration setting with its default.
type duration struct {
	field, key string
	v          *time.Duration
	def        time.Duration
}

// fill replaces each zero setting by its default.
func fill(ds []duration) {
	for _, d := range ds {
		if *d.v == 0 {
			*d.v = d.def
		}
	}
}

// positive checks that each setting is positive.
func positive(ds []duration) error {
	for _, d := range ds {
		if *d.v <= 0 {
			return &FieldError{d.field, d.key, fmt.Sprintf("must be positive, got %v", *d.v)}
		}
	}
	return nil
}

func (l *Limits) durations() []duration {
	return []duration{
		{"ReadHeaderTimeout", "read_header_timeout", &l.ReadHeaderTimeout, DefaultReadHeaderTimeout},
		{"IdleTimeout", "idle_timeout", &l.IdleTimeout, DefaultIdleTimeout},
		{"ClientBodyTimeout", "client_body_timeout", &l.ClientBodyTimeout, DefaultClientBodyTimeout},
		{"SendTimeout", "send_timeout", &l.SendTimeout, DefaultSendTimeout},
	}
}

// WithDefaults returns l with its zero values replaced by the defaults,
// checked (Check).
func (l Limits) WithDefaults() (Limits, error) {
	fill(l.durations())
	if l.MaxHeaderBytes == 0 {
		l.MaxHeaderBytes = DefaultMaxHeaderBytes
	}
	return l, l.Check()
}

// Check reports what is wrong with l taken as it is (a zero timeout is
// a zero timeout here: WithDefaults fills the defaults first); every
// error is a *FieldError.
func (l Limits) Check() error {
	if err := positive(l.durations()); err != nil {
		return err
	}
	if l.MaxHeaderBytes < MinMaxHeaderBytes {
		return &FieldError{"MaxHeaderBytes", "max_header_bytes", fmt.Sprintf("must be at least 4KiB, got %d bytes", l.MaxHeaderBytes)}
	}
	if l.MaxHeaderBytes > MaxMaxHeaderBytes {
		return &FieldError{"MaxHeaderBytes", "max_header_bytes", fmt.Sprintf("must be at most 1MiB, got %d bytes", l.MaxHeaderBytes)}
	}
	if l.MaxConnections < 0 {
		return &FieldError{"MaxConnections", "max_connections", fmt.Sprintf("must not be negative (0 means no bound), got %d", l.MaxConnections)}
	}
	return nil
}

// Upstream is how an engine's client talks to the application: the
// [server] keys upstream_connect_timeout, upstream_timeout,
// upstream_max_idle and upstream_idle_timeout. Zero values are the
// defaults.
type Upstream struct {
	// ConnectTimeout bounds a connection attempt to the upstream; a
	// failure is 502. 0 means 5s.
	ConnectTimeout time.Duration
	// Timeout bounds the wait for the upstream's response header (504
	// when it passes) and then between two reads of its body, like nginx's
	// proxy_read_timeout; also between two writes of the request. While a
	// request body streams from the client, the waits for its next bytes
	// are not the upstream's (client_body_timeout bounds them): the wait
	// for the header runs from the last byte sent. 0 means 60s.
	Timeout time.Duration
	// MaxIdle is how many idle keep-alive connections to the upstream
	// each worker keeps for reuse. 0 means 256; negative keeps none.
	MaxIdle int
	// IdleTimeout is how long an idle connection to the upstream is kept
	// for reuse, like nginx's keepalive_timeout in an upstream block; less
	// when the upstream's Keep-Alive gives a shorter timeout
	// (ResponseHead.IdleFor). Set it below an upstream's own idle timeout
	// when the upstream does not say it (a request sent just as the
	// upstream closes the connection, if it is not retried, is a 502).
	// 0 means 60s.
	IdleTimeout time.Duration
}

// Defaults of Upstream.
const (
	DefaultUpstreamConnectTimeout = 5 * time.Second
	DefaultUpstreamTimeout        = 60 * time.Second
	DefaultUpstreamMaxIdle        = 256
	DefaultUpstreamIdleTimeout    = 60 * time.Second
)

func (u *Upstream) durations() []duration {
	return []duration{
		{"ConnectTimeout", "upstream_connect_timeout", &u.ConnectTimeout, DefaultUpstreamConnectTimeout},
		{"Timeout", "upstream_timeout", &u.Timeout, DefaultUpstreamTimeout},
		{"IdleTimeout", "upstream_idle_timeout", &u.IdleTimeout, DefaultUpstreamIdleTimeout},
	}
}

// WithDefaults returns u with its zero values replaced by the defaults
// (a negative MaxIdle by 0: keep none), checked (Check).
func (u Upstream) WithDefaults() (Upstream, error) {
	fill(u.durations())
	switch {
	case u.MaxIdle == 0:
		u.MaxIdle = DefaultUpstreamMaxIdle
	case u.MaxIdle < 0:
		u.MaxIdle = 0
	}
	return u, u.Check()
}

// Check reports what is wrong with u taken as it is; every error is a
// *FieldError.
func (u Upstream) Check() error {
	if err := positive(u.durations()); err != nil {
		return err
	}
	if u.MaxIdle < 0 {
		return &FieldError{"MaxIdle", "upstream_max_idle", fmt.Sprintf("must not be negative, got %d", u.MaxIdle)}
	}
	return nil
}

// The drain rule, for every engine a worker runs (a reload, or TERM):
//
//  1. Stop accepting: close this worker's copy of the shared listener. The
//     socket stays open in the other workers, which accept what is queued
//     on it; nothing is refused.
//  2. Tell before leaving: every response that starts from now on carries
//     "Connection: close", and the connection is closed once it is sent.
//     A keep-alive client learns from that response not to send another
//     request on this connection, and opens a new one (served by a worker
//     that stays).
//  3. Never close a connection the client may be writing a request on: a
//     connection with no request in progress is closed only once it has
//     been idle for DrainIdleGrace (after a response; the idle time counts
//     from the end of the response, also when that was before the drain)
//     or DrainNewGrace (accepted, no request yet: it may be on its way).
//     Closing an idle connection at once, as http.Server.Shutdown does,
//     races with a client that sends its next request at that instant: the
//     request is lost (wrk -c50 counted about one read error per
//     connection and reload). A client that kept a connection idle for the
//     grace is in the position every server's idle timeout puts it in (RFC
//     9112 §9.3.1: it retries on a new connection).
//  4. Done when the last connection is closed; when the drain's time is up,
//     whatever is left is closed (requests in flight are cut).
const (
	DrainIdleGrace = time.Second
	DrainNewGrace  = 5 * time.Second
)

// CloseWait bounds how long an engine's Close, and its Shutdown after the
// drain, waits for its serving goroutines to let go of the connections it
// closed (each counts its connection out of the worker's row as it goes).
// After it, nothing of the engine touches the core or its region.
const CloseWait = 2 * time.Second
