// Package loop is preforkd's event-loop engine: cleartext HTTP/1.1 served
// by a few goroutines that each own an epoll poller (level-triggered
// epoll, an eventfd wake-up and gnet v2's lock-free task queue),
// with the upstream connections registered on the same poller as the
// clients they serve. A socket is read when epoll says it has bytes, and
// a response goes out in one write with its head: two reads and two
// writes a proxied request, as nginx makes them, and no goroutine per
// connection (an idle keep-alive connection costs a few hundred bytes).
// The core (package core) runs every request; this package carries bytes.
//
// The call most users want, once per worker process:
//
//	srv, err := loop.New(loop.Options{Upstream: "http://127.0.0.1:3000", Core: c})
//	...
//	go srv.Serve(ln) // the supervisor's listening socket: the loops accept from it
//	...
//	srv.Shutdown(ctx) // the drain rule of package engine
//
// # What the upstream sees, and what is refused
//
// The same as package proxy says (the conformance tables of package proxy
// run every row on both engines): the request line with the path's dot
// segments removed and slashes merged, the client's fields as sent but
// the hop-by-hop ones, Expect (answered here) and names with '_';
// X-Forwarded-For/-Proto/-Host set; a body that ends within its first
// 64 KiB read whole and sent with a Content-Length, a longer one streamed.
// Ambiguous framing (Content-Length with Transfer-Encoding, two lengths,
// obs-fold, a bare LF, a bad chunk, Transfer-Encoding in HTTP/1.0), a
// control character in a field, CONNECT, PRI and asterisk-form targets
// but OPTIONS * are refused before anything is forwarded; the connection
// closes after an answer to a request whose framing cannot be trusted.
// Two Host fields are a 400 too, and a transfer coding other than chunked
// a 501 (RFC 9112 §3.2, §6.1).
//
// The response comes back without its hop-by-hop fields and with this
// server's Date, its body passed on as it arrives (a server-sent event
// at once), with its length, or chunked anew (an HTTP/1.0 client reads
// it up to the close); trailers are read and dropped, both ways. HEAD,
// 1xx, 204 and 304 responses carry no body, interim responses are not
// passed on, an upgrade is tunnelled once the upstream answered 101 (an
// upgrade to h2c is not). An upstream connection is reused only when
// clean: it is polled while idle, and peeked at before every reuse.
//
// # Nothing blocks a loop
//
// A request the core would make wait — a Redis rule's round trip, a
// duplicate of an idempotent request in flight, a cache miss another
// request fetches — is decided on the loop up to that point
// (core.Exchange.NoWait) and finished by a bounded set of goroutines
// (Options.Waiters), which hand it back; the body the core fingerprints
// is read before it decides. The upstream's name is resolved by a
// goroutine of the server's, warnings are written by another. An
// in-process application (Options.App) runs on the loop and must not
// block either.
//
// # Back-pressure and limits
//
// A side is not read while the other side's output holds more than
// 256 KiB (a slow client stops the upstream's response, a slow upstream
// the client's upload): memory per connection is bounded whatever the
// bodies' sizes. Every timeout of engine.Limits and engine.Upstream is
// kept by a timer wheel of 25 ms ticks (a timeout fires within two ticks
// after it is due). A loop ticks only while something happens: after a
// tick with no event it sleeps until its earliest timeout is due, so
// that an idle worker spends no CPU. MaxConnections stops the loops'
// accepting, which the other workers on the shared socket take over
// meanwhile.
//
// # Listening
//
// Serve takes the listener the supervisor made (inherited by the worker):
// the loops poll a duplicate of its descriptor, each on its own poller,
// and accept without blocking when it is readable. The engine speaks cleartext to clients and to the
// upstream: an https:// upstream is refused ([ErrTLSUpstream]); TLS and
// HTTP/2 are engine/nethttp's.
//
// # Concurrency
//
// A Server is safe for concurrent use. Its goroutines: the loops (one per
// Options.Loops, each with a ticker), the waiters while any decision
// waits, the resolver, the warner; Close stops them all and waits.
package loop
