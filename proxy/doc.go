// Package proxy is preforkd's data plane: an HTTP/1.1 server (on fasthttp)
// that asks the decision core (package core: rate limits, idempotent
// replay, the response cache) about every request and forwards the ones it lets through to
// one upstream over a pool of keep-alive connections — or serves them
// itself with a fasthttp handler (Options.App).
//
// The call most users want, once per worker process:
//
//	srv, err := proxy.New(proxy.Options{Upstream: "http://127.0.0.1:3000", Core: c})
//	...
//	go srv.Serve(ln)
//	...
//	srv.Shutdown(ctx) // drain: no request in flight or on its way fails
//
// # What the upstream sees
//
// The request line with the path's dot segments removed and repeated
// slashes merged (the query as sent), the client's header lines as sent
// but the hop-by-hop ones (Connection and the fields it names,
// Keep-Alive, TE, Trailer, Transfer-Encoding, Upgrade, Proxy-*), and
// Expect, which is answered here; Host as sent (the authority of an
// absolute-form target instead); X-Forwarded-For with the client's chain
// and the peer appended, X-Forwarded-Proto and X-Forwarded-Host set.
// A body that ends within its first 64 KiB is read whole first and sent
// with a Content-Length; a longer one streams, with its length or
// chunked. The response comes back without its hop-by-hop fields, its
// body streamed as it arrives (see [Options.SendTimeout]); HEAD, 1xx, 204
// and 304 responses carry no body; an upgrade (WebSocket) is tunnelled
// once the upstream answered 101 — but an upgrade to h2c, which would let
// HTTP/2 requests reach the upstream past the core, is forwarded as a
// plain request without it. A response header section over 16 KiB is a
// 502, as nginx's proxy_buffer_size makes it.
//
// A request that fills the response cache goes without its conditional
// and range fields (If-None-Match, Range, ...): what it stores must be
// whole. When the cache holds a stale response that stale-if-error lets
// it serve, an upstream that fails (a 5xx, or no response) is answered
// with it instead; a stale response served under stale-while-revalidate
// is refreshed by a copy of its request sent in the background.
//
// # What is refused
//
// Requests whose framing is ambiguous — Content-Length with
// Transfer-Encoding, two Content-Lengths, obs-fold, a bad chunk, HTTP/1.0
// with Transfer-Encoding — get 400 and the connection is closed: nothing
// of them reaches the upstream (a bad chunk past the first 64 KiB of a
// body aborts the upstream connection, so it never sees a whole
// request). CONNECT (405), PRI and asterisk-form targets but OPTIONS *
// (which is answered here) are refused; a header section over
// MaxHeaderBytes gets 431. An upstream that cannot be reached is a 502
// within UpstreamConnectTimeout, one that sends no response header
// within UpstreamTimeout a 504; both are logged at warn (one line a
// second at most) and counted ([Server.Stats]). Every answer of the
// server's own is an RFC 9457 problem+json.
//
// # Limits
//
// Each timeout of [Options] bounds one wait: the header (slowloris), the
// idle keep-alive, the gap between two reads of a body and between two
// writes to the client, the upstream's connect, and its silence.
// MaxConnections bounds the open connections of each listener a Server
// serves. Memory per
// connection is its header buffer (MaxHeaderBytes) while a request is
// read, and a 64 KiB read-ahead plus 32 KiB of copy buffer while its body
// moves: a 100 MB upload or download goes through in that.
//
// A response body goes out to the client as each piece arrives, with a
// Content-Length or without (chunked, server-sent events). Differences
// from nginx that a client can see: trailers are not forwarded either
// way. An upstream is spoken to in HTTP/1.1, over TLS for an https://
// upstream.
//
// # Concurrency
//
// A Server is safe for concurrent use; its goroutines are fasthttp's (one
// per connection), one per upgraded connection, per streamed request body
// and per cache refresh, and the upstream pool's reaper: Shutdown and
// Close stop them (Shutdown waits for the refreshes, within its context).
package proxy
