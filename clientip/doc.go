// Package clientip decides who the client of an HTTP request is, and under
// which key a rate-limit rule counts it, for any HTTP engine.
//
// Parse each rule's `by` once with [ParseBy] and build one [Resolver]
// from trusted_proxies and ipv6_prefix; then per request, with a [Source]
// over the request (its headers, cookies, query, path and client):
//
//	key, err := by.AppendKeyOf(buf[:0], src) // err: a repeated key header or parameter (400)
//
// # Client address
//
// The client is the TCP peer. A direct client can never choose its own
// key: X-Forwarded-For and Forwarded (RFC 7239 for=) are read only when
// the peer is in [Resolver.Trusted], and then walked from the right,
// skipping trusted proxies; the first untrusted address is the client. A
// hop that names no usable address stops the walk, since everything left
// of what a trusted proxy wrote may come from the client. When both
// headers list hops they must agree position by position from the right:
// a client cannot forge the header its proxy does not write (see
// [Resolver.ClientOf] for the details). IPv6 clients are keyed by their
// [Resolver.IPv6Prefix] network (default /64).
//
// # Keys
//
// A [By] is "ip", "global", or a chain of "header:NAME", "cookie:NAME",
// "query:NAME" and "path" elements ending in ip; the first element present
// with a usable value is the key. Each element has a key prefix of its
// own, and a value over [MaxKeyValue] bytes is keyed by its SHA-256, so
// elements never collide and a long value is never dropped. A header key
// is as trustworthy as the header: "header:X-Api-Key|ip" lets anybody
// escape the ip limit with a fresh value, unless something upstream
// rejects unknown keys.
//
// # Concurrency and cost
//
// A Resolver, a By and a [PrefixSet] are read-only once built and safe for
// concurrent use. Keys and clients are computed without allocating in the
// common cases, in time linear in the headers; PrefixSet membership is a
// binary search.
package clientip
