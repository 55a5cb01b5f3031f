package core

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/preforkd/preforkd/clientip"
	"github.com/preforkd/preforkd/metrics"
	"github.com/preforkd/preforkd/route"
	"github.com/preforkd/preforkd/shm"
)

// Options is what a Core decides by. The zero value decides nothing: every
// request passes untouched.
type Options struct {
	// RateLimits are the rate-limit rules, in the order their header items
	// are sent.
	RateLimits []RateLimit
	// Idempotency is the idempotent-replay stage (IdempotencyBlocks); the
	// zero value is none.
	Idempotency Stage[Idempotency]
	// Caches is the response cache stage (CacheBlocks); the zero value is
	// none.
	Caches Stage[Cache]
	// Resolver decides who the client is (trusted proxies, IPv6 prefix).
	Resolver clientip.Resolver
	// Exempt clients (judged on the resolved client address) are never
	// counted or refused by any rule and get no rate-limit header. An
	// invalid (zero) prefix is refused.
	Exempt []netip.Prefix
	// Shadow puts every rule in shadow mode: a dry run.
	Shadow bool
	// CaseSensitive makes a "path" key tell "/A" from "/a", as the routes
	// do when compiled with route.Options.CaseSensitive; by default they
	// are one key, as they are one route.
	CaseSensitive bool
	// Headers selects the rate-limit header families. The zero value is
	// HeadersBoth.
	Headers HeaderMode
	// MaxRequestBody is the largest request body read for an idempotency
	// fingerprint; larger ones get 413. 0 means 1 MiB; at most
	// MaxMaxRequestBody.
	MaxRequestBody int64
	// Logger receives the lines an operator acts on (rate-limited), never
	// one per request. nil means slog.Default() at the time of the line.
	Logger *slog.Logger
	// Now is the clock decisions are made with and durations measured by.
	// nil means the region's shared monotonic clock (shm.Region.Now). It
	// is read at Begin and at Done (and by a duplicate that waits), and
	// again by a rule's decision once the key's state is loaded
	// (bucket.Limiter.SetClock).
	Now func() time.Duration
	// Wall is the wall clock, read for X-RateLimit-Reset and for the
	// cache's freshness (Date, Expires, Last-Modified). nil means
	// time.Now.
	Wall func() time.Time
	// OnResponse, if set, is told the status of every response an engine
	// counts (Core.Responded), once it is counted: a worker's recycling
	// limits watch it (prefork.Worker.Responded).
	OnResponse func(status int)
	// ResetHeader is the response field by which the application resets
	// rules for the request's key: its value names them, comma-separated
	// ("Preforkd-Reset: login"). It never reaches a client, nor is it
	// forwarded from one (see Forward). "" means none; a name that frames
	// responses (Content-Length, ...) is refused.
	ResetHeader string
	// RequestID is the header field of the request id ("X-Request-Id"):
	// a client's well-formed value (at most MaxRequestIDLen visible
	// characters, one field line) is kept, else one is made; the
	// application gets it, the response carries it, and so do the
	// access log, the core's log lines and its problem+json bodies. ""
	// turns request ids off.
	RequestID string
	// HealthPath, if set, is answered by the core itself for GET and
	// HEAD, before any rule ("200 ok", never counted by a rule, never
	// forwarded), and 503 once Core.Drain was called: nothing calls it
	// but the program, which in a prefork worker registers it with
	// w.OnDrain(c.Drain), else the check answers 200 through
	// Settings.DrainDelay. The path is compared as sent, without the
	// query. "" means none.
	HealthPath string
	// AccessLog, if set, takes one entry per request when its exchange
	// ends (package accesslog writes them out, buffered). nil: none.
	AccessLog AccessLog
	// Redis keeps the counts of the rules whose RateLimit.Redis is set,
	// shared by every host that uses it (built by RedisRules). The Core
	// owns its store once New succeeds: Close closes it (when New fails,
	// the store is still the caller's to close). The zero value: no rule
	// may be a Redis rule.
	Redis Stage[SharedStore]
}

const defaultMaxRequestBody = 1 << 20

// MaxMaxRequestBody bounds MaxRequestBody: a body up to it is read into
// the worker's memory (as a cached one is, whose bound it shares).
const MaxMaxRequestBody = maxCacheBody

// Core decides about requests for one process: it is built once per worker
// and is safe for concurrent use. Every process whose Core uses the same
// region shares its counts and stored responses.
type Core struct {
	region   *shm.Region
	rules    []*rule
	byName   map[string]*rule
	blocks   []*block
	resolver clientip.Resolver
	exempt   clientip.PrefixSet
	caseSens bool
	headers  HeaderMode
	maxReq   int64
	now      func() time.Duration
	wall     func() time.Time
	respond  func(status int) // Options.OnResponse
	log      *slog.Logger     // nil: slog.Default()
	redis    SharedStore
	// redisCtx is the Redis decisions' context, which cutRedis ends
	// (Cut); both are set with Redis.
	redisCtx context.Context
	cutRedis context.CancelFunc
	ridName  string // Options.RequestID, canonical; "" when off
	access   AccessLog
	// healthPath is Options.HealthPath; drained makes it answer 503.
	healthPath string
	drained    *atomic.Bool // shared with the Cleartext views
	// cleartext is set on a Cleartext view: how it answers; redirect,
	// its redirect when it redirects (a hook, so that a program that
	// makes no view links none of it).
	cleartext *CleartextOptions
	redirect  func(*Exchange) (Verdict, bool)

	caches []*cacheBlock

	// steps are what each step of a decision runs: the optional stages'
	// are installed with them (stage.go), and idem and cache reach the
	// rest of their code; nil without the stage.
	steps       [stepDone]func(*Exchange) (Verdict, bool)
	idem, cache *stageHooks
	// preRedis is the Redis rules' check before anything is charged
	// (Exchange.preRedis), which RedisRules installs.
	preRedis func(*Exchange, time.Duration) *hit

	row          metrics.Row // this process's statistics row
	upstreamLogs [metrics.UpstreamBroken + 1]lineGate
	forwarded    forwardedLog // forwarding fields from peers not trusted

	// The application's reset (reset.go): the field's canonical name,
	// what Forward hides and drops with it, the gate of its lines.
	reset                    string
	resetHide, resetDropFill []string
	resetLog                 lineGate
	cutLog                   lineGate // cached bodies cut off (cacheStream): this process's lines
	pool                     sync.Pool
}

// New compiles opts over region, which this process must have joined
// (shm.Region.Join): a region that is not refuses every update. Blocks of
// opts.Idempotency need a region with a response table.
func New(region *shm.Region, opts Options) (*Core, error) {
	if region != nil && region.Worker() < 0 {
		return nil, fmt.Errorf("core: %w (call Region.Join first)", shm.ErrNotJoined)
	}
	return newCore(region, opts)
}

// newCore is New without the worker identity, which only decisions need.
func newCore(region *shm.Region, opts Options) (*Core, error) {
	if region == nil {
		return nil, errors.New("core: nil region")
	}
	if err := opts.Resolver.Validate(); err != nil {
		return nil, err
	}
	if !validPrefixes(opts.Exempt) {
		return nil, &FieldError{Field: "Exempt", Msg: "an invalid (zero) netip.Prefix in Exempt"}
	}
	c := &Core{
		region:     region,
		byName:     make(map[string]*rule, len(opts.RateLimits)),
		resolver:   opts.Resolver,
		exempt:     clientip.NewPrefixSet(opts.Exempt),
		caseSens:   opts.CaseSensitive,
		headers:    opts.Headers,
		maxReq:     opts.MaxRequestBody,
		now:        opts.Now,
		wall:       opts.Wall,
		respond:    opts.OnResponse,
		log:        opts.Logger,
		access:     opts.AccessLog,
		healthPath: opts.HealthPath,
		drained:    new(atomic.Bool),
	}
	if c.maxReq == 0 {
		c.maxReq = defaultMaxRequestBody
	}
	var err error
	if c.ridName, err = checkRequestIDName(opts.RequestID); err != nil {
		return nil, err
	}
	if err := CheckHealthPath(opts.HealthPath); err != nil {
		return nil, err
	}
	if c.maxReq < 0 || c.maxReq > MaxMaxRequestBody {
		return nil, fmt.Errorf("core: MaxRequestBody %d is negative or more than %d", c.maxReq, MaxMaxRequestBody)
	}
	if _, err := opts.Headers.MarshalText(); err != nil {
		return nil, err
	}
	if c.now == nil {
		c.now = region.Now
	}
	if c.wall == nil {
		c.wall = time.Now
	}
	c.row = metrics.NewRow(region)
	for kind := range c.upstreamLogs {
		c.upstreamLogs[kind] = lineGate{g: metrics.UpstreamGate(region, kind),
			total: func() uint64 { return metrics.Total(region, metrics.UpstreamErrors, kind) }}
	}
	c.forwarded = newForwardedLog(region)
	c.cutLog = lineGate{g: region.Gate(-1), total: func() uint64 { return metrics.Total(region, metrics.CacheCutSends, 0) }}
	copy(c.steps[:], baseSteps[:])
	if err := c.compileReset(opts.ResetHeader); err != nil {
		return nil, err
	}
	if err := opts.Redis.installIn(c); err != nil {
		return nil, err
	}
	if err := c.compileRules(opts.RateLimits, opts.Shadow); err != nil {
		return nil, err
	}
	if err := c.installStages(&opts); err != nil {
		return nil, err
	}
	c.pool.New = func() any { return &Exchange{c: c} }
	return c, nil
}

// Close releases what the Core owns: Options.Redis (its sync-mode
// flusher adds its last counts to Redis first). A worker calls it once it
// has drained; the Core must not decide after. It is idempotent.
func (c *Core) Close() error {
	if c.redis != nil && c.cleartext == nil {
		return c.redis.Close()
	}
	return nil
}

// Cut ends the Redis decisions not yet sent, and those in flight (at
// once when redis.timeout is a second or more; a shorter call ends by
// itself within it, see SharedStore.Decide): their requests end
// unanswered (Gone; counted and logged as 499, as a request a drain
// cuts elsewhere), nothing of them charged. An engine calls it when its
// drain is cut (its Shutdown's context ended), once its connections are
// closed; the Core's Redis decisions stay cut from then on. Close still
// adds the last sync-mode counts. It is idempotent; without Redis rules
// it does nothing.
func (c *Core) Cut() {
	if c.cutRedis != nil {
		c.cutRedis()
	}
}

// Redis is the Redis store the Core decides Redis rules with, or nil.
func (c *Core) Redis() SharedStore { return c.redis }

// Exchange is the core's state for one request, from Begin to Release.
// It is not safe for concurrent use.
type Exchange struct {
	c   *Core
	req Request

	match, forward string // the normalized path, and the one to forward

	now time.Duration // region time at Begin: decisions are made at it

	step   decideStep // the next step of the decision (DecideHead, Decide)
	nowait bool       // NoWait: a step that would wait returns Wait instead
	giveUp bool       // GiveUpWait: a wait for another request ends at once
	passed bool       // Decide said Pass: the application's response is told
	probe  bool       // a health check: not counted in the statistics (Finish)

	// The response sent, and what is recorded of the application's.
	status     int      // the status sent to the client
	rec        recorded // what Head and Body recorded
	recording  bool     // Head began recording (record said so)
	stray      bool     // bytes came past the response (Stray)
	gone       bool     // the core found the client gone as it decided (Gone)
	recMax     int64    // how much of the body is kept
	counted    bool     // the response was counted (Finish)
	refreshing bool     // the exchange lives on for a background refresh

	client, clientKey netip.Addr
	hasClient         bool

	// override is what matchRoute found of the request's override
	// fields: 0 not looked yet, else ovLooked with ovMethod (lines of a
	// methodOverrides field) and ovPath (a line of a pathOverrides
	// field).
	override   uint8
	altMethods []string // a POST's _method query parameters

	// Each stage's state.
	rl    rateState
	idem  idemState
	cache cacheState

	// lines receives a request field's lines: a stack array would escape
	// through the Request interface.
	lines [8]string

	// keyBuf holds the bytes of the key being made: part of the pooled
	// exchange, since a stack buffer would escape through clientip.Source.
	keyBuf [idemKeyBufSize]byte
	// kv is the request as keys are made of it (view).
	kv      keyView
	pathBuf [256]byte

	// fwdAdd are the fields added to the forwarded request (Forward.Add):
	// the request id made, in fwdAddBuf, after which a revalidation's
	// two validators fit.
	fwdAdd    []Field
	fwdAddBuf [3]Field

	// For the access log: the wall clock at Begin, the body bytes told
	// (Body), when the request went to the application (Sending; 0: it
	// did not) and how long its head took (upDur < 0: not yet), and the entry handed to the log.
	began time.Time
	sent  int64
	fwdAt time.Duration
	upDur time.Duration
	acc   AccessEntry

	// rid is the request id (nil: off, or not settled yet), in ridBuf.
	rid    []byte
	ridBuf [MaxRequestIDLen]byte

	// What the engine sends.
	fields   []Field
	fieldBuf [32]Field
	buf      []byte
	bufArr   [1024]byte
	resp     Response
}

// Begin starts deciding about req; the engine ends the exchange with
// Finish once the response was sent (see run.go). It reads the clock
// once: decisions are made at that instant, and the request's duration
// counts from it.
func (c *Core) Begin(req Request) *Exchange {
	ex := c.pool.Get().(*Exchange)
	ex.req = req
	ex.now = c.now()
	if c.access != nil {
		ex.began = c.wall()
	}
	ex.rl.hits = ex.rl.hitBuf[:0]
	ex.rl.rhits = ex.rl.rhitBuf[:0]
	ex.fields = ex.fieldBuf[:0]
	ex.buf = ex.bufArr[:0]
	return ex
}

// release ends the exchange. A reservation never completed (the
// application panicked, the engine gave up) is released, so that the retry
// runs; a fill lock is given up. The Exchange must not be used after.
func (ex *Exchange) release() {
	if ex.idem.reserved {
		ex.c.idem.release(ex)
	}
	if ex.cache.blk != nil {
		ex.c.cache.release(ex)
	}
	c := ex.c
	body, cbuf := ex.idem.stored.Body, ex.cache.buf
	*ex = Exchange{c: c}
	if cap(body) <= maxPooledBody {
		ex.idem.stored.Body = body[:0] // a replay buffer is worth keeping
	}
	if cap(cbuf) <= maxPooledBody {
		ex.cache.buf = cbuf[:0] // so is a cache entry's
	}
	c.pool.Put(ex)
}

// maxPooledBody bounds the replay buffers kept with pooled exchanges.
const maxPooledBody = 64 << 10

// Decide runs the request through the stages: path checks, rate limits,
// idempotent replay, the response cache. It may block while a duplicate
// waits for its original (up to the block's wait), or a cache miss for
// another request's fetch (up to the block's lock timeout), or a Redis
// rule's round trip; after NoWait(true) it returns Wait there instead.
func (ex *Exchange) Decide() Verdict {
	if ex.step < stepIdempotency {
		if v := ex.DecideHead(); v != Pass {
			return v
		}
	}
	v := ex.runSteps(stepDone)
	if v == Pass {
		ex.passed = true
	}
	return v
}

// DecideHead runs the stages that need only the request's head: the path
// checks and the rate limits, and the refusal of a declared body too
// large for an idempotency fingerprint. An engine calls it before it
// answers Expect: 100-continue (RFC 9110 §10.1.1), so that a refused
// request gets its final status at once, without 100 Continue, and its
// body is never read nor waited for; Decide then runs the other stages.
// A Respond from DecideHead is final: Decide must not be called. After
// NoWait(true) it returns Wait where a Redis rule's round trip is due.
func (ex *Exchange) DecideHead() Verdict {
	if ex.step == stepPath {
		ex.takeRequestID()
		if ex.isHealthCheck() {
			ex.step = stepIdempotency // final
			ex.probe = true
			v, _ := ex.health()
			return v
		}
		if redirect := ex.c.redirect; redirect != nil {
			ex.step = stepIdempotency // final
			v, _ := redirect(ex)
			return v
		}
	}
	return ex.runSteps(stepIdempotency)
}

// runSteps runs the decision's steps from ex.step until end. It returns
// Wait where a step would wait (ex.step is then where to resume), a
// step's Respond (ex.step is then end: the decision is final), or Pass
// once every step before end has passed.
func (ex *Exchange) runSteps(end decideStep) Verdict {
	for ex.step < end {
		v, done := ex.c.steps[ex.step](ex)
		if v == Wait {
			return Wait
		}
		if done && v == Respond {
			ex.step = end
			return v
		}
		ex.step = ex.step.next()
	}
	return Pass
}

// decideStep is where a decision stands: the step to run next.
type decideStep uint8

const (
	stepPath            decideStep = iota
	stepRateLimit                  // the rules, up to a Redis round trip
	stepRedis                      // the round trip, and the rest of the rules
	stepDeclaredSize               // the last step of DecideHead
	stepIdempotency                // the first step of Decide
	stepIdempotencyWait            // a duplicate waits for its original
	stepCache                      //
	stepCacheWait                  // a miss waits for another request's fetch
	stepDone
)

// baseSteps are the steps every Core runs (Core.steps): each returns a
// Verdict, and whether it is the step's last word (Respond then ends the
// decision). The optional stages install theirs.
var baseSteps = [...]func(*Exchange) (Verdict, bool){
	stepPath:      (*Exchange).checkPath,
	stepRateLimit: (*Exchange).rateLimit,
	stepRedis:     passStep, // RedisRules installs it
}

// next is the step after s, skipping the ones a step that returned
// without waiting has no use for (the waits, the Redis round trip when
// the rate limits needed none).
func (s decideStep) next() decideStep {
	switch s {
	case stepRateLimit, stepRedis:
		return stepDeclaredSize
	case stepIdempotency, stepIdempotencyWait:
		return stepCache
	case stepCache, stepCacheWait:
		return stepDone
	}
	return s + 1
}

// NoWait(true) makes DecideHead and Decide return Wait at a point where
// they would wait — a Redis rule's round trip, a duplicate whose original
// is in flight, a cache miss while another request fetches the response —
// instead of waiting there. Nothing is charged, reserved or counted twice:
// the engine calls NoWait(false) and the same method again, from a
// goroutine that may block, and the decision goes on where it stopped.
// An event loop decides every request on its loop so, and only the few
// that must wait elsewhere.
func (ex *Exchange) NoWait(on bool) { ex.nowait = on }

// LongWait reports whether the Wait DecideHead or Decide just returned is
// one for another request — a duplicate's for its original, a miss's for
// another's fetch — which may last the block's wait or lock_timeout,
// rather than a Redis rule's round trip, bounded by redis.timeout. An
// engine that finishes waits on a bounded set of goroutines keeps the
// long ones apart: clients that hold them all (duplicates of their own
// request, left in flight) must not stall the others' Redis decisions.
func (ex *Exchange) LongWait() bool {
	return ex.step == stepIdempotencyWait || ex.step == stepCacheWait
}

// GiveUpWait ends a long wait (LongWait) at once, as if its time had run
// out: the duplicate is answered 409, the miss is fetched without
// waiting and not stored. An engine calls it, then the same method
// again, when no goroutine is free to wait (never queueing behind
// whoever holds them all).
func (ex *Exchange) GiveUpWait() { ex.giveUp = true }

// WantsBody reports whether Decide reads the request's body, and how
// much of it at most (Request.Body's max): an idempotency block applies
// to the request and its key is present, so the body is fingerprinted.
// An engine that must not block while Decide reads (an event loop) reads
// the body first, up to max and one byte more, so that Request.Body
// answers at once. It is meaningful once DecideHead said Pass.
func (ex *Exchange) WantsBody() (max int64, ok bool) {
	b := ex.matchBlock()
	if b == nil {
		return 0, false
	}
	if _, lines := ex.req.Header(b.header); lines == 0 {
		return 0, false
	}
	return ex.c.maxReq, true
}

// Fields are the header fields to add to the application's response
// (Pass): the rate-limit headers, X-Cache.
func (ex *Exchange) Fields() []Field { return ex.fields }

// Response is the core's own answer (Respond).
func (ex *Exchange) Response() *Response { return &ex.resp }

// record reports whether the application's response is recorded for the
// stages, and how much of its body is kept (a reserved idempotency key, a
// cache fill); max is 0 when only the status and fields are needed (an
// unsafe request to a cached path): such a request needs no body kept and
// need not outlive its client, where one with a body to keep runs to its
// end for the retry or the cache.
func (ex *Exchange) record() (max int64, ok bool) {
	switch {
	case ex.idem.reserved:
		return ex.idem.blk.maxBody, true
	case ex.cache.flags&cFill != 0:
		return ex.cache.blk.maxBody, true
	case ex.cache.flags&cInvalidate != 0:
		return 0, true
	}
	return 0, false
}

// clock is the instant the exchange decides at, read by Begin.
func (ex *Exchange) clock() time.Duration { return ex.now }

// Conns is where an engine counts the client connections it serves for
// this core's worker: accepted, reaching max_connections, and the state
// each is in (metrics.Conns).
func (c *Core) Conns() metrics.Conns { return c.row.Conns() }

// Responded counts a response a worker sent, in the statistics: by status
// code, and its duration (from when the request was read to when the
// engine handed the response over; a streamed body may go on after).
// Every engine calls it once per response, for its own answers (a
// malformed request), the core's and the application's alike.
func (c *Core) Responded(status int, elapsed time.Duration) {
	c.row.Response(status, elapsed)
	if c.respond != nil {
		c.respond(status)
	}
}

// keyView is the request as clientip makes a key of it (clientip.Source):
// its fields and query as forwarded, its path as rules match it, and its
// client key, all settled by the core before it asks clientip for a key,
// so that clientip only reads. It lives in the pooled exchange: handing
// clientip a pointer to it allocates nothing.
type keyView struct {
	req     Request
	path    string     // normalized, ASCII-lowercased unless paths are case-sensitive
	client  netip.Addr // the client key
	lines   [4]string  // a field's lines: a stack array would escape through Request
	scratch [256]byte  // a decoded query value, valid until the next call
}

func (v *keyView) Header(name string) (string, int) { return v.req.Header(name) }

// Cookie is the first cookie called name in the request's Cookie lines.
func (v *keyView) Cookie(name string) (string, bool) {
	return clientip.CookieValue(v.req.HeaderLines("Cookie", v.lines[:0]), name)
}

// Query is the query parameter called name, decoded into the view's
// scratch buffer: valid until the next call.
func (v *keyView) Query(name string) (string, int) {
	q, n := clientip.QueryValue(v.req.Query(), name, v.scratch[:0])
	if len(q) == 0 {
		return "", n
	}
	return unsafe.String(&q[0], len(q)), n
}

func (v *keyView) Path() string          { return v.path }
func (v *keyView) ClientKey() netip.Addr { return v.client }

// view settles the request's key view, once: the path rules match (in
// the view's scratch buffer when it must be lowercased) and the client.
func (ex *Exchange) view() *keyView {
	v := &ex.kv
	if v.req != nil {
		return v
	}
	v.req, v.client = ex.req, ex.ClientKey()
	v.path = ex.match
	if !ex.c.caseSens && hasUpper(v.path) {
		b := ex.pathBuf[:0]
		for i := 0; i < len(v.path); i++ {
			c := v.path[i]
			if 'A' <= c && c <= 'Z' {
				c += 'a' - 'A'
			}
			b = append(b, c)
		}
		v.path = unsafe.String(&b[0], len(b))
	}
	return v
}

// methodOverrides are the fields by which applications run a request
// with another method's handler: Symfony (so Laravel), Express's
// method-override, Rack and ASP.NET Core run a POST that says
// "X-HTTP-Method-Override: DELETE" as a DELETE; OData services and
// SharePoint one that says "X-HTTP-Method: DELETE", Google's APIs one
// that says "X-Method-Override: DELETE". Canonical forms (net/http's
// header keys).
var methodOverrides = [...]string{"X-Http-Method-Override", "X-Http-Method", "X-Method-Override"}

// pathOverrides are the fields by which applications run a request as
// another path than its target's: Laminas and Zend before 2018, and
// applications behind IIS URL Rewrite, route by "X-Original-URL:
// /admin/x" or "X-Rewrite-URL: /admin/x" when present. Canonical forms.
var pathOverrides = [...]string{"X-Original-Url", "X-Rewrite-Url"}

// What matchRoute found of the override fields (Exchange.override).
const (
	ovLooked = 1 << iota
	ovMethod
	ovPath
)

// matchRoute reports whether rt covers the request: by its method and
// path, or by a method its methodOverrides lines name (each element of
// each line) or a POST's _method query parameter names, or a path its
// pathOverrides name (each line's, read by overridePath; one that cannot
// be normalized is no path), which the application may run it as. As for
// "post" and HEAD, counting such a request costs nothing and closes the
// bypass. The fields are looked for only when rt does not match the
// request as it is: which of them the request has, once per request; the
// paths, for each rule, only in a request that has a path override.
func (ex *Exchange) matchRoute(rt *route.Route) bool {
	method := ex.req.Method()
	if rt.Match(method, ex.match) {
		return true
	}
	if ex.override == 0 {
		ex.lookOverrides()
	}
	if ex.override == ovLooked {
		return false
	}
	if ex.matchAltPaths(rt, method) {
		return true
	}
	if ex.override&ovMethod == 0 {
		return false
	}
	for _, m := range ex.altMethods {
		if rt.Match(m, ex.match) || ex.matchAltPaths(rt, m) {
			return true
		}
	}
	for _, name := range methodOverrides {
		for _, line := range ex.req.HeaderLines(name, ex.lines[:0]) {
			for m := range strings.SplitSeq(line, ",") {
				if m = strings.Trim(m, " \t"); m != "" && (rt.Match(m, ex.match) || ex.matchAltPaths(rt, m)) {
					return true
				}
			}
		}
	}
	return false
}

// matchAltPaths reports whether rt covers method on a path a
// pathOverrides field names.
func (ex *Exchange) matchAltPaths(rt *route.Route, method string) bool {
	if ex.override&ovPath == 0 {
		return false
	}
	// Every line: PHP keeps the last of the FastCGI parameters a
	// server that passes each line (nginx before 1.23) sends. Read into
	// the key view's buffer (free between keys), as matchRoute may be
	// going through ex.lines.
	for _, name := range pathOverrides {
		for _, v := range ex.req.HeaderLines(name, ex.kv.lines[:0]) {
			if p, ok := overridePath(v); ok && rt.Match(method, p) {
				return true
			}
		}
	}
	return false
}

// queryMethods are the values of the _method parameters of the query q,
// decoded: every copy, as parsers differ in the one they keep (PHP the
// last), between '&'s or ';'s.
func queryMethods(q string) (ms []string) {
	for pair := range strings.FieldsFuncSeq(q, func(r rune) bool { return r == '&' || r == ';' }) {
		k, v, _ := strings.Cut(pair, "=")
		if k, err := url.QueryUnescape(k); err != nil || k != "_method" {
			continue
		}
		if v, err := url.QueryUnescape(v); err == nil && v != "" {
			ms = append(ms, v)
		}
	}
	return ms
}

// lookOverrides notes which override fields the request has, and the
// methods of its _method query parameters.
func (ex *Exchange) lookOverrides() {
	ex.override = ovLooked
	for _, name := range methodOverrides {
		if _, n := ex.req.Header(name); n > 0 {
			ex.override |= ovMethod
			break
		}
	}
	// Symfony with its parameter override on, and so Laravel, run a POST
	// as the method its _method parameter names (from the body first:
	// a body is not read here).
	if q := ex.req.Query(); strings.EqualFold(ex.req.Method(), "POST") && strings.Contains(q, "_method") {
		if ex.altMethods = queryMethods(q); len(ex.altMethods) > 0 {
			ex.override |= ovMethod
		}
	}
	for _, name := range pathOverrides {
		if _, n := ex.req.Header(name); n > 0 {
			ex.override |= ovPath
		}
	}
}

// overridePath is the match path of v, a pathOverrides line, read as
// Zend and Diactoros read it: a "scheme://authority" before the path
// dropped (they replace #^[^/:]+://[^/]+# with nothing), and the query
// and the fragment split off. ok is false for a path Normalize refuses.
func overridePath(v string) (match string, ok bool) {
	for i := 0; i < len(v) && v[i] != '/'; i++ {
		if v[i] == ':' {
			if rest := v[i+1:]; i > 0 && len(rest) > 2 && rest[0] == '/' && rest[1] == '/' && rest[2] != '/' {
				v = ""
				if j := strings.IndexByte(rest[2:], '/'); j >= 0 {
					v = rest[2+j:]
				}
			}
			break
		}
	}
	for i := 0; i < len(v); i++ {
		if v[i] == '?' || v[i] == '#' {
			v = v[:i]
			break
		}
	}
	match, _, err := route.Normalize(v)
	return match, err == nil
}

func hasUpper(s string) bool {
	for i := 0; i < len(s); i++ {
		if 'A' <= s[i] && s[i] <= 'Z' {
			return true
		}
	}
	return false
}

// ClientKey is the client address as rules count it.
func (ex *Exchange) ClientKey() netip.Addr {
	ex.resolveClient()
	return ex.clientKey
}

// Client is the client address: the peer, or the client a trusted proxy
// names.
func (ex *Exchange) Client() netip.Addr {
	ex.resolveClient()
	return ex.client
}

func (ex *Exchange) resolveClient() {
	if ex.hasClient {
		return
	}
	ex.hasClient = true
	r := &ex.c.resolver
	peer := ex.req.Peer()
	if !r.Trusts(peer) {
		ex.client = peer
		ex.untrustedForwarding(peer)
	} else {
		var xb, fb [4]string
		xff := ex.req.HeaderLines("X-Forwarded-For", xb[:0])
		fwd := ex.req.HeaderLines("Forwarded", fb[:0])
		ex.client = r.ClientOf(peer, xff, fwd)
	}
	ex.clientKey = r.Mask(ex.client)
}

// addField appends a field whose value is appended to the exchange's
// buffer by fill.
func (ex *Exchange) addField(name string, fill func([]byte) []byte) {
	from := len(ex.buf)
	ex.buf = fill(ex.buf)
	ex.fields = append(ex.fields, Field{name, ex.buf[from:len(ex.buf):len(ex.buf)]})
}

// respond makes the exchange's answer a problem.
func (ex *Exchange) respond(p *Problem, close bool) (Verdict, bool) {
	from := len(ex.buf)
	if ex.rid != nil {
		q := *p
		q.RequestID = ex.rid
		p = &q
	}
	ex.buf = p.AppendJSON(ex.buf)
	body := ex.buf[from:len(ex.buf):len(ex.buf)]
	ex.fields, ex.buf = ProblemFields(ex.fields, ex.buf, p.RetryAfter, len(body))
	ex.resp = Response{Status: p.Status, Fields: ex.fields, Body: body, Close: close}
	return Respond, true
}

// checkPath normalizes the request path (route.Normalize): rules match
// the normalized path, the application gets the one with dot segments
// removed and slashes merged. A path no application should see (an
// encoded slash, a backslash, NUL, a bad escape) is a 400, and so is
// userinfo in the authority; the connection closes after either, as after
// every malformed request on every engine.
func (ex *Exchange) checkPath() (Verdict, bool) {
	match, fwd, err := route.Normalize(ex.req.Path())
	if err != nil {
		return ex.respond(&Problem{Status: 400, Detail: "the request path is not acceptable: " + route.PathReason(err)}, true)
	}
	ex.match, ex.forward = match, fwd
	if host, _ := ex.req.Header("Host"); host != "" {
		if why := hostProblem(host); why != "" {
			// RFC 9112 §3.2: a Host that is not uri-host [":" port] is
			// a 400. Passed on, it would be a host to the cache, the
			// rules and the application alike, and the X-Forwarded-Host
			// an application builds links from.
			return ex.respond(&Problem{Status: 400, Detail: "the request's authority is not acceptable: " + why}, true)
		}
	}
	return Pass, false
}

// hostProblem says why host is not a Host field value (RFC 9112 §3.2,
// RFC 3986 §3.2.2: IP-literal, IPv4address or reg-name, then an optional
// ":" port of digits), or "".
func hostProblem(host string) string {
	// The common case in one pass: a name of bytes a reg-name has as they
	// are (a name or an IPv4 address), then ":" and digits or nothing.
	// Every request pays for this check: the general one below costs
	// three times as much.
	i := 0
	for i < len(host) && hostBytes[host[i]] {
		i++
	}
	if i < len(host) && host[i] == ':' {
		i++
		for i < len(host) && '0' <= host[i] && host[i] <= '9' {
			i++
		}
	}
	if i == len(host) {
		return ""
	}
	return hostProblemOf(host)
}

// hostProblemOf is hostProblem for any host: userinfo, an IP literal,
// percent-encoding, a bad byte or port.
func hostProblemOf(host string) string {
	if strings.IndexByte(host, '@') >= 0 {
		// RFC 9110 §4.2.4: userinfo has no place in a request's authority.
		return "it has userinfo"
	}
	name, port := host, ""
	if host[0] == '[' {
		end := strings.IndexByte(host, ']')
		if end < 0 {
			return "an IP literal without its closing ]"
		}
		name, port = host[:end+1], host[end+1:]
		if !ipLiteral(host[1:end]) {
			return "an IP literal that is neither an IPv6 address nor IPvFuture"
		}
	} else if i := strings.LastIndexByte(host, ':'); i >= 0 {
		name, port = host[:i], host[i:]
	}
	if port != "" {
		if port[0] != ':' {
			return "something after the IP literal that is not a port"
		}
		for i := 1; i < len(port); i++ {
			if port[i] < '0' || port[i] > '9' {
				return "a port that is not a number"
			}
		}
	}
	if name != "" && name[0] == '[' {
		return ""
	}
	for i := 0; i < len(name); i++ {
		switch c := name[i]; {
		case c == '%':
			if i+2 >= len(name) || !isHex(name[i+1]) || !isHex(name[i+2]) {
				return "a bad percent-encoding"
			}
			i += 2
		case !hostBytes[c]:
			return "a character a host name cannot have"
		}
	}
	return ""
}

// hostName is a valid Host field value's name, without its port (an IP
// literal keeps its brackets).
func hostName(host string) string {
	if i := strings.LastIndexByte(host, ':'); i > strings.LastIndexByte(host, ']') {
		return host[:i]
	}
	return host
}

// ipLiteral reports whether s, between an IP literal's brackets, is an
// IPv6address or IPvFuture ("v" HEXDIG... "." then unreserved,
// sub-delims or ":"), RFC 3986 §3.2.2: no zone id (RFC 6874 has clients
// strip it).
func ipLiteral(s string) bool {
	if len(s) > 1 && (s[0] == 'v' || s[0] == 'V') {
		dot := strings.IndexByte(s, '.')
		if dot < 2 || dot == len(s)-1 {
			return false
		}
		for i := 1; i < dot; i++ {
			if !isHex(s[i]) {
				return false
			}
		}
		for i := dot + 1; i < len(s); i++ {
			if !hostBytes[s[i]] && s[i] != ':' {
				return false
			}
		}
		return true
	}
	a, err := netip.ParseAddr(s)
	return err == nil && a.Is6() && a.Zone() == ""
}

// hostBytes marks the bytes that are unreserved or a sub-delim (RFC
// 3986): those a reg-name may have as they are.
var hostBytes = func() (t [256]bool) {
	for c := range t {
		t[c] = 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' ||
			strings.IndexByte("-._~!$&'()*+,;=", byte(c)) >= 0
	}
	return t
}()

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

func (c *Core) logger() *slog.Logger {
	if c.log != nil {
		return c.log
	}
	return slog.Default()
}
