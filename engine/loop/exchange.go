//go:build linux

package loop

import (
	"errors"

	"github.com/preforkd/preforkd/core"
	"github.com/preforkd/preforkd/engine"
)

// A request's way through the core (the protocol of core/run.go): begun
// on its loop, decided there unless the core must wait (then a waiter
// finishes the decision and hands the request back), then answered by
// the core, the application, or the upstream.

// startRequest begins the request whose whole head is p.
func (c *conn) startRequest(p []byte) {
	l := c.l
	r := l.getRequest(c)
	r.peer = c.peer
	r.buf = append(l.getBuf(len(p)), p...)
	c.r = r
	c.setState(csBusy)
	c.clearRead() // the head is whole; a body has a wait of its own
	bad := r.h.parse(r.buf)
	r.body.start(&r.h)
	if bad != nil {
		c.refuse(bad)
		return
	}
	if r.h.close {
		c.closeAfter = true
	}
	if r.h.asterisk {
		r.answerOptions()
		return
	}
	r.begin()
}

// begin starts the request's exchange and decides its head.
func (r *request) begin() {
	r.ex = r.l.s.o.Core.Begin(r)
	r.begun = true
	r.ex.NoWait(true)
	r.phase = phHead
	r.afterHead(r.ex.DecideHead())
}

// afterHead goes on from DecideHead's verdict.
func (r *request) afterHead(v core.Verdict) {
	if r.settled(v) {
		return
	}
	if max, ok := r.ex.WantsBody(); ok && !r.body.done {
		// The core fingerprints the body: it is read first, so that
		// Decide does not wait for it.
		r.phase = phCoreBody
		r.takeBody(sinkKeep, int(min(max+1, int64(maxInt))))
		return
	}
	r.decide()
}

// settled reports whether verdict v leaves nothing more to do here: the
// request waits (the waiters resume it), or the core answered it.
func (r *request) settled(v core.Verdict) bool {
	switch v {
	case core.Wait:
		if !r.ex.LongWait() {
			r.l.s.waiters.submit(r)
			return true
		}
		if r.l.s.long.trySubmit(r) {
			return true
		}
		// Every waiter for other requests is busy (clients that hold
		// them all, with duplicates of their own requests left in
		// flight): the wait ends at once, never in turn behind theirs.
		r.ex.GiveUpWait()
		if r.phase == phHead {
			r.afterHead(r.ex.DecideHead())
		} else {
			r.afterDecide(r.ex.Decide())
		}
		return true
	case core.Respond:
		r.respondCore(r.ex.Response())
		return true
	}
	return false
}

// decide runs the stages that need more than the head.
func (r *request) decide() {
	r.phase = phDecide
	r.afterDecide(r.ex.Decide())
}

// afterDecide goes on from Decide's verdict.
func (r *request) afterDecide(v core.Verdict) {
	if r.settled(v) {
		return
	}
	r.fwd = r.ex.Forward()
	if r.l.s.o.App != nil {
		r.phase = phAppBody
		if r.body.done {
			r.runApp()
			return
		}
		r.takeBody(sinkKeep, maxAppBody+1)
		return
	}
	r.phase = phReadAhead
	if r.body.done {
		r.sendUpstream()
		return
	}
	r.takeBody(sinkKeep, readAheadBytes)
}

// resume goes on with a request a waiter decided (a loop task).
func (l *loop) resume(arg any) error {
	r := arg.(*request)
	r.waiting = false
	if r.c == nil {
		// The client went away meanwhile: nobody to answer.
		r.finish(errClientGone)
		return nil
	}
	r.ex.NoWait(true)
	c := r.c
	if r.phase == phHead {
		r.afterHead(r.verdict)
	} else {
		r.afterDecide(r.verdict)
	}
	if c.state != csClosed && c.r == nil && c.inLen() > 0 && !c.processing {
		c.process(nil)
	}
	return nil
}

// waitDecision finishes a decision that must wait, on a waiter's
// goroutine: nothing of the loop is touched but through its queue.
func (r *request) waitDecision() {
	r.ex.NoWait(false)
	if r.phase == phHead {
		r.verdict = r.ex.DecideHead()
	} else {
		r.verdict = r.ex.Decide()
	}
}

// takeBody lets the body's bytes go to sink, up to limit when kept.
func (r *request) takeBody(sink uint8, limit int) {
	c := r.c
	b := &r.body
	b.sink, b.limit = sink, limit
	if b.err != nil {
		// The body failed while the request waited for its decision (the
		// client ended it early or went away): nothing more will come,
		// and nothing would wake the request.
		r.bodyFailed(b.err)
		return
	}
	if b.expect {
		b.expect = false
		c.write(continue100)
	}
	c.setRead(r.l.s.o.limits.ClientBodyTimeout)
	if !c.processing && c.inLen() > 0 {
		c.process(nil)
		return
	}
	if !c.processing {
		c.checkInput()
	}
}

var continue100 = []byte("HTTP/1.1 100 Continue\r\n\r\n")

// bodyProgress goes on once body bytes were taken.
func (r *request) bodyProgress() {
	b := &r.body
	c := r.c
	if b.err != nil {
		r.bodyFailed(b.err)
		return
	}
	if c != nil {
		// While the upstream has highWater queued, the client is not
		// read: the wait is the upstream's (upstream_timeout), not the
		// client's.
		if b.taking() && !r.upstreamFull() {
			c.setRead(r.l.s.o.limits.ClientBodyTimeout)
			if u := r.up; u != nil && b.sink == sinkUpstream && u.state == upBusy && !u.headDone && u.backlog() == 0 {
				// The upstream took all it was sent: the wait is the
				// client's alone, and the upstream's clock stops until
				// the next bytes go (flush arms it).
				r.l.wheel.disarm(&u.t)
			}
		} else {
			c.clearRead()
		}
	}
	full := b.sink == sinkKeep && len(b.buf) >= b.limit
	switch {
	case b.sink == sinkDiscard:
		if b.done {
			b.sink = sinkNone
			r.done()
		}
	case r.phase == phCoreBody && (b.done || full):
		b.sink = sinkNone
		r.decide()
	case r.phase == phAppBody && b.done:
		b.sink = sinkNone
		r.runApp()
	case r.phase == phAppBody && full:
		b.sink = sinkNone
		r.refuseAfter(engine.ErrBodyTooLong)
	case r.phase == phReadAhead && (b.done || full):
		b.sink = sinkNone
		r.sendUpstream()
	case b.sink == sinkUpstream && b.done:
		b.sink = sinkNone
	}
}

// bodyFailed ends a request whose body could not be read: it ended early,
// a chunk was malformed, or it did not arrive in time. The connection
// closes after the answer.
func (r *request) bodyFailed(bad *engine.BadRequest) {
	b := &r.body
	if b.err == nil {
		b.err = bad
	}
	sink := b.sink
	b.sink = sinkNone
	c := r.c
	if c != nil {
		c.closeAfter, c.linger = true, true
		c.clearRead()
	}
	switch {
	case r.phase == phCoreBody:
		r.decide() // the core reads the failure (Request.Body) and answers
	case r.phase == phAppBody, r.phase == phReadAhead:
		r.refuseAfter(bad)
	case sink == sinkUpstream && !r.headSent:
		// The upstream must not take what it got for a whole request.
		if r.up != nil {
			r.up.close()
			r.up = nil
		}
		r.refuseAfter(bad)
	case sink == sinkUpstream:
		if r.up != nil {
			r.up.close()
			r.up = nil
		}
		r.finish(errBodyFailed)
	case sink == sinkDiscard && c != nil:
		c.close(nil)
	}
}

var errBodyFailed = errors.New("loop: the request body could not be read")

// refuseAfter answers a request that passed the core with a problem of
// the server's own, when its body cannot be read.
func (r *request) refuseAfter(bad *engine.BadRequest) {
	r.l.s.count.BadRequests.Add(1)
	r.respondCore(r.ex.Refuse(bad.Status, bad.Detail, bad.CloseConn))
}

// respondCore sends the core's own answer and ends the exchange.
func (r *request) respondCore(resp *core.Response) {
	if c := r.c; c != nil {
		if resp.Close {
			c.closeAfter, c.linger = true, true
		}
		r.settleBody()
		r.writeCore(resp)
		if r.stream != nil {
			c.send()
			r.phase = phStream
			r.pump()
			return
		}
		// Counted and logged before the answer goes, as upConn.end: a
		// client that has it finds it in the access log and the metrics.
		r.endExchange(nil)
		c.send()
	}
	r.finish(nil)
}

// settleBody decides what becomes of a body the answer did not need: a
// short one is read and dropped, so that the connection can serve
// another request; any other ends the connection after the answer (the
// client that waits for 100 Continue never sends it).
func (r *request) settleBody() {
	b := &r.body
	c := r.c
	if b.done || b.err != nil || c.closeAfter {
		return
	}
	if b.mode == bodyLength && b.left <= readAheadBytes && !b.expect {
		return // dropped after the answer (done)
	}
	// Closed with the body unread, the connection would be reset, and a
	// reset can destroy the answer before the client read it: it lingers.
	c.closeAfter, c.linger = true, true
}

// finish ends the exchange (core.Exchange.Finish): err is nil when the
// response reached its end. A stale response the cache served is then
// refreshed in the background.
func (r *request) finish(err error) {
	r.endExchange(err)
	r.phase = phDone
	if r.refresh {
		r.refresh = false
		r.l.s.refreshDone()
	}
	r.done()
}

// endExchange ends the exchange, once (finish's first step, which the
// end of a response takes before its last bytes go).
func (r *request) endExchange(err error) {
	if ex := r.ex; ex != nil {
		r.ex = nil
		if ex.Finish(err) {
			r.l.refresh(r, ex)
		}
	}
}

// done ends a request: its connection goes on with the next one, once
// the rest of a short body was dropped.
func (r *request) done() {
	if r.waiting {
		return // a waiter or a refresh still holds it
	}
	c := r.c
	if c != nil && c.r == r {
		b := &r.body
		if !b.done && b.err == nil && !c.closeAfter && c.state != csClosed {
			b.sink, b.limit = sinkDiscard, 0
			c.setRead(r.l.s.o.limits.ClientBodyTimeout)
			if !c.processing && c.inLen() > 0 {
				c.process(nil)
			} else if !c.processing {
				c.checkInput()
			}
			return // bodyProgress calls done again
		}
		c.endRequest()
	}
	if r.up != nil {
		r.up.close()
		r.up = nil
	}
	r.l.recycle(r)
}

// clientClosed ends what a request was doing for a client that is gone
// (its connection closed). A response the core keeps is still read to its
// end, and stored.
func (r *request) clientClosed(err error) {
	if err != errServerClosed && !errors.Is(err, core.ErrClientGone) {
		err = errors.Join(core.ErrClientGone, err) // a reset, a send timeout
	}
	r.gone.Store(true)
	r.c = nil
	switch {
	case r.waiting:
		// A waiter decides it; resume finishes it.
	case r.keep && (r.phase == phUpstream || r.phase == phRelay) && r.up != nil && r.body.done:
		r.discarded = true
		// Held back while the client's output was full (and its timer
		// with it, the client's send timeout watching): nobody drains
		// that output any more.
		r.up.resumeRead()
	case r.up != nil:
		r.up.close()
		r.up = nil
		r.finish(err)
	case r.ex != nil:
		r.finish(err)
	default:
		r.done()
	}
}

// clientDrained: the client took all the output.
func (r *request) clientDrained() {
	switch {
	case r.up != nil && r.phase == phRelay:
		r.up.resumeRead()
	case r.phase == phStream:
		r.pump()
	}
}

// answerOptions answers OPTIONS *, which asks about the server, not a
// resource: never forwarded.
func (r *request) answerOptions() {
	c := r.c
	l := r.l
	r.settleBody() // first: a body it will not read closes the connection, which the answer says
	dst := appendStatusLine(l.head[:0], 200, nil)
	dst = append(dst, "Allow: GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS\r\nContent-Length: 0\r\n"...)
	dst = append(dst, l.dateLine...)
	dst = r.appendConnection(dst)
	dst = append(dst, "\r\n"...)
	l.head = dst
	r.responded(200)
	l.s.o.Core.Responded(200, 0)
	c.write(dst)
	r.done()
}

const maxInt = int(^uint(0) >> 1)

// sendUpstream sends the request upstream: its head, and its body when it
// was read whole; a longer body streams after it.
func (r *request) sendUpstream() {
	l := r.l
	r.phase = phUpstream
	// Known before the response comes: a client that goes away while the
	// upstream works on a request whose response the core keeps (an
	// idempotency key's) must not cut it, or the key is let go and the
	// retry runs the request again (clientClosed).
	r.keep = r.ex.Keep()
	b := &r.body
	if r.h.upgrade && !b.done {
		r.refuseAfter(engine.ErrUpgradeBody)
		return
	}
	r.streamed = !b.done
	r.ex.Sending()
	// The head sent upstream goes after the client's in the same buffer:
	// one buffer a request.
	r.sent = r.appendHead(r.buf[len(r.buf):], &l.s.o.target)
	var u *upConn
	var err error
	if r.h.upgrade {
		u, err = l.dial() // it will not come back to the pool
	} else {
		u, err = l.pool.get()
	}
	if err != nil {
		l.s.count.UpstreamErrors.Add(1)
		r.respondCore(r.ex.Failed(core.UpstreamConnect, l.s.o.target.Addr, err))
		return
	}
	r.up = u
	u.start(r)
}

// refresh sends a copy of r upstream in the background and tells ex its
// response (core.Exchange.Finish asked for it). The copy is made here,
// before r goes back to its pool; a request with a body is not
// refreshed, nor one served by an application, nor one that arrives while
// the server drains.
func (l *loop) refresh(r *request, ex *core.Exchange) {
	s := l.s
	if s.o.App != nil || r.h.hasBody() || l.draining {
		ex.Finish(core.ErrNoRefresh)
		return
	}
	rr := l.getRequest(nil)
	rr.peer, rr.refresh = r.peer, true
	rr.buf = append(l.getBuf(len(r.h.raw)), r.h.raw...)
	_ = rr.h.parse(rr.buf) // it parsed before
	rr.body.start(&rr.h)
	rr.ex, rr.begun, rr.keep, rr.counted = ex, true, true, true
	rr.fwd = ex.Forward()
	rr.phase = phUpstream
	rr.sent = rr.appendHead(rr.buf[len(rr.buf):], &s.o.target)
	s.refreshes.Add(1)
	u, err := l.pool.get()
	if err != nil {
		s.warn(warnRefresh, "upstream failed a cache refresh", "upstream", s.o.target.Addr, "err", err)
		rr.finish(err)
		return
	}
	rr.up = u
	u.start(rr)
}
