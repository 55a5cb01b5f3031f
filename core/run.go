package core

import (
	"errors"
	"net/http"
	"strings"

	"github.com/preforkd/preforkd/core/httpcache"
)

// The engine's side of an exchange, from the verdict to the end: what it
// sends, what it forwards, and what it tells the core of the
// application's response. The core keeps everything else — the stale
// response sent instead of a failure, what is recorded for a replay or
// the cache, the counts, the release — so that every engine runs a
// request the same way:
//
//	ex := c.Begin(req)
//	if ex.Decide() == core.Respond {
//		send(ex.Response())
//	} else {
//		fwd := ex.Forward() // the path, and the fields to drop and add
//		// ...read ahead what of the body goes with the head...
//		ex.Sending() // the upstream time starts
//		// ...send the request to the application...
//		switch {
//		case it gave no response:
//			send(ex.Failed(kind, upstream, err))
//		case ex.Head(status, header) != nil:
//			send that instead, discarding the application's
//		default:
//			send its head with ex.Fields() added, and each piece of
//			its body p after ex.Body(p)
//		}
//	}
//	if ex.Finish(err) {
//		// the exchange lives on for a background refresh: forward a
//		// copy of the request (no body) the same way, to nobody, then
//		// ex.Finish once more
//	}
//
// An engine that must never block (an event loop) decides the same way
// with two additions. It calls ex.NoWait(true) after Begin: DecideHead
// and Decide then return Wait where they would wait (a Redis rule's round
// trip, a duplicate of a request in flight, a cache miss another request
// is fetching), and the engine calls the same method again from a
// goroutine that may block, which goes on where the first call stopped.
// And before Decide, when ex.WantsBody() says the core will read the body
// (an idempotency fingerprint), it reads the body into memory first (up
// to the max given and one byte more), so that Request.Body answers at
// once:
//
//	ex := c.Begin(req)
//	ex.NoWait(true)
//	v := ex.DecideHead() // before 100 Continue
//	if v == core.Pass {
//		if max, ok := ex.WantsBody(); ok {
//			// read the body, up to max+1 bytes
//		}
//		v = ex.Decide()
//	}
//	if v == core.Wait {
//		// elsewhere: ex.NoWait(false); v = ex.Decide() (or DecideHead)
//	}

// Header is a response's header section as an engine holds it.
type Header interface {
	// Each calls f with the name and the value of every field line, in
	// order; the slices are valid during the call only.
	Each(f func(name, value []byte))
}

// Forward is how the engine forwards a request that passed.
type Forward struct {
	// Path is the path to forward: the request's, with dot segments
	// removed and slashes merged; everything else goes as sent.
	Path string
	// Drop are the fields of the request not to forward (canonical
	// names): a cache fill's conditional and range fields, since what it
	// stores must be whole; the reset header (reset.go).
	Drop []string
	// Add are fields the core adds to the forwarded request, in place of
	// any the client sent with the same name (Dropped reports those too):
	// the request id it made, and the validators of the stale response a
	// cache fill revalidates (If-None-Match, If-Modified-Since). Their
	// values alias the exchange's memory, like Field's.
	Add []Field
	// Hide are the fields of the application's response not to send on
	// (canonical names): the cache's own targeted field, which speaks to
	// this cache alone, and the reset header, which is for the core alone
	// (reset.go). The engine drops them from the head it sends.
	Hide []string
}

// Hidden reports whether the response field called name (in any case)
// is one of Hide.
func (f *Forward) Hidden(name string) bool {
	for _, h := range f.Hide {
		if strings.EqualFold(h, name) {
			return true
		}
	}
	return false
}

// Dropped reports whether the field called name (in any case) is one of
// Drop, or one of Add (whose value replaces the client's).
func (f *Forward) Dropped(name string) bool {
	for _, d := range f.Drop {
		if strings.EqualFold(d, name) {
			return true
		}
	}
	for i := range f.Add {
		if strings.EqualFold(f.Add[i].Name, name) {
			return true
		}
	}
	return false
}

// Forward is how to forward the request, once Decide let it pass.
func (ex *Exchange) Forward() Forward {
	ex.forwarded()
	f := Forward{Path: ex.forward, Add: ex.fwdAdd}
	if ex.cache.blk != nil {
		f = ex.c.cache.forward(ex, f)
	}
	ex.forwardReset(&f)
	return f
}

// Keep reports whether the application's response must be read to its end
// even when the client has gone away: it is stored for the client's retry
// (an idempotency key), or for the cache. One that outgrew its max_body
// is not kept any more: nothing of it will be stored, and an idempotency
// key's is then unreplayable whether its end comes or not (the
// application ran the request: a retry gets 409). An engine asks again as
// the body comes.
func (ex *Exchange) Keep() bool {
	max, ok := ex.record()
	return ok && max > 0 && !ex.rec.Overflow
}

// Head tells the core the final status and header section of the
// application's response (a 101 included), before any of it is sent. It
// returns what to send instead, or nil: a stored response that
// stale-if-error lets the cache serve in place of a 500, 502, 503 or 504,
// or the stored response a 304 to the cache's revalidation refreshed.
// With a replacement, the application's response is neither sent nor
// read further; without one, the engine sends it with Fields added.
func (ex *Exchange) Head(status int, h Header) *Response {
	ex.answered()
	ex.status = status
	ex.applicationReset(h)
	if ex.cache.blk != nil {
		if r := ex.c.cache.head(ex, status, h); r != nil {
			ex.status = r.Status
			return r
		}
	}
	max, ok := ex.record()
	if !ok {
		return nil
	}
	ex.recording, ex.recMax = true, max
	ex.rec.Status = status
	ex.rec.Hijacked = status == http.StatusSwitchingProtocols
	if h != nil {
		h.Each(ex.recordField)
	}
	return nil
}

// Stray tells the core that the upstream sent bytes past the end of the
// response Head was told of, when Finish will not be told so
// (engine.ErrRespStray): a 304 to the cache's revalidation, which the
// refreshed entry replaced. Its framing cannot be trusted: nothing of it
// is stored, the entry's refresh included.
func (ex *Exchange) Stray() { ex.stray = true }

// recordField keeps a field line of a recorded response.
func (ex *Exchange) recordField(name, value []byte) {
	if ex.c.isResetField(name) {
		return // never sent: never replayed
	}
	f := httpcache.Field{Name: string(name), Value: append([]byte(nil), value...)}
	ex.rec.Header = append(ex.rec.Header, f)
	switch {
	case ex.rec.ContentType == "" && strings.EqualFold(f.Name, "Content-Type"):
		ex.rec.ContentType = string(value)
	case ex.rec.Location == "" && strings.EqualFold(f.Name, "Location"):
		ex.rec.Location = string(value)
	case strings.EqualFold(f.Name, "Content-Encoding"):
		// Codings applied in order may come in several lines (RFC 9110
		// §8.4): one list.
		if ex.rec.ContentEncoding != "" {
			ex.rec.ContentEncoding += ", "
		}
		ex.rec.ContentEncoding += string(value)
	}
}

// Body tells the core a piece of the response body as it is sent (or, in
// a background refresh, read). Only what the core records is kept.
func (ex *Exchange) Body(p []byte) {
	ex.sent += int64(len(p))
	if !ex.recording || ex.rec.Overflow {
		return
	}
	if int64(len(ex.rec.Body)+len(p)) > ex.recMax {
		ex.rec.Overflow, ex.rec.Body = true, nil
		if ex.cache.flags&cFill != 0 {
			// Not to be stored: the fill ends now, and its lock goes,
			// not when the body ends (a stream may never end).
			ex.c.cache.complete(ex, &ex.rec)
		}
		return
	}
	ex.rec.Body = append(ex.rec.Body, p...)
}

// Failed is the answer to a request the application gave no response to:
// kind says how it failed (counted, and logged at most once a second per
// kind across all workers), upstream is its address for the log. The
// answer is a stale response the cache may serve instead, or a problem:
// 504 for a timeout, else 502.
func (ex *Exchange) Failed(kind UpstreamError, upstream string, err error) *Response {
	ex.answered()
	ex.c.upstreamFailed(kind, upstream, err, ex.rid)
	status, detail := http.StatusBadGateway, "the application gave no valid response"
	switch kind {
	case UpstreamConnect:
		detail = "the application is unreachable"
	case UpstreamTimeout:
		status, detail = http.StatusGatewayTimeout, "the application did not answer in time"
	}
	ex.rec.Failed = true
	if ex.cache.blk != nil {
		if fb := ex.c.cache.fallback(ex, status); fb != nil {
			ex.status = fb.Status
			return fb
		}
	}
	return ex.Refuse(status, detail, false)
}

// Refuse is the engine's own problem answer to a request that passed,
// when it cannot go on with it (its body could not be read, say), with
// the core's fields; close asks for the connection to be closed after it.
// The application's response, if any began, is not sent.
func (ex *Exchange) Refuse(status int, detail string, close bool) *Response {
	ex.rec.Failed = true
	ex.status = status
	ex.respond(&Problem{Status: status, Detail: detail}, close)
	return &ex.resp
}

// ErrNoRefresh is what an engine gives Finish when it does not make the
// refresh the previous Finish asked for: the exchange then ends.
var ErrNoRefresh = errors.New("core: refresh not made")

// ErrClientGone is what an engine gives Finish (wrapped or not) when the
// client's connection ended under its request: the client went away, or
// the server cut it (a drain past its deadline). One that ended before
// any response began is counted and logged as StatusClientClosed, as
// nginx logs 499: no response was sent, and it is no server error (which
// a canary judges).
var ErrClientGone = errors.New("core: the client went away")

// StatusClientClosed is the status counted and logged for a request
// whose client went away before its response began (nginx's 499).
const StatusClientClosed = 499

// Finish ends the exchange: err is nil when the response reached its end
// (it was sent whole, or in a refresh, read whole), else why not. What was
// recorded is stored or let go; the response sent to the client is
// counted once, with its status and its duration from Begin.
//
// Finish reports true when the exchange lives on for a background refresh
// of the stale response just sent (stale-while-revalidate): the engine
// forwards a copy of the request, without its body, as Forward says,
// tells Head and Body what comes back as above, and calls Finish again;
// an engine that will not (a request with a body, a server shutting down)
// calls Finish(ErrNoRefresh) at once. The request view is not read during
// a refresh: the engine may reuse its memory once it made the copy.
// After Finish reports false, the Exchange must not be used.
func (ex *Exchange) Finish(err error) (refresh bool) {
	ex.answered() // no head came: the upstream time ends here
	if ex.refreshing {
		ex.completeRecorded(err)
		ex.release()
		return false
	}
	if ex.status == 0 {
		ex.status = ex.resp.Status // a Respond answer
	}
	if ex.status == 0 && errors.Is(err, ErrClientGone) {
		ex.status = StatusClientClosed
	}
	if ex.status == 0 {
		// Passed, and the engine was never told of a response (the
		// application panicked before it wrote one): the client got
		// none, which is a server error.
		ex.status = http.StatusInternalServerError
	}
	if ex.passed {
		ex.completeRecorded(err)
	}
	if !ex.counted {
		ex.counted = true
		elapsed := ex.c.now() - ex.now
		ex.countStream()
		if !ex.probe {
			// A load balancer's probes are no traffic: they would pass a
			// canary's min_requests alone, and their 503s from a
			// retiring worker would count as the fleet's errors.
			ex.c.Responded(ex.status, elapsed)
		}
		if ex.c.access != nil {
			ex.logAccess(elapsed)
		}
	}
	if ex.cache.flags&cRefresh != 0 {
		// The stale response was sent; its fill lock is held for the
		// refresh.
		ex.releaseStream()
		ex.refreshing = true
		ex.rec = recorded{}
		ex.recording, ex.stray = false, false
		// The fields sent were the stale response's: none is added to
		// the refresh's response, and none of its own is the core's.
		ex.fields = ex.fields[:0]
		return true
	}
	ex.release()
	return false
}

// RefreshBy starts, once Finish reported true, the background refresh by
// by, whose method Refresh(*Exchange) makes it as Finish says. Reached
// so, through the response cache (the one stage that asks for a
// refresh), an engine's refresh code is linked only into a program that
// caches. It reports false when by has no such method, or there is no
// refresh to make: the engine then calls Finish(ErrNoRefresh).
func (ex *Exchange) RefreshBy(by any) bool {
	return ex.refreshing && ex.c.cache != nil && ex.c.cache.refresh(ex, by)
}

// completeRecorded gives the core's stages what was recorded, once.
func (ex *Exchange) completeRecorded(err error) {
	if _, ok := ex.record(); !ok {
		return
	}
	if err != nil && !ex.rec.Overflow || !ex.recording && !ex.rec.Failed {
		// No whole response: nothing of it can be stored, and a
		// reservation is let go for the retry. (One that had outgrown
		// max_body was not to be stored: its end, read or cut once the
		// client was gone, changes nothing; Keep.)
		ex.rec.Failed = true
	}
	if err != nil || ex.stray {
		// Nor the fields of a 304 that refreshed the stored entry: bytes
		// came past it (Stray), or its exchange failed.
		ex.cache.flags &^= cRefreshed
	}
	if ex.rec.Status == 0 {
		ex.rec.Status = ex.status
	}
	// What the stages recorded for: a reserved idempotency key's response,
	// a cache fill's, or a successful unsafe request that invalidates the
	// cached responses of its URL.
	if ex.idem.reserved {
		ex.c.idem.complete(ex, &ex.rec)
	}
	if ex.cache.blk != nil {
		ex.c.cache.complete(ex, &ex.rec)
	}
}

// Gone reports whether the core found, as it decided, that the client
// went away (its body could not be read, or it left while its request
// waited): the Respond answer is for nobody, and the engine sends nothing
// and calls Finish(ErrClientGone). Not a 499 the upstream sent, which a
// cache may serve like any status.
func (ex *Exchange) Gone() bool { return ex.gone }

// Status is the status of the response sent to the client, as far as the
// core knows it (0 before Head, Failed, Refuse or a Respond verdict).
func (ex *Exchange) Status() int {
	if ex.status == 0 {
		return ex.resp.Status
	}
	return ex.status
}
