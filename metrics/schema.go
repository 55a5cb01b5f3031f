package metrics

import (
	"encoding/binary"
	"hash/fnv"
	"strconv"
	"sync"

	"github.com/preforkd/preforkd/shm"
)

// Family is one metric counted in the region's statistics rows.
type Family uint16

// The families. Adding a metric is a constant here and its entry in
// newSpecs; the words of every row, the sums and the Prometheus text
// follow from the table.
const (
	RateLimitRequests      Family = iota // per rule: what each matching rule did with a request
	RateLimitUnavailable                 // per rule: decisions of a Redis rule that on_unavailable answered
	HTTPRequests                         // responses sent, by status code, with their durations
	UpstreamErrors                       // requests the upstream failed, by kind
	IdempotencyRequests                  // keyed requests, by what they got
	IdempotencyCompletions               // what became of executed keyed requests
	IdempotencyWaits                     // duplicates that waited for their original
	IdempotencyStoredBytes               // sizes of the responses stored for replay
	CacheRequests                        // requests of a cache block, by their X-Cache
	CacheNotModified                     // hits answered 304 to a conditional request
	CacheSentBytes                       // body bytes sent from the cache
	CacheFills                           // what became of the responses fetched to fill the cache
	CacheWaits                           // misses that waited for another request's fetch
	CacheRefreshes                       // background refreshes (stale-while-revalidate)
	CacheInvalidations                   // URLs invalidated by successful unsafe requests
	CachePurged                          // entries a lookup found purged and dropped
	CacheCutSends                        // hits whose body was cut off: the entry changed before its body was copied
	WorkerGCCycles                       // per worker: garbage collections its process ran, written by itself (Row.SetGCCycles)
	UpstreamDuration                     // time from sending a request to the upstream to its response head, or its failure
	Connections                          // client connections open now, by state (a gauge: Conns)
	ConnectionsAccepted                  // client connections accepted
	ConnectionsMaxReached                // times a worker reached server.max_connections and stopped accepting
	RedisCalls                           // round trips to Redis made for requests, by result (a Redis store's Observer)
	RedisCallDuration                    // their durations
	RedisShortCircuits                   // requests' calls the open breaker kept from Redis
	RedisDenyCacheHits                   // decisions the deny cache answered with no call
	RedisFlushes                         // sync-mode flushes, by result
	RedisNoScript                        // calls and flushes that met NOSCRIPT and sent the script again
	numFamilies
)

// Results of RateLimitRequests: one per matching rule and request. A rule
// counts a request when it is served, and when this rule refuses it; a
// request refused by another rule is not counted by this one.
const (
	Allowed           = iota // counted, within the limit
	Limited                  // refused by this rule's limit (its status: 429 or 503)
	ShadowLimited            // over the limit of a shadow rule: served all the same
	FullOpen                 // no slot for the key: served uncounted (on_full open, or a shadow rule)
	FullClosed               // no slot for the key: refused with 503 (on_full closed)
	UnavailableOpen          // a Redis rule that Redis could not decide: served uncounted (on_unavailable open, or a shadow rule)
	UnavailableClosed        // a Redis rule that Redis could not decide: refused with 503 (on_unavailable closed)
	CappedOpen               // no slot for a new key: the rule's keys hold max_keys slots; served uncounted
	CappedClosed             // the same, refused with 503 (on_full closed)
	// NearLimit counts, besides Allowed (as envoy's ratelimit counts
	// near_limit besides within_limit), the allowed requests after which
	// the key has at most a fifth of the rule's limit left: at least 80%
	// of it is used. It is not a result of its own: the other results
	// add up to the requests a rule matched.
	NearLimit
)

// IsNearLimit reports whether a request allowed with remaining of limit
// left leaves at least 80% of the limit used (NearLimit).
func IsNearLimit(remaining, limit int64) bool { return limit > 0 && remaining*5 <= limit }

// Kinds of UpstreamErrors.
const (
	UpstreamConnect  = iota // refused, unreachable, or no connection within the connect timeout: 502
	UpstreamTimeout         // no response header within the upstream timeout: 504
	UpstreamResponse        // an invalid response, or the connection closed before one: 502; or bytes past a whole response, or on an idle connection
	UpstreamBroken          // the response broke off after its header: the client got part of it
)

// Results of IdempotencyRequests: one per keyed request.
const (
	IdemExecuted = iota // reserved the key and ran
	IdemReplayed        // got the stored response
	IdemConflict        // 409: its original still in flight after the wait, or unreplayable
	IdemMismatch        // 422: the key was used for another request
	IdemFull            // 503: no record could be had
	IdemInvalid         // 400 or 413: no usable key or body
	IdemCapped          // 429: the client holds max_records records already
	IdemGone            // 499: the client went away while its duplicate waited for the original
)

// Results of IdempotencyCompletions: one per executed keyed request.
const (
	IdemStored       = iota // the response is stored for replay
	IdemUnreplayable        // completed without a stored response: over max_body or no blocks; retries get 409
	IdemReleased            // 5xx, 408, 429 or no whole response: the key is free again
)

// Results of CacheRequests: one per request of a cache block.
const (
	CacheHit         = iota // from the cache, fresh
	CacheStale              // from the cache, stale (stale-while-revalidate, stale-if-error)
	CacheMiss               // the application answered
	CacheBypass             // not one the cache answers (another method, If-Match, ...)
	CacheRevalidated        // from the cache, stale, after the application answered 304 to its validators
)

// Results of CacheFills: one per fetch that held a key's fill lock.
const (
	CacheStored    = iota // the response is stored
	CacheNotStored        // not storable, too large, no room, or purged while fetched
)

// Results of CacheWaits.
const (
	CacheWaited      = iota // waited for another request's fetch
	CacheLockTimeout        // and its wait ran out: fetched itself, not stored
)

// Results of RedisCalls and RedisFlushes.
const (
	RedisOK      = iota // Redis answered
	RedisError          // the call failed: refused, reset, an error reply
	RedisTimeout        // no answer within the timeout
)

// codes are the status codes HTTPRequests counts one by one; any other
// (an engine's own 1xx, a handler's 999) is counted as "other".
const (
	minCode  = 100
	maxCode  = 599
	numCodes = maxCode - minCode + 2 // and "other"
)

// spec describes a family.
type spec struct {
	name    string // its HELP is in helps
	kind    kind
	label   string   // "" for none
	values  []string // label values, a word each
	perRule bool     // a block of words per rule index, labelled rule=NAME
	bounds  []uint64 // histogram: upper bounds, in counted units; +Inf is implicit
	per     float64  // histogram: counted units per unit of the family (µs per second)
	// codeHistogram: the histogram's name (its HELP in helps). Its buckets are kept
	// per label value, so that a response is one add for its value and
	// its bucket, and one for the sum; the counter by value and the
	// histogram are sums of them.
	hist string
	// redis: written only while [redis] is configured (AppendRedis), as
	// the breaker's state; counted all the same.
	redis bool
}

type kind uint8

const (
	counter kind = iota
	histogram
	codeHistogram // a counter by label value and a histogram, from one table of buckets by value
	perWorker     // a counter of one process, read per worker index and never summed (AppendWorkers)
	connGauge     // the connections open now, by state, in one word (Conns); dropped when a worker is reaped
)

// specs is the schema, built when first asked for (by the page writer
// and the tests): a program that only counts (an embedding one) links
// rowLayout and histBounds, not the names, labels and values.
func specs() *[numFamilies]spec {
	specsOnce.Do(func() { specsTab = newSpecs() })
	return specsTab
}

var (
	specsOnce sync.Once
	specsTab  *[numFamilies]spec
)

func newSpecs() *[numFamilies]spec {
	return &[numFamilies]spec{
		RateLimitRequests: {
			name: "preforkd_ratelimit_requests_total", kind: counter, perRule: true,
			label: "result", values: []string{"allowed", "limited", "shadow_limited", "full_open", "full_closed", "unavailable_open", "unavailable_closed", "capped_open", "capped_closed", "near_limit"},
		},
		RateLimitUnavailable: {
			name: "preforkd_ratelimit_unavailable_total", kind: counter, perRule: true,
		},
		HTTPRequests: {
			name: "preforkd_http_requests_total", kind: codeHistogram,
			label: "code", values: codeValues(),
			hist:   "preforkd_http_request_duration_seconds",
			bounds: histBounds[HTTPRequests],
			per:    1e6,
		},
		UpstreamErrors: {
			name: "preforkd_upstream_errors_total", kind: counter,
			label: "kind", values: []string{"connect", "timeout", "response", "broken"},
		},
		IdempotencyRequests: {
			name: "preforkd_idempotency_requests_total", kind: counter,
			label: "result", values: []string{"executed", "replayed", "conflict", "mismatch", "full", "invalid", "capped", "gone"},
		},
		IdempotencyCompletions: {
			name: "preforkd_idempotency_completions_total", kind: counter,
			label: "result", values: []string{"stored", "unreplayable", "released"},
		},
		IdempotencyWaits: {
			name: "preforkd_idempotency_waits_total", kind: counter,
		},
		IdempotencyStoredBytes: {
			name: "preforkd_idempotency_stored_bytes", kind: histogram,
			bounds: histBounds[IdempotencyStoredBytes],
			per:    1,
		},
		CacheRequests: {
			name: "preforkd_cache_requests_total", kind: counter,
			label: "result", values: []string{"hit", "stale", "miss", "bypass", "revalidated"},
		},
		CacheNotModified: {
			name: "preforkd_cache_not_modified_total", kind: counter,
		},
		CacheSentBytes: {
			name: "preforkd_cache_sent_bytes_total", kind: counter,
		},
		CacheFills: {
			name: "preforkd_cache_fills_total", kind: counter,
			label: "result", values: []string{"stored", "not_stored"},
		},
		CacheWaits: {
			name: "preforkd_cache_waits_total", kind: counter,
			label: "result", values: []string{"waited", "lock_timeout"},
		},
		CacheRefreshes: {
			name: "preforkd_cache_refreshes_total", kind: counter,
		},
		CacheInvalidations: {
			name: "preforkd_cache_invalidations_total", kind: counter,
		},
		CachePurged: {
			name: "preforkd_cache_purged_entries_total", kind: counter,
		},
		CacheCutSends: {
			name: "preforkd_cache_cut_sends_total", kind: counter,
		},
		UpstreamDuration: {
			name: "preforkd_upstream_response_duration_seconds", kind: histogram,
			bounds: histBounds[UpstreamDuration],
			per:    1e6,
		},
		Connections: {
			name: "preforkd_connections", kind: connGauge,
			label: "state", values: []string{"reading", "writing", "idle"},
		},
		ConnectionsAccepted: {
			name: "preforkd_connections_accepted_total", kind: counter,
		},
		ConnectionsMaxReached: {
			name: "preforkd_connections_max_reached_total", kind: counter,
		},
		RedisCalls: {
			name: "preforkd_redis_calls_total", kind: counter, redis: true,
			label: "result", values: []string{"ok", "error", "timeout"},
		},
		RedisCallDuration: {
			name: "preforkd_redis_call_duration_seconds", kind: histogram, redis: true,
			bounds: histBounds[RedisCallDuration],
			per:    1e6,
		},
		RedisShortCircuits: {
			name: "preforkd_redis_short_circuits_total", kind: counter, redis: true,
		},
		RedisDenyCacheHits: {
			name: "preforkd_redis_deny_cache_hits_total", kind: counter, redis: true,
		},
		RedisFlushes: {
			name: "preforkd_redis_flushes_total", kind: counter, redis: true,
			label: "result", values: []string{"ok", "error", "timeout"},
		},
		RedisNoScript: {
			name: "preforkd_redis_noscript_total", kind: counter, redis: true,
		},
		WorkerGCCycles: {
			name: "preforkd_worker_gc_cycles_total", kind: perWorker,
		},
	}
}

// durationBounds are the buckets of the duration histograms, in µs (1ms
// to 60s): the same for a request and for its upstream, so that the two
// can be read against each other bucket by bucket.
var durationBounds = []uint64{1e3, 2.5e3, 5e3, 10e3, 25e3, 50e3, 100e3, 250e3, 500e3, 1e6, 2.5e6, 5e6, 10e6, 30e6, 60e6}

// redisBounds are the buckets of RedisCallDuration, in µs (100µs to
// 1s): a call is bounded by redis.timeout (25ms by default), a probe by
// twice that and 50ms.
var redisBounds = []uint64{100, 250, 500, 1e3, 2.5e3, 5e3, 10e3, 25e3, 50e3, 100e3, 250e3, 500e3, 1e6}

// histBounds are the histograms' bounds, apart from their specs: a row
// counts with them (Row.Observe, Row.Response) and needs nothing else of
// the schema but rowLayout.
var histBounds = [numFamilies][]uint64{
	HTTPRequests:           durationBounds,
	IdempotencyStoredBytes: {256, 1 << 10, 4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20},
	UpstreamDuration:       durationBounds,
	RedisCallDuration:      redisBounds,
}

func codeValues() []string {
	v := make([]string, 0, numCodes)
	for c := minCode; c <= maxCode; c++ {
		v = append(v, strconv.Itoa(c))
	}
	return append(v, "other")
}

// words is how many words a family takes (per rule for a per-rule one):
// one per label value, or the histogram's buckets, +Inf and the sum.
func (s *spec) words() int {
	switch s.kind {
	case histogram:
		return len(s.bounds) + 2
	case codeHistogram:
		return len(s.values)*(len(s.bounds)+1) + 1
	case connGauge:
		return 1
	}
	return max(len(s.values), 1)
}

// layout is where each family's words start: gauges from 0 (the
// region's StatGauges, dropped when a worker is reaped), then the other
// fixed families, then a block of perRuleWords for each rule index after
// fixedWords.
type layout struct {
	off          [numFamilies]int
	gaugeWords   int
	fixedWords   int
	perRuleWords int
}

func tagOf(fams *[numFamilies]spec) uint64 {
	h := fnv.New64a()
	var b []byte
	for f := range numFamilies {
		s := &fams[f]
		b = append(b, s.name...)
		b = append(b, 0, byte(s.kind))
		if s.perRule {
			b = append(b, 1)
		}
		b = binary.LittleEndian.AppendUint64(b, uint64(s.words()))
	}
	h.Write(b)
	return max(h.Sum64(), 1)
}

func newLayout(families *[numFamilies]spec) layout {
	var l layout
	for f := range numFamilies {
		if s := &families[f]; s.kind == connGauge {
			l.off[f] = l.fixedWords
			l.fixedWords += s.words()
		}
	}
	l.gaugeWords = l.fixedWords
	for f := range numFamilies {
		if s := &families[f]; !s.perRule && s.kind != connGauge {
			l.off[f] = l.fixedWords
			l.fixedWords += s.words()
		}
	}
	for f := range numFamilies {
		if s := &families[f]; s.perRule {
			l.off[f] = l.perRuleWords
			l.perRuleWords += s.words()
		}
	}
	return l
}

// DefaultRules is the least number of rule names a region has room for.
const DefaultRules = 256

// gates: per rule, one each for refusals, shadow refusals, requests let
// through by on_full open and by on_unavailable open; then one per
// upstream error kind; then the peer gates (PeerGate).
const (
	gateRefused = iota
	gateShadow
	gateFull
	gateUnavailable
	gatesPerRule
	upstreamGates = 4
	// PeerGates are the gates of the warning about forwarded requests
	// from a peer that is not trusted: the first passes one line a
	// second; the marks of the others remember the peers warned about.
	PeerGates = 65
	// resetGates: the lines about the application's reset header.
	resetGates = 1
)

// Geometry sets the statistics geometry of o for a configuration of n
// rules: room for DefaultRules rule names or 4n, whichever is more, so
// that reloads can add rules (a name keeps its index for the region's
// life, also once its rule is removed).
func Geometry(o *shm.Options, rules int) {
	o.StatLayout = layoutTag
	names := max(DefaultRules, 4*rules)
	o.StatNames = names
	o.StatWords = rowLayout.fixedWords + names*rowLayout.perRuleWords
	o.StatGauges = rowLayout.gaugeWords
	o.StatGates = names*gatesPerRule + upstreamGates + PeerGates + resetGates
}

// capacity is how many rule indexes a row of words words has room for.
func capacity(words int) int {
	if words < rowLayout.fixedWords {
		return 0
	}
	return (words - rowLayout.fixedWords) / rowLayout.perRuleWords
}
