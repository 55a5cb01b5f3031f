// Package idempotency applies the [[idempotency]] blocks of a preforkd
// configuration: an http.Handler in front of the application that runs an
// unsafe request (a POST that creates an order, say) once per idempotency
// key, stores its response in the shared response table of an shm.Region,
// and replays it, byte for byte, to every retry, whichever worker process
// the retry reaches (draft-ietf-httpapi-idempotency-key-header).
//
// The call most users want, once per worker process after
// shm.Region.Join, behind the rate limiter (so that a refused request
// never reserves a key):
//
//	idem, err := idempotency.New(cfg, region, app, idempotency.Options{})
//	...
//	limited, err := httplimit.New(cfg, region, idem, httplimit.Options{})
//	srv := &http.Server{Handler: limited}
//
// # Which requests
//
// A request is keyed when the first block whose path and methods match it
// (same syntax and path cleaning as the rate-limit rules: package route)
// names a header, Idempotency-Key by default, that the request carries.
// Requests that match no block, and requests without the header where the
// block does not set `required`, go to the next handler untouched: no
// wrapper, no buffering, streaming as before.
//
// The key is a structured-field String (`Idempotency-Key: "8e03978e"`, with
// the escapes \" and \\) or, as many clients send it, a bare token
// (`Idempotency-Key: 8e03978e`); both spellings are the same key. It is
// refused with 400 when it is missing where required, empty, longer than
// 255 bytes, holds a control character or anything but printable ASCII, is
// sent twice (two field lines, or a list "a", "b") or carries parameters.
//
// Keys are per client: the block's `by` (package clientip, default
// "header:Authorization|ip") names the client, and the record's identity
// is the 128-bit hash of the block's path, the client and the key, so the
// same key from two clients never collides, and a client cannot reach
// another's responses by guessing its keys.
//
// # The life of a keyed request
//
//  1. The body is read, at most server.max_request_body bytes (a larger
//     one is 413 before anything runs), and the request fingerprinted: the
//     SHA-256 of its method, path, query and body, each length-prefixed.
//  2. Begin on the response table, with the fingerprint:
//     - no live record: the key is reserved for this request, which runs
//     the next handler once (step 3);
//     - completed, same fingerprint: the stored response is replayed, with
//     Idempotent-Replayed: true; the handler does not run;
//     - another fingerprint (in flight or completed): 422; nothing runs and
//     the record is unchanged;
//     - in flight, same fingerprint: the duplicate sleeps on the record (a
//     futex shared by every worker process) until the original completes
//     or releases it, then looks again, replaying the original's response;
//     after the block's `wait` of real time it gets 409 with Retry-After;
//     - completed without a stored response: 409;
//     - no record can be had (the table is full, or its insert lock stays
//     held): 503 with Retry-After. A keyed request never runs without a
//     reservation.
//  3. The reserved request runs with a recorder that passes the response
//     through to the client as it is written (Flush works) and keeps a copy
//     of the status, Content-Type, Location and body. The handler's context
//     is the request's without its cancellation, and a client that goes
//     away stops only the writes to it: the handler runs to the end and its
//     response is stored for the retry that client is about to send.
//  4. A 5xx, 408 or 429 is not stored: the reservation is released and
//     waiting duplicates race for the key again, one of them running the
//     request. So is a handler that panics (http.ErrAbortHandler from a
//     proxy whose upstream failed mid-body). Any other status is stored,
//     replayable for the block's ttl; a body over max_body was passed
//     through whole but is not kept: the record completes unreplayable and
//     every retry gets 409, never a second execution. So does a response
//     the block pool has no room for, and one whose handler hijacked the
//     connection.
//
// Every answer of this layer's own (400, 409, 413, 422, 503) is an RFC 9457
// problem+json body {type, title, status, detail} with Cache-Control:
// no-store, saying what is wrong with the request and nothing about the
// table or the worker.
//
// # Guarantees
//
// While a record lives, its request runs exactly once across all the
// workers of the region: the reservation is one CAS in shared memory
// under the key's insert lock, and a duplicate in any worker sees it. A
// worker that dies holding reservations (a crash, kill -9) is reaped by
// the supervisor (shm.Region.Reap), which releases them at once and wakes
// their waiters; one of them then runs the request. The original may have
// reached the application before the crash, so across a crash the
// guarantee is at least once, exactly once otherwise: an application that
// must never run twice checks the key itself too.
//
// A replay is the stored status, Content-Type, Location and body, byte for
// byte, and nothing else of the original's headers (no Set-Cookie, ETag or
// Cache-Control). A response without Content-Type is sniffed once, by the
// recorder, so that the original and its replays agree.
//
// # Limits
//
//   - ttl: after it, the key is free and a retry runs again. Completed
//     records are never evicted earlier; a full table answers 503.
//   - max_body: larger responses are not replayable (409 on retry).
//   - server.max_request_body: larger request bodies get 413, and at most
//     that much (plus one byte) is buffered per request.
//   - No block, or no header where not required: nothing is done.
//   - A duplicate that waits holds its goroutine and connection for up to
//     `wait`; one whose client goes away stops waiting within 250 ms.
//
// # Concurrency and cost
//
// A Middleware is safe for concurrent use and holds no lock across the
// next handler. A request that matches no block costs a path scan and no
// allocation. A keyed request costs its body (buffered), one SHA-256, one
// or two table operations, and a few small allocations; a replay copies
// the stored response out of the region once. [Middleware.Stats] counts
// per process.
package idempotency
