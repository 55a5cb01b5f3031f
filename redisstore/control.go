package redisstore

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/preforkd/preforkd/bucket"
)

// An operator's look at one key, and its reset: what package core's
// Control does for a Redis rule. Both work on a Store whose region this
// process has not joined (the supervisor's admin endpoint), call Redis
// outside the breaker (an operator asks once and is told what failed),
// and wait for it up to the Store's timeout but at least controlTimeout.

// controlTimeout is the least time State and Reset wait for Redis: an
// operator's call is not a request's, which must not wait.
const controlTimeout = 2 * time.Second

func (s *Store) controlContext() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), max(s.timeout, controlTimeout))
}

// State reports k's state at now as Redis keeps it, without charging
// anything: d is what a request now would meet (for a key Redis holds
// nothing of, a fresh key's), stored whether Redis holds anything of it.
// For a sync-mode limiter it is the window's count over every host (as
// the last flushes left it in Redis) plus this host's own, which is
// counted in the region. Errors wrap ErrUnavailable.
func (l *Limiter) State(k *Key, now time.Duration) (d bucket.Decision, stored bool, err error) {
	ctx, cancel := l.s.controlContext()
	defer cancel()
	if l.Sync() {
		return l.syncState(ctx, k)
	}
	v, _, err := l.s.decide.run(ctx, l.s.rdb, []string{l.redisKey(k, "")}, []any{"p", int(l.algo), l.a, l.b, l.cost, 0})
	if err != nil {
		return d, false, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	r, err := ints(v, 7)
	if err != nil {
		return d, false, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	d = bucket.Decision{
		Allowed:    r[1] == 1,
		Limit:      l.rule.Limit,
		Remaining:  r[2],
		ResetAfter: time.Duration(r[3]) * time.Microsecond,
		RetryAfter: time.Duration(r[4]) * time.Microsecond,
	}
	return d, r[5] == 1, nil
}

// syncState is State for a sync-mode limiter: the window of Redis's clock
// that holds now, the other hosts' part of its count in Redis, and this
// host's count in the region.
func (l *Limiter) syncState(ctx context.Context, k *Key) (d bucket.Decision, stored bool, err error) {
	before := l.s.region.Now()
	t, err := l.s.rdb.Time(ctx).Result()
	if err != nil {
		return d, false, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	us := t.UnixMicro()
	widx := us / l.b
	vals, err := l.s.rdb.HMGet(ctx, l.windowKey(k, widx), "t", l.s.host).Result()
	if err != nil {
		return d, false, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	total, mine := hashInt(vals[0]), hashInt(vals[1])
	// This host's count, in the window of the region's clock that Redis's
	// clock says is current (as AllowKey shifts it).
	w := l.b
	off := us - int64(before/time.Microsecond)
	at := before + time.Duration((off%w+w)%w)*time.Microsecond
	hp, inRegion := l.s.tab.Peek(k.Host, at)
	host, _ := bucket.WindowCount(hp, at, l.rule.Window)
	reset := time.Duration((widx+1)*l.b-us) * time.Microsecond
	d = l.syncDecision(host, max(total-mine, 0), reset, host+max(total-mine, 0)+l.cost <= l.rule.Limit)
	return d, vals[0] != nil || inRegion && host > 0, nil
}

// hashInt reads an HMGET value as an integer; 0 for none.
func hashInt(v any) int64 {
	s, _ := v.(string)
	n, _ := strconv.ParseInt(s, 10, 64)
	return n
}

// windowKey is the Redis key of a sync-mode key's window widx (Redis's
// clock), as the flush writes it.
func (l *Limiter) windowKey(k *Key, widx int64) string {
	return l.redisKey(k, ":w"+strconv.FormatInt(widx, 10))
}

// Reset forgets k: its Redis key is deleted (for a sync-mode limiter,
// those of the current and the previous window), so its next request
// anywhere finds the whole allowance; on this host, its deny-cache entry
// and its sync-mode counts are cleared too. (Counts a worker admitted
// since its last flush still reach Redis with its next one.) Errors wrap
// ErrUnavailable; the host's entries are cleared whatever Redis answered.
//
// request tells a reset on a request's path (the application's reset
// header, core.Core.Reset from a handler) from an operator's: it keeps to
// the breaker (while it is open Redis is not asked, and the key's count
// there stays) and waits for Redis no longer than a decision does
// (redis.timeout), telling the breaker what came of it. An operator's
// waits up to controlTimeout, outside the breaker.
func (l *Limiter) Reset(k *Key, now time.Duration, request bool) error {
	s := l.s
	s.tab.Reset(k.Deny, now)
	if l.Sync() {
		s.tab.Reset(k.Host, now)
		s.tab.Reset(k.Remote, now)
	}
	if !request {
		ctx, cancel := s.controlContext()
		defer cancel()
		if err := l.forget(ctx, k); err != nil {
			return fmt.Errorf("%w: %w", ErrUnavailable, err)
		}
		return nil
	}
	adm := s.br.admit(now)
	if adm == Refuse {
		s.st.shortCircuits.Add(1)
		s.obs.ShortCircuit()
		return ErrUnavailable
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.timeout)
	defer cancel()
	start := time.Now()
	err := l.forget(ctx, k)
	s.obs.Call(resultOf(err), time.Since(start))
	if err != nil {
		s.failed(err, now, adm == Probe)
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	s.br.success(now, adm == Probe)
	return nil
}

// forget deletes k's Redis keys.
func (l *Limiter) forget(ctx context.Context, k *Key) error {
	var keys []string
	if l.Sync() {
		t, err := l.s.rdb.Time(ctx).Result()
		if err != nil {
			return err
		}
		widx := t.UnixMicro() / l.b
		keys = []string{l.windowKey(k, widx), l.windowKey(k, widx-1)}
	} else {
		keys = []string{l.redisKey(k, "")}
	}
	// One hash tag: one Cluster slot, one DEL.
	return l.s.rdb.Del(ctx, keys...).Err()
}
