// Package core runs each request of preforkd from its verdict to its end:
// the rate limits, idempotent replay and the response cache are its
// stages, in that order, over a small view of the request ([Request]) that
// each engine implements; what the application answered is told back to
// it, and it stores, counts and releases. An engine only carries bytes:
// the same rules give the same answers, byte for byte, on every engine.
// Idempotent replay, the cache and the Redis rules' round trip run when
// Options builds them ([IdempotencyBlocks], [CacheBlocks], [RedisRules]
// over a redisstore.Store): a program that builds none links none of
// their code.
//
// Per worker process, once: [New] over a joined shm.Region. Per request,
// the protocol every engine follows (run.go has it in full):
//
//	ex := c.Begin(req)
//	if ex.Decide() == core.Respond {
//		// send ex.Response()
//	} else {
//		// forward as ex.Forward() says; then send ex.Failed(...) for no
//		// response, or what ex.Head(status, header) returns instead of
//		// the application's response, or that response with ex.Fields()
//		// added, telling ex.Body each piece of its body
//	}
//	if ex.Finish(err) {
//		// refresh the stale response just served, in the background
//	}
//
// An engine that must never block (an event loop) asks the core not to
// wait (Exchange.NoWait) and finishes the few decisions that must wait on
// a goroutine of its own.
//
// What the core decides is counted in the region's statistics (package
// metrics), in this worker's row, so that every engine counts alike; the
// lines an operator acts on (refusals, shadow refusals, a full table,
// upstream failures) are logged at most once a second across all workers.
// [Control] inspects and forgets single keys, also from a process that
// never joined the region (the supervisor's admin endpoint).
//
// A Core is safe for concurrent use. Its state lives in the region, so
// every process deciding over one region shares counts and stored
// responses: a refusal charges no rule, a keyed request runs at most once
// per key while its record lives, a cached response is fetched once for
// every process. Decide allocates nothing for a request that no rule or
// block matches, and nothing but the fingerprint's hash state for most
// that one does; a cache hit allocates nothing.
package core
