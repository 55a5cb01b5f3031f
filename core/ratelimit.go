package core

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/preforkd/preforkd/bucket"
	"github.com/preforkd/preforkd/clientip"
	"github.com/preforkd/preforkd/metrics"
	"github.com/preforkd/preforkd/shm"
)

// The rate-limit stage. Every rule whose route matches counts the request;
// it is refused if any enforcing rule refuses it, and a refused request is
// charged to no rule (see charge).

// rateState is the rate-limit stage's part of an exchange.
type rateState struct {
	hits    []hit
	hitBuf  [inlineHits]hit
	refusal Refusal
	// refusalBuf holds refusal.Fields: the rate-limit fields and
	// Retry-After, as many as one rule sends.
	refusalBuf [6]Field
	remotes    int // hits of Redis rules
	rhits      []SharedHit
	rhitBuf    [inlineHits]SharedHit
}

// hit is one rule matching the request being decided.
type hit struct {
	r       *rule
	v       *variant // the limit that applies to this request's key
	key     shm.Key  // in the host's table (a local rule, a Redis rule's local share)
	rk      SharedKey
	d       bucket.Decision
	decided bool // d holds a decision (a charge or a peek) for this request
	charged bool // the request is counted in the table: refund it if the request is refused
	refused bool // an enforcing rule that refuses the request
	settled bool // d is final: nothing more to decide for this rule

	// unavailable: Redis could not decide, on_unavailable answered;
	// unknown: nothing is known of the key's state (Redis was not asked,
	// or on_unavailable "open" let it through): no header item.
	unavailable, unknown bool

	// Not comparable: nothing compares hits, and a comparable type that
	// an Exchange holds has its equality function linked into every
	// program (an Exchange goes through an interface, its pool): 1.3 KB.
	_ [0]func()
}

// unavailableClosed reports whether the hit refuses because Redis could
// not decide and its on_unavailable is "closed" (a 503, like a full
// table), as opposed to its local share refusing (a 429 like any rule's).
func (h *hit) unavailableClosed() bool {
	return h.unavailable && h.v.remote != nil && !h.d.Allowed
}

// exact reports whether the hit is decided in Redis (a Redis rule not in
// sync mode, still using Redis).
func (h *hit) exact() bool { return h.v.remote != nil && !h.v.remote.Sync() }

// allow, peek and refund decide a hit on the host's table: a local
// rule's, a sync-mode Redis rule's host count, or a Redis rule's local
// share.
func (h *hit) allow(now time.Duration) bucket.Decision {
	if h.v.remote != nil {
		return h.v.remote.AllowKey(&h.rk, now)
	}
	return h.v.lim.AllowKey(h.key, now)
}

func (h *hit) peek(now time.Duration) bucket.Decision {
	if h.v.remote != nil {
		return h.v.remote.PeekKey(&h.rk, now)
	}
	return h.v.lim.PeekKey(h.key, now)
}

func (h *hit) refund(now time.Duration) {
	if h.v.remote != nil {
		h.v.remote.RefundKey(&h.rk, now)
		return
	}
	h.v.lim.RefundKey(h.key, now)
}

// inlineHits is how many matching rules a request handles without
// allocating.
const inlineHits = 8

// variantOf is the limit that applies to a key made of value for the
// request's client.
func (ex *Exchange) variantOf(ru *rule, value string) *variant {
	if value != "" && ru.byKey != nil {
		if v := ru.byKey[value]; v != nil {
			return v
		}
	}
	if len(ru.overrides) > 0 {
		client := ex.Client()
		for _, v := range ru.overrides {
			if v.clients.Contains(client) {
				return v
			}
		}
	}
	return &ru.base
}

// rateLimit counts the request under every rule that matches it and
// either refuses it (429, or 503 from on_full "closed") or lets it pass
// with the rate-limit headers in the exchange's fields. With NoWait, it
// stops before a Redis round trip (Wait; rateLimitRemote goes on).
func (ex *Exchange) rateLimit() (Verdict, bool) {
	ex.matchRules()
	if len(ex.rl.hits) == 0 {
		return Pass, false
	}
	now := ex.clock()
	if err := ex.keys(); err != nil {
		if re, ok := errors.AsType[*clientip.RepeatedError](err); ok {
			return ex.respond(&Problem{Status: http.StatusBadRequest,
				Detail: "send " + re.What + " at most once"}, false)
		}
		panic("core: unexpected key error: " + err.Error())
	}
	if refusing := ex.charge(now); refusing != nil {
		return ex.refuse(refusing, now)
	}
	if ex.redisPending() {
		if ex.nowait {
			ex.step = stepRedis
			return Wait, false
		}
		return ex.c.steps[stepRedis](ex) // rateLimitRemote, which RedisRules installs
	}
	return ex.rateLimitServed(now)
}

// rateLimitRemote is the rest of rateLimit from its Redis round trip on
// (step 3 of charge).
func (ex *Exchange) rateLimitRemote() (Verdict, bool) {
	now := ex.clock()
	h, cut := ex.chargeRedis(now)
	if cut {
		// Core.Cut: the drain ended the request's connection, so nobody
		// is answered, nor charged.
		ex.refundLocal(now)
		v, ok := ex.respond(&Problem{Status: http.StatusServiceUnavailable}, true)
		ex.status, ex.gone = StatusClientClosed, true
		return v, ok
	}
	if h != nil {
		ex.refundLocal(now)
		return ex.refuse(h, now)
	}
	return ex.rateLimitServed(now)
}

// rateLimitServed charges the shadow rules of a request every enforcing
// rule let through and gives it the rate-limit headers.
func (ex *Exchange) rateLimitServed(now time.Duration) (Verdict, bool) {
	for i := range ex.rl.hits {
		if h := &ex.rl.hits[i]; h.r.shadow && !h.settled && !h.exact() {
			h.d, h.decided, h.settled = h.allow(now), true, true
			h.charged = h.d.Allowed && !h.d.Full
		}
	}
	ex.served(now)
	ex.rateLimitFields()
	return Pass, false
}

// redisPending reports whether a Redis rule is left for the round trip.
func (ex *Exchange) redisPending() bool {
	for i := range ex.rl.hits {
		if h := &ex.rl.hits[i]; h.exact() && !h.settled {
			return true
		}
	}
	return false
}

// matchRules appends a hit for every rule whose route matches the request
// and whose exempt clients do not hold the request's, and counts the
// enforcing ones. An exempt client is never counted, never refused and
// gets no header.
func (ex *Exchange) matchRules() (enforcing int) {
	c := ex.c
	for _, ru := range c.rules {
		if !ex.matchRoute(&ru.route.Route) {
			continue
		}
		if c.exempt.Len() > 0 && c.exempt.Contains(ex.Client()) {
			return 0 // no rule counts this client: nothing matched yet either
		}
		if ru.exempt.Len() > 0 && ru.exempt.Contains(ex.Client()) {
			continue
		}
		ex.rl.hits = append(ex.rl.hits, hit{r: ru})
		if !ru.shadow {
			enforcing++
		}
		if ru.base.remote != nil {
			ex.rl.remotes++
		}
	}
	return enforcing
}

// keys computes each hit's limit and table key. Key bytes are built once
// for consecutive rules with the same `by`.
func (ex *Exchange) keys() error {
	var id []byte
	var value string
	last := -1
	for i := range ex.rl.hits {
		h := &ex.rl.hits[i]
		if h.r.byIdx != last {
			var err error
			if id, value, err = ex.keyOf(h.r); err != nil {
				return err
			}
			last = h.r.byIdx
		}
		h.v = ex.variantOf(h.r, value)
		switch {
		case h.v.remote == nil:
			h.key = h.v.lim.Key(id)
		default:
			h.rk = h.v.remote.Key(id)
			if h.v.fallback != nil {
				h.key = h.v.fallback.lim.Key(id)
			}
		}
	}
	return nil
}

// keyOf makes the key bytes of rule ru for the request, and the value
// an override's key is matched against: its key function's, when it has
// one that gives a usable value, else its by's.
func (ex *Exchange) keyOf(ru *rule) ([]byte, string, error) {
	if ru.keyFunc != nil {
		v := ru.keyFunc(ex.req)
		if id, ok := clientip.AppendFuncKey(ex.keyBuf[:0], v); ok {
			return id, v, nil
		}
	}
	return ru.by.AppendKeyValue(ex.keyBuf[:0], ex.view())
}

// charge counts the request in every matching rule, or in none: it returns
// the hit of the enforcing rule that refuses the request (the one with the
// latest RetryAfter when several do), after undoing any charge it made,
// or nil when the request goes on, its local rules charged; the Redis
// round trip (step 3) and the shadow rules follow (rateLimitRemote,
// rateLimitServed).
//
// The order, for a request that matches local and Redis rules:
//
//  1. Redis rules, with no I/O: a key in the deny cache refuses at once;
//     an open breaker hands every Redis rule to its on_unavailable.
//  2. Local rules (and sync-mode Redis rules, counted on this host):
//     peek, then charge, refunding on a late refusal, as below.
//  3. Redis rules, in one round trip: the script charges them all or
//     none. If it refuses, the local charges of step 2 are refunded.
//
// Local first, because a local charge is undone by a CAS that cannot
// fail, while undoing a Redis charge after a late local refusal would cost
// a second round trip that can fail, leaving every host one request
// short. The price: for the length of one round trip, a request that
// Redis then refuses holds a local charge that a concurrent request may
// see; the deny cache makes that the first refusal of a key per retry
// time. A client that a local rule refuses costs Redis nothing.
//
// Step 2, with two or more enforcing rules: peek at each, so that a
// refusal is known before anything is charged; then charge each. A rule
// can still refuse there when another worker took the last request
// between the peek and the charge; then the charges already made for this
// request are refunded. With a single enforcing rule the peek is skipped:
// its own refusal charges nothing. Shadow rules never refuse, so they are
// charged last, when the request is served.
func (ex *Exchange) charge(now time.Duration) *hit {
	if ex.rl.remotes > 0 {
		if h := ex.c.preRedis(ex, now); h != nil {
			return h
		}
	}
	return ex.chargeLocal(now)
}

// preRedis is what charge does first for a request with Redis rules
// (Core.preRedis, which RedisRules installs): a refusal the deny cache
// holds, or the answer of on_unavailable while the breaker is open.
func (ex *Exchange) preRedis(now time.Duration) *hit {
	if h := ex.denied(now); h != nil {
		return h
	}
	if !ex.c.redis.Available(now) {
		return ex.unavailable(now, false)
	}
	return nil
}

// denied returns the enforcing Redis rule whose key the deny cache holds
// (the latest retry of several), or nil.
func (ex *Exchange) denied(now time.Duration) *hit {
	var refusing *hit
	for i := range ex.rl.hits {
		h := &ex.rl.hits[i]
		if h.r.shadow || !h.exact() {
			continue
		}
		retry, ok := h.v.remote.Denied(&h.rk, now)
		if !ok {
			continue
		}
		h.d = bucket.Decision{Limit: h.v.remote.Rule().Limit, RetryAfter: retry}
		h.decided, h.refused, h.settled = true, true, true
		if refusing == nil || retry > refusing.d.RetryAfter {
			refusing = h
		}
	}
	return refusing
}

// unavailable hands the Redis rules that Redis has not decided to their
// on_unavailable, because Redis cannot decide: "open" lets the request
// through (no header item: nothing is known), "closed" refuses it with
// 503, "local" decides it on this host's share. Sync-mode rules too,
// unless exactOnly. It returns the first enforcing "closed" rule, or nil.
func (ex *Exchange) unavailable(now time.Duration, exactOnly bool) *hit {
	var refusing *hit
	for i := range ex.rl.hits {
		h := &ex.rl.hits[i]
		if h.v.remote == nil || h.settled || exactOnly && !h.exact() {
			continue
		}
		h.unavailable = true
		switch h.v.remote.Rule().OnUnavailable {
		case FailLocal:
			h.v = h.v.fallback // decided on the host's table from here on
		case FailClosed:
			if !h.r.shadow {
				h.d = bucket.Decision{Limit: h.v.remote.Rule().Limit, RetryAfter: bucket.FullRetryAfter}
				h.decided, h.refused, h.settled = true, true, true
				if refusing == nil {
					refusing = h
				}
				continue
			}
			fallthrough
		default:
			h.d = bucket.Decision{Allowed: true, Limit: h.v.remote.Rule().Limit}
			h.decided, h.settled, h.unknown = true, true, true
		}
	}
	return refusing
}

// chargeLocal charges the enforcing rules decided on the host's table
// that are not settled yet (step 2 of charge), refunding every local
// charge of the request if one refuses.
func (ex *Exchange) chargeLocal(now time.Duration) *hit {
	hits := ex.rl.hits
	pending := 0
	for i := range hits {
		if h := &hits[i]; !h.r.shadow && !h.settled && !h.exact() {
			pending++
		}
	}
	if pending >= 2 {
		var refusing *hit
		for i := range hits {
			h := &hits[i]
			if h.r.shadow || h.settled || h.exact() {
				continue
			}
			h.d, h.decided = h.peek(now), true
			if !h.d.Allowed {
				h.refused = true
				if refusing == nil || h.d.RetryAfter > refusing.d.RetryAfter {
					refusing = h
				}
			}
		}
		if refusing != nil {
			return refusing
		}
	}
	for i := range hits {
		h := &hits[i]
		if h.r.shadow || h.settled || h.exact() {
			continue
		}
		h.d, h.decided, h.settled = h.allow(now), true, true
		if h.d.Allowed {
			h.charged = !h.d.Full // on_full "open" took no slot: nothing to refund
			continue
		}
		h.refused = true
		ex.refundLocal(now)
		return h
	}
	return nil
}

// refundLocal gives back every charge the request made on the host's
// table.
func (ex *Exchange) refundLocal(now time.Duration) {
	for j := range ex.rl.hits {
		if o := &ex.rl.hits[j]; o.charged {
			o.refund(now)
			o.charged, o.decided = false, false // refuse peeks again for the headers
		}
	}
}

// chargeRedis decides the Redis rules not yet settled in one round trip
// (step 3 of charge). When Redis cannot decide, on_unavailable answers,
// "local" on the host's table; cut reports that Core.Cut ended the round
// trip instead.
func (ex *Exchange) chargeRedis(now time.Duration) (refusing *hit, cut bool) {
	rh := ex.rl.rhits[:0]
	for i := range ex.rl.hits {
		if h := &ex.rl.hits[i]; h.exact() && !h.settled {
			rh = append(rh, SharedHit{Lim: h.v.remote, Key: &h.rk, Shadow: h.r.shadow})
		}
	}
	if len(rh) == 0 {
		return nil, false
	}
	refused, err := ex.c.redis.Decide(ex.c.redisCtx, rh, now)
	if err != nil {
		if ex.c.redisCtx.Err() != nil {
			return nil, true
		}
		if h := ex.unavailable(now, true); h != nil {
			return h, false
		}
		return ex.chargeLocal(now), false
	}
	j := 0
	for i := range ex.rl.hits {
		h := &ex.rl.hits[i]
		if !h.exact() || h.settled {
			continue
		}
		h.d, h.decided, h.settled = rh[j].D, true, true
		j++
		if !h.d.Allowed && !h.r.shadow && refused {
			h.refused = true
			if refusing == nil || h.d.RetryAfter > refusing.d.RetryAfter {
				refusing = h
			}
		}
	}
	return refusing, false
}

// refuse answers a request that refusing refused; nothing is charged for
// it. The headers report what each rule's state is without the request.
func (ex *Exchange) refuse(refusing *hit, now time.Duration) (Verdict, bool) {
	row := &ex.c.row
	for i := range ex.rl.hits {
		h := &ex.rl.hits[i]
		if !h.decided {
			if h.exact() {
				h.unknown = true // Redis was not asked: no header item
			} else {
				h.d, h.decided = h.peek(now), true
				if !h.r.shadow && !h.d.Allowed && !h.d.Full && h.d.RetryAfter > refusing.d.RetryAfter {
					// It refuses too, and for longer (the deny cache
					// refused before it was looked at): the client is
					// told the latest retry, as when both are charged.
					h.refused, refusing = true, h
				}
			}
		}
		switch {
		case h.refused && h.unavailableClosed():
			row.AddRule(metrics.RateLimitRequests, h.r.stat, metrics.UnavailableClosed, 1)
		case h.refused && h.d.Full && h.d.Capped:
			row.AddRule(metrics.RateLimitRequests, h.r.stat, metrics.CappedClosed, 1)
		case h.refused && h.d.Full:
			row.AddRule(metrics.RateLimitRequests, h.r.stat, metrics.FullClosed, 1)
		case h.refused:
			row.AddRule(metrics.RateLimitRequests, h.r.stat, metrics.Limited, 1)
		}
		if h.unavailable {
			row.AddRule(metrics.RateLimitUnavailable, h.r.stat, 0, 1)
		}
	}
	ex.rateLimitFields()
	var p Problem
	p, ex.buf = refusalProblem(refusing, ex.rl.hits, ex.buf)
	n := len(ex.fields)
	ex.respond(&p, false)
	ex.rl.refusal = Refusal{Rule: refusing.r.name, Status: p.Status, RetryAfter: refusing.d.RetryAfter, Full: refusing.d.Full,
		Unavailable: refusing.unavailableClosed(), Fields: append(ex.rl.refusalBuf[:0], ex.fields[:n]...)}
	for _, f := range ex.fields[n:] {
		if f.Name == fieldRetryAfter {
			ex.rl.refusal.Fields = append(ex.rl.refusal.Fields, f)
		}
	}
	ex.logRefusal(refusing, now)
	return Respond, true
}

// Refusal describes a request the rate limits refused, for an embedder
// that writes the answer itself (its body, its own format).
type Refusal struct {
	// Rule is the rule that refused (of several, the one whose retry time
	// is latest).
	Rule string
	// Status is 429, or 503 (the rule's status, or a full table with
	// on_full "closed").
	Status int
	// RetryAfter is when the client may try again.
	RetryAfter time.Duration
	// Full means the rule's table had no slot for the key.
	Full bool
	// Unavailable means the rule is a Redis rule that Redis could not
	// decide, and its on_unavailable "closed" refused.
	Unavailable bool
	// Fields are the rate-limit header fields and Retry-After to send.
	Fields []Field
}

// Refusal returns the refusal the exchange answered with, or nil when its
// answer is something else (Respond for another reason, or Pass).
func (ex *Exchange) Refusal() *Refusal {
	if ex.rl.refusal.Status == 0 {
		return nil
	}
	return &ex.rl.refusal
}

// served counts a request that is about to be served, and logs the shadow
// rules that would have refused it and the rules that let it through
// without a slot (on_full "open", or a shadow rule).
func (ex *Exchange) served(now time.Duration) {
	row := &ex.c.row
	for i := range ex.rl.hits {
		h := &ex.rl.hits[i]
		switch {
		case h.unavailable && h.unknown:
			// Redis could not decide and on_unavailable let it through.
			row.AddRule(metrics.RateLimitRequests, h.r.stat, metrics.UnavailableOpen, 1)
			ex.logUnavailable(h, now)
		case h.d.Full && h.d.Capped:
			row.AddRule(metrics.RateLimitRequests, h.r.stat, metrics.CappedOpen, 1)
			ex.logFull(h, now)
		case h.d.Full:
			row.AddRule(metrics.RateLimitRequests, h.r.stat, metrics.FullOpen, 1)
			ex.logFull(h, now)
		case h.d.Allowed:
			row.AddRule(metrics.RateLimitRequests, h.r.stat, metrics.Allowed, 1)
			if metrics.IsNearLimit(h.d.Remaining, h.d.Limit) {
				row.AddRule(metrics.RateLimitRequests, h.r.stat, metrics.NearLimit, 1)
			}
		default: // only a shadow rule can refuse a served request
			row.AddRule(metrics.RateLimitRequests, h.r.stat, metrics.ShadowLimited, 1)
			ex.logShadow(h, now)
		}
		if h.unavailable {
			row.AddRule(metrics.RateLimitUnavailable, h.r.stat, 0, 1)
		}
	}
}

// logRefusal logs an enforced refusal under the rule that answered it, at
// most one line per rule a second across all workers; the refusals left
// out are counted in the next line.
func (ex *Exchange) logRefusal(h *hit, now time.Duration) {
	msg := "request refused"
	attrs := []slog.Attr{slog.Int("status", ex.resp.Status), slog.Int64("retry_after", retryAfterSeconds(h.d.RetryAfter))}
	switch {
	case h.d.Capped: // the table has room: the rule's keys hold their share
		msg = "request refused: its keys hold max_keys counter slots (on_full closed)"
		attrs = append(attrs, slog.Int("max_keys", h.r.maxKeys), slog.Int("keys", ex.c.region.Counters().Held(h.r.account)))
	case h.d.Full:
		msg = "request refused: counter table full (on_full closed)"
	}
	ex.logRule(&h.r.refusedLog, now, slog.LevelInfo, msg, h, attrs...)
}

// logShadow logs a shadow rule's would-be refusal, at most one line per
// rule a second across all workers; the lines left out are counted in the
// next one.
func (ex *Exchange) logShadow(h *hit, now time.Duration) {
	ex.logRule(&h.r.shadowLog, now, slog.LevelWarn, "shadow rule would refuse", h,
		slog.Int("status", h.r.status),
		slog.Int64("retry_after", retryAfterSeconds(h.d.RetryAfter)))
}

// logFull logs a request that a rule let through unlimited because no
// slot could be had for its key (on_full "open", or a shadow rule): the
// table was full, or the rule's keys held max_keys slots. Rate-limited
// like logShadow: the operator must hear that the rule is not being
// enforced.
func (ex *Exchange) logFull(h *hit, now time.Duration) {
	if h.d.Capped {
		msg := "rule not enforced: its keys hold max_keys counter slots (on_full open)"
		if h.r.shadow {
			msg = "shadow rule not counting: its keys hold max_keys counter slots"
		}
		ex.logRule(&h.r.fullLog, now, slog.LevelWarn, msg, h,
			slog.Int("max_keys", h.r.maxKeys), slog.Int("keys", ex.c.region.Counters().Held(h.r.account)))
		return
	}
	msg := "rule not enforced: counter table full (on_full open)"
	if h.r.shadow {
		msg = "shadow rule not counting: counter table full"
	}
	ex.logRule(&h.r.fullLog, now, slog.LevelWarn, msg, h)
}

// logUnavailable logs a request that a Redis rule let through unlimited
// because Redis could not decide (on_unavailable "open"), rate-limited
// like logFull.
func (ex *Exchange) logUnavailable(h *hit, now time.Duration) {
	ex.logRule(&h.r.unavailableLog, now, slog.LevelWarn, "rule not enforced: redis unavailable (on_unavailable open)", h)
}

// logRule writes a line about h's rule and the request, when g lets one
// through at now: the rule, the method, the path and the client's address
// (never its key: a header key may be a secret), then more, then how many
// lines g left out before this one.
func (ex *Exchange) logRule(g *lineGate, now time.Duration, level slog.Level, msg string, h *hit, more ...slog.Attr) {
	suppressed, ok := g.allow(now)
	if !ok {
		return
	}
	attrs := make([]slog.Attr, 0, 8)
	attrs = append(attrs,
		slog.String("rule", h.r.name),
		slog.String("method", ex.req.Method()),
		slog.String("path", ex.match),
		slog.String("client", ex.Client().String()))
	if ex.rid != nil {
		attrs = append(attrs, slog.String("request_id", string(ex.rid)))
	}
	attrs = append(attrs, more...)
	attrs = append(attrs, slog.Uint64("suppressed", suppressed))
	ex.c.logger().LogAttrs(context.Background(), level, msg, attrs...)
}

// Limiter returns the limiter of the rule called name, or nil when there
// is no such rule or it is a Redis rule: the rule's own limit, for Peek
// and Reset with the key from KeyOf. A client an override applies to is
// counted under the override's limit, apart: Reset (of the Core) resets a
// request's count under whichever applies.
func (c *Core) Limiter(name string) *bucket.Limiter {
	if ru := c.byName[name]; ru != nil {
		return ru.base.lim
	}
	return nil
}

// KeyOf returns the key bytes rule name counts req under ("ip:192.0.2.1",
// "h:X-Api-Key:…", "g"), exactly as a decision would make them, or nil
// when there is no such rule. Whether the rule's route matches does not
// matter. The bytes are the id for the rule's Limiter:
// Limiter(name).Peek(string(key), now). A request the core would refuse
// as malformed (a bad path, a repeated key header) is an error.
func (c *Core) KeyOf(name string, req Request) ([]byte, error) {
	ru := c.byName[name]
	if ru == nil {
		return nil, nil
	}
	var key []byte
	err := c.withKey(ru, req, func(_ *Exchange, id []byte, _ string) error {
		key = bytes.Clone(id)
		return nil
	})
	return key, err
}

// Reset forgets req's count under the rule called name, in every process,
// as the application's reset header does: under the limit that applies to
// req's key (an override's, when one does), wherever the rule keeps it
// (the region; Redis and this host's share of it: within redis.timeout,
// through the breaker, as a decision). A successful login may
// forgive the client's failed attempts with it. Whether the rule's route
// matches does not matter. No such rule is ErrUnknownRule; a request the
// core would refuse as malformed (a bad path, a repeated key header) is an
// error.
func (c *Core) Reset(name string, req Request) error {
	ru := c.byName[name]
	if ru == nil {
		return fmt.Errorf("%w %q", ErrUnknownRule, name)
	}
	return c.withKey(ru, req, func(ex *Exchange, id []byte, value string) error {
		return ex.variantOf(ru, value).reset(id, c.now(), true)
	})
}

// withKey calls f with an exchange over req (released after) and the key
// ru counts req under.
func (c *Core) withKey(ru *rule, req Request, f func(ex *Exchange, id []byte, value string) error) error {
	ex := c.Begin(req)
	defer ex.release()
	if _, refused := ex.checkPath(); refused {
		return errors.New("core: the request path is not acceptable")
	}
	id, value, err := ex.keyOf(ru)
	if err != nil {
		return err
	}
	return f(ex, id, value)
}

// Now is the time the core decides at: the region's clock (or
// Options.Now), the instant a Limiter takes.
func (c *Core) Now() time.Duration { return c.now() }

// Keys reports how many counter slots the keys of rule name (its
// overrides' included) hold now, in every process sharing the region, and
// the most they may hold (max_keys); 0, 0 for no such rule.
func (c *Core) Keys(name string) (held, max int) {
	ru := c.byName[name]
	if ru == nil {
		return 0, 0
	}
	return c.region.Counters().Held(ru.account), ru.maxKeys
}

// Resolver is the client resolver the core was built with.
func (c *Core) Resolver() *clientip.Resolver { return &c.resolver }
