package idempotency

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/textproto"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/preforkd/preforkd/clientip"
	"github.com/preforkd/preforkd/config"
	"github.com/preforkd/preforkd/route"
	"github.com/preforkd/preforkd/shm"
)

// Options tunes a Middleware. The zero value is what production wants.
type Options struct {
	// Logger receives the conditions an operator should hear about, which
	// a client cannot cause: a reservation lost before it completed (its
	// worker was reaped as dead while alive), a region that refuses
	// reservations for an unexpected reason. Never one line per request.
	// nil means slog.Default() at the time of the line.
	Logger *slog.Logger
	// Now is the region's clock, which stored responses expire by: read
	// once when a keyed request arrives (and at each look after a wait),
	// and once when it completes. nil means region.Now. How long a
	// duplicate waits is real time, like the futex it sleeps on, so that a
	// clock a test holds still cannot make it wait for ever.
	Now func() time.Duration
}

// Middleware runs the requests of the [[idempotency]] blocks of a
// configuration at most once per key, and replays their responses to
// retries. It is safe for concurrent use, and every process whose
// Middleware uses the same region shares its records.
type Middleware struct {
	next     http.Handler
	blocks   []*block
	tab      *shm.Responses
	keys     *shm.Counters
	resolver clientip.Resolver
	maxReq   int64 // server.max_request_body
	now      func() time.Duration
	log      *slog.Logger // nil: slog.Default()
	stats    counters
}

// block is one compiled [[idempotency]] block.
type block struct {
	route    route.Route
	header   string // canonical header name
	required bool
	ttl      time.Duration
	wait     time.Duration
	by       clientip.By
	maxBody  int64
	ns       uint64 // key namespace: the block's path, so that reloads keep records
	problems [nProblems]problemText
}

type counters struct {
	executions, replays, mismatches, waits, conflicts, full, unreplayable, released, invalid atomic.Uint64
}

// Stats counts what the middleware did in this process since New. Other
// processes sharing the region count their own; the table's occupancy is
// shm.Responses.Stats.
type Stats struct {
	// Executions counts keyed requests that reserved their key and ran the
	// next handler.
	Executions uint64
	// Replays counts retries answered with a stored response.
	Replays uint64
	// Mismatches counts 422s: a key reused for another request.
	Mismatches uint64
	// Waits counts duplicates that waited for an original in flight.
	Waits uint64
	// Conflicts counts 409s: an original still in flight after the wait,
	// or completed without a stored response.
	Conflicts uint64
	// Full counts 503s: no record could be had for a new key.
	Full uint64
	// Unreplayable counts executions completed without a stored response
	// (over max_body, no room in the block pool, a hijacked connection):
	// their retries get 409.
	Unreplayable uint64
	// Released counts executions whose reservation was released instead
	// of completed (5xx, 408, 429, a panic): their retries run again.
	Released uint64
	// Invalid counts 400s (a missing or malformed key, an unreadable
	// body) and 413s.
	Invalid uint64
}

// keyBufSize is the stack buffer for a key's identity: the `by` key
// ("h:Authorization:" and up to clientip.MaxKeyValue bytes, or a digest),
// a NUL and the key; a longer one costs an allocation.
const keyBufSize = 640

// waitSlice bounds one sleep of a waiting duplicate, so that it notices a
// client that went away. A completion wakes it at once whatever the slice.
const waitSlice = 250 * time.Millisecond

// Problem retry hints, in seconds.
const (
	retryInFlight = 1 // the retry waits again, up to `wait`
	retryFull     = 1
)

// New compiles the [[idempotency]] blocks of cfg (with cfg.Server's
// trusted_proxies, ipv6_prefix and max_request_body) and binds them to
// region's response table. region must have been joined (shm.Region.Join)
// by this process and have a response table. When cfg has no blocks, the
// Middleware passes every request to next untouched and region may be nil.
func New(cfg config.Config, region *shm.Region, next http.Handler, opts Options) (*Middleware, error) {
	if next == nil {
		return nil, errors.New("idempotency: nil next handler")
	}
	cfg = cfg.WithDefaults()
	m := &Middleware{
		next:     next,
		resolver: clientip.Resolver{Trusted: cfg.Server.TrustedProxies, IPv6Prefix: cfg.Server.IPv6Prefix},
		maxReq:   cfg.Server.MaxRequestBody,
		now:      opts.Now,
		log:      opts.Logger,
	}
	if len(cfg.Idempotency) == 0 {
		return m, nil
	}
	switch {
	case region == nil:
		return nil, errors.New("idempotency: nil region")
	case region.Worker() < 0:
		return nil, fmt.Errorf("idempotency: %w (call Region.Join before New)", shm.ErrNotJoined)
	case region.Responses().Len() == 0:
		return nil, fmt.Errorf("idempotency: %w (table.responses is 0)", shm.ErrNoResponses)
	case m.maxReq <= 0:
		return nil, fmt.Errorf("idempotency: server.max_request_body must be positive, got %d", m.maxReq)
	}
	if err := m.resolver.Validate(); err != nil {
		return nil, fmt.Errorf("idempotency: %w", err)
	}
	m.tab, m.keys = region.Responses(), region.Counters()
	if m.now == nil {
		m.now = region.Now
	}
	for i := range cfg.Idempotency {
		d := &cfg.Idempotency[i]
		b, err := compileBlock(d, m.maxReq)
		if err != nil {
			if d.Line > 0 {
				return nil, fmt.Errorf("idempotency: block %d (line %d): %w", i+1, d.Line, err)
			}
			return nil, fmt.Errorf("idempotency: block %d: %w", i+1, err)
		}
		m.blocks = append(m.blocks, b)
	}
	return m, nil
}

func compileBlock(d *config.Idempotency, maxReq int64) (*block, error) {
	rt, err := route.Compile(d.Path, d.Methods)
	if err != nil {
		return nil, err
	}
	if !route.IsToken(d.Header) {
		return nil, fmt.Errorf("header %q is not a valid header name", d.Header)
	}
	by, err := clientip.ParseBy(d.By)
	if err != nil {
		return nil, err
	}
	switch {
	case d.TTL <= 0:
		return nil, fmt.Errorf("ttl must be positive, got %v", d.TTL)
	case d.Wait < 0:
		return nil, fmt.Errorf("wait must not be negative, got %v", d.Wait)
	case d.MaxBody <= 0:
		return nil, fmt.Errorf("max_body must be positive, got %d", d.MaxBody)
	}
	b := &block{
		route:    rt,
		header:   textproto.CanonicalMIMEHeaderKey(d.Header),
		required: d.Required,
		ttl:      d.TTL,
		wait:     d.Wait,
		by:       by,
		maxBody:  d.MaxBody,
		// The cleaned path, not the methods: a reload that adds a method
		// keeps the records, and the fingerprint (which has the method)
		// tells a POST from a PATCH under one key.
		ns: xxhash.Sum64String("idempotency\x00" + rt.String()),
	}
	for p := range b.problems {
		b.problems[p] = newProblem(problemKind(p), b.header, maxReq)
	}
	return b, nil
}

// ServeHTTP runs r through the first [[idempotency]] block whose route
// matches it; requests that match none, and requests without the key
// header where it is not required, go to the next handler untouched (no
// wrapper, nothing read).
func (m *Middleware) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b := m.match(r)
	if b == nil {
		m.next.ServeHTTP(w, r)
		return
	}
	vs := r.Header[b.header]
	if len(vs) == 0 && !b.required {
		m.next.ServeHTTP(w, r)
		return
	}
	// The key's identity: the client (by) and the key, NUL between them
	// (by keys hold no control bytes), so that two clients never share a key.
	var buf [keyBufSize]byte
	id := b.by.AppendKey(buf[:0], &m.resolver, r.RemoteAddr, r.Header)
	id = append(id, 0)
	id, kp := parseKey(id, vs)
	if kp != keyOK {
		m.stats.invalid.Add(1)
		m.problem(w, b, keyProblemKind(kp))
		return
	}
	body, bp := readBody(r.Body, r.ContentLength, m.maxReq)
	if bp != problemNone {
		m.stats.invalid.Add(1)
		m.problem(w, b, bp)
		return
	}
	k := m.keys.KeyOf(b.ns, id)
	m.serveKeyed(w, r, b, k, fingerprint(r, body), body)
}

// match returns the first block whose route covers r, or nil.
func (m *Middleware) match(r *http.Request) *block {
	if len(m.blocks) == 0 {
		return nil
	}
	p := ""
	if r.URL != nil {
		p = r.URL.Path
	}
	p = route.Clean(p)
	for _, b := range m.blocks {
		if b.route.Match(r.Method, p) {
			return b
		}
	}
	return nil
}

// serveKeyed answers a keyed request: it reserves k and runs it, replays
// the stored response, or refuses; a duplicate of an original in flight
// waits for it (real time, up to the block's wait) and looks again.
func (m *Middleware) serveKeyed(w http.ResponseWriter, r *http.Request, b *block, k shm.Key, fp shm.Fingerprint, body []byte) {
	var deadline time.Time
	for waited := false; ; {
		var stored shm.Response
		out, tk, err := m.tab.Begin(k, fp, m.now(), &stored)
		if err != nil {
			// ErrFull, ErrLockTimeout and ErrRetired (this worker was
			// reaped while it runs) are the table's to say; anything else
			// (a region without a response table or identity) New rules
			// out. Either way: no reservation, no execution.
			if !errors.Is(err, shm.ErrFull) && !errors.Is(err, shm.ErrLockTimeout) && !errors.Is(err, shm.ErrRetired) {
				m.logger().LogAttrs(r.Context(), slog.LevelError, "idempotency: reservation refused", slog.String("err", err.Error()))
			}
			m.stats.full.Add(1)
			m.problem(w, b, problemUnavailable)
			return
		}
		switch out {
		case shm.Reserved:
			m.execute(w, r, b, tk, body)
			return
		case shm.Replay:
			m.stats.replays.Add(1)
			replay(w, &stored)
			return
		case shm.Mismatch:
			m.stats.mismatches.Add(1)
			m.problem(w, b, problemMismatch)
			return
		case shm.Unreplayable:
			m.stats.conflicts.Add(1)
			m.problem(w, b, problemUnreplayable)
			return
		case shm.InFlight:
			if !waited {
				waited, deadline = true, time.Now().Add(b.wait)
				if b.wait > 0 {
					m.stats.waits.Add(1)
				}
			}
			left := time.Until(deadline)
			if left <= 0 {
				m.stats.conflicts.Add(1)
				m.problem(w, b, problemInFlight)
				return
			}
			if r.Context().Err() != nil {
				return // the client went away: nobody to answer
			}
			m.tab.Wait(tk, min(left, waitSlice))
		default:
			panic(fmt.Sprintf("idempotency: unknown outcome %d", out))
		}
	}
}

// execute runs the reserved request once and completes or releases its
// reservation tk. The handler runs without the client's cancellation: a
// client that disconnects does not stop the response from being stored
// for its retry.
func (m *Middleware) execute(w http.ResponseWriter, r *http.Request, b *block, tk shm.Ticket, body []byte) {
	m.stats.executions.Add(1)
	rec := newRecorder(w, b.maxBody)
	r2 := r.WithContext(context.WithoutCancel(r.Context()))
	if len(body) == 0 {
		r2.Body = http.NoBody
	} else {
		r2.Body = io.NopCloser(bytes.NewReader(body))
	}
	returned := false
	defer func() {
		if !returned {
			// The handler panicked (http.ErrAbortHandler from a proxy whose
			// upstream broke mid-body, say): nothing whole was sent, so
			// the retry runs. The panic goes on to net/http.
			m.tab.Release(tk)
			m.stats.released.Add(1)
		}
		rec.release()
	}()
	m.next.ServeHTTP(rec, r2)
	returned = true
	rec.finish()

	keep, replayable := rec.storable()
	if !keep {
		m.tab.Release(tk)
		m.stats.released.Add(1)
		return
	}
	var resp *shm.Response
	if replayable {
		resp = &shm.Response{Status: rec.status, ContentType: rec.ct, Location: rec.loc, Body: rec.body}
	}
	stored, err := m.tab.Complete(tk, resp, m.now(), b.ttl)
	if err != nil {
		m.logger().LogAttrs(r.Context(), slog.LevelWarn, "idempotency: response not stored", slog.String("err", err.Error()))
		return
	}
	if !stored {
		m.stats.unreplayable.Add(1)
	}
}

// replay answers with a stored response: status, Content-Type, Location
// and the body, byte for byte.
func replay(w http.ResponseWriter, s *shm.Response) {
	h := w.Header()
	// One allocation for the values of all four fields (Header.Set makes
	// one per field); each slice is capped, so that an Add reallocates
	// rather than write into its neighbour.
	v := make([]string, 4)
	v[0], v[1], v[2], v[3] = s.ContentType, s.Location, "true", strconv.Itoa(len(s.Body))
	if s.ContentType != "" {
		h["Content-Type"] = v[0:1:1]
	} else {
		h["Content-Type"] = nil // the original had none: no sniffing now either
	}
	if s.Location != "" {
		h["Location"] = v[1:2:2]
	} else {
		delete(h, "Location")
	}
	h["Idempotent-Replayed"] = v[2:3:3]
	if bodyAllowed(s.Status) {
		h["Content-Length"] = v[3:4:4]
	} else {
		delete(h, "Content-Length")
	}
	w.WriteHeader(s.Status)
	if len(s.Body) > 0 && bodyAllowed(s.Status) {
		_, _ = w.Write(s.Body) // the client went away: nothing to do
	}
}

// readBody reads a request body of at most max bytes, never buffering more
// than max+1; length is the request's ContentLength (-1: unknown).
func readBody(body io.Reader, length, max int64) ([]byte, problemKind) {
	if body == nil || body == http.NoBody {
		return nil, problemNone
	}
	if length > max {
		return nil, problemTooLarge
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
			return nil, problemTooLarge
		}
		switch {
		case err == io.EOF:
			return buf, problemNone
		case err != nil:
			var mbe *http.MaxBytesError
			if errors.As(err, &mbe) {
				return nil, problemTooLarge
			}
			return nil, problemUnreadable
		}
	}
}

// fingerprint is the SHA-256 of the method, path (decoded and as sent),
// query and body, each prefixed with its length, so that no two different
// requests can be made to hash the same fields by shifting a boundary.
func fingerprint(r *http.Request, body []byte) shm.Fingerprint {
	var buf [512]byte
	b := appendField(buf[:0], r.Method)
	if r.URL != nil {
		b = appendField(b, r.URL.Path)
		b = appendField(b, r.URL.RawPath)
		b = appendField(b, r.URL.RawQuery)
	} else {
		b = appendField(appendField(appendField(b, ""), ""), "")
	}
	b = binary.BigEndian.AppendUint64(b, uint64(len(body)))
	h := sha256.New()
	h.Write(b)
	h.Write(body)
	var fp shm.Fingerprint
	h.Sum(fp[:0])
	return fp
}

func appendField(b []byte, s string) []byte {
	b = binary.BigEndian.AppendUint64(b, uint64(len(s)))
	return append(b, s...)
}

func (m *Middleware) logger() *slog.Logger {
	if m.log != nil {
		return m.log
	}
	return slog.Default()
}

// Stats reports what the middleware did in this process since New.
func (m *Middleware) Stats() Stats {
	s := &m.stats
	return Stats{
		Executions:   s.executions.Load(),
		Replays:      s.replays.Load(),
		Mismatches:   s.mismatches.Load(),
		Waits:        s.waits.Load(),
		Conflicts:    s.conflicts.Load(),
		Full:         s.full.Load(),
		Unreplayable: s.unreplayable.Load(),
		Released:     s.released.Load(),
		Invalid:      s.invalid.Load(),
	}
}
