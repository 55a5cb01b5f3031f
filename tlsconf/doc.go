// Package tlsconf is what preforkd's TLS listeners are configured with:
// the certificates (the first the default, the others chosen by the
// client's SNI against their names), the least protocol version, HTTP/2
// by ALPN, and the session ticket keys that every worker shares, so that
// a client resumes its session on whichever worker its next connection
// lands.
//
// The ticket keys come from one secret the supervisor draws at start
// ([NewTickets]) and hands to its workers with their settings, never to
// a file: the key of each period of Rotation is the SHA-256 of the
// previous period's ([Tickets.Keys]), so every process derives the same
// keys from the same clock without talking to the others, and a key
// cannot be derived from a later one: what a process holds opens no
// ticket older than the period before the one it was handed. A worker
// encrypts new tickets with the current key and accepts the previous
// period's too ([Rotate] keeps a tls.Config's keys current).
//
// The call most users want, in a worker:
//
//	cfg, err := tlsconf.Options{Certificates: pairs, HTTP2: true, Tickets: t}.Config()
//	...
//	stop := tlsconf.Rotate(cfg, t, time.Now)
//	defer stop()
package tlsconf
