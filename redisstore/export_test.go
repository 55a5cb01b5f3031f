package redisstore

import (
	"time"

	"github.com/redis/go-redis/v9"
)

// SetClock records Redis's clock (µs) as read between two region times,
// as a flush does; ForgetClock makes it unknown again.
func SetClock(s *Store, redisUS int64, before, after time.Duration) {
	s.setClock(redisUS, before, after)
}
func ForgetClock(s *Store)     { s.clockKnown.Store(false) }
func ClockKnown(s *Store) bool { return s.clockKnown.Load() }

// PendingWindows is the counts l holds for its next flush, by the window
// index each is filed under (-1: Redis's clock was not known), and the
// index of the current window.
func PendingWindows(l *Limiter, now time.Duration) (byWindow map[int64]int64, current int64) {
	l.pending.mu.Lock()
	defer l.pending.mu.Unlock()
	byWindow = map[int64]int64{}
	for k, v := range l.pending.m {
		byWindow[k.widx] += v.n
	}
	return byWindow, l.window(now)
}

// ClientOptions are the go-redis options New would use for o (defaults
// filled in).
func ClientOptions(o Options) (*redis.UniversalOptions, error) {
	o, err := o.withDefaults()
	if err != nil {
		return nil, err
	}
	return clientOptions(o)
}

// RedisKey is the Redis key l counts k under.
func RedisKey(l *Limiter, k *Key) string { return l.redisKey(k, "") }

// SetRemote records remote as the other hosts' count of k at now, as a
// flush that read it does.
func SetRemote(l *Limiter, k *Key, remote int64, now time.Duration) {
	l.setRemote(k.Remote, remote, now)
}

// Flush adds the pending counts of every sync-mode rule with an interval
// of at most an hour to Redis now, as a tick of the flusher does.
func Flush(s *Store) { s.flusher.flush(time.Hour, false) }

// WindowKey is the Redis key of k's current window, as a flush writes it.
func WindowKey(l *Limiter, k *Key, now time.Duration) string {
	return l.windowKey(k, l.window(now))
}
