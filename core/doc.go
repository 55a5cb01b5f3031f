// Package core is preforkd's decision core: what happens to a request
// before the application sees it, with no HTTP engine's types in it.
// Rate limiting and idempotent replay are its stages, over a small view of
// the request ([Request]) that each engine's adapter implements; the same
// rules therefore give the same answers, byte for byte, on every engine.
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
// per key while its record lives. Decide allocates nothing for a request
// that no rule or block matches, and nothing but the fingerprint's hash
// state for most that one does.
package core
