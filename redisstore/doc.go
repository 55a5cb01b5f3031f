// Package redisstore keeps the counts of rate-limit rules in Redis, so
// that several preforkd hosts behind one load balancer enforce one limit
// together, while each host's shared-memory region stays the fast path:
// a deny cache and a circuit breaker that every worker of the host shares.
//
// Most users want [New] once per worker process over its joined region,
// [Store.NewLimiter] per rule, then per request [Limiter.Denied] (no I/O)
// and [Store.Decide] (one round trip for every Redis rule of the request).
// Package core does this for preforkd's rules with store = "redis".
//
// # Decisions
//
// GCRA and fixed windows are computed in one Lua script from Redis's own
// clock (TIME): the hosts' clocks never matter. The script looks at every
// key of the request first and charges them all only when no enforcing
// rule refuses, atomically, so a refusal charges no rule. Keys carry the
// key value's hash as a hash tag, so that one request's keys share one
// Cluster slot and one EVALSHA; keys in several slots (rules keyed by
// different values, on a Cluster) go in one pipeline of a script per
// slot, and a refusal in one slot refunds the others (one more round
// trip). A server that lost the script (restart, failover, SCRIPT FLUSH)
// answers NOSCRIPT; the call is then sent once with EVAL, which caches it
// again.
//
// # Failure
//
// Every call is bounded by Options.Timeout (25ms) and never retried on the
// request path. Consecutive failures open a breaker kept in the region
// (see [Breaker]): while it is open no request waits on Redis and each
// rule's [OnUnavailable] answers; after a backoff one worker of the host
// at a time probes, and Breaker.Successes probes in a row close it. On a
// Cluster, failing calls and an open breaker have go-redis reload the
// slot map (at most every [SlotReloadInterval]), so that a failover is
// seen as soon as the Cluster made it, not a minute later. [Stats] counts
// calls, errors, timeouts, deny-cache hits and the breaker's state in
// this process; an [Observer] (Options.Observer) is told of each as it
// happens: the daemon counts them in its worker's statistics row.
//
// # Secrets
//
// Options.Username and Password (and the Sentinels' own) authenticate
// every connection; TLS and CA encrypt them. A password is a [Secret],
// which prints as "xxxxx"; [ReadPasswordFile] reads one from a file
// closed to other users, and [RedactURL] shows a URL without its.
//
// # Deny cache
//
// A key Redis refused is remembered in the region until its retry time,
// under the rule's namespace xor a deny tag, with a GCRA-style payload
// (the time until which it is refused) that the table judges fresh once
// passed: a client that floods a host while limited costs Redis nothing
// until it may be served again.
//
// # Sync mode
//
// A fixed-window rule with Sync > 0 is counted on the host and added to
// Redis every interval by one goroutine per Store; see sync.go for the
// bound on over-admission. Store.Close stops it after a last flush.
//
// # Control
//
// [Limiter.State] and [Limiter.Reset] are an operator's look at one key
// and its reset (package core's Control): State reads Redis without
// charging anything, Reset deletes the key in Redis and clears the host's
// entries for it. A Store over a region this process has not joined (a
// supervisor's) does only these: it decides nothing and flushes nothing.
//
// # Persistence
//
// Nothing of a Redis rule is meant to be dumped: Redis holds it. Deny
// entries carry a window no rule has and the breaker a window of 0, so a
// dump (which keeps only entries whose meta word is one of its rules')
// never holds them; a caller excludes Redis rules from the dump's rules.
package redisstore
