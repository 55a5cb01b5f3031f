package redisstore_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/preforkd/preforkd/bucket"
	"github.com/preforkd/preforkd/internal/redistest"
	"github.com/preforkd/preforkd/redisstore"
	"github.com/preforkd/preforkd/shm"
)

// BenchmarkDecide measures one request's round trip against a real Redis,
// with the context the core passes (one Core.Cut can end) and with one no
// cut can end, at the default timeout (the call on the caller's
// goroutine either way) and at a second (a cuttable call on one of its
// own: cutInline).
func BenchmarkDecide(b *testing.B) {
	srv := redistest.Start(b)
	r, err := shm.CreatePrivate(shm.Options{Counters: 4096})
	if err != nil {
		b.Fatal(err)
	}
	if err := r.Join(0); err != nil {
		b.Fatal(err)
	}
	cuttable, cancel := context.WithCancel(context.Background())
	b.Cleanup(cancel)
	for _, timeout := range []time.Duration{25 * time.Millisecond, time.Second} {
		s, err := redisstore.New(r, redisstore.Options{URL: srv.URL(), Timeout: timeout})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { s.Close() })
		<-s.Warmed()
		l, err := s.NewLimiter(rule("bench"+timeout.String(), bucket.FixedWindow, 1<<20-1, time.Hour))
		if err != nil {
			b.Fatal(err)
		}
		for _, c := range []struct {
			name string
			ctx  context.Context
		}{{"cuttable", cuttable}, {"background", context.Background()}} {
			b.Run(c.name+"/timeout="+timeout.String(), func(b *testing.B) {
				var keys [64]redisstore.Key
				for i := range keys {
					keys[i] = l.Key([]byte("client-" + strconv.Itoa(i)))
				}
				hits := make([]redisstore.Hit, 1)
				b.ReportAllocs()
				i := 0
				for b.Loop() {
					hits[0] = redisstore.Hit{Lim: l, Key: &keys[i%len(keys)]}
					i++
					if _, err := s.Decide(c.ctx, hits, r.Now()); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
