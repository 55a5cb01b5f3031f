package core

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/preforkd/preforkd/bucket"
	"github.com/preforkd/preforkd/clientip"
	"github.com/preforkd/preforkd/route"
	"github.com/preforkd/preforkd/shm"
)

// Control inspects and forgets the state of single keys: what an operator
// does after a support call ("this customer was locked out"), and what an
// application does after a successful login. Keys are named as operators
// know them (clientip.ParseKeyRef): "ip:192.0.2.1", or a bare address,
// "header:X-Api-Key:VALUE", "path:/api/x", "global"; and the key of a
// rule's RateLimit.KeyFunc by the value it gave, "func:alice".
//
// Unlike a Core, a Control needs no worker identity: a supervisor that
// never serves builds one over the region it created (NewControl); in a
// worker, Core.Control returns one. It is safe for concurrent use, and
// every process sharing the region sees what it does at once. The state
// of a Redis rule is Redis's: a Control looks it up there and resets it
// there (through Options.Redis, RedisRules of a redisstore.Store, which
// may be over a region this process has not joined); when Redis does not
// answer, the error wraps redisstore.ErrUnavailable.
type Control struct{ c *Core }

// NewControl compiles opts over region, which this process need not have
// joined.
func NewControl(region *shm.Region, opts Options) (*Control, error) {
	c, err := newCore(region, opts)
	if err != nil {
		return nil, err
	}
	return &Control{c}, nil
}

// Control returns the Control over c's rules and region.
func (c *Core) Control() *Control { return &Control{c} }

// ErrUnknownRule means no rate-limit rule has the name given.
var ErrUnknownRule = errors.New("core: no such rule")

// KeyError means a key does not name a key of the rule: it does not parse,
// or the rule does not count by that element.
type KeyError struct {
	Rule string // "" for an idempotency key
	Msg  string
}

func (e *KeyError) Error() string {
	if e.Rule == "" {
		return "core: " + e.Msg
	}
	return fmt.Sprintf("core: rule %q: %s", e.Rule, e.Msg)
}

// KeyState is the state of one key under one rule. It says which element
// of the rule's `by` the key is, never its value: the value may be a
// secret.
type KeyState struct {
	Rule    string
	Element string // "ip", "header:X-Api-Key", ... (clientip.KeyRef.Element)
	// Override reports that an override's limit applies to the key rather
	// than the rule's own.
	Override bool
	// Stored reports that the key has a slot in the table; a key without
	// one is as fresh.
	Stored     bool
	Limit      int64
	Remaining  int64         // what could still pass now
	Limited    bool          // a request now would be refused
	RetryAfter time.Duration // until the next request may pass (Limited)
	ResetAfter time.Duration // until the key is as fresh
}

// KeyState reports the state of key under the rule called rule at the
// region's time.
func (ct *Control) KeyState(rule, key string) (KeyState, error) {
	ru, ref, err := ct.ruleKey(rule, key)
	if err != nil {
		return KeyState{}, err
	}
	id, value := ct.keyBytes(ru, ref)
	now := ct.c.now()
	vs := ct.variants(ru, ref, value)
	for _, v := range vs {
		d, stored, err := v.state(id, now)
		if err != nil {
			return KeyState{}, fmt.Errorf("core: rule %q: %w", rule, err)
		}
		if stored {
			return keyState(ru, ref, v, d, true), nil
		}
	}
	// Not stored: a fresh key, under the limit that would apply. For a key
	// that is not an address, that is the rule's own unless an override
	// names the value: which client will send it is not known.
	v := &ru.base
	if vs[0] == ru.byKey[value] || ref.Element == "ip" {
		v = vs[0]
	}
	d, _, err := v.state(id, now)
	if err != nil {
		return KeyState{}, fmt.Errorf("core: rule %q: %w", rule, err)
	}
	return keyState(ru, ref, v, d, false), nil
}

// state is the state of the key made of id under v at now: stored
// reports that v keeps something of it (a slot in the table, a key in
// Redis); otherwise d is a fresh key's.
func (v *variant) state(id []byte, now time.Duration) (d bucket.Decision, stored bool, err error) {
	if v.remote != nil {
		k := v.remote.Key(id)
		return v.remote.State(&k, now)
	}
	k := v.lim.Key(id)
	if d, ok := v.lim.Lookup(k, now); ok {
		return d, true, nil
	}
	return v.lim.PeekKey(k, now), false, nil
}

// reset forgets the key made of id under v: in the table, or for a Redis
// rule in Redis, in this host's deny cache and sync counts, and in its
// local share; request for a reset on a request's path
// (SharedLimiter.Reset).
func (v *variant) reset(id []byte, now time.Duration, request bool) error {
	if v.remote == nil {
		v.lim.ResetKey(v.lim.Key(id), now)
		return nil
	}
	if v.fallback != nil {
		v.fallback.lim.ResetKey(v.fallback.lim.Key(id), now)
	}
	k := v.remote.Key(id)
	return v.remote.Reset(&k, now, request)
}

// ResetKey forgets key under the rule called rule: its next request finds
// the whole allowance, in every worker at once. Where the limit that
// applies cannot be told from the key alone (an override for some client
// addresses, and a key made of a header), the key is forgotten under each
// candidate. It returns the key's state before.
func (ct *Control) ResetKey(rule, key string) (before KeyState, err error) {
	if before, err = ct.KeyState(rule, key); err != nil {
		return before, err
	}
	ru, ref, _ := ct.ruleKey(rule, key)
	id, value := ct.keyBytes(ru, ref)
	now := ct.c.now()
	for _, v := range ct.variants(ru, ref, value) {
		if err := v.reset(id, now, false); err != nil {
			return before, fmt.Errorf("core: rule %q: %w", rule, err)
		}
	}
	return before, nil
}

func keyState(ru *rule, ref clientip.KeyRef, v *variant, d bucket.Decision, stored bool) KeyState {
	return KeyState{
		Rule: ru.name, Element: ref.Element, Override: v != &ru.base, Stored: stored,
		Limit: d.Limit, Remaining: d.Remaining, Limited: !d.Allowed,
		RetryAfter: d.RetryAfter, ResetAfter: d.ResetAfter,
	}
}

// ruleKey finds the rule and parses the key, which must be of an element
// the rule counts by.
func (ct *Control) ruleKey(rule, key string) (*rule, clientip.KeyRef, error) {
	ru := ct.c.byName[rule]
	if ru == nil {
		return nil, clientip.KeyRef{}, fmt.Errorf("%w %q", ErrUnknownRule, rule)
	}
	ref, err := clientip.ParseKeyRef(key)
	if err != nil {
		return nil, ref, &KeyError{Rule: rule, Msg: strings.TrimPrefix(err.Error(), "clientip: ")}
	}
	els := ru.by.Elements()
	if ru.keyFunc != nil {
		els = append([]string{"func"}, els...)
	}
	if !slices.Contains(els, ref.Element) {
		return nil, ref, &KeyError{Rule: rule, Msg: fmt.Sprintf("it counts by %s, and %s is not one of them",
			strings.Join(els, "|"), ref.Element)}
	}
	return ru, ref, nil
}

// keyBytes makes the key a request carrying ref's element would be counted
// under, by the rule's own `by` (the one source of key bytes).
func (ct *Control) keyBytes(ru *rule, ref clientip.KeyRef) (id []byte, value string) {
	if ref.Element == "func" { // ruleKey let it through: ru has a key function
		id, _ = clientip.AppendFuncKey(nil, ref.Value) // ParseKeyRef made sure it is usable
		return id, ref.Value
	}
	return ct.keyBytesBy(ru.by, ref)
}

// keyBytesBy is keyBytes for any `by`.
func (ct *Control) keyBytesBy(by clientip.By, ref clientip.KeyRef) (id []byte, value string) {
	src := &refSource{ref: ref}
	switch ref.Element {
	case "ip":
		src.addr = ct.c.resolver.Mask(ref.Addr)
	case "path":
		src.path = pathValue(ref.Value, ct.c.caseSens)
	}
	id, value, err := by.AppendKeyValue(nil, src)
	if err != nil {
		panic("core: a key reference made a repeated key: " + err.Error()) // refSource reports one line
	}
	return id, strings.Clone(value)
}

// pathValue is the value a path element makes of the path p as a request
// sends it: as rules see it, normalized, and case-folded unless paths are
// case-sensitive (keyView). A path the core would refuse is kept as
// given.
func pathValue(p string, caseSens bool) string {
	if match, _, err := route.Normalize(p); err == nil {
		p = match
	}
	if !caseSens {
		p = strings.ToLower(p)
	}
	return p
}

// variants are the limits key may be kept under, most specific first: an
// override for its value, the overrides for its client address (all of
// them when the key is not an address: the client that sent it is not
// known), and the rule's own.
func (ct *Control) variants(ru *rule, ref clientip.KeyRef, value string) []*variant {
	var out []*variant
	if v := ru.byKey[value]; value != "" && v != nil {
		out = append(out, v)
	}
	for _, v := range ru.overrides {
		if ref.Element != "ip" || v.clients.Contains(ref.Addr) {
			out = append(out, v)
		}
	}
	return append(out, &ru.base)
}

// refSource is the clientip.Source of a request that carries only what a
// key reference names.
type refSource struct {
	ref  clientip.KeyRef
	addr netip.Addr
	path string
}

func (s *refSource) Header(name string) (string, int) {
	if s.ref.Element == "header:"+name {
		return s.ref.Value, 1
	}
	return "", 0
}

func (s *refSource) Cookie(name string) (string, bool) {
	if s.ref.Element == "cookie:"+name {
		return s.ref.Value, true
	}
	return "", false
}

func (s *refSource) Query(name string) (string, int) {
	if s.ref.Element == "query:"+name {
		return s.ref.Value, 1
	}
	return "", 0
}

func (s *refSource) Path() string          { return s.path }
func (s *refSource) ClientKey() netip.Addr { return s.addr }

// ErrInFlight means the idempotency key's request is running: forgetting
// its reservation would let a retry run it a second time.
var ErrInFlight = errors.New("core: the key's request is still running")

// ForgetResponse drops the responses stored for the idempotency key key
// (as a client sends it in the block's header: a quoted string or a bare
// token) of the client named by by (a key reference of the block's `by`,
// as for KeyState: "ip:192.0.2.1", "header:Authorization:Bearer …"), in
// every block whose `by` has that element: a retry then runs again. It
// returns how many it dropped, and ErrInFlight when the request is still
// running (nothing is dropped for that block).
func (ct *Control) ForgetResponse(key, by string) (int, error) {
	c := ct.c
	if len(c.blocks) == 0 {
		return 0, &KeyError{Msg: "no idempotency block is configured"}
	}
	ref, err := clientip.ParseKeyRef(by)
	if err != nil {
		return 0, &KeyError{Msg: "by: " + strings.TrimPrefix(err.Error(), "clientip: ")}
	}
	now, tab := c.now(), c.region.Responses()
	n, matched := 0, false
	var inFlight error
	for _, b := range c.blocks {
		if !slices.Contains(b.by.Elements(), ref.Element) {
			continue
		}
		matched = true
		id, _ := ct.keyBytesBy(b.by, ref)
		id = append(id, 0)
		id, kp := parseKey(id, key, 1)
		if kp != keyOK {
			return n, &KeyError{Msg: "key: not a valid " + b.header}
		}
		forgot, err := tab.Forget(c.region.Counters().KeyOf(b.ns, id), now)
		switch {
		case errors.Is(err, shm.ErrInFlight):
			inFlight = ErrInFlight
		case err != nil:
			return n, err
		case forgot:
			n++
		}
	}
	if !matched {
		return 0, &KeyError{Msg: "by: no idempotency block keys its clients by " + ref.Element}
	}
	return n, inFlight
}
