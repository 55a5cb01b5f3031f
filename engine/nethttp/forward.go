package nethttp

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"net/textproto"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/preforkd/preforkd/core"
	"github.com/preforkd/preforkd/engine"
	"github.com/preforkd/preforkd/internal/httpfield"
	"github.com/preforkd/preforkd/internal/upconn"
	"github.com/preforkd/preforkd/route"
)

// Forwarding: the net/http engine's own way to one upstream, for what the
// fast engine (package proxy) cannot serve: TLS listeners (crypto/tls
// needs a blocking connection) and with them HTTP/2. A request that
// passed the core goes to the application over HTTP/1.1, on a pooled
// keep-alive connection reused only when clean, written as the fast
// engine writes it: the path the core forwards, the client's fields but
// the hop-by-hop ones (Connection and what it names, Keep-Alive, TE,
// Trailer, Transfer-Encoding, Upgrade but on an upgrade, Proxy-*), Expect
// and names with '_'; the core's own (Forward.Add) in place of the
// client's; X-Forwarded-For (the client's chain, then the peer),
// X-Forwarded-Proto (https on TLS) and X-Forwarded-Host set. The response
// comes back without its hop-by-hop fields (its Date kept, as the fast
// engine keeps it: a stored response's age depends on it), its body streamed
// (flushed piece by piece when its length is unknown), HEAD, 1xx, 204 and
// 304 without one, an upgrade (WebSocket, HTTP/1.1 only) tunnelled after
// the upstream's 101. What differs from the fast engine, because net/http
// parses the request: field names reach the upstream in canonical form
// ("x-custom" as "X-Custom") and in no fixed order. The requests net/http
// refuses itself get the server's problem+json answers (clientConn).

// readAheadBytes is how much of a request body is read before it is
// forwarded: one that ends within it goes with a Content-Length.
const readAheadBytes = 64 << 10

// Upstream is an application a Server forwards to itself, in place of a
// Handler (NewUpstream). An interface so that a program that builds none
// links no forwarding.
type Upstream interface {
	serve(rw *writer, r *http.Request, req *request, ex *core.Exchange, fwd core.Forward) error
	// unforwardable answers what cannot be forwarded
	// (refuseUnforwardable): a method, so that a program that forwards
	// nothing links none of it.
	unforwardable(w http.ResponseWriter, r *http.Request) (status int, answered bool)
	close()
	// cut closes the upstream connections responses are still read
	// from (upconn.Pool.Cut).
	cut()
}

// NewUpstream returns the application at upstreamURL ("http://host:port"
// or https, with an optional path prefix) for ServerOptions.Upstream,
// spoken to as client says (engine.Upstream: the connect and response
// timeouts, the idle connections kept; zero values are the defaults),
// its failures reported to c, the Server's core. It serves one Server.
func NewUpstream(c *core.Core, upstreamURL string, client engine.Upstream) (Upstream, error) {
	if c == nil {
		return nil, errors.New("nethttp: NewUpstream: the core is nil")
	}
	t, err := engine.ParseTarget(upstreamURL)
	if err != nil {
		return nil, fmt.Errorf("nethttp: %w", err)
	}
	client, err = client.WithDefaults()
	if err != nil {
		return nil, fmt.Errorf("nethttp: %w", err)
	}
	f := &forwarder{c: c, up: upconn.New(t, client), timeout: client.Timeout}
	f.up.Stray = func() { c.UpstreamFailed(core.UpstreamResponse, t.Addr, engine.ErrRespStray) }
	return f, nil
}

// forwarder sends what passed the core to the upstream.
type forwarder struct {
	c  *core.Core
	up *upconn.Pool
	// timeout is the upstream's (engine.Upstream.Timeout): a tunnel
	// idle on both sides for that long ends.
	timeout time.Duration
}

func (f *forwarder) close() { f.up.Close() }
func (f *forwarder) cut()   { f.up.Cut() }

func (f *forwarder) unforwardable(w http.ResponseWriter, r *http.Request) (int, bool) {
	return refuseUnforwardable(w, r)
}

// headPool holds the buffers request heads are written into.
var headPool = sync.Pool{New: func() any { b := make([]byte, 0, 4096); return &b }}

// serve forwards r, which passed ex (forwarded as fwd), and relays the
// response through rw; the error is what Finish is told (nil: the
// response reached its end).
func (f *forwarder) serve(rw *writer, r *http.Request, req *request, ex *core.Exchange, fwd core.Forward) error {
	upgrade := isUpgrade(r)
	body, err := readAhead(r, req)
	if err != nil {
		return f.refuse(rw, r, ex, err)
	}
	if upgrade && body.stream != nil {
		// Past the request the connection's bytes are the tunnel's: a
		// body that does not end within the read-ahead would be streamed
		// into them (the other engines refuse it too).
		body.release()
		b := engine.ErrUpgradeBody
		f.answer(rw, ex.Refuse(b.Status, b.Detail, b.CloseConn))
		return nil
	}
	ex.Sending()
	hp := headPool.Get().(*[]byte)
	defer headPool.Put(hp)
	head := appendHead((*hp)[:0], r, fwd, &f.up.Target, upgrade, body)
	*hp = head
	var uc *upconn.Conn
	for attempt := 0; ; attempt++ {
		if upgrade || attempt > 0 {
			// A tunnel will not go back to the pool; a retry goes on a
			// new connection, not on the next idle one.
			uc, err = f.up.Dial(context.Background())
		} else {
			uc, err = f.up.Get(context.Background())
		}
		var hd respHead
		if err == nil {
			// A client that goes away while its request is with the
			// upstream cuts it (the event loop does the same), unless
			// the core keeps the response: it is stored for the retry,
			// or the cache, all the same. Only once the body was read
			// whole: while it is streamed, the request's context also
			// ends when reading it stops or fails (an early answer, a
			// client_body_timeout), which the body's reads report.
			stop := func() bool { return true }
			if !rw.keep && body.stream == nil {
				conn := uc.Conn
				stop = context.AfterFunc(r.Context(), func() { _ = conn.SetDeadline(time.Now()) })
			}
			hd, err = f.exchange(uc, head, body, rw.w.Header(), interimTo(rw.w, r, rw.hide))
			if !stop() {
				uc.Conn.Close()
				clear(rw.w.Header())
				return core.ErrClientGone // counted and logged as 499
			}
		}
		if err == nil {
			return f.relay(rw, r, ex, uc, hd, upgrade, body.stream == nil)
		}
		if uc != nil {
			uc.Conn.Close()
		}
		clear(rw.w.Header()) // what a failed attempt read of a response head
		var be *engine.BodyReadError
		switch {
		case errors.As(err, &be):
			return f.refuse(rw, r, ex, be.Err)
		case attempt == 0 && uc != nil && uc.Reused && !uc.Got() && body.stream == nil &&
			engine.Retryable(r.Method, len(r.Header["Idempotency-Key"]) > 0) && staleConn(err):
			continue // the upstream had closed the idle connection: nothing was done
		}
		f.answer(rw, ex.Failed(f.failure(err), f.up.Target.Addr, err))
		return nil
	}
}

// failure is the kind of an upstream failure.
func (f *forwarder) failure(err error) core.UpstreamError {
	var de *upconn.DialError
	switch {
	case errors.As(err, &de):
		return core.UpstreamConnect
	case isTimeout(err):
		return core.UpstreamTimeout
	}
	return core.UpstreamResponse
}

// answer sends one of the core's answers in place of the response.
func (f *forwarder) answer(rw *writer, resp *core.Response) {
	rw.sent, rw.replaced, rw.status = true, resp, resp.Status
	clear(rw.w.Header())
	writeResponse(rw.w, resp, rw.h1)
}

// refuse answers a request whose body could not be read. A client that
// went away (bodyGone) before its response began is sent nothing, and
// the core counts and logs 499, as on the other engines. One that only
// ended its body short (a FIN) may still read the 400.
func (f *forwarder) refuse(rw *writer, r *http.Request, ex *core.Exchange, err error) error {
	status, detail := http.StatusBadRequest, "the request body could not be read"
	var mbe *http.MaxBytesError
	switch {
	case isTimeout(err):
		status, detail = http.StatusRequestTimeout, "the request body did not arrive in time"
	case errors.As(err, &mbe):
		status, detail = http.StatusRequestEntityTooLarge, "the request body is too large"
	case bodyGone(r, err):
		clear(rw.w.Header())
		return core.ErrClientGone
	}
	f.answer(rw, ex.Refuse(status, detail, true))
	return nil
}

// aheadBody is a request body as it goes upstream: all of it in memory
// (read ahead, or read by the core), or its first bytes and the rest
// streamed.
type aheadBody struct {
	bytes  []byte
	stream io.Reader // the rest, or nil
	length int64     // the whole length, -1 when unknown (sent chunked)
	sendCL bool      // a Content-Length goes with a body of no bytes
	buf    *[]byte   // pooled buffer of bytes
}

var aheadPool = sync.Pool{New: func() any { b := make([]byte, readAheadBytes); return &b }}

// relayPool holds the buffers response bodies are copied through: the
// size of the upstream connection's read buffer, what one read brings.
var relayPool = sync.Pool{New: func() any { b := make([]byte, upconn.ReadBuffer); return &b }}

// readAhead reads up to readAheadBytes of r's body.
func readAhead(r *http.Request, req *request) (aheadBody, error) {
	if req.body != nil || req.bodyRead {
		return aheadBody{bytes: req.body, length: int64(len(req.body)), sendCL: true}, nil
	}
	if r.Body == nil || r.Body == http.NoBody {
		_, hasCL := r.Header["Content-Length"]
		return aheadBody{sendCL: hasCL && r.ContentLength == 0}, nil
	}
	bp := aheadPool.Get().(*[]byte)
	n, err := io.ReadFull(r.Body, *bp)
	if err == nil && r.ContentLength == int64(n) {
		err = io.EOF // the declared length fills the buffer: the body is whole, as on the other engines
	}
	switch {
	case err == io.EOF || err == io.ErrUnexpectedEOF:
		if r.ContentLength > 0 && int64(n) != r.ContentLength {
			aheadPool.Put(bp)
			return aheadBody{}, &engine.BodyReadError{Err: io.ErrUnexpectedEOF}
		}
		_, hasCL := r.Header["Content-Length"]
		return aheadBody{bytes: (*bp)[:n], length: int64(n), sendCL: n > 0 || hasCL || r.ContentLength < 0, buf: bp}, nil
	case err != nil:
		aheadPool.Put(bp)
		return aheadBody{}, &engine.BodyReadError{Err: err}
	}
	return aheadBody{bytes: (*bp)[:n], stream: r.Body, length: r.ContentLength, buf: bp}, nil
}

func (b *aheadBody) release() {
	if b.buf != nil {
		aheadPool.Put(b.buf)
		b.buf = nil
	}
}

// isUpgrade reports whether r asks for an upgrade the upstream may
// grant: HTTP/1.1, Connection: upgrade with an Upgrade field, and not to
// h2c (HTTP/2 spoken straight to the upstream would pass every later
// request by the core).
func isUpgrade(r *http.Request) bool {
	if r.ProtoMajor != 1 || r.ProtoMinor != 1 {
		return false
	}
	up := r.Header["Upgrade"]
	if len(up) == 0 || !httpfield.HasToken(r.Header["Connection"], "upgrade") {
		return false
	}
	return !httpfield.HasToken(up, "h2c")
}

// hopByHop reports whether the field called name (canonical) never goes
// to the next hop, in either direction (RFC 9110 §7.6.1).
func hopByHop(name string) bool {
	switch name {
	case "Connection", "Keep-Alive", "Te", "Trailer", "Transfer-Encoding", "Upgrade":
		return true
	}
	return len(name) > 6 && strings.EqualFold(name[:6], "proxy-")
}

// appendHead appends the request head the upstream gets.
func appendHead(dst []byte, r *http.Request, fwd core.Forward, t *engine.Target, upgrade bool, body aheadBody) []byte {
	dst = append(dst, r.Method...)
	dst = append(dst, ' ')
	dst = append(dst, t.Prefix...)
	dst = append(dst, fwd.Path...)
	if q := r.URL.RawQuery; q != "" || r.URL.ForceQuery {
		dst = append(dst, '?')
		dst = append(dst, q...)
	}
	dst = append(dst, " HTTP/1.1\r\n"...)
	host := r.Host
	if host == "" {
		host = t.Authority // HTTP/1.0 without Host: HTTP/1.1 needs one
	}
	dst = engine.AppendField(dst, "Host", host)
	for name, vs := range r.Header {
		switch {
		case hopByHop(name) && !(upgrade && name == "Upgrade"):
			continue
		case name == "Expect", name == "Host", name == "Content-Length",
			name == "X-Forwarded-For", name == "X-Forwarded-Proto", name == "X-Forwarded-Host":
			continue
		case strings.IndexByte(name, '_') >= 0:
			continue // nginx's underscores_in_headers off (see package proxy)
		case (len(fwd.Drop) > 0 || len(fwd.Add) > 0) && fwd.Dropped(name):
			continue
		}
		for _, v := range vs {
			dst = engine.AppendField(dst, name, v)
		}
	}
	for _, f := range fwd.Add {
		dst = engine.AppendField(dst, f.Name, f.Value)
	}
	xff := engine.BeginForwardedFor(dst)
	for _, v := range r.Header["X-Forwarded-For"] {
		xff.Add(textproto.TrimString(v))
	}
	var peer netip.Addr
	if ap, err := netip.ParseAddrPort(r.RemoteAddr); err == nil {
		peer = ap.Addr().Unmap().WithZone("")
	}
	dst = xff.End(peer)
	dst = engine.AppendField(dst, "X-Forwarded-Proto", ownScheme(r))
	if r.Host != "" {
		dst = engine.AppendField(dst, "X-Forwarded-Host", r.Host)
	}
	if upgrade {
		dst = append(dst, "Connection: Upgrade\r\n"...)
	}
	switch {
	case body.stream == nil && (len(body.bytes) > 0 || body.sendCL):
		dst = engine.AppendLength(dst, int64(len(body.bytes)))
	case body.stream != nil && body.length >= 0:
		dst = engine.AppendLength(dst, body.length)
	case body.stream != nil:
		dst = append(dst, "Transfer-Encoding: chunked\r\n"...)
	}
	return append(dst, "\r\n"...)
}

// exchange writes the head and the body and reads the response head into
// h; an upstream may answer before it has the whole body (a 413): the
// rest is then not sent, and the connection not reused.
func (f *forwarder) exchange(uc *upconn.Conn, head []byte, body aheadBody, h http.Header, interim func(int)) (hd respHead, err error) {
	defer body.release()
	if err := uc.AwaitHead(); err != nil {
		return hd, err
	}
	defer uc.HeadRead()
	if body.stream == nil {
		if _, err := uc.Write(append(head, body.bytes...)); err != nil {
			return hd, err
		}
		hd, err = readResponseHead(uc.Buf, h, interim)
		uc.IdleFor = hd.idleFor
		return hd, err
	}
	var stop func()
	if s, ok := body.stream.(interface{ StopReading() }); ok {
		stop = s.StopReading
	}
	reuse, err := engine.SendWhileReading(uc.Conn,
		func() error { return engine.SendBody(uc, head, body.bytes, body.stream, body.length) },
		func() (err error) {
			hd, err = readResponseHead(uc.Buf, h, interim)
			return err
		}, stop)
	hd.close = hd.close || !reuse
	uc.IdleFor = hd.idleFor
	return hd, err
}

// respHead is what framing a response head says.
type respHead struct {
	status  int
	length  int64         // the body's length; -1 chunked; -2 until the upstream closes
	close   bool          // the connection is not reused after it
	upgrade bool          // a 101 with its Connection and Upgrade kept
	idleFor time.Duration // engine.ResponseHead's IdleFor: the connection's idle bound
}

// interimTo is what forwards the upstream's interim responses (1xx but
// 100 and 101: 102 Processing, 103 Early Hints) to w's client as they
// come, as RFC 9110 §15.2 asks of a proxy, from the fields the head was
// read into (w's header, cleared before the next): nil for an HTTP/1.0
// client, which gets none. 100 is not forwarded: net/http answers Expect
// itself. They are never recorded or stored, and carry none of the fields
// the core hides from every response (hide: core.Forward.Hide).
func interimTo(w http.ResponseWriter, r *http.Request, hide []string) func(int) {
	if !r.ProtoAtLeast(1, 1) {
		return nil
	}
	return func(status int) {
		if status != http.StatusContinue {
			for _, n := range hide {
				w.Header().Del(n)
			}
			w.WriteHeader(status)
		}
	}
}

// readResponseHead reads the final response head, putting its end-to-end
// fields in h. Interim responses but 101 come before it: each is read into
// h too and given to interim, when not nil, as it comes: up to
// engine.MaxInterims, and one more is engine.ErrRespInterims, not given
// first.
func readResponseHead(br *bufio.Reader, h http.Header, interim func(status int)) (respHead, error) {
	for interims := 0; ; interims++ {
		clear(h)
		hd, err := readOneHead(br, h)
		if err != nil {
			return hd, err
		}
		if hd.status >= 200 || hd.status == http.StatusSwitchingProtocols {
			return hd, nil
		}
		if interims == engine.MaxInterims {
			return respHead{}, engine.ErrRespInterims // refused, not passed on first
		}
		if interim != nil {
			interim(hd.status)
		}
	}
}

// readOneHead reads one response head, checked by the rules every engine
// that reads an upstream applies (engine.ResponseHead), and puts the
// fields that go on to the client in h.
func readOneHead(br *bufio.Reader, h http.Header) (respHead, error) {
	var stack [4096]byte
	raw, err := readHead(br, stack[:0])
	if err != nil {
		return respHead{}, err
	}
	var fields [32]engine.Field
	ph, err := engine.ParseResponseHead(raw, fields[:0])
	if err != nil {
		return respHead{}, err
	}
	hd := respHead{status: ph.Status, length: -2, close: ph.Close, upgrade: ph.Status == http.StatusSwitchingProtocols, idleFor: ph.IdleFor}
	switch {
	case ph.Chunked:
		hd.length = -1
	case ph.HasLength:
		hd.length = ph.Length
	}
	// Every value passed on in one string (one allocation), each field's
	// a piece of it.
	n, size := 0, 0
	for i := range ph.Fields {
		if f := &ph.Fields[i]; ph.Passed(f) {
			n, size = n+1, size+int(f.Value.To-f.Value.From)
		}
	}
	var all strings.Builder
	all.Grow(size)
	for i := range ph.Fields {
		if f := &ph.Fields[i]; ph.Passed(f) {
			all.Write(f.Value.Of(raw))
		}
	}
	values := all.String()
	kept := make([]string, 0, n+1)
	at := 0
	for i := range ph.Fields {
		f := &ph.Fields[i]
		if !ph.Passed(f) {
			continue
		}
		name := fieldName(f.Name.Of(raw))
		end := at + int(f.Value.To-f.Value.From)
		kept = append(kept, values[at:end])
		at = end
		if vs := h[name]; len(vs) > 0 {
			h[name] = append(vs[:len(vs):len(vs)], kept[len(kept)-1])
		} else {
			h[name] = kept[len(kept)-1 : len(kept) : len(kept)]
		}
	}
	if ph.HasLength {
		// Kept: relay frames the body with it.
		kept = append(kept, strconv.FormatInt(ph.Length, 10))
		h["Content-Length"] = kept[len(kept)-1:]
	}
	return hd, nil
}

// readHead appends one response head from br to buf: every line ended by
// CRLF, at most engine.MaxResponseHead bytes.
func readHead(br *bufio.Reader, buf []byte) ([]byte, error) {
	for line := 0; ; {
		piece, err := br.ReadSlice('\n')
		if len(buf)+len(piece) > engine.MaxResponseHead {
			return nil, engine.ErrRespTooLarge
		}
		buf = append(buf, piece...)
		switch {
		case err == bufio.ErrBufferFull:
			continue // the rest of a long line
		case err != nil:
			return nil, err
		case len(buf)-line < 2 || buf[len(buf)-2] != '\r':
			return nil, engine.ErrRespBareLF
		case len(buf)-line == 2:
			return buf, nil // the empty line
		}
		line = len(buf)
	}
}

// commonFields are the response field names met most: found without an
// allocation.
var commonFields = func() map[string]string {
	m := map[string]string{}
	for _, n := range []string{"Content-Type", "Content-Length", "Date", "Server", "Connection", "Keep-Alive",
		"Transfer-Encoding", "Cache-Control", "Etag", "Last-Modified", "Expires", "Vary", "Location", "Set-Cookie",
		"Content-Encoding", "Accept-Ranges", "Age", "X-Request-Id", "Upgrade", "Access-Control-Allow-Origin"} {
		m[n] = n
		m[strings.ToLower(n)] = n
	}
	return m
}()

// fieldName is the canonical form of a field name.
func fieldName(b []byte) string {
	if n, ok := commonFields[string(b)]; ok {
		return n
	}
	return textproto.CanonicalMIMEHeaderKey(string(b))
}

// relay makes the upstream's response the answer: the head through the
// core (which may send a stale response instead), then the body; watch
// says that the request's context ends when its client goes away (its
// body was read whole).
func (f *forwarder) relay(rw *writer, r *http.Request, ex *core.Exchange, uc *upconn.Conn, hd respHead, upgrade, watch bool) error {
	status := hd.status
	h := rw.w.Header()
	if hd.upgrade && (!upgrade || !engine.SwitchAsked([]byte(strings.Join(r.Header["Upgrade"], ",")), []byte(strings.Join(h["Upgrade"], ",")))) {
		uc.Conn.Close()
		clear(h)
		err := engine.ErrRespUnasked
		if upgrade {
			err = engine.ErrRespSwitch
		}
		f.answer(rw, ex.Failed(core.UpstreamResponse, f.up.Target.Addr, err))
		return nil
	}
	setFields(h, ex.Fields())
	if _, ok := h["Content-Type"]; !ok {
		h["Content-Type"] = nil // what the upstream did not send is not sent: no sniffing
	}
	head := r.Method == http.MethodHead
	noBody := engine.Bodyless(status, head)
	if noBody && (!head || status == http.StatusNoContent || status == http.StatusNotModified) {
		// readOneHead kept the upstream's: no body here. HEAD's gives the
		// length a GET's body would have, but a 204 has none, and a 304
		// goes without, as the other engines send both: net/http's
		// HTTP/1 writer drops it, x/net's HTTP/2 one sent it.
		delete(h, "Content-Length")
	}
	if status == http.StatusSwitchingProtocols {
		return f.tunnel(rw, uc, status)
	}
	rw.WriteHeader(status)
	if rw.replaced != nil {
		// stale-if-error: the cache's stale response went instead; the
		// upstream's body is not read, nor its connection kept.
		uc.Conn.Close()
		return nil
	}
	reusable := !hd.close
	if noBody {
		// No body, whatever the head says (RFC 9112 §6.3). A connection
		// that answered HEAD is not reused: applications that run HEAD as
		// GET write the body anyway (see package proxy).
		return f.done(uc, reusable && !head)
	}
	if hd.length >= 0 && hd.length <= int64(uc.Buf.Buffered()) {
		// The whole body is here: one write to the client, and the
		// connection is free for another request at once.
		b, _ := uc.Buf.Peek(int(hd.length))
		if _, werr := rw.Write(b); werr != nil {
			uc.Conn.Close()
			return werr
		}
		_, _ = uc.Buf.Discard(len(b))
		return f.done(uc, reusable)
	}
	var body io.Reader
	switch {
	case hd.length >= 0:
		body = &limitedBody{br: uc.Buf, left: hd.length}
	case hd.length == -1:
		body = engine.NewChunkedReader(uc.Buf)
	default:
		body = uc.Buf
	}
	// A client that goes away mid-body cuts the upstream's connection at
	// once, as before the head (and as nginx does), unless the core keeps
	// the response, which is read on to be stored: an event stream that
	// has nothing to send for a while would hold it until its next event
	// or the upstream timeout.
	var kept, cut atomic.Bool
	kept.Store(ex.Keep())
	stop := func() bool { return true }
	if watch {
		conn := uc.Conn
		stop = context.AfterFunc(r.Context(), func() {
			if !kept.Load() {
				cut.Store(true)
				_ = conn.Close()
			}
		})
	}
	defer stop()
	f.up.Relaying(uc) // Shutdown cuts it once its time is up
	defer f.up.Relayed(uc)
	bp := relayPool.Get().(*[]byte)
	defer relayPool.Put(bp)
	// What the client was given goes out before a read that may wait for
	// the upstream, whatever the framing: the head (net/http holds it
	// until the body fills its buffer: a stream's head before its first
	// event, a long poll's), each piece of a body of unknown length (a
	// chunk's end may still be buffered), and a piece of a body with a
	// length once nothing more of it came.
	if uc.Buf.Buffered() == 0 {
		rw.Flush()
	}
	for {
		n, err := body.Read(*bp)
		if n > 0 {
			if _, werr := rw.Write((*bp)[:n]); werr != nil {
				// The client went away, and the response is not kept.
				uc.Conn.Close()
				return werr
			}
			if hd.length < 0 || uc.Buf.Buffered() == 0 {
				rw.Flush()
			}
			kept.Store(ex.Keep())
			if watch && !kept.Load() && r.Context().Err() != nil {
				// Gone while the response was kept: not any more.
				uc.Conn.Close()
				return core.ErrClientGone
			}
		}
		switch {
		case err == io.EOF && hd.length == -2:
			uc.Conn.Close()
			return nil
		case err == io.EOF:
			return f.done(uc, reusable && stop())
		case err != nil && cut.Load():
			return core.ErrClientGone // logged with what was sent
		case err != nil:
			uc.Conn.Close()
			f.c.UpstreamFailed(core.UpstreamBroken, f.up.Target.Addr, err)
			// The response is cut off as the upstream cut it: the client
			// gets the head and what came (net/http would drop what it
			// holds), then must not take it for whole (net/http closes
			// the connection, or resets the HTTP/2 stream).
			rw.Flush()
			panic(http.ErrAbortHandler)
		}
	}
}

// done puts a connection whose response was read back in the pool; a
// connection with bytes past the response is closed, the response is not
// whole to the core (engine.ErrRespStray), and the bytes are counted as a
// response failure.
func (f *forwarder) done(uc *upconn.Conn, reusable bool) error {
	f.up.Relayed(uc) // before another request may take it
	if !f.up.Done(uc, reusable, time.Now()) {
		f.c.UpstreamFailed(core.UpstreamResponse, f.up.Target.Addr, engine.ErrRespStray)
		return engine.ErrRespStray
	}
	return nil
}

// tunnel hands the client's connection to the upstream's after its 101,
// and carries bytes both ways until each side's end was passed on to the
// other (a half-close), or until neither side sent anything for the
// upstream timeout, as the other engines do (nginx closes an idle
// upgraded connection after proxy_read_timeout the same way).
func (f *forwarder) tunnel(rw *writer, uc *upconn.Conn, status int) error {
	// The core is told the head with its fields, as for any response
	// (its reset header, say), before the client gets it without those
	// it hides.
	h := rw.w.Header()
	rw.sent, rw.status = true, status
	if rw.replaced = rw.ex.Head(status, header(h)); rw.replaced != nil {
		uc.Conn.Close()
		clear(h)
		writeResponse(rw.w, rw.replaced, rw.h1)
		return nil
	}
	for _, n := range rw.hide {
		delete(h, n)
	}
	cc, brw, err := rw.Hijack()
	if err != nil {
		uc.Conn.Close()
		return err
	}
	h["Connection"] = []string{engine.SwitchedConnection}
	if _, ok := h["Date"]; !ok {
		// net/http adds one to the heads it writes; this one it does not.
		h["Date"] = []string{time.Now().UTC().Format(http.TimeFormat)}
	}
	var head bytes.Buffer
	fmt.Fprintf(&head, "HTTP/1.1 %d %s\r\n", status, core.StatusText(status))
	h.Write(&head)
	head.WriteString("\r\n")
	// A write to the client waits at most its send_timeout on a
	// Server's connection; under another server, the upstream timeout.
	send := f.timeout
	if lw, ok := rw.w.(*limitWriter); ok {
		send = lw.timeout
	}
	_ = cc.SetWriteDeadline(time.Now().Add(send))
	if _, err := cc.Write(head.Bytes()); err != nil {
		cc.Close()
		uc.Conn.Close()
		return err
	}
	// The bytes are carried once the exchange has ended (ServeHTTP):
	// the 101 is the response, counted and logged when it was sent. What
	// each side sent past its head is in its reader already: the
	// client's read by net/http, the upstream's with its 101.
	rw.tunnel = func() { engine.Tunnel(cc, brw.Reader, uc.Conn, uc.Buf, f.timeout, send) }
	return nil
}

// limitedBody is a body of a known length.
type limitedBody struct {
	br   *bufio.Reader
	left int64
}

func (b *limitedBody) Read(p []byte) (int, error) {
	if b.left == 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.br.Read(p)
	b.left -= int64(n)
	switch {
	case err == io.EOF:
		return n, io.ErrUnexpectedEOF
	case err == nil && b.left == 0:
		return n, io.EOF
	}
	return n, err
}

// staleConn reports whether err is what a request sent on a connection
// the upstream had just closed meets: nothing came back.
func staleConn(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || isConnReset(err)
}

// refuseUnforwardable answers, before the core sees them, the requests a
// reverse proxy never forwards (as the fast engine refuses them):
// CONNECT (405), PRI (400: the HTTP/2 preface is no request), an
// asterisk-form target but OPTIONS * (400), an absolute-form target of
// another scheme than the connection's (400: "ftp://", or "https://" on
// cleartext; on HTTP/2, a :scheme of http, to which x/net's server gives
// no TLS state on a TLS connection), an HTTP/2 request with no authority
// (400, as an HTTP/1.1 one without Host), a target with a '#' anywhere (400:
// the path's checks do not read the query, where the upstream may take
// it for a fragment) and an HTTP/2 :path with a space (400: an HTTP/1.1
// request line cannot carry it, and written into the upstream's it would
// end the target there), an HTTP/2 :method that is not a token (400: it
// would be the upstream's request line's first word, and a space in it
// another target), an HTTP/2 request whose content-length disagrees with
// its DATA (400: h2Length) or that has a :protocol but is no CONNECT
// (400), each closing the connection; OPTIONS * is
// answered here (200, with Allow). It reports whether it answered.
func refuseUnforwardable(w http.ResponseWriter, r *http.Request) (status int, answered bool) {
	if r.ProtoMajor == 2 {
		if b := h2Length(r); b != nil {
			return writeOwnProblem(w, r, b.Status, b.Detail), true
		}
		if _, ok := r.Header[":protocol"]; ok && r.Method != http.MethodConnect {
			// x/net's server, with extended CONNECT on, passes a
			// :protocol on any method as this field: no HTTP/1.1 name.
			return writeOwnProblem(w, r, http.StatusBadRequest, "a :protocol on a request that is not CONNECT"), true
		}
	}
	switch {
	case !route.IsToken(r.Method):
		// net/http refuses such an HTTP/1 request line itself; x/net's
		// HTTP/2 server takes any :method without a control character.
		return writeOwnProblem(w, r, engine.ErrLine.Status, "the request method is not a token"), true
	case strings.IndexByte(r.RequestURI, '#') >= 0:
		return writeOwnProblem(w, r, engine.ErrTarget.Status, engine.ErrTarget.Detail), true
	case strings.IndexByte(r.RequestURI, ' ') >= 0:
		return writeOwnProblem(w, r, http.StatusBadRequest, "the request target has a space"), true
	case r.URL != nil && r.URL.IsAbs() && (!strings.EqualFold(r.URL.Scheme, ownScheme(r)) || r.URL.Host == ""):
		// An http URI has a host (RFC 9110 §4.2.1): net/http would take
		// Host's for "http:///x".
		return writeOwnProblem(w, r, http.StatusBadRequest, "the request target is not an absolute path"), true
	case r.ProtoMajor == 1 && r.ProtoMinor >= 1 && r.Host == "":
		// net/http takes an empty Host as a Host: an http URI has a
		// host (RFC 9110 §4.2.1), so it is none (RFC 9112 §3.2).
		return writeOwnProblem(w, r, engine.ErrNoHost.Status, engine.ErrNoHost.Detail), true
	case r.Method == http.MethodConnect:
		return writeOwnProblem(w, r, http.StatusMethodNotAllowed, "CONNECT is not supported"), true
	case r.ProtoMajor == 2 && r.TLS == nil:
		// HTTP/2 is served on TLS connections only (package tlsedge);
		// a CONNECT stream has no :scheme, and no TLS state either.
		return writeOwnProblem(w, r, http.StatusBadRequest, "the request's scheme is not the connection's"), true
	case r.ProtoMajor == 2 && r.Host == "":
		// RFC 9113 §8.3.1: an https request without :authority or Host
		// is malformed, as an HTTP/1.1 request without Host is.
		return writeOwnProblem(w, r, http.StatusBadRequest, "an HTTP/2 request without :authority or Host"), true
	case r.Method == "PRI":
		return writeOwnProblem(w, r, http.StatusBadRequest, "PRI is the HTTP/2 connection preface, not a request"), true
	case r.RequestURI == "*" && r.Method == http.MethodOptions:
		w.Header().Set("Allow", "GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS")
		w.Header()["Content-Type"] = nil
		w.WriteHeader(http.StatusOK)
		return http.StatusOK, true
	case r.RequestURI == "*":
		return writeOwnProblem(w, r, http.StatusBadRequest, "the request target is not an absolute path"), true
	}
	return 0, false
}

// h2Length is the refusal of an HTTP/2 request's content-length that
// x/net's server lets through, nil for none. It resets a stream whose
// DATA run past the first content-length or end short of it, but takes
// the length of a stream ended with its headers for 0 and a length that
// is no number for 0, and reads no second one: each such request is
// malformed (RFC 9113 §8.1.1), and forwarded it would carry a length of
// the forwarder's own that the rules did not see.
func h2Length(r *http.Request) *engine.BadRequest {
	vs := r.Header["Content-Length"]
	switch {
	case len(vs) == 0:
		return nil
	case len(vs) > 1:
		return engine.ErrTwoLengths
	}
	if n, err := strconv.ParseUint(vs[0], 10, 63); err != nil || int64(n) != r.ContentLength {
		return engine.ErrLength
	}
	return nil
}

// writeOwnProblem writes a problem of the server's own, closing an
// HTTP/1 connection after it (writeResponse).
func writeOwnProblem(w http.ResponseWriter, r *http.Request, status int, detail string) int {
	p := core.Problem{Status: status, Detail: detail}
	body := p.AppendJSON(nil)
	fields, _ := core.ProblemFields(nil, nil, 0, len(body))
	writeResponse(w, &core.Response{Status: status, Fields: fields, Body: body, Close: true}, r.ProtoMajor == 1)
	return status
}
