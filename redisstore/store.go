package redisstore

import (
	"cmp"
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/redis/go-redis/v9"

	"github.com/preforkd/preforkd/bucket"
	"github.com/preforkd/preforkd/core"
	"github.com/preforkd/preforkd/shm"
)

// ErrUnavailable means Redis did not decide: the call failed or timed
// out, or the breaker is open. The rule's OnUnavailable answers.
var ErrUnavailable = errors.New("redisstore: redis unavailable")

// Store keeps the counts of rate-limit rules in Redis, shared by every
// host, with a deny cache and a circuit breaker in the host's region. One
// Store per process; it is safe for concurrent use.
type Store struct {
	rdb     redis.UniversalClient
	owns    bool // Close closes rdb
	cluster bool
	// slots is rdb when it is a Cluster's client: its slot map is
	// reloaded while calls fail (see reloadSlots); slotsAsked is the
	// region time of the last reload asked for, +1 (0: never).
	slots      *redis.ClusterClient
	slotsAsked atomic.Int64
	tab        *shm.Counters
	region     *shm.Region
	timeout    time.Duration
	prefix     string
	host       string
	log        *slog.Logger
	// joined: the region was joined by this process, which may decide;
	// otherwise the Store only inspects and resets keys (see New).
	joined bool

	decide, flush script
	br            sharedBreaker
	st            counters
	obs           Observer

	syncMu    sync.Mutex
	syncRules []*Limiter
	flusher   *flusher
	closeOnce sync.Once
	closeErr  error
	warmed    chan struct{} // closed when the warm-up is over

	// clock is Redis's clock minus the region's, in µs, as last measured
	// (when the flusher starts, then by each flush); clockKnown is set once
	// it was.
	clock      atomic.Int64
	clockKnown atomic.Bool
}

// New connects a Store to Redis (lazily: nothing is sent yet) over
// region. A process that decides (a worker) has joined region first; one
// that has not (a supervisor's admin endpoint) gets a Store that only
// looks at keys and forgets them (Limiter.State, Limiter.Reset): its
// Decide answers ErrUnavailable wrapping shm.ErrNotJoined, and its
// sync-mode limiters count nothing and flush nothing.
func New(region *shm.Region, o Options) (*Store, error) {
	if region == nil {
		return nil, errors.New("redisstore: nil region")
	}
	o, err := o.withDefaults()
	if err != nil {
		return nil, err
	}
	s := &Store{
		rdb: o.Client, cluster: len(o.Cluster) > 0, tab: region.Counters(), region: region,
		timeout: o.Timeout, prefix: o.Prefix, host: o.Host, log: o.Logger,
		decide: newScript(decideScript), flush: newScript(flushScript),
		joined: region.Worker() >= 0, obs: o.Observer,
	}
	if s.obs == nil {
		s.obs = noObserver{}
	}
	if s.rdb == nil {
		if s.rdb, err = newClient(o); err != nil {
			return nil, err
		}
		s.owns = true
	}
	if cc, ok := s.rdb.(*redis.ClusterClient); ok {
		s.cluster, s.slots = true, cc
	}
	if s.host == "" {
		// The seeds alone would not do: a region that loads a dump takes
		// the dump's, and would take the host's counts in Redis from
		// before the restart for its own, which the region no longer
		// holds (nothing of a Redis rule is dumped).
		a, b := region.Seeds()
		c := uint64(region.Created().UnixNano())
		s.host = fmt.Sprintf("%016x", a^b*0x9e3779b97f4a7c15^c*0xbf58476d1ce4e5b9)
	}
	s.tab.SetFresh(bucket.Fresh) // the deny cache and the sync counts are judged as bucket's
	s.br = newSharedBreaker(s.tab, o.Breaker, target(o), region.Worker(), s.log)
	s.warmed = make(chan struct{})
	go s.warm()
	return s, nil
}

// warmTimeout bounds the warm-up: connecting and loading the scripts
// happen off the request path, so they may take longer than Timeout.
const warmTimeout = 2 * time.Second

// warm connects to Redis and loads the scripts once, in the background,
// so that the first requests neither dial under their timeout nor meet
// NOSCRIPT. A failure is left to the requests (and the breaker) to find.
func (s *Store) warm() {
	defer close(s.warmed)
	ctx, cancel := context.WithTimeout(context.Background(), warmTimeout)
	defer cancel()
	for _, sc := range []*script{&s.decide, &s.flush} {
		if err := s.rdb.ScriptLoad(ctx, sc.src).Err(); err != nil {
			return
		}
	}
}

// target names the Redis a breaker watches, so that a reload to another
// Redis starts with a breaker of its own.
func target(o Options) string {
	switch {
	case o.URL != "":
		return "url\x00" + o.URL
	case len(o.Cluster) > 0:
		return fmt.Sprint("cluster\x00", o.Cluster)
	case o.Sentinel.Master != "":
		return fmt.Sprint("sentinel\x00", o.Sentinel.Master, o.Sentinel.Addrs)
	}
	return "client"
}

// Close stops the sync flusher after a last flush, and closes the client
// the Store built. It is idempotent.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		s.syncMu.Lock()
		f := s.flusher
		s.syncMu.Unlock()
		if f != nil {
			f.stop()
		}
		<-s.warmed
		if s.owns {
			s.closeErr = s.rdb.Close()
		}
	})
	return s.closeErr
}

// Warmed is closed when the Store's background warm-up (connecting,
// loading the scripts) is over, whether it succeeded or not: a caller that
// must not have its first requests dial under Timeout waits for it.
func (s *Store) Warmed() <-chan struct{} { return s.warmed }

// Client is the go-redis client the Store calls.
func (s *Store) Client() redis.UniversalClient { return s.rdb }

// Rule is a rate-limit rule whose counts Redis keeps: core's shared rule.
type Rule = core.SharedRule

// Key is a client's key in a Limiter: core's shared key (its ID names it
// in Redis, Deny its deny-cache entry in the host's table, Host and
// Remote its sync-mode counts there).
type Key = core.SharedKey

// Hit is a rule of a request that Decide decides: core's shared hit,
// whose Lim is a *Limiter of this store.
type Hit = core.SharedHit

// Limiter is core.SharedStore's Limiter: NewLimiter behind the core's
// interface.
func (s *Store) Limiter(r Rule) (core.SharedLimiter, error) { return s.NewLimiter(r) }

var _ core.SharedStore = (*Store)(nil)
var _ core.SharedLimiter = (*Limiter)(nil)

// MaxLocalShare bounds Rule.LocalShare.
const MaxLocalShare = 1 << 16

// Limiter applies one Rule through a Store.
type Limiter struct {
	s    *Store
	rule Rule
	pol  bucket.Policy
	algo bucket.Algorithm
	a, b int64 // the script's parameters (see decideScript)
	cost int64
	ns   uint64
	nsx  string // ns in hex: the rule's part of its Redis keys

	denyNS, denyMeta uint64
	// quota charges the rule's entries in the host's table (deny cache,
	// sync counts) to its account, within its MaxKeys.
	quota      shm.Quota
	local      *bucket.Limiter // FailLocal: the host's share
	localLimit int64

	// Sync mode.
	hostNS, remoteNS, syncMeta uint64
	pending                    pendingCounts
	clock                      func() time.Duration // SetClock's; the region's by default
}

// Key tags of the table entries a Limiter keeps under its rule's
// namespace: xored into it, they keep each kind in a namespace of its own.
const (
	denyTag   = 0x64656e79_00000001 // "deny"
	hostTag   = 0x686f7374_00000002 // "host": this host's count (sync)
	remoteTag = 0x72656d6f_00000003 // "remo": the other hosts' count (sync)
)

// denyWindow is the window in the meta word of deny-cache entries: under
// bucket.MinWindow, so that no rule's state has the same meta word (a dump
// keeps only the state of its rules: never a deny entry).
const denyWindow = time.Microsecond

// localShare is the rule a host enforces on its own for FailLocal.
func localShare(r Rule) bucket.Rule {
	share := int64(max(r.LocalShare, 1))
	lr := r.Rule
	lr.Name = r.Name + "\x00local share"
	lr.Limit = max(r.Limit/share, 1)
	if r.Burst > 0 {
		lr.Burst = max(r.Burst/share, 1)
	}
	return lr
}

// ValidateRule reports the first problem with r, as NewLimiter would: a
// *bucket.RuleError for r.Rule's fields, a *FieldError for the others.
func ValidateRule(r Rule) error {
	_, err := compileRule(r)
	return err
}

func compileRule(r Rule) (bucket.Policy, error) {
	pol, err := r.Rule.Compile()
	if err != nil {
		return pol, err
	}
	fail := func(field, format string, args ...any) (bucket.Policy, error) {
		return pol, &FieldError{Field: field, Rule: r.Name, Msg: fmt.Sprintf(format, args...)}
	}
	switch {
	case r.LocalShare < 0 || r.LocalShare > MaxLocalShare:
		return fail("LocalShare", "must be between 1 and %d, got %d", MaxLocalShare, r.LocalShare)
	case r.Sync < 0 || r.Sync > time.Hour:
		return fail("Sync", "must be between 0 (exact) and 1h, got %v", r.Sync)
	case r.Sync > 0 && r.Algorithm != bucket.FixedWindow:
		return fail("Sync", "%v needs algorithm fixed-window (gcra is decided in Redis: sync \"exact\")", r.Sync)
	case r.OnUnavailable > FailClosed:
		return fail("OnUnavailable", "unknown value %d", r.OnUnavailable)
	}
	if r.OnUnavailable == FailLocal {
		if _, err := localShare(r).Compile(); err != nil {
			why := err.Error()
			var be *bucket.RuleError
			if errors.As(err, &be) {
				why = be.Msg
			}
			return pol, &FieldError{Field: "LocalShare", Rule: r.Name, Err: err,
				Msg: fmt.Sprintf("its local share (limit %d ÷ %d) cannot hold one request: %s", r.Limit, max(r.LocalShare, 1), why)}
		}
	}
	return pol, nil
}

// NewLimiter compiles r for s.
func (s *Store) NewLimiter(r Rule) (*Limiter, error) {
	pol, err := compileRule(r)
	if err != nil {
		return nil, err
	}
	l := &Limiter{s: s, rule: r, pol: pol, ns: r.Namespace(), clock: s.region.Now}
	l.algo, l.a, l.b, l.cost = pol.Params()
	l.nsx = fmt.Sprintf("%016x", l.ns)
	// The deny cache is kept per rule and per parameters: a refusal under
	// a limit says nothing under another (a reload that raised it), so
	// the namespace, which only the name, algorithm and window make, is
	// not enough.
	var pb [24]byte
	binary.LittleEndian.PutUint64(pb[0:], uint64(l.a))
	binary.LittleEndian.PutUint64(pb[8:], uint64(l.b))
	binary.LittleEndian.PutUint64(pb[16:], uint64(l.cost))
	l.denyNS = l.ns ^ denyTag ^ xxhash.Sum64(pb[:])
	l.denyMeta = bucket.MetaOf(r.Tag(), bucket.GCRA, denyWindow)
	l.quota = shm.Quota{Account: r.Account(), Max: r.MaxKeys}
	if r.OnUnavailable == FailLocal {
		lr := localShare(r)
		l.localLimit = lr.Limit
		if l.local, err = bucket.NewLimiter(lr, s.tab); err != nil {
			return nil, err
		}
	}
	if r.Sync > 0 {
		l.hostNS, l.remoteNS = l.ns^hostTag, l.ns^remoteTag
		l.syncMeta = bucket.MetaOf(r.Tag(), bucket.FixedWindow, r.Window)
		l.pending.m = make(map[pendingKey]pendingVal)
		if s.joined {
			s.addSync(l)
		}
	}
	s.tab.SetFresh(bucket.Fresh)
	// The metas this process writes (shm's Counters.Use), so that none is
	// taken for a definition a reload left.
	s.tab.Use(l.denyMeta)
	if r.Sync > 0 {
		s.tab.Use(l.syncMeta)
	}
	return l, nil
}

// Rule is the rule the limiter applies.
func (l *Limiter) Rule() Rule { return l.rule }

// Sync reports whether the limiter counts on this host (sync mode): its
// decisions are local (AllowKey, PeekKey, RefundKey), never Decide's.
func (l *Limiter) Sync() bool { return l.rule.Sync > 0 }

// LocalShare is the limiter of this host's share and the limit it
// enforces, for FailLocal; nil otherwise. Its state is kept under the
// rule's name with a suffix.
func (l *Limiter) LocalShare() (*bucket.Limiter, int64) { return l.local, l.localLimit }

// Key returns the key of id (key bytes as core makes them).
func (l *Limiter) Key(id []byte) Key {
	k := Key{ID: idHash(id), Deny: l.s.tab.KeyOf(l.denyNS, id)}
	if l.Sync() {
		k.Host = l.s.tab.KeyOf(l.hostNS, id)
		k.Remote = l.s.tab.KeyOf(l.remoteNS, id)
	}
	return k
}

// idHash is a 128-bit hash of a key value with fixed seeds: every host
// names the same Redis key for it (the region's seeds differ per host).
func idHash(id []byte) [2]uint64 {
	var d xxhash.Digest
	d.ResetWithSeed(0x7072_6566_6f72_6b64) // "preforkd"
	d.Write(id)
	a := d.Sum64()
	d.ResetWithSeed(0x7265_6469_735f_6b65) // "redis_ke"
	d.Write(id)
	return [2]uint64{a, d.Sum64()}
}

// redisKey is prefix{id hash}:rule: the hash tag puts every rule's key of
// one key value in one Cluster slot, so one script decides them all.
func (l *Limiter) redisKey(k *Key, suffix string) string {
	var b [32]byte
	binary.BigEndian.PutUint64(b[:8], k.ID[0])
	binary.BigEndian.PutUint64(b[8:16], k.ID[1])
	var h [32]byte
	hex.Encode(h[:], b[:16])
	return l.s.prefix + "{" + string(h[:]) + "}:" + l.nsx + suffix
}

// Denied reports whether the deny cache holds k at now: a refusal by
// Redis that still stands, for every worker of the host. retry is how
// long it stands.
func (l *Limiter) Denied(k *Key, now time.Duration) (retry time.Duration, ok bool) {
	p, found := l.s.tab.Peek(k.Deny, now)
	if !found {
		return 0, false
	}
	until := time.Duration(p) * time.Microsecond
	if until <= now {
		return 0, false
	}
	l.s.st.denyHits.Add(1)
	l.s.obs.DenyHit()
	return until - now, true
}

// deny remembers that k is refused until now + retry.
func (l *Limiter) deny(k *Key, now, retry time.Duration) {
	until := uint64((now + retry + time.Microsecond - 1) / time.Microsecond)
	if until > shm.PayloadMask {
		until = shm.PayloadMask
	}
	_, _ = l.s.tab.Update(k.Deny, l.quota, l.denyMeta, now, func(p uint64, _ time.Duration) (uint64, bool) {
		return max(p, until), p < until
	})
}

// Decide decides a request's hits (limiters not in sync mode) in one
// round trip: one EVALSHA of every key when they can share a script (one
// server, or one Cluster slot), else one pipeline of a script per slot.
// refused reports that an enforcing hit refused the request: no rule was
// charged (across Cluster slots, unless the refund of the others failed:
// that is logged), and each refusing key is remembered in the deny cache until
// its retry time. An error (ErrUnavailable) means Redis did not decide:
// nothing is known and the caller's OnUnavailable answers. now is the
// region's clock, for the deny cache and the breaker; the decisions use
// Redis's.
//
// ctx ending cuts the decision (a server's drain cut at its deadline):
// one not sent yet never is. For one in flight, with an Options.Timeout
// of a second or more, Decide returns at once, with an error wrapping
// ctx's cause; the call itself goes on in the background until Redis
// answers or the timeout passes (go-redis stops a read at a deadline
// only), writing to none of the caller's hits. With a shorter timeout
// the call runs on the caller's goroutine and ends by itself within it
// (see cutInline). A call that ctx ending made fail is no failure of
// Redis for the breaker.
func (s *Store) Decide(ctx context.Context, hits []Hit, now time.Duration) (refused bool, err error) {
	if len(hits) == 0 {
		return false, nil
	}
	if !s.joined {
		return false, fmt.Errorf("%w: %w", ErrUnavailable, shm.ErrNotJoined)
	}
	if ctx.Err() != nil {
		return false, fmt.Errorf("%w: %w", ErrUnavailable, context.Cause(ctx))
	}
	adm := s.br.admit(now)
	if adm == Refuse {
		s.st.shortCircuits.Add(1)
		s.obs.ShortCircuit()
		s.reloadSlots(now)
		return false, ErrUnavailable
	}
	if ctx.Done() == nil || s.timeout < cutInline {
		return s.roundTrip(ctx, hits, now, adm == Probe)
	}
	return s.decideCut(ctx, hits, now, adm == Probe)
}

// cutInline is the shortest Options.Timeout whose decisions run on a
// goroutine of their own when their context can end (decideCut), so
// that a cut returns at once. One under it runs on the caller's, and
// ends by itself at most that long after a cut: the worker still exits
// seconds before its kill (its last flush waits 2 s at most), and no
// decision pays for the goroutine and the copies, about 10 µs on a busy
// machine and 5 allocations (BenchmarkDecide).
const cutInline = time.Second

// decideCut is roundTrip on a goroutine of its own, over copies of hits and
// their keys (a request cut may be gone, its memory reused), so that ctx
// ending returns at once.
func (s *Store) decideCut(ctx context.Context, hits []Hit, now time.Duration, probe bool) (bool, error) {
	own := make([]Hit, len(hits))
	keys := make([]Key, len(hits))
	for i := range hits {
		own[i], keys[i] = hits[i], *hits[i].Key
		own[i].Key = &keys[i]
	}
	type result struct {
		refused bool
		err     error
	}
	done := make(chan result, 1)
	go func() {
		r, err := s.roundTrip(ctx, own, now, probe)
		done <- result{r, err}
	}()
	select {
	case r := <-done:
		for i := range hits {
			hits[i].D = own[i].D
		}
		return r.refused, r.err
	case <-ctx.Done():
		return false, fmt.Errorf("%w: %w", ErrUnavailable, context.Cause(ctx))
	}
}

// roundTrip is Decide's round trip, which the breaker admitted
// (probe: as its probe).
func (s *Store) roundTrip(ctx context.Context, hits []Hit, now time.Duration, probe bool) (refused bool, err error) {
	start := time.Now()
	refused, err = s.call(ctx, hits)
	if err != nil && ctx.Err() != nil {
		// Cut while it waited for a connection: never sent.
		return false, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	d := time.Since(start)
	s.st.latency.Add(uint64(d))
	s.obs.Call(resultOf(err), d)
	if err != nil {
		s.failed(err, now, probe)
		return false, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	s.br.success(now, probe)
	if refused {
		for i := range hits {
			h := &hits[i]
			if !h.Shadow && !h.D.Allowed {
				h.Lim.(*Limiter).deny(h.Key, now, h.D.RetryAfter)
			}
		}
	}
	return refused, nil
}

// failed counts a failed call, tells the breaker, and has a Cluster's
// slot map reloaded.
func (s *Store) failed(err error, now time.Duration, probe bool) {
	if resultOf(err) == CallTimeout {
		s.st.timeouts.Add(1)
	} else {
		s.st.errors.Add(1)
	}
	s.br.failure(now, probe, err)
	s.reloadSlots(now)
}

// SlotReloadInterval is how often, at most, a Store asks for a Cluster's
// slot map again while its calls fail or the breaker keeps them from
// Redis.
const SlotReloadInterval = 250 * time.Millisecond

// reloadSlots asks go-redis to load a Cluster's slot map again (in the
// background, from any node that answers), at most every
// SlotReloadInterval. go-redis loads it on its own only after a MOVED or
// ASK reply, or once a minute: a call to a dead master times out before
// any reply, and the breaker stops calls altogether, so after a failover
// requests would go on meeting the dead master's address until the
// minute is up. Reloaded while the calls fail or are refused, the map
// names the promoted replica as soon as the Cluster does.
func (s *Store) reloadSlots(now time.Duration) {
	if s.slots == nil {
		return
	}
	last := s.slotsAsked.Load()
	if last != 0 && now-time.Duration(last-1) < SlotReloadInterval && now >= time.Duration(last-1) {
		return
	}
	if !s.slotsAsked.CompareAndSwap(last, int64(now)+1) {
		return // another request of this process asks
	}
	s.st.slotReloads.Add(1)
	s.slots.ReloadState(context.Background())
}

// call runs the decide script for hits and fills their decisions.
func (s *Store) call(ctx context.Context, hits []Hit) (refused bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	if !s.cluster || oneSlot(hits) {
		keys, args := s.scriptArgs(hits, "d")
		s.st.calls.Add(1)
		v, noscript, err := s.decide.run(ctx, s.rdb, keys, args)
		if noscript {
			s.st.noscript.Add(1)
			s.obs.NoScript()
		}
		if err != nil {
			return false, err
		}
		return fill(hits, v)
	}
	return s.callSlots(ctx, hits)
}

func oneSlot(hits []Hit) bool {
	for i := 1; i < len(hits); i++ {
		if hits[i].Key.ID != hits[0].Key.ID {
			return false
		}
	}
	return true
}

// scriptArgs are the keys and arguments of decideScript for hits.
func (s *Store) scriptArgs(hits []Hit, mode string) ([]string, []any) {
	keys := make([]string, len(hits))
	args := make([]any, 1, 1+5*len(hits))
	args[0] = mode
	for i := range hits {
		h := &hits[i]
		l := h.Lim.(*Limiter)
		keys[i] = l.redisKey(h.Key, "")
		shadow := 0
		if h.Shadow {
			shadow = 1
		}
		args = append(args, int(l.algo), l.a, l.b, l.cost, shadow)
	}
	return keys, args
}

// fill reads decideScript's answer into hits.
func fill(hits []Hit, v any) (refused bool, err error) {
	r, err := ints(v, 1+6*len(hits))
	if err != nil {
		return false, err
	}
	for i := range hits {
		h := &hits[i]
		o := 1 + 6*i
		h.D = bucket.Decision{
			Allowed:    r[o] == 1,
			Limit:      h.Lim.Rule().Limit,
			Remaining:  r[o+1],
			ResetAfter: time.Duration(r[o+2]) * time.Microsecond,
			RetryAfter: time.Duration(r[o+3]) * time.Microsecond,
		}
	}
	return r[0] == 1, nil
}

// callSlots decides hits whose keys lie in several Cluster slots: one
// pipeline of a script per slot, each charging its keys or none. When one
// slot refused, or failed, and others charged, a second pipeline refunds
// what those charged: a refusal, or a decision Redis could not make whole
// (on_unavailable answers it), charges no rule here too, at the price of
// a round trip.
func (s *Store) callSlots(ctx context.Context, hits []Hit) (refused bool, err error) {
	// Group the hits by key value (one hash tag, one slot), keeping
	// each hit's place.
	var groups [][]Hit
	seen := map[[2]uint64]int{}
	var order [][]int
	for i := range hits {
		g, ok := seen[hits[i].Key.ID]
		if !ok {
			g = len(order)
			seen[hits[i].Key.ID] = g
			order = append(order, nil)
		}
		order[g] = append(order[g], i)
	}
	for _, o := range order {
		g := make([]Hit, len(o))
		for j, i := range o {
			g[j] = hits[i]
		}
		groups = append(groups, g)
	}
	// run runs the script in mode on each of gs, in one pipeline: the
	// answer of each group, nil for one that failed, and the first error.
	run := func(mode string, gs [][]Hit) ([]any, error) {
		pipe := s.rdb.Pipeline()
		cmds := make([]*redis.Cmd, len(gs))
		for j, g := range gs {
			keys, args := s.scriptArgs(g, mode)
			cmds[j] = pipe.EvalSha(ctx, s.decide.sha, keys, args...)
		}
		s.st.calls.Add(1)
		_, _ = pipe.Exec(ctx)
		var retry []int
		var first error
		out := make([]any, len(gs))
		for j, c := range cmds {
			v, err := c.Result()
			switch {
			case isNoScript(err):
				retry = append(retry, j)
			case err != nil:
				first = cmp.Or(first, err)
			default:
				out[j] = v
			}
		}
		if len(retry) > 0 {
			s.st.noscript.Add(1)
			s.obs.NoScript()
			pipe := s.rdb.Pipeline()
			ev := make([]*redis.Cmd, len(retry))
			for k, j := range retry {
				keys, args := s.scriptArgs(gs[j], mode)
				ev[k] = pipe.Eval(ctx, s.decide.src, keys, args...)
			}
			_, _ = pipe.Exec(ctx)
			for k, j := range retry {
				if v, err := ev[k].Result(); err != nil {
					first = cmp.Or(first, err)
				} else {
					out[j] = v
				}
			}
		}
		return out, first
	}
	res, err := run("d", groups)
	// What the groups that answered charged: the hits they let through (a
	// shadow rule that would refuse is not charged). A refusal, or a
	// group that failed (Redis did not decide: on_unavailable answers),
	// gives them back, so that no rule counts a request it did not serve.
	var charged [][]Hit
	for g, v := range res {
		if v == nil {
			continue
		}
		r, ferr := fill(groups[g], v)
		if ferr != nil {
			err = cmp.Or(err, ferr)
			continue
		}
		if r {
			refused = true
			continue
		}
		var allowed []Hit
		for _, h := range groups[g] {
			if h.D.Allowed {
				allowed = append(allowed, h)
			}
		}
		if len(allowed) > 0 {
			charged = append(charged, allowed)
		}
	}
	if (refused || err != nil) && len(charged) > 0 {
		if _, rerr := run("r", charged); rerr != nil {
			s.log.Warn("redis: refunding a refused request failed: it stays counted", "err", rerr)
		}
	}
	if err != nil {
		return false, err
	}
	for g, o := range order {
		for j, i := range o {
			hits[i].D = groups[g][j].D
		}
	}
	return refused, nil
}
