package shm_test

import (
	"strconv"
	"testing"
	"time"

	"github.com/preforkd/preforkd/bucket"
	"github.com/preforkd/preforkd/internal/shmtest"
	"github.com/preforkd/preforkd/shm"
)

// The paths the accounts add to: a new key (its slot charged under the
// account's lock) and a new key of a rule at its maximum (refused before
// it takes anything). A known key's decision does not touch an account.
func BenchmarkNewKey(b *testing.B) {
	for _, bc := range []struct {
		name    string
		maxKeys int
	}{{"claim", 0}, {"capped", 1000}} {
		b.Run(bc.name, func(b *testing.B) {
			r := shmtest.Private(b, shm.Options{Counters: 1 << 21})
			lim := newLimiter(b, r, bucket.Rule{Name: "n", Limit: 10, Window: time.Hour, MaxKeys: bc.maxKeys})
			for i := range bc.maxKeys {
				lim.Allow("fill-"+strconv.Itoa(i), time.Minute)
			}
			keys := make([]string, b.N)
			for i := range keys {
				keys[i] = "client-" + strconv.Itoa(i)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				lim.Allow(keys[i], time.Minute)
			}
		})
	}
}
