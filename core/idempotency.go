package core

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/preforkd/preforkd/clientip"
	"github.com/preforkd/preforkd/metrics"
	"github.com/preforkd/preforkd/shm"
)

// The idempotency stage: requests of an idempotency block that carry its
// key run at most once per key, and their responses are replayed to
// retries (draft-ietf-httpapi-idempotency-key-header).

// idemState is the idempotency stage's part of an exchange.
type idemState struct {
	blk      *block
	tk       shm.Ticket
	reserved bool // tk is held and must be completed or released
	stored   shm.Response
	wait     idemWait // what reserve waits with, when NoWait stopped it
}

// idemWait is what a duplicate that NoWait stopped resumes reserve with.
type idemWait struct {
	b       *block
	k       shm.Key
	q, addr shm.Quota
	fp      idemFP
}

// idemFP is a request's fingerprint, and the one a build that did not
// fingerprint the Host gave it: a record that build stored (in this
// region, or in a dump) is looked up by it once the first says Mismatch,
// so that its retries still replay rather than get 422.
type idemFP struct {
	now, legacy shm.Fingerprint
	old, tried  bool // legacy is the one in use; it was tried
}

// idemKeyBufSize is the buffer for a key's identity: the `by` key
// ("h:Authorization:" and up to clientip.MaxKeyValue bytes, or a digest),
// a NUL and the key; a longer one costs an allocation.
const idemKeyBufSize = 640

// waitSlice bounds one sleep of a waiting duplicate, so that it notices a
// client that went away. A completion wakes it at once whatever the slice.
const waitSlice = 250 * time.Millisecond

// Problem retry hints, in seconds.
const (
	retryInFlight = 1 // the retry waits again, up to `wait`
	retryFull     = 1
	// A client at its maximum of records gets one back when a request of
	// its own finishes or a stored response expires (up to the ttl after
	// it was stored): which one comes first is not recorded, so it is told
	// to come back in a minute (or the ttl, when shorter).
	retryCapped = 60
)

// idempotency runs a keyed request of the first block whose route matches
// it: it reserves the key (Pass, with Record asking for the response),
// replays the stored response, or answers a problem. A duplicate of an
// original in flight waits for it (real time, up to the block's wait) and
// looks again. Requests of no block, and requests without the key where
// it is not required, pass untouched (no body read).
func (ex *Exchange) idempotency() (Verdict, bool) {
	b := ex.matchBlock()
	if b == nil {
		return Pass, false
	}
	first, lines := ex.req.Header(b.header)
	if lines == 0 && !b.required {
		return Pass, false
	}
	c := ex.c
	// The key's identity: the client (by) and the key, NUL between them
	// (by keys hold no control bytes), so that two clients never share a key.
	id, err := b.by.AppendKeyOf(ex.keyBuf[:0], ex.view())
	if err != nil {
		c.row.Add(metrics.IdempotencyRequests, metrics.IdemInvalid, 1)
		if re, ok := errors.AsType[*clientip.RepeatedError](err); ok {
			return ex.respond(&Problem{Status: http.StatusBadRequest, Detail: "send " + re.What + " at most once"}, false)
		}
		panic("core: unexpected key error: " + err.Error())
	}
	// The client's account: a hash of the namespace and its by key, seeded
	// per region, so that nobody can aim keys at another client's bucket.
	acct := uint16(c.region.Counters().KeyOf(b.ns^accountSalt, id).A)
	addr := ex.addrQuota(b)
	id = append(id, 0)
	id, kp := parseKey(id, first, lines)
	if kp != keyOK {
		c.row.Add(metrics.IdempotencyRequests, metrics.IdemInvalid, 1)
		return ex.idemProblem(b, keyProblemKind(kp))
	}
	body, err := ex.req.Body(c.maxReq)
	if errors.Is(err, ErrClientGone) {
		// Nobody to answer, and nothing reserved: the answer ends the
		// exchange unsent, counted and logged as 499, as on the event
		// loop, which reads the body before Decide.
		v, ok := ex.idemProblem(b, problemUnreadable)
		ex.status, ex.gone = StatusClientClosed, true
		return v, ok
	}
	if err != nil {
		c.row.Add(metrics.IdempotencyRequests, metrics.IdemInvalid, 1)
		var te interface{ Timeout() bool }
		switch {
		case errors.Is(err, ErrBodyTooLarge):
			return ex.idemProblem(b, problemTooLarge)
		case errors.As(err, &te) && te.Timeout():
			return ex.idemProblem(b, problemBodyTimeout)
		}
		return ex.idemProblem(b, problemUnreadable)
	}
	k := c.region.Counters().KeyOf(b.ns, id)
	legacy := ex.fingerprint(body)
	return ex.reserve(b, k, shm.Quota{Account: acct, Max: b.maxRecords}, addr, idemFP{now: ex.hostBound(legacy), legacy: legacy})
}

// Salts keep a client's account hash and its address's apart from its
// keys' hashes.
const (
	accountSalt = 0x6163636f756e7473 // "accounts"
	addrSalt    = 0x6164647265737373 // "addresss"
)

// addrQuota is the account of the request's client address in b's
// namespace, which holds b.maxRecords records at most: the address rules
// key by (the peer, or the client trusted proxies name; an IPv6 address
// masked to ipv6_prefix), whatever the request's `by` key is, so that
// values a client invents for a header never widen its share. A request
// with no address (none could be known) is charged to no address.
func (ex *Exchange) addrQuota(b *block) shm.Quota {
	a := ex.ClientKey()
	if !a.IsValid() {
		return shm.Quota{}
	}
	a16 := a.As16()
	acct := uint16(ex.c.region.Counters().KeyOf(b.ns^addrSalt, a16[:]).A)
	return shm.Quota{Account: acct, Max: b.maxRecords}
}

// declaredTooLarge refuses, before anything of the body is read, a
// request whose idempotency key makes the core read its body and whose
// Content-Length is already over MaxRequestBody: the 413 the read would
// end in.
func (ex *Exchange) declaredTooLarge() (Verdict, bool) {
	b := ex.matchBlock()
	if b == nil {
		return Pass, false
	}
	if _, lines := ex.req.Header(b.header); lines == 0 {
		return Pass, false
	}
	cl, n := ex.req.Header("Content-Length")
	if n != 1 {
		return Pass, false
	}
	if size, err := strconv.ParseInt(cl, 10, 64); err != nil || size <= ex.c.maxReq {
		return Pass, false
	}
	ex.c.row.Add(metrics.IdempotencyRequests, metrics.IdemInvalid, 1)
	return ex.idemProblem(b, problemTooLarge)
}

// releaseIdem lets go of a reservation never completed (the application
// panicked, the engine gave up), so that the retry runs.
func (ex *Exchange) releaseIdem() {
	ex.c.region.Responses().Release(ex.idem.tk)
	ex.c.row.Add(metrics.IdempotencyCompletions, metrics.IdemReleased, 1)
}

// matchBlock returns the first block whose route covers the request.
func (ex *Exchange) matchBlock() *block {
	if len(ex.c.blocks) == 0 {
		return nil
	}
	for _, b := range ex.c.blocks {
		if ex.matchRoute(&b.route) {
			return b
		}
	}
	return nil
}

// reserve answers a keyed request: it reserves k (Pass), replays the
// stored response, or refuses; a duplicate of an original in flight waits
// for it and looks again.
func (ex *Exchange) reserve(b *block, k shm.Key, q, addr shm.Quota, fp idemFP) (Verdict, bool) {
	c, tab := ex.c, ex.c.region.Responses()
	var deadline time.Time
	for waited := false; ; {
		use := fp.now
		if fp.old {
			use = fp.legacy
		}
		out, tk, err := tab.Begin(k, q, addr, use, c.now(), &ex.idem.stored)
		switch {
		case errors.Is(err, shm.ErrQuota):
			// This client holds its maximum of records: it waits, others
			// are unaffected.
			c.row.Add(metrics.IdempotencyRequests, metrics.IdemCapped, 1)
			return ex.idemProblem(b, problemCapped)
		case errors.Is(err, shm.ErrAddrQuota):
			// So does its address, whatever keys it sends.
			c.row.Add(metrics.IdempotencyRequests, metrics.IdemCapped, 1)
			return ex.idemProblem(b, problemAddrCapped)
		}
		if err != nil {
			// ErrFull, ErrLockTimeout and ErrRetired (this worker was
			// reaped while it runs) are the table's to say; anything else
			// (a region without a response table or identity) New rules
			// out. Either way: no reservation, no execution.
			if !errors.Is(err, shm.ErrFull) && !errors.Is(err, shm.ErrLockTimeout) && !errors.Is(err, shm.ErrRetired) {
				c.logger().LogAttrs(context.Background(), slog.LevelError, "idempotency: reservation refused", slog.String("err", err.Error()))
			}
			c.row.Add(metrics.IdempotencyRequests, metrics.IdemFull, 1)
			return ex.idemProblem(b, problemUnavailable)
		}
		switch out {
		case shm.Reserved:
			if fp.old {
				// The record the legacy fingerprint was tried for is
				// gone: this one is stored under today's.
				tab.Release(tk)
				fp.old = false
				continue
			}
			c.row.Add(metrics.IdempotencyRequests, metrics.IdemExecuted, 1)
			ex.idem.blk, ex.idem.tk, ex.idem.reserved = b, tk, true
			return Pass, true
		case shm.Replay:
			c.row.Add(metrics.IdempotencyRequests, metrics.IdemReplayed, 1)
			return ex.replay()
		case shm.Mismatch:
			if !fp.tried && fp.legacy != fp.now {
				fp.old, fp.tried = true, true
				continue
			}
			c.row.Add(metrics.IdempotencyRequests, metrics.IdemMismatch, 1)
			return ex.idemProblem(b, problemMismatch)
		case shm.Unreplayable:
			c.row.Add(metrics.IdempotencyRequests, metrics.IdemConflict, 1)
			return ex.idemProblem(b, problemUnreplayable)
		case shm.InFlight:
			if ex.giveUp {
				// No goroutine was free to wait (GiveUpWait): as if the
				// wait had run out.
				c.row.Add(metrics.IdempotencyRequests, metrics.IdemConflict, 1)
				return ex.idemProblem(b, problemInFlight)
			}
			if ex.nowait {
				// Nothing is held yet: the wait is made elsewhere
				// (reserveAgain), from a fresh look at the table.
				ex.idem.wait = idemWait{b: b, k: k, q: q, addr: addr, fp: fp}
				ex.step = stepIdempotencyWait
				return Wait, false
			}
			if !waited {
				waited, deadline = true, time.Now().Add(b.wait)
				if b.wait > 0 {
					c.row.Add(metrics.IdempotencyWaits, 0, 1)
				}
			}
			left := time.Until(deadline)
			if left <= 0 {
				c.row.Add(metrics.IdempotencyRequests, metrics.IdemConflict, 1)
				return ex.idemProblem(b, problemInFlight)
			}
			if ex.req.Gone() {
				// The client went away: nobody to answer. A response is
				// still needed to end the exchange; it is never read, so
				// it is no conflict: counted and logged as 499, as a
				// client gone while the application has its request,
				// and counted as gone.
				c.row.Add(metrics.IdempotencyRequests, metrics.IdemGone, 1)
				v, ok := ex.idemProblem(b, problemInFlight)
				ex.status, ex.gone = StatusClientClosed, true
				return v, ok
			}
			tab.Wait(tk, min(left, waitSlice))
		default:
			panic(fmt.Sprintf("core: unknown reservation outcome %d", out))
		}
	}
}

// reserveAgain is reserve for a duplicate that NoWait stopped: it looks
// again, and waits this time.
func (ex *Exchange) reserveAgain() (Verdict, bool) {
	w := &ex.idem.wait
	return ex.reserve(w.b, w.k, w.q, w.addr, w.fp)
}

// completeIdem stores a reserved idempotency key's response for replay,
// records it as not replayable, or releases the reservation so that a
// retry runs again (5xx, 408, 429, or no whole response).
func (ex *Exchange) completeIdem(rec *recorded) {
	if !ex.idem.reserved {
		return
	}
	ex.idem.reserved = false
	c, b, tab := ex.c, ex.idem.blk, ex.c.region.Responses()
	keep, replayable := storable(rec)
	if !keep {
		tab.Release(ex.idem.tk)
		c.row.Add(metrics.IdempotencyCompletions, metrics.IdemReleased, 1)
		return
	}
	var resp *shm.Response
	if replayable {
		resp = &shm.Response{Status: rec.Status, ContentType: rec.ContentType, Location: rec.Location,
			ContentEncoding: rec.ContentEncoding, Body: rec.Body}
	}
	stored, err := tab.Complete(ex.idem.tk, resp, c.now(), b.ttl)
	switch {
	case err != nil:
		// The reservation was lost (this worker was reaped meanwhile):
		// the key is free again, as after a release.
		c.row.Add(metrics.IdempotencyCompletions, metrics.IdemReleased, 1)
		c.logger().LogAttrs(context.Background(), slog.LevelWarn, "idempotency: response not stored", slog.String("err", err.Error()))
	case stored:
		c.row.Add(metrics.IdempotencyCompletions, metrics.IdemStored, 1)
		c.row.Observe(metrics.IdempotencyStoredBytes, uint64(len(rec.Body)+len(rec.ContentType)+len(rec.Location)+len(rec.ContentEncoding)))
	default:
		c.row.Add(metrics.IdempotencyCompletions, metrics.IdemUnreplayable, 1)
	}
}

// storable says what becomes of a reservation once the application has
// answered: keep is false for the statuses a client is meant to retry
// (5xx, 408, 429) and for no whole response, whose reservation is released
// so that the retry runs; a kept response is replayable unless it went
// over max_body, the connection was hijacked (what was sent is unknown)
// or the final status was 101.
func storable(rec *recorded) (keep, replayable bool) {
	switch s := rec.Status; {
	case rec.Failed:
		return false, false
	case rec.Hijacked:
		return true, false
	case s >= 500, s == http.StatusRequestTimeout, s == http.StatusTooManyRequests:
		return false, false
	case rec.Overflow, s < 200:
		return true, false
	}
	return true, true
}

// replay answers with the stored response: status, Content-Type, Location,
// Content-Encoding (without which the body cannot be read) and the body,
// byte for byte, and Idempotent-Replayed: true. A field the response was
// stored without is replayed without.
func (ex *Exchange) replay() (Verdict, bool) {
	s := &ex.idem.stored
	for _, f := range [...]struct{ name, value string }{
		{"Content-Type", s.ContentType}, {"Location", s.Location}, {"Content-Encoding", s.ContentEncoding},
	} {
		if f.value != "" {
			ex.addField(f.name, func(b []byte) []byte { return append(b, f.value...) })
		}
	}
	ex.fields = append(ex.fields, Field{"Idempotent-Replayed", valTrue})
	var body []byte
	// A HEAD's original had no body, so none was stored: its length is
	// not known, and a HEAD answer carries either the length a GET would
	// have had or none (RFC 9110 §8.6), never the empty body's 0.
	if BodyAllowed(s.Status) && ex.req.Method() != http.MethodHead {
		body = s.Body
		ex.addField(fieldLength, func(b []byte) []byte { return strconv.AppendInt(b, int64(len(body)), 10) })
	}
	ex.resp = Response{Status: s.Status, Fields: ex.fields, Body: body}
	return Respond, true
}

var valTrue = []byte("true")

// BodyAllowed reports whether a response with status may have a body.
func BodyAllowed(status int) bool {
	return !(status >= 100 && status < 200 || status == http.StatusNoContent || status == http.StatusNotModified)
}

// hostBound is the fingerprint of a request with a Host: the SHA-256 of
// its host name (ASCII lower case: host names are case-insensitive) and
// of fp, the fingerprint of the rest. The host is what tells one
// application's tenants apart (a.example and b.example behind one
// upstream): the same key and body sent to another is another request,
// never answered with the first one's response. The port is not: the
// operation is the client's whichever listener it reached (cleartext or
// TLS). A request without a Host keeps fp.
func (ex *Exchange) hostBound(fp shm.Fingerprint) shm.Fingerprint {
	host, n := ex.req.Header("Host")
	if n == 0 {
		return fp
	}
	host = hostName(host)
	var buf [320]byte
	b := appendField(buf[:0], "Host")
	b = binary.BigEndian.AppendUint64(b, uint64(len(host)))
	for i := 0; i < len(host); i++ {
		c := host[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		b = append(b, c)
	}
	return sha256.Sum256(append(b, fp[:]...))
}

// fingerprint is the SHA-256 of the method, the path (as forwarded: two
// spellings of one path are one request to the application), the query,
// the Content-Type, the override fields by which the application runs
// the request as another method or path (methodOverrides,
// pathOverrides: a POST that says X-HTTP-Method-Override: PATCH is a
// PATCH to it) and the body, each prefixed with its length, so that
// no two different requests can be made to hash the same fields by
// shifting a boundary. Content-Type is in it (every line: the
// application may read another than the first) because the same bytes
// sent as JSON and as a form are two different requests. An override
// field sent, or a second Content-Type line, adds its name and lines; a
// request without one hashes as it did before they were in it, so that
// records stored then still replay.
func (ex *Exchange) fingerprint(body []byte) shm.Fingerprint {
	var buf [512]byte
	ct, n := ex.req.Header("Content-Type")
	b := appendField(buf[:0], ex.req.Method())
	b = appendField(b, ex.forward)
	b = appendField(b, ex.req.Query())
	b = appendField(b, ct)
	if n > 1 {
		// Every line reaches the application, which may read another
		// than the first (Puma and gunicorn join them).
		b = appendLines(b, "Content-Type", ex.req.HeaderLines("Content-Type", ex.lines[:0])[1:])
	}
	for _, names := range [...][]string{methodOverrides[:], pathOverrides[:]} {
		for _, name := range names {
			if lines := ex.req.HeaderLines(name, ex.lines[:0]); len(lines) > 0 {
				b = appendLines(b, name, lines)
			}
		}
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

// appendLines appends the field name, the number of lines and each line,
// each string prefixed with its length.
func appendLines(b []byte, name string, lines []string) []byte {
	b = appendField(b, name)
	b = binary.BigEndian.AppendUint64(b, uint64(len(lines)))
	for _, v := range lines {
		b = appendField(b, v)
	}
	return b
}

// problemKind is an answer the idempotency stage gives instead of the
// application's.
type problemKind uint8

const (
	problemNone problemKind = iota
	problemMissing
	problemEmpty
	problemTooLong
	problemControl
	problemRepeated
	problemMalformed
	problemUnreadable
	problemBodyTimeout
	problemTooLarge
	problemMismatch
	problemInFlight
	problemUnreplayable
	problemUnavailable
	problemCapped
	problemAddrCapped
	nProblems
)

func keyProblemKind(p keyProblem) problemKind {
	switch p {
	case keyMissing:
		return problemMissing
	case keyEmpty:
		return problemEmpty
	case keyTooLong:
		return problemTooLong
	case keyControl:
		return problemControl
	case keyRepeated:
		return problemRepeated
	}
	return problemMalformed
}

// newIdemProblem is one of a block's answers, made once per block. Its
// detail says what is wrong with the request, never anything about the
// table or the worker.
func newIdemProblem(p problemKind, b *block, maxReq int64) Problem {
	header := b.header
	status, retry, detail := http.StatusBadRequest, 0, ""
	switch p {
	case problemNone:
		return Problem{}
	case problemMissing:
		detail = "this request needs the " + header + " header"
	case problemEmpty:
		detail = "the " + header + " header is empty"
	case problemTooLong:
		detail = "the " + header + " is longer than " + strconv.Itoa(MaxKeyLen) + " bytes"
	case problemControl:
		detail = "the " + header + " contains control characters"
	case problemRepeated:
		detail = "send exactly one " + header + " header, with one key"
	case problemMalformed:
		detail = "the " + header + ` must be a quoted string ("...") or a token`
	case problemUnreadable:
		detail = "the request body could not be read"
	case problemBodyTimeout:
		status = http.StatusRequestTimeout
		detail = "the request body did not arrive in time"
	case problemTooLarge:
		status = http.StatusRequestEntityTooLarge
		detail = "a request with the " + header + " header may have a body of at most " + strconv.FormatInt(maxReq, 10) + " bytes"
	case problemMismatch:
		status = http.StatusUnprocessableEntity
		detail = "this " + header + " was already used for a request with another method, host, path, query, content type or body"
	case problemInFlight:
		status, retry = http.StatusConflict, retryInFlight
		detail = "a request with this " + header + " is still being processed; retry later"
	case problemUnreplayable:
		status = http.StatusConflict
		detail = "a request with this " + header + " was already processed, and its response cannot be sent again"
	case problemUnavailable:
		status, retry = http.StatusServiceUnavailable, retryFull
		detail = "this request cannot be made idempotent right now; retry in " + strconv.Itoa(retryFull) + " second"
	case problemCapped, problemAddrCapped:
		status = http.StatusTooManyRequests
		retry = int(min(int64(retryCapped), int64((b.ttl+time.Second-1)/time.Second)))
		who := "you have "
		if p == problemAddrCapped {
			who = "your address has "
		}
		detail = who + strconv.Itoa(b.maxRecords) + " requests with an " + header +
			" in progress or stored, the most allowed; retry in " + strconv.Itoa(retry) + " seconds"
		return Problem{Status: status, Type: problemQuotaExceeded, Detail: detail, RetryAfter: int64(retry)}
	}
	return Problem{Status: status, Detail: detail, RetryAfter: int64(retry)}
}

// idemProblem answers with b's problem p.
func (ex *Exchange) idemProblem(b *block, p problemKind) (Verdict, bool) {
	// A body that could not be read whole leaves the rest of it on the
	// connection, where no next request may be read from: it closes.
	return ex.respond(&b.problems[p], p == problemUnreadable || p == problemBodyTimeout)
}
