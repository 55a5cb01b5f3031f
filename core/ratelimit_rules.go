package core

import (
	"fmt"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/preforkd/preforkd/bucket"
	"github.com/preforkd/preforkd/clientip"
	"github.com/preforkd/preforkd/metrics"
	"github.com/preforkd/preforkd/route"
	"github.com/preforkd/preforkd/shm"
)

// rule is one compiled rate-limit rule and its in-process counters.
type rule struct {
	name  string
	route *RateLimit
	by    clientip.By
	byIdx int // index of the first rule with an equal by: equal bys give equal key bytes
	// keyFunc is RateLimit.KeyFunc: a rule with one has a byIdx of its own.
	keyFunc func(Request) string
	shadow  bool
	status  int // of a refusal: 429 or 503
	exempt  clientip.PrefixSet
	// maxKeys bounds the counter slots of the rule's keys, its overrides'
	// included (bucket.Rule.MaxKeys, the default resolved), all charged to
	// account.
	maxKeys int
	account uint16

	// base is the rule's own limit; overrides replace it for some keys:
	// byKey by exact key value, then the first whose clients contain the
	// client.
	base      variant
	overrides []*variant
	byKey     map[string]*variant

	// stat is the rule's index in the region's statistics (-1: none, its
	// requests are not counted).
	stat int
	// Rate-limited log lines: refusals, shadow refusals, keys let through
	// by on_full "open" and by on_unavailable "open".
	refusedLog, shadowLog, fullLog, unavailableLog lineGate
}

// variant is one limit of a rule: its own, or an override's. Each has its
// own key namespace, so a key lives in one slot, under the limit that
// applies to it.
type variant struct {
	lim     *bucket.Limiter // a local rule's; nil for a Redis rule
	hdr     ruleHeaders
	clients clientip.PrefixSet

	// A Redis rule's limiter, and for on_unavailable "local" the
	// variant of this host's share (a local one, headers of its own
	// limit).
	remote   SharedLimiter
	fallback *variant
}

func (c *Core) compileRules(rls []RateLimit, shadowAll bool) error {
	if err := CheckAccounts(rls); err != nil {
		return err
	}
	tab := c.region.Counters()
	bys := map[string]int{}
	for i := range rls {
		rl := rls[i]
		if rl.Redis != nil && c.redis == nil {
			return fmt.Errorf("core: rule %q is a Redis rule, but Options.Redis has no store: set it to core.RedisRules(store)", rl.Rule.Name)
		}
		if rl.Rule.MaxKeys == 0 {
			rl.Rule.MaxKeys = DefaultMaxKeys(tab.Len(), len(rls))
		}
		ru, err := compileRule(&rl, tab, c.redis, c.caseSens, c.now)
		if err != nil {
			return err
		}
		c.statRule(ru)
		if _, dup := c.byName[ru.name]; dup {
			return fmt.Errorf("core: rule %q defined twice", ru.name)
		}
		ru.shadow = ru.shadow || shadowAll
		b := ru.by.String()
		if ru.keyFunc != nil {
			b = fmt.Sprintf("func of rule %d", i) // its keys are its own
		}
		if _, ok := bys[b]; !ok {
			bys[b] = i
		}
		ru.byIdx = bys[b]
		c.rules = append(c.rules, ru)
		c.byName[ru.name] = ru
	}
	return nil
}

// DefaultMaxKeys is a rule's MaxKeys when it sets none: half of the
// table's slots when there are several rules, so that no rule's keys can
// take another's room, else all of them.
func DefaultMaxKeys(slots, rules int) int {
	if rules > 1 {
		return max(slots/2, 1)
	}
	return slots
}

// An AccountError is two rules whose names hash to one 16-bit account
// (bucket.Rule.Account): their keys would share one count of slots, so
// that one rule's flood could take the other's room, and a dump could not
// tell their state apart (persistence drops both at every restart).
// Renaming either rule ends it.
//
// With Override set (1-based), it is that override of the later rule,
// whose state's 16-bit tag Other (a rule or an override, described)
// has: persistence could not tell their state apart. Renaming the rule
// ends it.
type AccountError struct {
	Rule     string // the later rule
	Index    int    // its index among the rules
	Override int    // 1-based index of the rule's override at fault; 0: the rule itself
	Other    string // the earlier rule (with Override set: "rule NAME" or "override N of rule NAME")
	Account  uint16 // the account (with Override set: the tag) they share
}

func (e *AccountError) Error() string {
	if e.Override > 0 {
		return fmt.Sprintf("core: rule %q: the state of its override %d hashes to the 16-bit tag %#04x of %s; rename the rule", e.Rule, e.Override, e.Account, e.Other)
	}
	return fmt.Sprintf("core: rule %q: its name hashes to the 16-bit account %#04x of rule %q; rename one of them", e.Rule, e.Account, e.Other)
}

// CheckAccounts reports the first rule whose account an earlier rule
// has, as an *AccountError, else the first override whose state shares
// its 16-bit tag with another rule's or override's, as an *AccountError
// with Override set. Rules are told apart by a 16-bit hash of their
// names: two of 20 rules collide with a chance of about 0.3%.
func CheckAccounts(rls []RateLimit) error {
	seen := make(map[uint16]string, len(rls))
	for i := range rls {
		r := rls[i].Rule
		a := r.Account()
		if other, ok := seen[a]; ok && other != r.Name {
			return &AccountError{Rule: r.Name, Index: i, Other: other, Account: a}
		}
		seen[a] = r.Name
	}
	// An override's state is kept under a name of its own (stateName),
	// whose tag marks its slots: persistence tells rules' state apart by
	// it, and a rule's limiter judges by it which slots its own earlier
	// definitions left. A tag shared with another rule's or override's
	// would lose both at every restart. The base rules' tags are their
	// accounts, checked above.
	type owner struct{ state, desc string }
	owners := make(map[uint16]owner, len(rls))
	for i := range rls {
		n := rls[i].Rule.Name
		owners[rls[i].Rule.Tag()] = owner{n, fmt.Sprintf("rule %q", n)}
	}
	for i := range rls {
		rl := &rls[i]
		// A Redis rule's overrides too: in sync mode, and for
		// on_unavailable "local", their counts are in this host's table.
		for j := range rl.Overrides {
			r := rl.Overrides[j].rule(rl.Rule)
			t := r.Tag()
			// One key overridden twice is one state (and the rule's
			// own check's to report).
			if other, ok := owners[t]; ok && other.state != r.Name {
				return &AccountError{Rule: rl.Rule.Name, Index: i, Override: j + 1, Other: other.desc, Account: t}
			}
			owners[t] = owner{r.Name, fmt.Sprintf("override %d of rule %q", j+1, rl.Rule.Name)}
		}
	}
	return nil
}

// OverrideError is a problem with override Index (0-based) of a rule:
// Err is a *FieldError about the override itself ("Key" when it selects
// by neither or both of key and clients) or a *bucket.RuleError about
// its rate.
type OverrideError struct {
	Rule  string
	Index int
	Err   error
}

func (e *OverrideError) Error() string {
	// Err is a *FieldError or a *bucket.RuleError, whose Rule is the
	// name the override's state is kept under (the rule's, NUL, the
	// key): no name the program wrote. Their Msg alone says what.
	msg := e.Err.Error()
	switch err := e.Err.(type) {
	case *FieldError:
		msg = err.Msg
	case *bucket.RuleError:
		msg = err.Msg
	}
	return fmt.Sprintf("core: rule %q: override %d: %s", e.Rule, e.Index+1, msg)
}

func (e *OverrideError) Unwrap() error { return e.Err }

// Check reports what is wrong with a rule, as New would: a name that
// cannot be sent in headers, a refusal status other than 429 or 503, the
// rate (bucket.Rule.Compile, whose *bucket.RuleError says which field),
// an override that selects by neither or both of key and clients, or
// whose own rate is wrong (an *OverrideError around the cause).
func (rl *RateLimit) Check() error {
	name := rl.Rule.Name
	if !printableASCII(name) {
		return &FieldError{Field: "Name", Msg: "a name must be 1 or more printable ASCII characters", Rule: name}
	}
	if strings.IndexByte(name, ',') >= 0 || strings.TrimSpace(name) != name {
		// The reset header's value is a list of names (Options.ResetHeader).
		return &FieldError{Field: "Name", Msg: "a name is an element of a comma-separated list: no comma, no space at either end", Rule: name}
	}
	switch rl.Status {
	case 0, http.StatusTooManyRequests, http.StatusServiceUnavailable:
	default:
		return &FieldError{Field: "Status", Msg: fmt.Sprintf("status %d: want 429 or 503", rl.Status), Rule: name}
	}
	if rl.Route.String() == "" {
		// The zero Route matches no request: a rule that never counts.
		return &FieldError{Field: "Route", Msg: "no route: give it one (route.Compile(\"/*\", nil) for every request)", Rule: name}
	}
	if _, err := rl.Rule.Compile(); err != nil {
		return err // bucket's error names the rule
	}
	if !validPrefixes(rl.Exempt) {
		return &FieldError{Field: "Exempt", Msg: "an invalid (zero) netip.Prefix in Exempt", Rule: name}
	}
	keys := map[string]bool{}
	for i := range rl.Overrides {
		o := &rl.Overrides[i]
		fail := func(err error) error { return &OverrideError{name, i, err} }
		switch {
		case (o.Key == "") == (len(o.Clients) == 0):
			return fail(&FieldError{Field: "Key", Msg: "give it either a key or clients"})
		case o.Key != "" && keys[o.Key]:
			return fail(&FieldError{Field: "Key", Msg: fmt.Sprintf("key %q is overridden twice", o.Key)})
		case !validPrefixes(o.Clients):
			return fail(&FieldError{Field: "Clients", Msg: "an invalid (zero) netip.Prefix in Clients"})
		case len(o.Clients) > 0 && shadowed(o.Clients, rl.Exempt, rl.Overrides[:i]):
			return fail(&FieldError{Field: "Clients", Msg: "every client range of it is exempt or an earlier override's: it would never apply"})
		}
		keys[o.Key] = true
		if _, err := o.rule(rl.Rule).Compile(); err != nil {
			return fail(err)
		}
	}
	return nil
}

// validPrefixes reports whether every prefix of ps is valid. The zero
// Prefix, which netip.ParsePrefix returns with its error, matches no
// address: a range list holding one would silently leave out the clients
// it was meant to hold.
func validPrefixes(ps []netip.Prefix) bool {
	for _, p := range ps {
		if !p.IsValid() {
			return false
		}
	}
	return true
}

// shadowed reports whether the rule's exempt ranges and the client
// overrides before (the first that holds a client applies) take every
// one of clients, so that an override of them would never apply.
func shadowed(clients, exempt []netip.Prefix, before []Override) bool {
	within := func(p netip.Prefix, of []netip.Prefix) bool {
		for _, q := range of {
			if q.Bits() <= p.Bits() && q.Contains(p.Addr()) {
				return true
			}
		}
		return false
	}
	for _, p := range clients {
		taken := within(p, exempt)
		for i := 0; i < len(before) && !taken; i++ {
			taken = within(p, before[i].Clients)
		}
		if !taken {
			return false
		}
	}
	return true
}

// rule is the bucket rule of an override of base: base's, with the
// override's rate and a name of its own (see stateName), in base's group,
// so that its keys count against base's MaxKeys.
func (o *Override) rule(base bucket.Rule) bucket.Rule {
	r := base
	r.Name = o.stateName(base.Name)
	if r.Group == "" {
		r.Group = base.Name
	}
	r.Limit, r.Burst = o.Limit, o.Burst
	if o.Window != 0 {
		r.Window = o.Window
	}
	return r
}

func compileRule(rl *RateLimit, tab *shm.Counters, store SharedStore, caseSens bool, clock func() time.Duration) (*rule, error) {
	if err := rl.Check(); err != nil {
		return nil, err
	}
	ru := &rule{name: rl.Rule.Name, route: rl, by: rl.By, keyFunc: rl.KeyFunc, shadow: rl.Shadow, status: rl.Status,
		exempt: clientip.NewPrefixSet(rl.Exempt), maxKeys: rl.Rule.MaxKeys, account: rl.Rule.Account()}
	if ru.status == 0 {
		ru.status = http.StatusTooManyRequests
	}
	var err error
	if ru.base, err = newVariant(rl.Rule, rl.Redis, tab, store, clock); err != nil {
		return nil, err
	}
	byPath := slices.Contains(rl.By.Elements(), "path")
	for i := range rl.Overrides {
		o := &rl.Overrides[i]
		r := o.rule(rl.Rule)
		v, err := newVariant(r, rl.Redis, tab, store, clock)
		if err != nil {
			return nil, err
		}
		v.hdr = newRuleHeaders(ru.name, r.Limit, r.Window) // clients see the rule's name
		if v.fallback != nil {
			_, limit := v.remote.LocalShare()
			v.fallback.hdr = newRuleHeaders(ru.name, limit, r.Window)
		}
		v.clients = clientip.NewPrefixSet(o.Clients)
		if o.Key != "" {
			if ru.byKey == nil {
				ru.byKey = map[string]*variant{}
			}
			ru.byKey[o.Key] = &v
			// A request's path value is its match path (pathValue):
			// "/api/Export" as written would match no request. The
			// override applies to the path it reads as, unless another
			// names that path exactly (written later, it takes it over)
			// or read as it first: every worker compiles the same choice.
			if byPath && strings.HasPrefix(o.Key, "/") {
				if p := pathValue(o.Key, caseSens); ru.byKey[p] == nil {
					ru.byKey[p] = &v
				}
			}
		} else {
			ru.overrides = append(ru.overrides, &v)
		}
	}
	return ru, nil
}

// statRule gives ru its index in the region's statistics and its log
// gates. A region whose name table is full (more distinct rule names over
// its life than it has room for) counts the rule nowhere: said once, here.
func (c *Core) statRule(ru *rule) {
	r := c.region
	ru.stat = metrics.RuleIndex(r, ru.name)
	if ru.stat < 0 && r.Geometry().StatNames > 0 { // a region made with no statistics counts none
		c.logger().Warn("rule not counted in the metrics: the region has no room for another rule name (a restart makes room)", "rule", ru.name)
	}
	gate := func(kind int, results ...int) lineGate {
		return lineGate{g: metrics.RuleGate(r, ru.stat, kind), total: func() uint64 {
			var n uint64
			for _, res := range results {
				n += metrics.RuleTotal(r, metrics.RateLimitRequests, ru.stat, res)
			}
			return n
		}}
	}
	ru.refusedLog = gate(metrics.GateRefused, metrics.Limited, metrics.FullClosed, metrics.CappedClosed)
	ru.shadowLog = gate(metrics.GateShadow, metrics.ShadowLimited)
	ru.fullLog = gate(metrics.GateFull, metrics.FullOpen, metrics.CappedOpen)
	ru.unavailableLog = gate(metrics.GateUnavailable, metrics.UnavailableOpen)
}

// stateName is the name an override's state is kept under: the rule's,
// and what the override selects, so that a reload that changes one
// override (or a dump guarded by it) touches only that override's keys.
func (o *Override) stateName(rule string) string {
	if o.Key != "" {
		return rule + "\x00key\x00" + o.Key
	}
	var b strings.Builder
	b.WriteString(rule + "\x00clients")
	for _, p := range o.Clients {
		b.WriteString("\x00" + p.String())
	}
	return b.String()
}

func newVariant(r bucket.Rule, rr *RedisRule, tab *shm.Counters, store SharedStore, clock func() time.Duration) (variant, error) {
	if rr == nil {
		lim, err := bucket.NewLimiter(r, tab)
		if err != nil {
			return variant{}, err
		}
		lim.SetClock(clock)
		return variant{lim: lim, hdr: newRuleHeaders(r.Name, r.Limit, r.Window)}, nil
	}
	rem, err := store.Limiter(SharedRule{Rule: r, OnUnavailable: rr.OnUnavailable, LocalShare: rr.LocalShare, Sync: rr.Sync})
	if err != nil {
		return variant{}, err
	}
	if c, ok := rem.(interface{ SetClock(func() time.Duration) }); ok {
		c.SetClock(clock) // a sync-mode rule decides on the host's table too
	}
	v := variant{remote: rem, hdr: newRuleHeaders(r.Name, r.Limit, r.Window)}
	if ls, limit := rem.LocalShare(); ls != nil {
		ls.SetClock(clock) // decided on the host's table, as a local rule's
		// The share's headers name the rule and announce the limit it
		// enforces while Redis is away.
		v.fallback = &variant{lim: ls, hdr: newRuleHeaders(r.Name, limit, r.Window)}
	}
	return v, nil
}

// printableASCII reports whether a rule name can appear in the headers as
// it is.
func printableASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return s != ""
}

// RateLimit is one compiled rate-limit rule.
type RateLimit struct {
	// Rule is the limit itself (name, limit, window, algorithm, burst,
	// on_full); its Name must be printable ASCII, as it is sent in headers.
	Rule bucket.Rule
	// Route is the requests the rule counts (route.Compile; "/*" for
	// every one). Required: the zero Route matches none, and is refused.
	Route route.Route
	// By is what the rule counts a request under (clientip.ParseBy); the
	// zero By is "ip".
	By clientip.By
	// Shadow counts and sends headers but never refuses.
	Shadow bool
	// Status is the status of a refusal: 429 (0 means 429) or 503.
	Status int
	// Exempt clients are never counted or refused by this rule (an
	// invalid, zero, prefix is refused).
	Exempt []netip.Prefix
	// Overrides give some keys or clients another limit.
	Overrides []Override
	// KeyFunc, if set, makes the key a request counts under from what
	// only the application can read (the user of a verified session or
	// token, say: engine/nethttp's HTTPRequest gives the net/http request
	// of r). It must be fast and must not block: it runs for every
	// request the rule matches, before the rule decides, and so before
	// the application's handler: it reads the request as the client sent
	// it (verifying the session or token itself), never what a middleware
	// inside the handler adds to it. KeyOf and Reset run it again, on the
	// request they are given. An empty value (or one with control bytes)
	// falls back to By. A value longer than 256 bytes is hashed; an
	// override's Key is matched against the value. The key, as KeyOf
	// makes it ("f:" and the value, or its hash), is what
	// Limiter(name).Peek and Reset take; a Control names it "func:" and
	// the value ("func:alice").
	KeyFunc func(r Request) string
	// Redis, if set, keeps the rule's counts (and each override's) in
	// Options.Redis instead of this host's table: one limit for every
	// host.
	Redis *RedisRule
}

// RedisRule is how a rule uses Redis.
type RedisRule struct {
	// OnUnavailable answers when Redis cannot decide (down, slow, the
	// breaker open): let the request through, refuse it (503), or enforce
	// this host's share of the limit on its own table.
	OnUnavailable OnUnavailable
	// LocalShare is the number of hosts sharing the rule, for
	// OnUnavailable local: this host enforces the limit (and burst)
	// divided by it. 0 means 1.
	LocalShare int
	// Sync 0 decides every request in Redis (one round trip); a positive
	// interval counts on this host and adds the counts to Redis every
	// interval (fixed window only; see package redisstore for the bound
	// on over-admission).
	Sync time.Duration
}

// Override is another limit for some keys of a rule (an API key of a
// paying tier) or for some clients: exactly one of Key and Clients is set.
// A key an override selects lives in one slot, under the override's limit
// (never also under the rule's), in a namespace of the override's own, so
// that changing one override leaves every other key's count alone.
type Override struct {
	// Key is an exact key value: the header, cookie or query value (or
	// the path) that the rule's by made the key of.
	Key string
	// Clients are client address ranges (an invalid, zero, prefix is
	// refused).
	Clients []netip.Prefix
	// Limit, Window and Burst are as a rule's (Window 0: the rule's).
	Limit  int64
	Window time.Duration
	Burst  int64
}

// StateRules are the bucket rules whose state a core with these options
// keeps in the host's table: each local rule's own and each override's,
// for persistence to guard (each is dropped at load when its definition
// changed). Redis rules keep theirs in Redis: nothing of theirs is
// dumped.
func (o *Options) StateRules() []bucket.Rule {
	var out []bucket.Rule
	for i := range o.RateLimits {
		rl := &o.RateLimits[i]
		if rl.Redis != nil {
			continue
		}
		out = append(out, rl.Rule)
		for j := range rl.Overrides {
			out = append(out, rl.Overrides[j].rule(rl.Rule))
		}
	}
	return out
}
