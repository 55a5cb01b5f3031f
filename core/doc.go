// Package core is preforkd's decision core: what happens to a request
// before the application sees it, with no HTTP engine's types in it.
// Rate limiting, idempotent replay and the response cache are its stages,
// in that order, over a small view of the request ([Request]) that each
// engine's adapter implements; the same rules therefore give the same
// answers, byte for byte, on every engine.
//
// Per worker process, once: [New] over a joined shm.Region. Per request:
//
//	ex := c.Begin(req)
//	defer ex.Release()
//	if ex.Decide() == core.Respond {
//		// write ex.Response()
//	}
//	// forward to ex.ForwardPath() with ex.Fields() on the response; if
//	// ex.Record() asks, tee the response and give it to ex.Complete.
//	// Count the response sent: ex.Done(status) (or c.Responded for an
//	// answer of the engine's own); an upstream failure: c.UpstreamFailed.
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
//
// # What an engine does for the response cache
//
// Beside the steps above, an adapter that serves [Cache] blocks:
//
//   - forwards a request for which [Exchange.Unconditional] is true
//     without the fields [UnconditionalFields] lists (the response fills
//     the cache and must be whole);
//   - fills [Recorded.Header] with every field line of the response it
//     records;
//   - asks [Exchange.Fallback] before it sends a 500, 502, 503 or 504 of
//     the application's (or its own, when the application gave no
//     response) and sends what it returns instead, then completes with
//     Recorded.Failed;
//   - after it sent a Respond answer for which [Exchange.Refresh] is true,
//     forwards a copy of the request in the background (unconditional, no
//     body), records its response, calls Complete and only then Release.
//
// core/nethttp does all of it for net/http; its tests are the reference.
package core
