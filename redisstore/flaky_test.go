package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/preforkd/preforkd/bucket"
	"github.com/preforkd/preforkd/internal/logtest"
	"github.com/preforkd/preforkd/internal/redistest"
	"github.com/preforkd/preforkd/redisstore"
)

// A Redis that answers one call in two (a hook fails every second one):
// once open, the breaker lets only probes through, and with 3 successes
// to close it never closes; with 1 it closes at every success (it flaps).
func TestBreakerFlakyRedis(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	for _, successes := range []int{3, 1} {
		c := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1})
		t.Cleanup(func() { c.Close() })
		var calls atomic.Int64
		c.AddHook(oneInTwo{&calls})
		var logs logtest.Buffer
		o := counting
		o.Client = c
		o.Logger = slog.New(slog.NewTextHandler(&logs, nil))
		o.Breaker = redisstore.Breaker{Failures: 1, Backoff: 2 * time.Millisecond, Successes: successes}
		h := newHost(t, srv, 0, o)
		l := h.limiter(t, rule(fmt.Sprint("flaky-", successes), bucket.GCRA, 1e6, time.Minute))
		calls.Store(1) // the next call fails: the breaker opens
		for end := time.Now().Add(300 * time.Millisecond); time.Now().Before(end); {
			h.decide(t, "k", l)
		}
		closed := len(logs.Lines("redis breaker closed: the probes succeeded"))
		probes := calls.Load()
		t.Logf("successes %d: %d calls reached Redis, closed %d times", successes, probes, closed)
		if successes == 3 && (closed != 0 || probes < 20) {
			t.Errorf("one answer in two, 3 successes to close: closed %d times over %d calls; want never", closed, probes)
		}
		if successes == 1 && closed < 10 {
			t.Errorf("one answer in two, 1 success to close: closed %d times over %d calls; want it to flap", closed, probes)
		}
	}
}

// oneInTwo fails every second command (counted in n) before it is sent.
type oneInTwo struct{ n *atomic.Int64 }

func (oneInTwo) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h oneInTwo) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		switch cmd.Name() {
		case "evalsha", "eval":
			if h.n.Add(1)%2 == 0 {
				err := errors.New("flaky: no answer")
				cmd.SetErr(err)
				return err
			}
		}
		return next(ctx, cmd)
	}
}

func (oneInTwo) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
