package httplimit

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/preforkd/preforkd/bucket"
	"github.com/preforkd/preforkd/clientip"
	"github.com/preforkd/preforkd/config"
	"github.com/preforkd/preforkd/route"
	"github.com/preforkd/preforkd/shm"
)

// Options tunes a Middleware. The zero value is what production wants.
type Options struct {
	// Logger receives one line per shadow rule per second at most, for
	// requests that rule would have refused, with the number of such
	// requests not logged since the previous line. nil means
	// slog.Default() at the time of the line.
	Logger *slog.Logger
	// Now is the clock decisions are made with: the region's shared
	// monotonic clock. It is read once per request that matches a rule.
	// nil means region.Now.
	Now func() time.Duration
	// Wall is the wall clock, read only for X-RateLimit-Reset (Unix
	// seconds). nil means time.Now.
	Wall func() time.Time
}

// Middleware applies the [[ratelimit]] rules of a configuration to the
// requests it passes to the next handler. It is safe for concurrent use,
// and every process whose Middleware uses the same region shares its
// counts.
type Middleware struct {
	next     http.Handler
	rules    []*rule // configuration order: the order of the header items
	byName   map[string]*rule
	resolver clientip.Resolver
	headers  headerMode
	now      func() time.Duration
	wall     func() time.Time
	log      *slog.Logger // nil: slog.Default()
}

// rule is one compiled [[ratelimit]] rule and its in-process counters.
type rule struct {
	name   string
	route  route.Route
	by     clientip.By
	byIdx  int // index of the first rule with an equal by: equal bys give equal key bytes
	lim    *bucket.Limiter
	shadow bool
	hdr    ruleHeaders

	stats ruleCounters
	// Shadow logging: region time of the last line (noLog before the
	// first) and the would-be refusals not logged since.
	lastLog    atomic.Int64
	suppressed atomic.Uint64
}

const noLog = math.MinInt64

type ruleCounters struct {
	allowed, refused, shadowRefused, full atomic.Uint64
	_                                     [32]byte // keep two rules' counters off one cache line
}

// RuleStats counts what one rule decided in this process since New.
type RuleStats struct {
	Name string
	// Allowed counts served requests the rule counted (charged, or let
	// through by on_full "open").
	Allowed uint64
	// Refused counts requests this (enforcing) rule refused: 429s, and
	// 503s from on_full "closed". When two rules refuse one request, both
	// count it.
	Refused uint64
	// ShadowRefused counts served requests this shadow rule would have
	// refused.
	ShadowRefused uint64
	// Full counts decisions answered by on_full because the table had no
	// slot for the key, whatever on_full answered.
	Full uint64
}

// hit is one rule matching the request being served.
type hit struct {
	r       *rule
	key     shm.Key
	d       bucket.Decision
	decided bool // d holds a decision (a charge or a peek) for this request
	charged bool // the request is counted in the table: refund it if the request is refused
	refused bool // an enforcing rule that refuses the request
}

// inlineHits is how many matching rules a request handles without
// allocating.
const inlineHits = 8

// keyBufSize is the stack buffer for key bytes ("ip:2001:db8::", an API
// key); a longer key costs one allocation.
const keyBufSize = 256

// New compiles the rules of cfg (cfg.RateLimits, with cfg.Server's
// trusted_proxies, ipv6_prefix and headers) and binds each to region's
// counter table. region must have been joined (shm.Region.Join) by this
// process: a region that is not refuses every update, and New reports
// shm.ErrNotJoined rather than letting every rule fall to on_full.
// Requests matching no rule go to next untouched.
func New(cfg config.Config, region *shm.Region, next http.Handler, opts Options) (*Middleware, error) {
	switch {
	case region == nil:
		return nil, errors.New("httplimit: nil region")
	case next == nil:
		return nil, errors.New("httplimit: nil next handler")
	case region.Worker() < 0:
		return nil, fmt.Errorf("httplimit: %w (call Region.Join before New)", shm.ErrNotJoined)
	}
	cfg = cfg.WithDefaults()
	m := &Middleware{
		next:     next,
		byName:   make(map[string]*rule, len(cfg.RateLimits)),
		resolver: clientip.Resolver{Trusted: cfg.Server.TrustedProxies, IPv6Prefix: cfg.Server.IPv6Prefix},
		now:      opts.Now,
		wall:     opts.Wall,
		log:      opts.Logger,
	}
	if m.now == nil {
		m.now = region.Now
	}
	if m.wall == nil {
		m.wall = time.Now
	}
	if err := m.resolver.Validate(); err != nil {
		return nil, fmt.Errorf("httplimit: %w", err)
	}
	var err error
	if m.headers, err = parseHeaderMode(cfg.Server.Headers.String()); err != nil {
		return nil, err
	}
	bys := map[string]int{}
	for i := range cfg.RateLimits {
		rl := &cfg.RateLimits[i]
		ru, err := compileRule(rl, region.Counters())
		if err != nil {
			return nil, fmt.Errorf("httplimit: rule %q: %w", rl.Name, err)
		}
		if _, dup := m.byName[ru.name]; dup {
			return nil, fmt.Errorf("httplimit: rule %q defined twice", ru.name)
		}
		b := ru.by.String()
		if _, ok := bys[b]; !ok {
			bys[b] = i
		}
		ru.byIdx = bys[b]
		m.rules = append(m.rules, ru)
		m.byName[ru.name] = ru
	}
	return m, nil
}

func compileRule(rl *config.RateLimit, tab *shm.Counters) (*rule, error) {
	if !validName(rl.Name) {
		return nil, errors.New("name must be 1 or more printable ASCII characters")
	}
	rt, err := route.Compile(rl.Path, rl.Methods)
	if err != nil {
		return nil, err
	}
	by, err := clientip.ParseBy(rl.By)
	if err != nil {
		return nil, err
	}
	ru := &rule{name: rl.Name, route: rt, by: by}
	switch rl.Mode {
	case config.Enforce:
	case config.Shadow:
		ru.shadow = true
	default:
		return nil, fmt.Errorf("mode %v: want enforce or shadow", rl.Mode)
	}
	if ru.lim, err = bucket.NewLimiter(rl.BucketRule(), tab); err != nil {
		return nil, err
	}
	ru.hdr = newRuleHeaders(rl.Name, rl.Limit, rl.Window)
	ru.lastLog.Store(noLog)
	return ru, nil
}

// ServeHTTP counts r under every rule that matches it and either refuses
// it (429, or 503 from on_full "closed") or passes it to the next handler
// with the rate-limit headers already set.
func (m *Middleware) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var buf [inlineHits]hit
	hits, enforcing := m.match(r, buf[:0])
	if len(hits) == 0 {
		m.next.ServeHTTP(w, r)
		return
	}
	now := m.now()
	m.keys(r, hits)
	if refusing := m.charge(hits, enforcing, now); refusing != nil {
		m.refuse(w, hits, refusing, now)
		return
	}
	m.served(r, hits, now)
	setRateLimitHeaders(w.Header(), m.headers, hits, m.wallNow())
	m.next.ServeHTTP(w, r)
}

// match appends a hit for every rule whose route matches r and counts the
// enforcing ones. It does not allocate while hits has room.
func (m *Middleware) match(r *http.Request, hits []hit) ([]hit, int) {
	if len(m.rules) == 0 {
		return hits, 0
	}
	p := ""
	if r.URL != nil {
		p = r.URL.Path
	}
	p = route.Clean(p)
	enforcing := 0
	for _, ru := range m.rules {
		if ru.route.Match(r.Method, p) {
			hits = append(hits, hit{r: ru})
			if !ru.shadow {
				enforcing++
			}
		}
	}
	return hits, enforcing
}

// keys computes each hit's table key. Key bytes are built once for
// consecutive rules with the same `by`.
func (m *Middleware) keys(r *http.Request, hits []hit) {
	var buf [keyBufSize]byte
	var id []byte
	last := -1
	for i := range hits {
		ru := hits[i].r
		if ru.byIdx != last {
			id = ru.by.AppendKey(buf[:0], &m.resolver, r.RemoteAddr, r.Header)
			last = ru.byIdx
		}
		hits[i].key = ru.lim.Key(id)
	}
}

// charge counts the request in every matching rule, or in none: it returns
// the hit of the enforcing rule that refuses the request (the one with the
// latest RetryAfter when several do), after undoing any charge it made,
// or nil when the request is to be served, every rule charged.
//
// Phase 1, with two or more enforcing rules: peek at each, so that a
// refusal is known before anything is charged. Phase 2: charge each
// enforcing rule. A rule can still refuse here when another worker took
// the last request between the peek and the charge; then the charges
// already made for this request are refunded. With a single enforcing
// rule phase 1 is skipped: its own refusal charges nothing. Shadow rules
// never refuse, so they are charged last, when the request is served.
func (m *Middleware) charge(hits []hit, enforcing int, now time.Duration) *hit {
	if enforcing >= 2 {
		var refusing *hit
		for i := range hits {
			h := &hits[i]
			if h.r.shadow {
				continue
			}
			h.d, h.decided = h.r.lim.PeekKey(h.key, now), true
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
		if h.r.shadow {
			continue
		}
		h.d, h.decided = h.r.lim.AllowKey(h.key, now), true
		if h.d.Allowed {
			h.charged = !h.d.Full // on_full "open" took no slot: nothing to refund
			continue
		}
		h.refused = true
		for j := range hits[:i] {
			if o := &hits[j]; o.charged {
				o.r.lim.RefundKey(o.key, now)
				o.charged, o.decided = false, false // refuse peeks again for the headers
			}
		}
		return h
	}
	for i := range hits {
		if h := &hits[i]; h.r.shadow {
			h.d, h.decided = h.r.lim.AllowKey(h.key, now), true
			h.charged = h.d.Allowed && !h.d.Full
		}
	}
	return nil
}

// refuse answers a request that refusing refused; nothing is charged for
// it. The headers report what each rule's state is without the request.
func (m *Middleware) refuse(w http.ResponseWriter, hits []hit, refusing *hit, now time.Duration) {
	for i := range hits {
		h := &hits[i]
		if !h.decided {
			h.d, h.decided = h.r.lim.PeekKey(h.key, now), true
		}
		if h.refused {
			h.r.stats.refused.Add(1)
		}
		if h.d.Full {
			h.r.stats.full.Add(1)
		}
	}
	status := http.StatusTooManyRequests
	if refusing.d.Full {
		status = http.StatusServiceUnavailable
	}
	setRateLimitHeaders(w.Header(), m.headers, hits, m.wallNow())
	writeProblem(w, status, refusing, hits)
}

// served counts a request that is about to be served, and logs the shadow
// rules that would have refused it.
func (m *Middleware) served(r *http.Request, hits []hit, now time.Duration) {
	for i := range hits {
		h := &hits[i]
		st := &h.r.stats
		if h.d.Full {
			st.full.Add(1)
		}
		if h.d.Allowed {
			st.allowed.Add(1)
			continue
		}
		st.shadowRefused.Add(1) // only a shadow rule can refuse a served request
		m.logShadow(r, h, now)
	}
}

// logShadow logs a shadow rule's would-be refusal, at most one line per
// rule per second of region time; the lines left out are counted in the
// next one.
func (m *Middleware) logShadow(r *http.Request, h *hit, now time.Duration) {
	ru := h.r
	last := ru.lastLog.Load()
	if last != noLog && now-time.Duration(last) < time.Second || !ru.lastLog.CompareAndSwap(last, int64(now)) {
		ru.suppressed.Add(1)
		return
	}
	log := m.log
	if log == nil {
		log = slog.Default()
	}
	status := http.StatusTooManyRequests
	if h.d.Full {
		status = http.StatusServiceUnavailable
	}
	p := ""
	if r.URL != nil {
		p = r.URL.Path
	}
	// The client address, never the key: a header key may be a secret.
	log.LogAttrs(r.Context(), slog.LevelWarn, "httplimit: shadow rule would refuse",
		slog.String("rule", ru.name),
		slog.String("method", r.Method),
		slog.String("path", p),
		slog.String("client", m.resolver.Client(r.RemoteAddr, r.Header).String()),
		slog.Int("status", status),
		slog.Int64("retry_after", retryAfterSeconds(h.d.RetryAfter)),
		slog.Uint64("suppressed", ru.suppressed.Swap(0)))
}

func (m *Middleware) wallNow() time.Time {
	if m.headers&headersX == 0 {
		return time.Time{}
	}
	return m.wall()
}

// Limiter returns the limiter of the rule called name, or nil when there
// is no such rule: a handler can Reset a client's count with it (after a
// successful login, say), using the key from KeyOf.
func (m *Middleware) Limiter(name string) *bucket.Limiter {
	if ru := m.byName[name]; ru != nil {
		return ru.lim
	}
	return nil
}

// KeyOf returns the key bytes rule name counts r under ("ip:192.0.2.1",
// "h:X-Api-Key:…", "g"), or nil when there is no such rule. Whether the
// rule's route matches r does not matter. The bytes are the id for the
// rule's Limiter: Limiter(name).Reset(string(KeyOf(name, r)), now).
func (m *Middleware) KeyOf(name string, r *http.Request) []byte {
	ru := m.byName[name]
	if ru == nil {
		return nil
	}
	return ru.by.AppendKey(nil, &m.resolver, r.RemoteAddr, r.Header)
}

// Stats reports each rule's counts in this process, in configuration
// order. Other processes sharing the region count their own.
func (m *Middleware) Stats() []RuleStats {
	out := make([]RuleStats, len(m.rules))
	for i, ru := range m.rules {
		out[i] = RuleStats{
			Name:          ru.name,
			Allowed:       ru.stats.allowed.Load(),
			Refused:       ru.stats.refused.Load(),
			ShadowRefused: ru.stats.shadowRefused.Load(),
			Full:          ru.stats.full.Load(),
		}
	}
	return out
}
