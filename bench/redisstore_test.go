package bench

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/preforkd/preforkd/redisstore"
	"github.com/preforkd/preforkd/shm"
)

// BenchmarkRedisStore compares one decision through redisstore (the deny
// cache and breaker reads in the region, key hashing, one EVALSHA of the
// multi-rule script, the breaker's success) with a bare EVALSHA round trip
// of the single-rule GCRA script (Check/redis's), on one redis-server and
// one connection each, sequential: the store's own cost is the difference.
// The target: store ≤ 1.2 × bare.
func BenchmarkRedisStore(b *testing.B) {
	addr, err := startRedis(b)
	if err != nil {
		skipOrFail(b, err)
	}
	keys := visitOrder(makeKeys(numKeys))
	b.Run("bare", func(b *testing.B) {
		rdb := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 1,
			MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}})
		defer rdb.Close()
		sha, err := rdb.ScriptLoad(context.Background(), redisGCRA).Result()
		if err != nil {
			b.Fatal(err)
		}
		t, tau := gcraParams(benchRule)
		allowed := 0
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			now := time.Now().UnixMicro()
			res, err := rdb.EvalSha(context.Background(), sha, []string{keys[i%numKeys]}, now, t, tau).Int64Slice()
			if err != nil {
				b.Fatal(err)
			}
			if res[0] == 1 {
				allowed++
			}
		}
		b.ReportMetric(float64(allowed)/float64(b.N), "allowed/op")
	})
	b.Run("store", func(b *testing.B) {
		r, err := shm.CreatePrivate(shm.Options{Counters: numSlots})
		if err != nil {
			b.Fatal(err)
		}
		defer r.Close()
		if err := r.Join(0); err != nil {
			b.Fatal(err)
		}
		st, err := redisstore.New(r, redisstore.Options{URL: "redis://" + addr, PoolSize: 1, Timeout: time.Second})
		if err != nil {
			b.Fatal(err)
		}
		defer st.Close()
		lim, err := st.NewLimiter(redisstore.Rule{Rule: benchRule})
		if err != nil {
			b.Fatal(err)
		}
		bkeys := make([][]byte, len(keys))
		for i, k := range keys {
			bkeys[i] = []byte(k)
		}
		var hits [1]redisstore.Hit
		allowed := 0
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			now := r.Now()
			k := lim.Key(bkeys[i%numKeys])
			if _, denied := lim.Denied(&k, now); denied {
				continue
			}
			hits[0] = redisstore.Hit{Lim: lim, Key: &k}
			refused, err := st.Decide(context.Background(), hits[:], now)
			if err != nil {
				b.Fatal(err)
			}
			if !refused {
				allowed++
			}
		}
		b.ReportMetric(float64(allowed)/float64(b.N), "allowed/op")
	})
}

// skipOrFail ends a benchmark that could not start its server: a skip
// when the server is not installed, a failure otherwise.
func skipOrFail(b *testing.B, err error) {
	if se, ok := err.(skipError); ok {
		b.Skip(se.Error())
	}
	b.Fatal(err)
}
