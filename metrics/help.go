package metrics

// helps are the families' HELP texts, apart from their specs (families):
// only a program that writes the page (Text) links them, not one that
// only counts (an embedding program that serves no /metrics).
var helps = [numFamilies]struct{ family, hist string }{
	RateLimitRequests:    {family: "Requests a rate-limit rule matched, by rule and by what the rule did: allowed, limited (refused by it), shadow_limited (over the limit, served: shadow mode), full_open (no slot for the key: served uncounted), full_closed (no slot: refused with 503), unavailable_open and unavailable_closed (a Redis rule Redis could not decide: served uncounted, or refused with 503), capped_open and capped_closed (no slot for a new key because the rule's keys hold max_keys slots: served uncounted, or refused with 503). near_limit counts, among the allowed ones, those after which at most a fifth of the limit is left (80% used); it is not added to the others."},
	RateLimitUnavailable: {family: "Decisions of a Redis rule that Redis could not make (down, slow, the breaker open), answered by its on_unavailable, whatever that answered (with local, the host's share decides)."},
	HTTPRequests: {
		family: "Responses sent by the workers, by status code (the application's, or preforkd's own; not the health_path's answers).",
		hist:   "Time from reading a request to handing its response over (a streamed body may go on after).",
	},
	UpstreamErrors:         {family: "Requests the upstream failed: connect (refused, unreachable, connect timeout: 502), timeout (no response header in time: 504), response (invalid, or closed before one: 502; or bytes past a response the client got whole, or sent unasked on an idle connection), broken (cut off after its header)."},
	IdempotencyRequests:    {family: "Requests with an idempotency key, by what they got: executed (reserved the key and ran), replayed, conflict (409), mismatch (422), full (503: no record), invalid (400 or 413), capped (429: the client holds max_records records), gone (499: the client went away while its duplicate waited for the original)."},
	IdempotencyCompletions: {family: "Executed keyed requests, by what became of their response: stored (replayable), unreplayable (over max_body or no blocks: retries get 409), released (5xx, 408, 429 or no whole response: retries run again)."},
	IdempotencyWaits:       {family: "Duplicates that waited for their original, in any worker, to finish."},
	IdempotencyStoredBytes: {family: "Sizes of the responses stored for replay (the body and the fields kept: Content-Type, Location, Content-Encoding), for sizing table.response_bytes."},
	CacheRequests:          {family: "Requests of a cache block, by the X-Cache they were sent: hit (from the cache, fresh), stale (from the cache, stale: stale-while-revalidate or stale-if-error), miss (the application answered), bypass (not a request the cache answers), revalidated (from the cache after the application answered 304 to its validators)."},
	CacheNotModified:       {family: "Hits answered 304 to a conditional request (If-None-Match, If-Modified-Since)."},
	CacheSentBytes:         {family: "Body bytes sent from the cache."},
	CacheFills:             {family: "Responses fetched to fill the cache (misses and refreshes that held the key's fill lock), by what became of them: stored, not_stored (not storable, over max_body, no room, or a purge ran while it was fetched)."},
	CacheWaits:             {family: "Misses that waited for another request's fetch of the same response, in any worker (waited), and those whose wait ran out after lock_timeout, or that found every wait of the event loop taken: they fetched themselves, not storing (lock_timeout)."},
	CacheRefreshes:         {family: "Stale responses refreshed in the background (stale-while-revalidate)."},
	CacheInvalidations:     {family: "Successful unsafe requests (POST, PUT, DELETE, ...) that invalidated the cached responses of their URL."},
	CachePurged:            {family: "Cached responses a lookup found purged (by tag, by URL or by an unsafe request) and dropped."},
	CacheCutSends:          {family: "Responses from the cache whose body was cut off, the connection closed: the entry changed (evicted, purged, replaced) before the copy of its body was taken, which no path of the lookup leaves to happen (0 is expected)."},
	UpstreamDuration:       {family: "Time from sending a request to the upstream to its response header, or to its failure (as the access log's upstream_time). Only requests that reached the upstream: not preforkd's own answers, not cache hits, not requests refused before they went (a 408 body timeout)."},
	Connections:            {family: "Client connections the workers have open, by state: reading (a request header being read, or awaited on a new connection), writing (a request in progress: its body, the decision, the upstream, the response; an upgraded connection), idle (keep-alive, between two requests). Their sum is the connections open."},
	ConnectionsAccepted:    {family: "Client connections the workers accepted."},
	ConnectionsMaxReached:  {family: "Times a worker reached server.max_connections and stopped accepting until one of its connections closed. The connections that come meanwhile wait in the listen queue for another worker: none is accepted and closed, and no idle connection is evicted to make room."},
	RedisCalls:             {family: "Round trips to Redis made for requests (one per request decided in Redis, whatever its number of Redis rules or Cluster slots; a reset by the application's reset header), by result: ok, error (refused, reset, an error reply), timeout (no answer within redis.timeout). Sync-mode flushes are preforkd_redis_flushes_total."},
	RedisCallDuration:      {family: "Time the round trips of preforkd_redis_calls_total took, failed ones included (a timeout takes redis.timeout)."},
	RedisShortCircuits:     {family: "Requests' calls that the open breaker kept from Redis: on_unavailable answered them with no call."},
	RedisDenyCacheHits:     {family: "Decisions of Redis rules that the host's deny cache answered with no call: a refusal by Redis that still stood."},
	RedisFlushes:           {family: "Flushes of sync-mode counts to Redis (one pipeline each, in the background), by result: ok, error, timeout. Those the open breaker held back are not counted."},
	RedisNoScript:          {family: "Calls and flushes that found the script missing in Redis (NOSCRIPT: a restart, a failover, SCRIPT FLUSH) and sent it again."},
	WorkerGCCycles:         {family: "Garbage collections each worker process ran, by worker index (its process's own count: a replaced worker starts again from 0), written by the worker every second."},
}
