// Package bucket holds preforkd's rate-limit algorithms as pure functions
// over one 48-bit state word, and the [Limiter] that applies a [Rule] to a
// shared counter table from package shm.
//
// Most users want [NewLimiter] and [Limiter.Allow]:
//
//	lim, err := bucket.NewLimiter(bucket.Rule{Name: "login", Limit: 5, Window: 5 * time.Minute}, region.Counters())
//	lim.SetClock(region.Now)
//	d := lim.Allow(clientIP, region.Now())
//	if !d.Allowed { /* 429, Retry-After: d.RetryAfter */ }
//
// # Algorithms
//
// GCRA (the default) is a token bucket of Burst tokens (default: Limit)
// refilled smoothly at Limit per Window. Its state is the theoretical
// arrival time in microseconds of region time, so fractions of a token are
// never lost: a client sending 5/min every 10 ms gets 55 requests through
// in 10 minutes (the burst, then one per 12 s), not 5. The emission
// interval is rounded up to a whole microsecond, so the rate may fall
// short of Limit per Window by under a microsecond per request but never
// exceeds it.
//
// FixedWindow lets exactly Limit requests through per window aligned to
// the region's time base. Its state is the window index modulo 2^28 and a
// 20-bit count, so Limit is at most [MaxLimit]. A stored window at most
// 2^20 windows ahead of the clock is taken for one still to come (see
// Time), any other for one past: a key left untouched for within 2^20
// windows short of a multiple of 2^28 windows (8.5 years at 1 s, 74
// hours at 1 ms) could be misread as current or as still to come.
//
// # Time
//
// Every function takes `now`, the region's clock (shm.Region.Now), as a
// parameter. A clock that reads behind a key's state grants nothing: GCRA
// keeps the later arrival time, and a fixed window keeps counting in the
// later window (up to 2^20 windows behind it). A Limiter given the clock
// its callers read ([Limiter.SetClock]) decides no earlier than that clock
// reads once the key's state is loaded, so that decisions of several
// processes on one key are ordered as their times; without it, a caller
// descheduled between reading `now` and deciding may be refused the last
// request the limit allows.
//
// # Concurrency
//
// [Policy] is pure and safe anywhere. A [Limiter] is safe for concurrent
// use by goroutines and by every process that maps the table: a decision
// is one CAS, exact across processes (a limit of L lets exactly L through,
// never L × workers). A refusal writes nothing. [Limiter.RefundKey] gives a
// request back when another rule refused it.
//
// When the table has no slot for a new key, the rule's [OnFull] answers:
// [Open] allows, [Closed] refuses with Retry-After [FullRetryAfter]; the
// decision has Full set, and the table counts it. So it does when the keys
// of the rule's group already hold [Rule.MaxKeys] slots (Capped set too):
// a flood of new keys on one rule cannot take the others' room.
package bucket
