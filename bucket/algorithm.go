package bucket

import (
	"errors"
	"fmt"
	"time"

	"github.com/preforkd/preforkd/internal/textvalue"
	"github.com/preforkd/preforkd/shm"
)

// Algorithm selects how a rule counts.
type Algorithm uint8

const (
	// GCRA is the generic cell rate algorithm: a token bucket of Burst
	// tokens refilled smoothly at Limit per Window, with no rounding loss
	// (its state is the theoretical arrival time, in microseconds).
	GCRA Algorithm = iota
	// FixedWindow lets exactly Limit requests through per aligned Window.
	FixedWindow
)

// algorithmNames are the names ParseAlgorithm reads and String writes,
// indexed by algorithm.
var algorithmNames = textvalue.Enum[Algorithm]{GCRA: "gcra", FixedWindow: "fixed-window"}

func (a Algorithm) String() string { return algorithmNames.String(a, "Algorithm") }

// ParseAlgorithm parses "gcra" or "fixed-window"; "" is GCRA.
func ParseAlgorithm(s string) (Algorithm, error) {
	if s == "" {
		return GCRA, nil
	}
	if a, ok := algorithmNames.Value(s); ok {
		return a, nil
	}
	return 0, fmt.Errorf("bucket: unknown algorithm %q (want \"gcra\" or \"fixed-window\")", s)
}

// MarshalText returns "gcra" or "fixed-window".
func (a Algorithm) MarshalText() ([]byte, error) { return marshalName(algorithmNames, a, "algorithm") }

// UnmarshalText parses "gcra" or "fixed-window". Unlike ParseAlgorithm it
// refuses "": a text that names no algorithm is a mistake.
func (a *Algorithm) UnmarshalText(b []byte) error {
	if len(b) == 0 {
		return errors.New(`bucket: empty algorithm (want "gcra" or "fixed-window")`)
	}
	return textvalue.Unmarshal(b, a, ParseAlgorithm)
}

// marshalName is the MarshalText of this package's enums: v's name, or an
// error "bucket: unknown <what> <v>" for a value without one.
func marshalName[T ~uint8](names textvalue.Enum[T], v T, what string) ([]byte, error) {
	name, ok := names.Name(v)
	if !ok {
		return nil, fmt.Errorf("bucket: unknown %s %d", what, v)
	}
	return []byte(name), nil
}

// Limits of the payload encoding.
const (
	MaxLimit  = 1<<countBits - 1                       // requests per window (and burst)
	MaxWindow = (1<<windowBits - 1) * time.Microsecond // ~203 days
	MinWindow = time.Millisecond

	countBits  = 20 // fixed window: count in the low bits
	widxBits   = 28 // fixed window: window index modulo 2^28 in the high bits
	widxMask   = 1<<widxBits - 1
	countMask  = 1<<countBits - 1
	payloadMax = shm.PayloadMask
)

// Decision is the answer to one request, with what the rate-limit headers
// need.
type Decision struct {
	Allowed    bool
	Limit      int64         // the rule's limit per window
	Remaining  int64         // quota units still available now, after this request (a refused one takes none)
	ResetAfter time.Duration // until the state is as a fresh key's (bucket full / window over)
	RetryAfter time.Duration // until the next request can pass; 0 when allowed
	// Full is set when no slot could be had for the key and the rule's
	// on_full policy answered (Allowed says how).
	Full bool
	// Capped is set with Full when the slot was refused because the keys
	// of the rule's group hold MaxKeys slots (the table itself had room).
	Capped bool
}

// Policy is a rule compiled for decisions: pure functions over one
// 48-bit payload and `now` (region time). The zero payload is a fresh key.
type Policy struct {
	algo   Algorithm
	limit  int64
	burst  int64
	window int64 // µs
	t      int64 // GCRA emission interval, µs, rounded up so the rate is never exceeded
	tau    int64 // GCRA capacity in time: burst × t
	cost   int64 // what one request takes: 1..burst (GCRA), 1..limit (fixed window)
}

// Take decides one request at now against payload and returns the payload
// to store when it is allowed. A refusal changes nothing.
func (p *Policy) Take(payload uint64, now time.Duration) (next uint64, d Decision) {
	us := max(int64(now/time.Microsecond), 0)
	if p.algo == FixedWindow {
		return p.takeWindow(payload, us)
	}
	return p.takeGCRA(payload, us)
}

// Peek reports what the state means at now without taking anything:
// Remaining is what could still pass, Allowed whether one more would.
func (p *Policy) Peek(payload uint64, now time.Duration) Decision {
	_, d := p.Take(payload, now)
	if d.Allowed {
		// As things stand, not as they would after taking one.
		d.Remaining += p.cost
		if p.algo == GCRA {
			us := max(int64(now/time.Microsecond), 0)
			d.ResetAfter = time.Duration(max(int64(payload), us)-us) * time.Microsecond
		}
	}
	return d
}

// Refund gives back one request (its cost) taken at or before now, as if it had not
// been served. It never gives back more than was taken in the current
// window (fixed window) or than the bucket holds (GCRA).
func (p *Policy) Refund(payload uint64, now time.Duration) (next uint64, changed bool) {
	if payload == 0 {
		return 0, false
	}
	us := max(int64(now/time.Microsecond), 0)
	if p.algo == FixedWindow {
		_, cnt, over := p.window3(payload, us)
		if over || cnt == 0 {
			return payload, false
		}
		return payload - uint64(min(p.cost, cnt)), true
	}
	tat := int64(payload)
	if tat <= us {
		return payload, false
	}
	tat = max(tat-p.cost*p.t, us)
	return uint64(tat), true
}

// Fresh reports whether payload is equivalent at now to a key never seen.
func (p *Policy) Fresh(payload uint64, now time.Duration) bool {
	return fresh(p.algo, p.window, payload, max(int64(now/time.Microsecond), 0))
}

func fresh(algo Algorithm, window int64, payload uint64, us int64) bool {
	if payload == 0 {
		return true
	}
	if algo == FixedWindow {
		widx := uint64(us/window) & widxMask
		stored := payload >> countBits
		return payload&countMask == 0 || widxDiff(widx, stored) > 0
	}
	return int64(payload) <= us
}

// widxAhead is how many windows ahead of the clock a stored window may be
// and still be taken for one still to come (the clock read behind the
// key's state), not for one long past: 2^20, 12 days at 1 s, 17 minutes
// at 1 ms. A key is misread only when left untouched for within that of
// a multiple of 2^28 windows.
const widxAhead = 1 << 20

// widxDiff is cur − stored modulo 2^28, as a signed distance: negative
// when stored is at most widxAhead windows ahead.
func widxDiff(cur, stored uint64) int64 {
	d := int64((cur - stored) & widxMask)
	if d >= 1<<widxBits-widxAhead {
		d -= 1 << widxBits
	}
	return d
}

// window3 decodes a fixed-window payload at us: the absolute index of the
// window to count in and its count so far. That is the current window, or
// the stored one if it is later (the clock went backwards: that grants
// nothing); over reports that the stored window has ended.
func (p *Policy) window3(payload uint64, us int64) (abs int64, cnt int64, over bool) {
	now := us / p.window
	if payload == 0 {
		return now, 0, true
	}
	d := widxDiff(uint64(now)&widxMask, payload>>countBits)
	if d > 0 {
		return now, 0, true
	}
	return now - d, int64(payload & countMask), false
}

func (p *Policy) takeWindow(payload uint64, us int64) (uint64, Decision) {
	abs, cnt, _ := p.window3(payload, us)
	reset := time.Duration((abs+1)*p.window-us) * time.Microsecond
	d := Decision{Limit: p.limit, ResetAfter: reset}
	if cnt+p.cost > p.limit {
		d.RetryAfter = reset
		d.Remaining = max(p.limit-cnt, 0) // a reload may have lowered the limit below the count
		return payload, d
	}
	cnt += p.cost
	d.Allowed = true
	d.Remaining = p.limit - cnt
	return uint64(abs)&widxMask<<countBits | uint64(cnt), d
}

func (p *Policy) takeGCRA(payload uint64, us int64) (uint64, Decision) {
	tat := max(int64(payload), us) // a clock that went back finds tat ahead: nothing granted
	next := tat + p.cost*p.t
	d := Decision{Limit: p.limit}
	if next-us > p.tau {
		// Allowed once next − t − tau ≤ now.
		d.RetryAfter = time.Duration(next-p.tau-us) * time.Microsecond
		d.ResetAfter = time.Duration(tat-us) * time.Microsecond
		d.Remaining = max(p.tau-(tat-us), 0) / p.t
		return payload, d
	}
	if next > payloadMax {
		next = payloadMax
	}
	d.Allowed = true
	d.Remaining = (p.tau - (next - us)) / p.t
	d.ResetAfter = time.Duration(next-us) * time.Microsecond
	return uint64(next), d
}

// Params returns the policy in microseconds, for a store that runs the
// same algorithm elsewhere (a Redis script): for GCRA the emission
// interval and the capacity (burst × interval), for a fixed window the
// limit and the window; cost is what one request takes.
func (p *Policy) Params() (algo Algorithm, a, b, cost int64) {
	if p.algo == FixedWindow {
		return p.algo, p.limit, p.window, p.cost
	}
	return p.algo, p.t, p.tau, p.cost
}

// WindowCount is the count a fixed-window payload holds for the window of
// the given length that contains now (0 when the stored window is over),
// and how long until that window ends. As in Take, a stored window later
// than now's (a clock that went back) is the one counted in.
func WindowCount(payload uint64, now, window time.Duration) (count int64, reset time.Duration) {
	p := Policy{algo: FixedWindow, window: max(int64(window/time.Microsecond), 1)}
	us := max(int64(now/time.Microsecond), 0)
	abs, cnt, _ := p.window3(payload, us)
	return cnt, time.Duration((abs+1)*p.window-us) * time.Microsecond
}

// WindowPayload is the fixed-window payload that holds count in the window
// of the given length that contains now, or in the later window a stored
// payload prev holds (see WindowCount). count is at most MaxLimit.
func WindowPayload(prev uint64, now, window time.Duration, count int64) uint64 {
	p := Policy{algo: FixedWindow, window: max(int64(window/time.Microsecond), 1)}
	us := max(int64(now/time.Microsecond), 0)
	abs, _, _ := p.window3(prev, us)
	return uint64(abs)&widxMask<<countBits | uint64(min(max(count, 0), MaxLimit))
}
