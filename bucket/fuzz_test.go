package bucket

import (
	"testing"
	"time"
)

// FuzzTake drives a rule through arbitrary payloads and instants. A
// decision never grants more than the rule holds, a refusal never writes,
// the stored payload fits 48 bits and decodes to what was decided, and an
// allowed request is followed, at the same instant, by a state with one
// fewer remaining.
func FuzzTake(f *testing.F) {
	f.Add(uint8(0), int64(5), int64(60_000_000), int64(0), uint64(0), int64(1_000_000), int64(0))
	f.Add(uint8(1), int64(3), int64(10_000_000), int64(0), uint64(12345), int64(99_000_000), int64(-5_000_000))
	f.Add(uint8(0), int64(10000), int64(1_000_000), int64(1), uint64(1<<48-1), int64(1<<40), int64(7))
	f.Fuzz(func(t *testing.T, algo uint8, limit, windowUS, burst int64, payload uint64, nowUS, stepUS int64) {
		r := Rule{Name: "fz", Limit: limit, Window: time.Duration(windowUS) * time.Microsecond, Algorithm: Algorithm(algo % 2), Burst: burst}
		p, err := r.Compile()
		if err != nil {
			return
		}
		payload &= payloadMax
		now := time.Duration(nowUS%(1<<47)) * time.Microsecond
		next, d := p.Take(payload, now)
		if next > payloadMax {
			t.Fatalf("payload %#x over 48 bits", next)
		}
		cap := p.limit
		if p.algo == GCRA {
			cap = p.burst
		}
		if d.Remaining < 0 || d.Remaining >= cap || d.RetryAfter < 0 || d.ResetAfter < 0 {
			t.Fatalf("decision out of range: %+v (limit %d burst %d)", d, p.limit, p.burst)
		}
		if !d.Allowed {
			if next != payload || d.RetryAfter == 0 {
				t.Fatalf("refusal wrote %#x→%#x or has no retry: %+v", payload, next, d)
			}
			return
		}
		// Taking again at the same instant sees one fewer.
		_, d2 := p.Take(next, now)
		if d2.Allowed && d2.Remaining != d.Remaining-1 {
			t.Fatalf("remaining %d then %d", d.Remaining, d2.Remaining)
		}
		if !d2.Allowed && d.Remaining != 0 {
			t.Fatalf("refused with %d remaining", d.Remaining)
		}
		// A refund gives exactly this request back.
		back, ok := p.Refund(next, now)
		if !ok {
			t.Fatalf("refund of an allowed request refused")
		}
		if _, d3 := p.Take(back, now); !d3.Allowed || d3.Remaining != d.Remaining {
			t.Fatalf("after refund: %+v, want remaining %d", d3, d.Remaining)
		}
		// Time never runs backwards into more allowance than the state had.
		later := now + time.Duration(stepUS%(1<<40))*time.Microsecond
		if later < 0 {
			return
		}
		if _, d4 := p.Take(next, later); later < now && d4.Allowed && d4.Remaining > d.Remaining {
			t.Fatalf("clock back %v granted: %+v after %+v", now-later, d4, d)
		}
	})
}

// FuzzFresh: a payload judged fresh decides exactly as a fresh key.
func FuzzFresh(f *testing.F) {
	f.Add(uint8(0), int64(5), int64(60_000_000), uint64(123456789), int64(200_000_000))
	f.Add(uint8(1), int64(2), int64(1_000_000), uint64(5<<20|2), int64(7_000_000))
	f.Fuzz(func(t *testing.T, algo uint8, limit, windowUS int64, payload uint64, nowUS int64) {
		r := Rule{Name: "fz", Limit: limit, Window: time.Duration(windowUS) * time.Microsecond, Algorithm: Algorithm(algo % 2)}
		p, err := r.Compile()
		if err != nil || nowUS < 0 {
			return
		}
		payload &= payloadMax
		now := time.Duration(nowUS%(1<<47)) * time.Microsecond
		if !Fresh(r.Meta(), payload, now) {
			return
		}
		_, got := p.Take(payload, now)
		_, want := p.Take(0, now)
		if got.Allowed != want.Allowed || got.Remaining != want.Remaining {
			t.Fatalf("fresh payload %#x decides %+v, a fresh key %+v", payload, got, want)
		}
	})
}
