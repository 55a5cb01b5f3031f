package redisstore

import (
	"context"
	"errors"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/preforkd/preforkd/bucket"
	"github.com/preforkd/preforkd/shm"
)

// Sync mode: a fixed-window rule counted on this host and added to Redis
// every interval.
//
// Two entries per key in the host's table, both fixed-window payloads
// (bucket.WindowPayload), so the table judges their freshness as a rule's:
// "host" counts what this host admitted in the window (every worker, one
// CAS each), "remote" what the other hosts had added to Redis when this
// host last asked. A request is admitted when host + remote + cost ≤
// limit. Each worker keeps what it admitted since its last flush
// (pending) and, every interval, adds it to Redis with one pipeline of
// flushScript calls (one per key: HINCRBY of this host's field and of the
// total; calls the server answers NOSCRIPT go again with EVAL), which
// answer the total: remote = total − this host's part. Keys this worker
// counted in the current window are asked again every interval even with
// nothing to add, so that its view of the others is never older than an
// interval plus a round trip.
//
// Windows follow Redis's clock: each flush measures it against the
// region's, and decisions shift the region's clock by that offset modulo
// the window, so that every host's windows begin and end together.
//
// The bound on over-admission: with H hosts, each admitting at most R
// requests per second of one key, interval I and flush round trip d, a
// window admits at most limit + H × R × (2I + d). Proof sketch: take the
// window's last admission, on host h. Its view lacks of each other host g
// at most what g admitted in the last 2I + d (g flushes what it admitted
// within I; h reads the totals within I + d), so the others' part is over
// by at most (H − 1) × R × (2I + d). If h first counted the key in the
// last I + d it had no view yet: then h admitted at most R × (I + d) in
// all, and the others, bounded on their own by the same argument, admit
// no more for h's counts. Counts a worker admitted but could not flush
// (a flush that timed out, see putBack; the worker killed) never reach
// the other hosts: they are over the bound by as much.

// pendingKey is one key in one window of Redis's clock.
type pendingKey struct {
	id   [2]uint64
	widx int64 // window index in Redis time; -1: Redis's clock was not known yet
}

type pendingVal struct {
	n      int64 // admitted since the last flush (net of refunds)
	remote shm.Key
}

// pendingCounts is what one worker admitted per key since its last flush,
// and the keys it counted in the current window (n = 0).
type pendingCounts struct {
	mu sync.Mutex
	m  map[pendingKey]pendingVal
}

func (p *pendingCounts) add(k pendingKey, remote shm.Key, n int64) {
	p.mu.Lock()
	v := p.m[k]
	v.n += n
	v.remote = remote
	p.m[k] = v
	p.mu.Unlock()
}

// shift is the offset, modulo the limiter's window, that aligns the
// region's clock with Redis's windows, and the whole windows between them;
// known is false (and both zero) while Redis's clock is not known yet.
// Callers take all three from one call: a flusher may learn the clock
// between two reads.
func (l *Limiter) shift() (mod time.Duration, whole int64, known bool) {
	if !l.s.clockKnown.Load() {
		return 0, 0, false
	}
	w := l.b // µs
	off := l.s.clock.Load()
	m := (off%w + w) % w
	return time.Duration(m) * time.Microsecond, (off - m) / w, true
}

// windowIndex is the index in Redis's clock of the window holding at, a
// region time already shifted by shift; -1 when the clock was not known.
func (l *Limiter) windowIndex(at time.Duration, whole int64, known bool) int64 {
	if !known {
		return -1
	}
	return int64(at/time.Microsecond)/l.b + whole
}

// syncDecision computes a sync-mode decision from the two counts.
func (l *Limiter) syncDecision(host, remote int64, reset time.Duration, allowed bool) bucket.Decision {
	d := bucket.Decision{Allowed: allowed, Limit: l.rule.Limit, ResetAfter: reset}
	d.Remaining = max(l.rule.Limit-host-remote, 0)
	if !allowed {
		d.RetryAfter = reset
	}
	return d
}

// SetClock gives l the clock its callers read now from (the region's by
// default, or a core's own): a sync-mode decision is taken no earlier
// than the clock reads once the key's host count is loaded, as
// bucket.Limiter.SetClock does for a local rule. A worker that read the
// clock, was descheduled, and decides after another worker's decision in
// a later window would otherwise add the other hosts' count of the window
// before to this one's, refusing a request the limit allows, and file
// what it admits under that past window, which is never flushed. Call it
// before l is used.
func (l *Limiter) SetClock(now func() time.Duration) {
	if now != nil {
		l.clock = now
	}
}

// AllowKey decides one request of a sync-mode limiter at now on this
// host's counts.
func (l *Limiter) AllowKey(k *Key, now time.Duration) bucket.Decision {
	mod, whole, known := l.shift()
	at := now + mod
	win := l.rule.Window
	var host, remote int64
	var reset time.Duration
	var ok bool
	_, err := l.s.tab.Update(k.Host, l.quota, l.syncMeta, at, func(p uint64, t time.Duration) (uint64, bool) {
		// Read after the state (see SetClock); the other hosts' count
		// at the same time.
		t = bucket.AtReading(t, l.clock()+mod)
		at = t
		rp, _ := l.s.tab.Peek(k.Remote, t)
		remote, _ = bucket.WindowCount(rp, t, win)
		host, reset = bucket.WindowCount(p, t, win)
		ok = host+remote+l.cost <= l.rule.Limit
		if !ok {
			return p, false
		}
		host += l.cost
		return bucket.WindowPayload(p, t, win, host), true
	})
	if err != nil {
		l.s.tab.Refused(err)
		return l.full(err == shm.ErrQuota)
	}
	if ok {
		l.pending.add(pendingKey{id: k.ID, widx: l.windowIndex(at, whole, known)}, k.Remote, l.cost)
	}
	// Times are reported from the caller's now.
	return l.syncDecision(host, remote, reset+max(at-mod-now, 0), ok)
}

// full is the rule's on_full answer for a key with no slot in the host's
// table; capped: its account holds MaxKeys slots.
func (l *Limiter) full(capped bool) bucket.Decision {
	d := bucket.Decision{Limit: l.rule.Limit, Full: true, Capped: capped}
	if l.rule.OnFull == bucket.Closed {
		d.RetryAfter = bucket.FullRetryAfter
		return d
	}
	d.Allowed, d.Remaining = true, l.rule.Limit-1
	return d
}

// PeekKey reports a sync-mode key's state at now without taking anything.
func (l *Limiter) PeekKey(k *Key, now time.Duration) bucket.Decision {
	mod, _, _ := l.shift()
	at := now + mod
	hp, _ := l.s.tab.Peek(k.Host, at)
	at = bucket.AtReading(at, l.clock()+mod) // after the state, as AllowKey (see SetClock)
	rp, _ := l.s.tab.Peek(k.Remote, at)
	remote, _ := bucket.WindowCount(rp, at, l.rule.Window)
	host, reset := bucket.WindowCount(hp, at, l.rule.Window)
	return l.syncDecision(host, remote, reset+max(at-mod-now, 0), host+remote+l.cost <= l.rule.Limit)
}

// RefundKey gives back one request a sync-mode limiter admitted at or
// before now (another rule refused it).
func (l *Limiter) RefundKey(k *Key, now time.Duration) {
	mod, whole, known := l.shift()
	at := now + mod
	if _, ok := l.s.tab.Peek(k.Host, at); !ok {
		return
	}
	refunded := false
	_, _ = l.s.tab.Update(k.Host, l.quota, l.syncMeta, at, func(p uint64, t time.Duration) (uint64, bool) {
		host, _ := bucket.WindowCount(p, t, l.rule.Window)
		refunded = host > 0
		if !refunded {
			return p, false
		}
		return bucket.WindowPayload(p, t, l.rule.Window, host-min(l.cost, host)), true
	})
	if refunded {
		l.pending.add(pendingKey{id: k.ID, widx: l.windowIndex(at, whole, known)}, k.Remote, -l.cost)
	}
}

// addSync registers a sync-mode limiter and starts the flusher with the
// first one.
func (s *Store) addSync(l *Limiter) {
	s.syncMu.Lock()
	defer s.syncMu.Unlock()
	s.syncRules = append(s.syncRules, l)
	if s.flusher == nil {
		s.flusher = newFlusher(s)
	} else {
		s.flusher.interval <- l.rule.Sync
	}
}

// flusher is the goroutine of a Store that adds its sync-mode counts to
// Redis: it ticks at the shortest interval of its rules, and flushes each
// rule at the last tick before its own interval would have passed (see
// due). Store.Close stops it after a last flush.
type flusher struct {
	s        *Store
	interval chan time.Duration
	quit     chan struct{}
	done     chan struct{}
	once     sync.Once
	by       time.Time // the last flush's deadline, set before quit closes
	last     map[*Limiter]time.Duration
}

func newFlusher(s *Store) *flusher {
	f := &flusher{s: s, interval: make(chan time.Duration, 16), quit: make(chan struct{}), done: make(chan struct{}), last: map[*Limiter]time.Duration{}}
	first := s.syncRules[0].rule.Sync
	go f.run(first)
	return f
}

// stop has the flusher make its last flush and waits for it, at most
// maxFlushWait in all: a flush under way (whose wait may be longer, see
// flushTimeout) ends first, and the last one has what is left. A worker
// that Redis keeps waiting so still exits in time, its counts not
// flushed, as when Redis refused them.
func (f *flusher) stop() {
	f.once.Do(func() {
		f.by = time.Now().Add(maxFlushWait)
		close(f.quit)
	})
	t := time.NewTimer(time.Until(f.by))
	defer t.Stop()
	select {
	case <-f.done:
	case <-t.C:
		f.s.log.Warn("redis: the last flush of sync counts did not end in time: other hosts will not see them", "waited", maxFlushWait)
	}
}

func (f *flusher) run(every time.Duration) {
	defer close(f.done)
	f.s.measureClock()
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case d := <-f.interval:
			if d < every {
				every = d
				t.Reset(every)
			}
		case <-t.C:
			f.flush(every, false)
		case <-f.quit:
			f.flush(every, true)
			return
		}
	}
}

// measureClock reads Redis's clock once, to align the windows before the
// first flush does.
func (s *Store) measureClock() {
	ctx, cancel := context.WithTimeout(context.Background(), s.flushTimeout())
	defer cancel()
	before := s.region.Now()
	t, err := s.rdb.Time(ctx).Result()
	if err != nil {
		return // the first flush measures it
	}
	s.setClock(t.UnixMicro(), before, s.region.Now())
}

// setClock records Redis's clock (µs) as read between two region times.
func (s *Store) setClock(redisUS int64, before, after time.Duration) {
	mid := int64((before + (after-before)/2) / time.Microsecond)
	s.clock.Store(redisUS - mid)
	s.clockKnown.Store(true)
}

// flushTimeout is how long a flush (and the clock reading before the
// first) waits for Redis: the shortest sync interval, at least the
// Store's timeout, at most maxFlushWait unless the timeout is longer (a
// worker's last flush, and the one under way, wait at most maxFlushWait
// in all: flusher.stop).
func (s *Store) flushTimeout() time.Duration {
	var every time.Duration
	for _, l := range s.syncRules {
		if every == 0 || l.rule.Sync < every {
			every = l.rule.Sync
		}
	}
	return max(s.timeout, min(every, maxFlushWait))
}

// maxFlushWait bounds a flush's wait for Redis (flushTimeout), and a
// worker's last flush (flusher.stop).
const maxFlushWait = 2 * time.Second

// flushItem is one key's count on its way to Redis.
type flushItem struct {
	l   *Limiter
	k   pendingKey
	v   pendingVal
	cmd *redis.Cmd
}

// due reports whether a rule of interval sync, last flushed since ago, is
// flushed at a tick of the flusher, which ticks every every: unless the
// next tick still comes within its interval. A rule is then never left
// unflushed for longer than its interval (plus the lateness of a tick),
// which the bound on over-admission above needs; waiting for the
// interval to have passed would leave it a tick longer, up to twice the
// interval when a tick comes a moment early.
func due(since, sync, every time.Duration) bool {
	return since+every > sync
}

// flush adds the pending counts of every rule that is due (all when
// final) to Redis in one pipeline, and records the totals it answers as
// the other hosts' counts. every is the flusher's tick.
func (f *flusher) flush(every time.Duration, final bool) {
	s := f.s
	s.syncMu.Lock()
	rules := append([]*Limiter(nil), s.syncRules...)
	s.syncMu.Unlock()
	now := s.region.Now()
	var items []flushItem
	for _, l := range rules {
		if !final && !due(now-f.last[l], l.rule.Sync, every) {
			continue
		}
		f.last[l] = now
		items = l.takePending(items, now)
	}
	if len(items) == 0 {
		return
	}
	probe := false
	if !final {
		switch s.br.admit(now) {
		case Refuse:
			s.putBack(items)
			s.reloadSlots(now)
			return
		case Probe:
			probe = true
		}
	}
	deadline := time.Now().Add(s.flushTimeout())
	if final {
		deadline = f.by // stop's
	}
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	before := s.region.Now()
	err := s.runFlush(ctx, items)
	after := s.region.Now()
	s.st.flushes.Add(1)
	s.obs.Flush(resultOf(err))
	if err != nil {
		s.st.flushErrors.Add(1)
		s.failed(err, after, probe)
		s.putBack(items)
		if final {
			s.log.Warn("redis: the last flush of sync counts failed: other hosts will not see them", "err", err)
		}
		return
	}
	s.br.success(after, probe)
	var redisNow int64
	for i := range items {
		it := &items[i]
		r, err := ints(it.cmd.Val(), 3)
		if err != nil {
			continue
		}
		total, mine := r[0], r[1]
		redisNow = r[2]
		if it.v.n > 0 {
			s.st.flushedCounts.Add(uint64(it.v.n))
		}
		if it.k.widx == it.l.window(after) {
			it.l.setRemote(it.v.remote, total-mine, after)
		}
	}
	if redisNow != 0 {
		s.setClock(redisNow, before, after)
	}
}

// window is the index of the window of Redis's clock that holds region
// time now; -1 while the clock is not known.
func (l *Limiter) window(now time.Duration) int64 {
	mod, whole, known := l.shift()
	return l.windowIndex(now+mod, whole, known)
}

// takePending moves the limiter's pending counts into items: every key of
// the current window (those with nothing to add are asked for the total).
// The counts of past windows are dropped unflushed: nobody counts in them
// any more.
func (l *Limiter) takePending(items []flushItem, now time.Duration) []flushItem {
	cur := l.window(now)
	known := cur >= 0
	l.pending.mu.Lock()
	defer l.pending.mu.Unlock()
	for k, v := range l.pending.m {
		if k.widx < 0 && known {
			// Counted before Redis's clock was known: into the current window.
			delete(l.pending.m, k)
			k.widx = cur
			if o, ok := l.pending.m[k]; ok {
				v.n += o.n
			}
		}
		switch {
		case k.widx < 0:
			continue // no clock yet: keep it for a flush that has one
		case k.widx < cur:
			delete(l.pending.m, k)
			continue
		}
		items = append(items, flushItem{l: l, k: k, v: v})
		l.pending.m[k] = pendingVal{remote: v.remote} // asked again next interval
	}
	return items
}

// putBack returns the counts of a flush that failed to their pending
// entries: those of the calls that certainly did not add them. A call
// Redis answered has added its count (each key's is a call of its own in
// the pipeline, and one may fail while the others succeed), and so may a
// call sent but not answered in time (Redis stalled, the reply was lost):
// Redis runs it when it can. Put back, either would be added twice, and
// the other hosts would refuse requests the limit allows; the counts of a
// call that timed out are rather lost, as a worker's that could not
// flush at all, and the request path never retries a call either.
func (s *Store) putBack(items []flushItem) {
	for i := range items {
		it := &items[i]
		if it.v.n != 0 && (it.cmd == nil || notRun(it.cmd.Err())) {
			it.l.pending.add(it.k, it.v.remote, it.v.n)
		}
	}
}

// notRun reports whether a flush call that failed with err certainly did
// not change Redis: Redis answered with an error (the script is not
// loaded, a key of the wrong type, out of memory, busy, a Cluster
// redirection), or the call was never sent (no connection could be had).
func notRun(err error) bool {
	var re redis.Error
	var oe *net.OpError
	return err != nil && (errors.As(err, &re) || errors.Is(err, redis.ErrPoolTimeout) ||
		errors.Is(err, redis.ErrClosed) || errors.As(err, &oe) && oe.Op == "dial")
}

// runFlush sends one pipeline of flushScript calls, and again with EVAL
// those the server did not know.
func (s *Store) runFlush(ctx context.Context, items []flushItem) error {
	send := func(eval bool, which []int) error {
		pipe := s.rdb.Pipeline()
		for _, i := range which {
			it := &items[i]
			key := it.l.redisKey(&Key{ID: it.k.id}, ":w"+strconv.FormatInt(it.k.widx, 10))
			ttl := 2 * it.l.b / 1000 // ms: the window, and one more for late flushes
			args := []any{s.host, it.v.n, max(ttl, 1)}
			if eval {
				it.cmd = pipe.Eval(ctx, s.flush.src, []string{key}, args...)
			} else {
				it.cmd = pipe.EvalSha(ctx, s.flush.sha, []string{key}, args...)
			}
		}
		_, _ = pipe.Exec(ctx)
		return nil
	}
	all := make([]int, len(items))
	for i := range all {
		all[i] = i
	}
	send(false, all)
	var again []int
	for i := range items {
		err := items[i].cmd.Err()
		if isNoScript(err) {
			again = append(again, i)
		} else if err != nil {
			return err
		}
	}
	if len(again) > 0 {
		s.st.noscript.Add(1)
		s.obs.NoScript()
		send(true, again)
		for _, i := range again {
			if err := items[i].cmd.Err(); err != nil {
				return err
			}
		}
	}
	return nil
}

// setRemote records the other hosts' count of a key in the current
// window: it only grows within a window (a late answer never lowers it).
func (l *Limiter) setRemote(k shm.Key, remote int64, now time.Duration) {
	mod, _, _ := l.shift()
	at := now + mod
	_, _ = l.s.tab.Update(k, l.quota, l.syncMeta, at, func(p uint64, t time.Duration) (uint64, bool) {
		cur, _ := bucket.WindowCount(p, t, l.rule.Window)
		if remote <= cur {
			return p, false
		}
		return bucket.WindowPayload(p, t, l.rule.Window, remote), true
	})
}
