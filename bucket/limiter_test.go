package bucket

import (
	"testing"
	"time"

	"github.com/preforkd/preforkd/shm"
)

func TestLimiterLookupAndReset(t *testing.T) {
	r, err := shm.CreatePrivate(shm.Options{Counters: 64})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Join(0); err != nil {
		t.Fatal(err)
	}
	l, err := NewLimiter(Rule{Name: "login", Limit: 2, Window: time.Minute}, r.Counters())
	if err != nil {
		t.Fatal(err)
	}
	k := l.Key([]byte("ip:192.0.2.1"))
	now := time.Hour
	if d, ok := l.Lookup(k, now); ok || !d.Allowed || d.Remaining != 2 {
		t.Fatalf("unseen key: %+v stored=%v; want fresh, not stored", d, ok)
	}
	l.AllowKey(k, now)
	l.AllowKey(k, now)
	d, ok := l.Lookup(k, now)
	if !ok || d.Allowed || d.Remaining != 0 || d.RetryAfter <= 0 {
		t.Fatalf("after two requests: %+v stored=%v; want stored and limited", d, ok)
	}
	l.ResetKey(k, now)
	if d := l.AllowKey(k, now); !d.Allowed || d.Remaining != 1 {
		t.Fatalf("after ResetKey: %+v; want a fresh allowance", d)
	}
}
