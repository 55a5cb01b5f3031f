// Package nethttp runs the decision core (package core) in front of a
// net/http handler: the adapter preforkd's embedding API serves with.
//
//	h := nethttp.New(c, app, nethttp.Options{}) // c from core.New, once per worker
//	srv := &http.Server{Handler: h}
//
// It only translates: the rules, the answers and the headers are the
// core's, the same for every engine.
//
// [Server] is the net/http engine built on it, the one to give a prefork
// worker (a bare *http.Server is refused there): the [server] limits and
// the drain rule of package engine, an application handler or its own
// forwarding to an upstream ([NewUpstream], forward.go: the fast engine's
// rules), and with an [Edge] (package tlsedge), TLS and HTTP/2. The
// daemon serves its TLS listeners with it. What a program does not ask
// for, it does not link: forwarding, TLS serving and HTTP/2 are each
// reached only through the value that asks for them.
package nethttp

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/netip"
	"net/textproto"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/preforkd/preforkd/core"
	"github.com/preforkd/preforkd/engine"
)

// Handler applies a Core to the requests it passes to the next handler.
type Handler struct {
	c    *core.Core
	next http.Handler
	fwd  Upstream // in place of next: the Server's own forwarding
	opts Options

	background sync.WaitGroup // background refreshes
}

// Options tunes a Handler. The zero value is what most want.
type Options struct {
	// Refuse, if set, writes the answer to a request the rate limits
	// refused, instead of the core's problem+json: the status
	// (ref.Status) and a body. The rate-limit header fields and
	// Retry-After (ref.Fields) are set on w already; the status is not:
	// Refuse calls w.WriteHeader(ref.Status) itself, after its own header
	// fields and before its body, or net/http answers the refused
	// request with 200.
	Refuse func(w http.ResponseWriter, r *http.Request, ref *core.Refusal)
}

// New returns the handler that decides about each request with c and
// passes those it lets through to next. It panics if either is nil, as
// http.Handle does for a nil handler: the first request would.
func New(c *core.Core, next http.Handler, opts Options) *Handler {
	if c == nil || next == nil {
		panic("nethttp: New with a nil core or handler")
	}
	return newHandler(c, next, opts)
}

// newHandler is New for a Server, whose forwarder may stand in for next.
func newHandler(c *core.Core, next http.Handler, opts Options) *Handler {
	return &Handler{c: c, next: next, opts: opts}
}

// Core is the decision core the handler applies.
func (h *Handler) Core() *core.Core { return h.c }

// KeyOf returns the key bytes rule name counts r under, as the package's
// KeyOf does: nil for no such rule, or a request the core would refuse
// as malformed (a bad path, a key header sent twice).
func (h *Handler) KeyOf(name string, r *http.Request) []byte { return KeyOf(h.c, name, r) }

// KeyOf returns the key bytes the rule called name of c counts r under,
// exactly as a decision would make them ("ip:192.0.2.1",
// "h:X-Api-Key:…"): the id to give its Limiter, as in
//
//	c.Limiter("login").Peek(string(nethttp.KeyOf(c, "login", r)), c.Now())
//
// It is nil for no such rule, or a request the core would refuse as
// malformed (a bad path, a key header sent twice). To forgive a client
// (after a successful login), use Reset: an override's clients are
// counted apart from the rule's Limiter.
func KeyOf(c *core.Core, name string, r *http.Request) []byte {
	k, err := c.KeyOf(name, &request{r: withoutConnectionNamed(r)})
	if err != nil {
		return nil
	}
	return k
}

// Reset forgets r's count under the rule called name of c, in every
// worker, under the limit that applies to r (see core.Core.Reset):
//
//	nethttp.Reset(c, "login", r) // after a successful login
func Reset(c *core.Core, name string, r *http.Request) error {
	// The request as the handler decided it: without the fields its
	// Connection field names, which a key must not be read from.
	return c.Reset(name, &request{r: withoutConnectionNamed(r)})
}

// HTTPRequest is the net/http request behind the core's view of it, for
// a rule's key function (core.RateLimit.KeyFunc) that keys by what only
// the application can read (a session, a verified token); nil for a
// request of another engine. In a decision it is the request as the
// client sent it, before the handler runs: what a middleware inside the
// handler puts in its context is not there yet (see the example).
func HTTPRequest(r core.Request) *http.Request {
	if q, ok := r.(*request); ok {
		return q.r
	}
	return nil
}

var requests = sync.Pool{New: func() any { return new(request) }}

// ServeHTTP decides about r and either answers it or passes it on, with
// the core's header fields set.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	r = withoutConnectionNamed(r)
	req := requests.Get().(*request)
	req.r, req.forwarding = r, h.fwd != nil
	ex := h.c.Begin(req)
	finished := false
	defer func() {
		if finished {
			return
		}
		// The handler panicked (http.ErrAbortHandler from a proxy whose
		// upstream broke off, say): the exchange ends with what was sent,
		// and the panic goes on.
		p := recover()
		h.finish(ex, req, errPanicked)
		panic(p)
	}()
	var err error
	if v := ex.Decide(); v == core.Respond && ex.Gone() {
		// The client went away as the core read its body (request.Body)
		// or while its request waited: an answer nobody reads.
		err = core.ErrClientGone
	} else if v == core.Respond {
		if r.ProtoMajor == 1 && r.Body != nil && r.Body != http.NoBody && !req.bodyRead {
			// net/http reads what is left of a body before it sends the
			// answer, to keep the connection: a client that sent part of
			// one and waits would not get it. It goes at once, and the
			// connection closes after it. Once the handler returns,
			// net/http still drains up to 256 KiB of the body, with no
			// deadline: a read deadline already past ends that at once,
			// or a client that never sends it would hold the connection.
			w.Header().Set("Connection", "close")
			http.NewResponseController(w).SetReadDeadline(time.Unix(1, 0))
			if cc, ok := r.Context().Value(connKey{}).(*clientConn); ok {
				cc.lingerAtClose() // closed at once, with the body unread, it would be reset
			}
		}
		if ref := ex.Refusal(); ref != nil && h.opts.Refuse != nil {
			setFields(w.Header(), ref.Fields)
			h.opts.Refuse(w, r, ref)
		} else {
			err = writeResponse(w, ex.Response(), r.ProtoMajor == 1)
		}
	} else if req.Gone() {
		// The client went away while its request waited (for another's
		// fetch of the same response): nobody to forward it for, as on
		// the event loop.
		err = core.ErrClientGone
	} else {
		err = h.pass(w, r, req, ex)
	}
	finished = true
	tunnel := req.rw.tunnel
	h.finish(ex, req, err)
	if errors.Is(err, core.ErrClientGone) {
		// Returning would have net/http send 200 with an empty body, which
		// a client that only shut down its side (or the next request on
		// the connection) would read as the answer: the connection is
		// closed (the HTTP/2 stream reset) with nothing sent.
		panic(http.ErrAbortHandler)
	}
	if errors.Is(err, core.ErrBodyCut) {
		// A cached body cut off: the connection is closed (the HTTP/2
		// stream reset), so that the client sees it short.
		panic(http.ErrAbortHandler)
	}
	if tunnel != nil {
		// An upgrade: its exchange ended with the 101 handed over, as on
		// the other engines; the tunnel runs on in the handler, which a
		// drain waits for.
		tunnel()
	}
}

// errPanicked ends the exchange of a handler that panicked.
var errPanicked = errors.New("nethttp: the handler panicked")

// pass serves a request the core let through with the next handler.
func (h *Handler) pass(w http.ResponseWriter, r *http.Request, req *request, ex *core.Exchange) error {
	if h.fwd != nil {
		// The Server forwards to its upstream itself: the core's fields
		// go on the upstream's response head once it is read.
		fwd := ex.Forward()
		rw := &req.rw
		*rw = writer{w: w, ex: ex, keep: ex.Keep(), hide: fwd.Hide, h1: r.ProtoMajor == 1}
		err := h.fwd.serve(rw, r, req, ex, fwd)
		if !errors.Is(err, core.ErrClientGone) {
			rw.finish() // a client gone gets no head (and the core counts 499)
		}
		return err
	}
	setFields(w.Header(), ex.Fields())
	fwd := ex.Forward()
	if fwd.Path != req.Path() {
		forwardPath(r, fwd.Path)
	}
	if req.body != nil {
		r.Body = io.NopCloser(bytes.NewReader(req.body))
	} else if req.bodyRead {
		r.Body = http.NoBody
	}
	r = forwardFields(r, fwd.Drop, fwd.Add)
	rw := &req.rw
	*rw = writer{w: w, ex: ex, keep: ex.Keep(), hide: fwd.Hide, h1: r.ProtoMajor == 1}
	rw.body, _ = r.Body.(*bodyReader)
	if rw.keep {
		// A request whose response is kept runs without the client's
		// cancellation: a client that disconnects does not stop the
		// response from being stored for its retry (or for the cache).
		r = r.WithContext(context.WithoutCancel(r.Context()))
	}
	ex.Sending()
	h.next.ServeHTTP(rw, r)
	rw.finish()
	if rw.gone {
		return core.ErrClientGone
	}
	return nil
}

// finish ends the exchange and, when the core asks for one, starts the
// background refresh of the stale response it served.
func (h *Handler) finish(ex *core.Exchange, req *request, err error) {
	r := req.r
	refresh := ex.Finish(err)
	*req = request{}
	requests.Put(req)
	if refresh && !ex.RefreshBy(refresher{h, r}) {
		ex.Finish(core.ErrNoRefresh)
	}
}

// refresher is h's background refresh of r, started by the core's
// response cache (core.Exchange.RefreshBy): a program without one does
// not link it.
type refresher struct {
	h *Handler
	r *http.Request
}

// Refresh is the refresh's start.
func (f refresher) Refresh(ex *core.Exchange) { f.h.refresh(ex, f.r) }

// withoutConnectionNamed is r without the fields its Connection field
// names (RFC 9110 §7.6.1: they are for this hop only), so that the core
// and the handler see one request: a field that keys a rule, or that a
// response varies on, cannot be hidden from the limiter by naming it in
// Connection and still reach the application. As on every engine
// (engine.ClassifyField), a name whose kind already decides its fate
// stays: Connection itself and Upgrade, which net/http and upgrade
// handlers read, and X-Forwarded-For, Host and the framing fields, which
// the forwarding rules own.
func withoutConnectionNamed(r *http.Request) *http.Request {
	conn := r.Header["Connection"]
	if len(conn) == 0 {
		return r
	}
	var h http.Header
	for _, line := range conn {
		for t := range strings.SplitSeq(line, ",") {
			t = textproto.TrimString(t)
			if t == "" || engine.ClassifyField([]byte(t)) != engine.FieldOther {
				continue // "close", "keep-alive", "upgrade" among them
			}
			name := textproto.CanonicalMIMEHeaderKey(t)
			if _, ok := r.Header[name]; !ok {
				continue
			}
			if h == nil {
				h = cloneHeader(r.Header)
			}
			delete(h, name)
		}
	}
	if h == nil {
		return r
	}
	r2 := *r
	r2.Header = h
	return &r2
}

// forwardFields is r without the fields drop names (a cache fill's
// conditional fields) and with the fields add, each in place of the
// client's of the same name (the request id the core made, the
// validators of a revalidation). Dropping makes a copy of r with a header
// of its own, and so does adding a field drop names (a validator): the
// core reads the client's conditions from r's header after the response,
// and the cache's are not the client's. Adding any other field sets it in
// the header r then has, as a request-id middleware does, so that a
// request without an id costs the id's string and its slice, not a copy
// of the header.
func forwardFields(r *http.Request, drop []string, add []core.Field) *http.Request {
	for _, n := range drop {
		_, ok := r.Header[n]
		for _, f := range add {
			ok = ok || f.Name == n
		}
		if ok {
			r2 := *r
			r2.Header = cloneHeader(r.Header)
			for _, n := range drop {
				delete(r2.Header, n)
			}
			r = &r2
			break
		}
	}
	if len(add) > 0 && r.Header == nil {
		r.Header = make(http.Header, len(add))
	}
	for _, f := range add {
		r.Header[f.Name] = []string{string(f.Value)}
	}
	return r
}

// refresh sends a copy of r to the next handler in the background and
// tells ex its response: the cache's stale-while-revalidate refresh. The
// copy has no body (a refresh is a GET), and the cache's conditional
// fields in place of the client's.
func (h *Handler) refresh(ex *core.Exchange, r *http.Request) {
	fwd := ex.Forward()
	// The refresh runs while the handlers around this one may still read
	// r: it gets a request of its own, with no body (a refresh is a GET),
	// its own header and URL, and the path values of the pattern an outer
	// ServeMux matched (r.Pattern) set in it, so that an application that
	// changes any of them (a router's SetPathValue) changes the refresh's
	// alone. Not a copy of r, whose path values a copy would share, nor
	// r.Clone, which links the multipart form's copying into every
	// program; the forms are its own to parse (the application never ran
	// for r, a hit). Path values set by SetPathValue outside r's pattern
	// are not the refresh's.
	u := *r.URL
	r2 := (&http.Request{
		Method: r.Method, URL: &u, Proto: r.Proto, ProtoMajor: r.ProtoMajor, ProtoMinor: r.ProtoMinor,
		Header: cloneHeader(r.Header), Body: http.NoBody, Host: r.Host,
		RemoteAddr: r.RemoteAddr, RequestURI: r.RequestURI, TLS: r.TLS, Pattern: r.Pattern,
	}).WithContext(context.WithoutCancel(r.Context()))
	for p := r.Pattern; ; {
		i := strings.IndexByte(p, '{')
		j := strings.IndexByte(p[i+1:], '}')
		if i < 0 || j < 0 {
			break
		}
		name := strings.TrimSuffix(p[i+1:i+1+j], "...") // "$" too: it has no value
		setPathValue(r2, name, getPathValue(r, name))
		p = p[i+2+j:]
	}
	for _, n := range fwd.Drop {
		delete(r2.Header, n)
	}
	for _, f := range fwd.Add {
		r2.Header[f.Name] = []string{string(f.Value)}
	}
	if fwd.Path != r2.URL.EscapedPath() {
		forwardPath(r2, fwd.Path)
	}
	h.background.Add(1)
	go func() {
		defer h.background.Done()
		err := errPanicked
		defer func() {
			// A panicking application must not take the worker down from
			// a goroutine no server recovers: the refresh is abandoned,
			// and its fill lock given up.
			_ = recover()
			ex.Finish(err)
		}()
		// No client from the start: what the core keeps no more (a fill
		// that outgrew max_body) is not read on (writer.Write).
		rw := &writer{w: &nowhere{header: http.Header{}}, ex: ex, keep: true, clientGone: errNoClient}
		if h.fwd != nil {
			err = h.fwd.serve(rw, r2, &request{r: r2, bodyRead: true}, ex, fwd)
			rw.finish()
			return
		}
		h.next.ServeHTTP(rw, r2)
		rw.finish()
		err = nil
	}()
}

// getPathValue and setPathValue are called, not inlined: a pattern's
// wildcards are a refresh's rare case.
var getPathValue, setPathValue = (*http.Request).PathValue, (*http.Request).SetPathValue

// cloneHeader is h.Clone, once in the program rather than inlined at
// each copy of a request's header, and never nil.
//
//go:noinline
func cloneHeader(h http.Header) http.Header {
	if h == nil {
		return http.Header{}
	}
	return h.Clone()
}

// Wait waits for the background refreshes in flight to end.
func (h *Handler) Wait() { h.background.Wait() }

// errNoClient is the client of a background refresh: there is none.
var errNoClient = errors.New("nethttp: a background refresh has no client")

// nowhere is the client of a background refresh: it keeps nothing.
type nowhere struct{ header http.Header }

func (n *nowhere) Header() http.Header         { return n.header }
func (n *nowhere) WriteHeader(int)             {}
func (n *nowhere) Write(p []byte) (int, error) { return len(p), nil }

// forwardPath makes fwd (the path as sent, with dot segments removed and
// slashes merged) the request's path for the next handler.
func forwardPath(r *http.Request, fwd string) {
	p, err := url.PathUnescape(fwd)
	if err != nil {
		return // Normalize refuses bad escapes: cannot happen
	}
	u := *r.URL
	u.Path, u.RawPath = p, fwd
	if u.EscapedPath() != fwd {
		u.RawPath = ""
	}
	r.URL = &u
}

// request is the core's view of a net/http request.
type request struct {
	r *http.Request
	// forwarding: the Server forwards the request itself (forward.go),
	// and the view is of what it sends: without the fields it drops, with
	// the X-Forwarded-Proto and -Host it writes.
	forwarding bool
	body       []byte
	bodyRead   bool
	rw         writer // pooled with the request: no allocation per response
}

func (q *request) Method() string { return q.r.Method }

// Proto is the request's protocol, for the access log ("HTTP/2.0").
func (q *request) Proto() string { return q.r.Proto }

// Scheme implements core.Scheme, for the access log: https on TLS.
func (q *request) Scheme() string { return ownScheme(q.r) }

// Path is the path as sent: from the request line where the server kept
// it (after the authority of an absolute-form target), else re-encoded
// from the URL.
func (q *request) Path() string {
	t := q.r.RequestURI
	if _, rest, ok := strings.Cut(t, "://"); ok && t[0] != '/' {
		// Absolute form: the path begins where the authority ends, if
		// it ends with one.
		t = ""
		if j := strings.IndexAny(rest, "/?#"); j >= 0 && rest[j] == '/' {
			t = rest[j:]
		}
	}
	if t != "" && t[0] == '/' {
		if i := strings.IndexByte(t, '?'); i >= 0 {
			return t[:i]
		}
		return t
	}
	if q.r.URL == nil {
		return ""
	}
	if q.r.URL.Opaque != "" {
		return q.r.URL.Opaque
	}
	return q.r.URL.EscapedPath()
}

// Target implements core.RequestTarget, for the access log: the target
// as sent (an HTTP/2 request's :path); "" for a request a server did not
// read, whose Path and Query stand for it.
func (q *request) Target() string { return q.r.RequestURI }

func (q *request) Query() string {
	if q.r.URL == nil {
		return ""
	}
	return q.r.URL.RawQuery
}

func (q *request) Peer() netip.Addr {
	ap, err := netip.ParseAddrPort(q.r.RemoteAddr)
	if err != nil {
		return netip.Addr{}
	}
	return ap.Addr().WithZone("").Unmap()
}

func (q *request) Header(name string) (string, int) {
	if name == "Host" {
		// net/http moves Host out of the header, and takes the authority
		// of an absolute-form target for it, without its userinfo, which
		// the core refuses: it is put back for the core to see.
		if u := q.r.URL; u != nil && u.User != nil && u.Host != "" {
			return u.User.String() + "@" + q.r.Host, 1
		}
		if q.r.Host == "" {
			return "", 0
		}
		return q.r.Host, 1
	}
	if q.forwarding {
		if v, ok := q.forwarded(name); ok {
			return v, 1
		}
		if !q.forwardedAsSent(name) {
			return "", 0
		}
	}
	vs := q.r.Header[name]
	if len(vs) == 0 {
		return "", 0
	}
	return vs[0], len(vs)
}

func (q *request) HeaderLines(name string, dst []string) []string {
	if q.forwarding {
		if v, ok := q.forwarded(name); ok {
			return append(dst, v)
		}
		if !q.forwardedAsSent(name) {
			return dst
		}
	}
	return append(dst, q.r.Header[name]...)
}

// ownScheme is the scheme of the connection r came on.
func ownScheme(r *http.Request) string {
	if r.TLS != nil {
		return "https"
	}
	return "http"
}

// forwarded is the value the forwarder writes itself for the field
// called name, whatever the client sent (appendHead).
func (q *request) forwarded(name string) (string, bool) {
	switch name {
	case "X-Forwarded-Proto":
		return ownScheme(q.r), true
	case "X-Forwarded-Host":
		return q.r.Host, q.r.Host != ""
	}
	return "", false
}

// forwardedAsSent reports whether the forwarder sends the client's field
// called name (appendHead): not a hop-by-hop field (but Upgrade on an
// upgrade), Expect, or a name with '_'.
func (q *request) forwardedAsSent(name string) bool {
	switch {
	case name == "Upgrade":
		return isUpgrade(q.r)
	case hopByHop(name), name == "Expect", strings.IndexByte(name, '_') >= 0:
		return false
	}
	return true
}

// HasBody: net/http says -1 for a length it does not know (chunked, an
// HTTP/2 stream not ended with its headers), 0 for no body.
func (q *request) HasBody() bool { return q.r.ContentLength != 0 }

func (q *request) Gone() bool { return q.r.Context().Err() != nil }

// Body reads the request body, never buffering more than max+1 bytes.
func (q *request) Body(max int64) ([]byte, error) {
	q.bodyRead = true
	b, err := readBody(q.r.Body, q.r.ContentLength, max)
	q.body = b
	if err != nil && err != core.ErrBodyTooLarge && bodyGone(q.r, err) {
		err = errors.Join(core.ErrClientGone, err)
	}
	return b, err
}

// readBody reads a request body of at most max bytes; length is the
// request's ContentLength (-1: unknown).
func readBody(body io.Reader, length, max int64) ([]byte, error) {
	if body == nil || body == http.NoBody {
		return nil, nil
	}
	if length > max {
		return nil, core.ErrBodyTooLarge
	}
	n := 512 // length unknown (-1, or 0 in a request built by a client)
	if length > 0 {
		n = int(length) + 1 // +1: room for the read that sees EOF
	}
	buf := make([]byte, 0, min(int64(n), max+1))
	for {
		if len(buf) == cap(buf) {
			buf = slices.Grow(buf, 1)
		}
		lim := int(min(int64(cap(buf)), max+1))
		got, err := body.Read(buf[len(buf):lim])
		buf = buf[:len(buf)+got]
		if int64(len(buf)) > max {
			return nil, core.ErrBodyTooLarge
		}
		switch {
		case err == io.EOF:
			return buf, nil
		case err != nil:
			if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
				return nil, core.ErrBodyTooLarge
			}
			return nil, err
		}
	}
}

// setFields sets the core's fields on h, with one allocation for every
// value and one for the slices that hold them; each slice is capped, so
// that an Add by the next handler reallocates rather than write into its
// neighbour. A name given more than once (a stored response's Link lines)
// gets all its values, in order.
func setFields(h http.Header, fields []core.Field) {
	if len(fields) == 0 {
		return
	}
	n := 0
	for _, f := range fields {
		n += len(f.Value)
	}
	var sb strings.Builder
	sb.Grow(n)
	for _, f := range fields {
		sb.Write(f.Value)
	}
	all := sb.String()
	vals := make([]string, len(fields))
	at := 0
	for i, f := range fields {
		vals[i] = all[at : at+len(f.Value)]
		at += len(f.Value)
		if repeated(fields[:i], f.Name) {
			h[f.Name] = append(h[f.Name], vals[i])
			continue
		}
		h[f.Name] = vals[i : i+1 : i+1]
	}
}

// repeated reports whether fields has one called name.
func repeated(fields []core.Field, name string) bool {
	for i := range fields {
		if fields[i].Name == name {
			return true
		}
	}
	return false
}

// writeResponse sends one of the core's own answers; its Close closes an
// HTTP/1 connection (h1). HTTP/2 keeps the connection: the request was
// one stream, and net/http would send GOAWAY for Connection: close,
// sending every other stream's client to a new connection. A streamed
// body (a large cached one) is written a piece at a time; the error is
// core.ErrBodyCut when it was cut off, and one that says the client is
// gone when a write failed.
func writeResponse(w http.ResponseWriter, resp *core.Response, h1 bool) error {
	h := w.Header()
	setFields(h, resp.Fields)
	if _, ok := h["Content-Type"]; !ok {
		h["Content-Type"] = nil // none was stored: no sniffing now either
	}
	if resp.Close && h1 {
		h.Set("Connection", "close")
	}
	w.WriteHeader(resp.Status)
	if len(resp.Body) > 0 {
		_, _ = w.Write(resp.Body) // the client went away: nothing to do
	}
	if resp.Stream == nil {
		return nil
	}
	for {
		p, err := resp.Stream.Next()
		switch {
		case err == io.EOF:
			return nil
		case err != nil:
			return err
		}
		if _, err := w.Write(p); err != nil {
			return errors.Join(core.ErrClientGone, err)
		}
	}
}
