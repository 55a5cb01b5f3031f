// Package clientip decides who the client of an HTTP request is, and under
// which key a rate-limit rule counts it.
//
// The call most users want is [By.AppendKey]: parse each rule's `by` once at
// startup with [ParseBy], build one [Resolver] from trusted_proxies and
// ipv6_prefix, then per request
//
//	key = rule.By.AppendKey(key[:0], &resolver, req.RemoteAddr, req.Header)
//
// # Client address
//
// The client is the TCP peer (http.Request.RemoteAddr). A direct client can
// never choose its own key: X-Forwarded-For and Forwarded (RFC 7239, its for=
// parameter) are read only when the peer is inside [Resolver.Trusted]. Then
// the hops they list are walked from the right, skipping trusted proxies;
// the first address that is not trusted is the client. If every hop is
// trusted, the left-most hop is the client.
//
// A hop that names no usable address (garbage, "unknown", an obfuscated
// "_hidden", an empty list element, a Forwarded element without for=, a
// repeated for=, a syntax error) stops the walk: the client is the last good
// address seen, the trusted hop just right of it, or the peer when the bad
// hop is the right-most. Nothing left of such a hop is believed, because
// everything left of what a trusted proxy wrote may come from the client.
//
// Several lines of one header are one list, in order (http.Header values).
// Blank lines contribute nothing. Hops may carry a port ("192.0.2.1:80",
// "[2001:db8::1]:80"; in Forwarded also an obfuscated "_port"); Forwarded
// values may be tokens or quoted-strings with escapes, and parameter names
// are case-insensitive. IPv4-mapped IPv6 addresses (::ffff:192.0.2.1) become
// IPv4 and zones are dropped, in the peer, in the hops and in comparisons
// with Trusted.
//
// # When both headers are present
//
// Neither header is preferred. A trusted proxy that writes only one of them
// passes the other through from the client untouched, so preferring either
// lets a client behind a proxy that does not write it name any address it
// likes. Instead, when both headers list hops, they must tell the same
// story: the two lists are aligned on the right and walked together, and a
// position where they name different addresses, or where only the longer
// list has a hop, is a malformed hop like any other. A proxy that writes
// both headers therefore works, whatever the client adds on the left; a
// client that forges the header its proxy does not write is counted under
// that proxy (the trusted hop right of the disagreement), shared with every
// other forger, never under a key of its choosing.
//
// A well-formed Forwarded header none of whose elements has a for= parameter
// (only proto=, host=, by=) says nothing about the client and is ignored. A
// malformed one is not ignored: a client's unterminated quote may have
// swallowed the element its proxy appended. Operators
// whose proxies write only one header and whose clients legitimately send
// the other (rare) should have the proxy drop the one it does not write.
//
// # Keys
//
// [Resolver.Key] is the client address as counted: IPv4 as is, IPv6 masked to
// [Resolver.IPv6Prefix] bits (default 64), since a single host usually owns
// a whole /64.
//
// A [By] is "ip", "global", "header:NAME" or a chain "header:A|header:B|ip":
// the first header whose first value is usable (non-empty, no control
// bytes) is the key, and a chain always ends in ip. Keys are
// "ip:192.0.2.1", "g", "h:X-Api-Key:value" and, for a value longer than
// [MaxKeyValue] bytes (a JWT), "H:Authorization:" and the value's SHA-256:
// a long value is never dropped for the next element of the chain. The
// prefixes keep elements of a chain from ever colliding. A header key is
// exactly as trustworthy as the header: a chain "header:X-Api-Key|ip" lets
// anybody escape the ip limit by sending a fresh value each time, unless
// something upstream of the limiter rejects unknown keys.
//
// # Concurrency, allocation and limits
//
// A Resolver and a By are read-only once built and safe for concurrent use.
// Client, Key and AppendKey do not allocate and take time linear in the size
// of the headers; the exceptions are a Forwarded for= value with backslash
// escapes, an address with a zone, and some malformed addresses, which may
// allocate a little. A RemoteAddr that does not parse (a Unix socket) gives
// the zero Addr, and every such request shares the key "ip:". Trusted is
// searched linearly, so it is meant for a handful of prefixes.
package clientip
