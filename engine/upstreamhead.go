package engine

import (
	"net/netip"
	"strconv"
)

// The head an engine sends upstream is written with these, so that the
// fields the server adds read the same whichever engine wrote them.

// AppendField appends the field line "name: value".
func AppendField[V string | []byte](dst []byte, name string, value V) []byte {
	dst = append(dst, name...)
	dst = append(dst, ": "...)
	dst = append(dst, value...)
	return append(dst, "\r\n"...)
}

// AppendLength appends the Content-Length field of a body of n bytes.
func AppendLength(dst []byte, n int64) []byte {
	dst = append(dst, "Content-Length: "...)
	dst = strconv.AppendInt(dst, n, 10)
	return append(dst, "\r\n"...)
}

// ForwardedFor writes the X-Forwarded-For field an upstream gets: the
// chain the client sent, then the peer (nginx's
// $proxy_add_x_forwarded_for). Which hops to believe is the core's
// business. Begin it, Add each value of the client's, End it.
type ForwardedFor struct {
	b    []byte
	some bool // a value was written
}

// BeginForwardedFor starts the field at the end of dst.
func BeginForwardedFor(dst []byte) ForwardedFor {
	return ForwardedFor{b: append(dst, "X-Forwarded-For: "...)}
}

// Add appends a value of the client's X-Forwarded-For (trimmed; an empty
// one is skipped).
func (x *ForwardedFor) Add(v string) {
	if v == "" {
		return
	}
	if x.some {
		x.b = append(x.b, ", "...)
	}
	x.b = append(x.b, v...)
	x.some = true
}

// End appends the peer, when valid, ends the field, and returns the
// whole.
func (x *ForwardedFor) End(peer netip.Addr) []byte {
	if peer.IsValid() {
		if x.some {
			x.b = append(x.b, ", "...)
		}
		x.b = peer.AppendTo(x.b)
	}
	return append(x.b, "\r\n"...)
}

// Retryable reports whether a request may be sent again, on a fresh
// connection, after a reused one failed before any of the response came
// (the upstream had closed it idle): its method is idempotent (RFC 9110
// §9.2.2), or it has an Idempotency-Key field (idempotencyKey; that name
// only: an idempotency block's own header name is not consulted).
func Retryable[M string | []byte](method M, idempotencyKey bool) bool {
	switch string(method) {
	case "GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE":
		return true
	}
	return idempotencyKey
}
