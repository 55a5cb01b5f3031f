package core

import (
	"net/http"
	"net/netip"
	"time"
)

// The access log: the core knows everything a line says about a request
// (who asked what, the answer, which rule refused it, what the cache did,
// how long it took and how much of it the application's wait was), so it
// writes the entry itself when the exchange ends, whatever the engine.
// Writing it out is the AccessLog's business, which must never make the
// request wait on a file (package accesslog buffers it).

// AccessLog takes one entry per request (Options.AccessLog).
type AccessLog interface {
	// Log takes the entry of a request that ended. It runs on the
	// request's path: it must not block on I/O. e and the memory its
	// fields alias are valid during the call only.
	Log(e *AccessEntry)
}

// AccessEntry is one request, as an access log line says it.
type AccessEntry struct {
	// Time is when the request's head was read (Begin), wall clock.
	Time time.Time
	// Client is the resolved client address (the peer, or the client a
	// trusted proxy names); the zero Addr for none (a Unix socket).
	Client netip.Addr
	// Method, Path and Query are the request's as sent (Query without
	// its '?', "" when none).
	Method, Path, Query string
	// Target is the request target as the client sent it (the request
	// line's, an absolute-form "http://host/p?q" whole), when the
	// engine's request view says it (RequestTarget); else "", and Path
	// and Query stand for it. The log writes it, as nginx's $request
	// has the request line as received.
	Target string
	// Proto is the protocol as the engine reports it ("HTTP/1.1",
	// "HTTP/2.0"; the engine's request view may say it, see Protocol),
	// else "HTTP/1.1".
	Proto string
	// Scheme is the scheme of the listener the request came on, "http"
	// or "https" (the engine's request view may say it, see Scheme):
	// with a cleartext port beside a TLS one, which of the two it was.
	Scheme string
	// Status is the status sent.
	Status int
	// Bytes counts the body bytes sent (nginx's $body_bytes_sent): the
	// application's as the engine told them (Exchange.Body), or the
	// core's own answer's.
	Bytes int64
	// Duration runs from Begin to Finish: until the response was sent
	// whole (or the exchange gave up on it).
	Duration time.Duration
	// Upstream is how long the application took to answer with a head,
	// from Sending to Head (or to Failed, or to Finish for a client gone
	// first); negative when the request never went to the application
	// (the core answered it, or the engine refused it before it went).
	Upstream time.Duration
	// Rule names the rule that refused the request; "" when none did.
	Rule string
	// Cache is what X-Cache said (HIT, STALE, MISS, BYPASS); "" when no
	// cache block applied.
	Cache string
	// RequestID is the request id (Options.RequestID); nil when off.
	RequestID []byte
	// Referer and UserAgent are the request's fields, "" when absent.
	Referer, UserAgent string
	// Worker is the region worker index of the process that served it.
	Worker int
}

// Protocol is what a request view may implement to give the access log
// its protocol ("HTTP/1.0", "HTTP/2.0"); one that does not is logged as
// HTTP/1.1.
type Protocol interface {
	Proto() string
}

// Scheme is what a request view may implement to give the access log
// its listener's scheme ("https"); one that does not is logged as http.
type Scheme interface {
	Scheme() string
}

// RequestTarget is what a request view may implement to give the access
// log the request target as sent (an absolute-form one whole), which
// Path, without the authority, does not say.
type RequestTarget interface {
	Target() string
}

// ownBodySent is how much of a response of the core's own (a refusal, a
// stored answer) went out as body: none to HEAD, whose answer the engines
// send without it, nor to a client that went away before it (499).
func (ex *Exchange) ownBodySent() int64 {
	if ex.req.Method() == http.MethodHead || ex.status == StatusClientClosed {
		return 0
	}
	if st := ex.resp.Stream; st != nil {
		return int64(st.Sent()) // what went of it: it may have been cut
	}
	return int64(len(ex.resp.Body))
}

// logAccess gives the access log the entry of the request, at its first
// Finish, while the request view can still be read.
func (ex *Exchange) logAccess(elapsed time.Duration) {
	e := &ex.acc
	*e = AccessEntry{
		Time:      ex.began,
		Client:    ex.Client(),
		Method:    ex.req.Method(),
		Path:      ex.req.Path(),
		Query:     ex.req.Query(),
		Proto:     "HTTP/1.1",
		Scheme:    "http",
		Status:    ex.status,
		Bytes:     ex.sent + ex.ownBodySent(),
		Duration:  elapsed,
		Upstream:  -1,
		RequestID: ex.rid,
		Worker:    ex.c.region.Worker(),
	}
	if p, ok := ex.req.(Protocol); ok {
		e.Proto = p.Proto()
	}
	if s, ok := ex.req.(Scheme); ok {
		e.Scheme = s.Scheme()
	}
	if t, ok := ex.req.(RequestTarget); ok {
		e.Target = t.Target()
	}
	if ex.fwdAt != 0 {
		e.Upstream = ex.upDur // Finish made it final
	}
	if ex.rl.refusal.Status != 0 {
		e.Rule = ex.rl.refusal.Rule
	}
	if ex.cache.xc != xNone {
		e.Cache = xcacheNames[ex.cache.xc]
	}
	e.Referer, _ = ex.req.Header("Referer")
	e.UserAgent, _ = ex.req.Header("User-Agent")
	ex.c.access.Log(e)
	*e = AccessEntry{}
}

// forwarded is Forward's part in the upstream time: a background
// refresh's request has no body and goes to the application at once, so
// its clock starts here; any other starts at Sending, which the engine
// calls when the request really goes, so that one refused before then (a
// body that never arrived: 408, a client gone) has no upstream time.
func (ex *Exchange) forwarded() {
	if ex.refreshing {
		ex.Sending()
	}
}

// Sending tells the core that the request goes to the application now
// (upstream, or to an application served in process), its body read
// ahead: the upstream time (the access log's, and UpstreamDuration) runs
// from the first Sending, not from Forward, so that a client's slow
// upload of a body the engine reads whole first is not counted as the
// application's time, and a request that never went has none.
func (ex *Exchange) Sending() {
	if ex.fwdAt == 0 {
		ex.fwdAt = max(ex.c.now(), 1)
		ex.upDur = -1
	}
}

// answered notes when the application's head (or its failure) came, and
// counts the upstream time, once per forwarded request. Finish calls it
// for a request whose application gave neither (the client went away):
// its upstream time runs until then.
func (ex *Exchange) answered() {
	if ex.fwdAt != 0 && ex.upDur < 0 {
		ex.upDur = ex.c.now() - ex.fwdAt
		ex.c.row.Upstream(ex.upDur)
	}
}
