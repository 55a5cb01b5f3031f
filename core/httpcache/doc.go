// Package httpcache is the HTTP side of preforkd's response cache: what
// RFC 9111 says about a response as a shared cache reads it (the
// Cache-Control directives and their targeted fields, Vary, Expires, Age,
// entity tags, whether a response may be stored and for how long), and
// the byte layout of an entry as the region's response table stores it.
//
// It holds no state and takes no locks: every function reads the field
// values it is given and never fails (what it cannot read is what a
// cache must assume of it). Package core decides with it and talks to
// the region; the entries it encodes are opaque to package shm.
//
// The call most users want is [Judge]: may this response be stored, for
// how long fresh and stale, how old is it, on what does it vary.
package httpcache
