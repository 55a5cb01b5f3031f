package nethttp

import (
	"errors"
	"net"
	"net/http"
	"syscall"
)

// isTimeout reports whether err is a deadline passing.
func isTimeout(err error) bool {
	te, ok := errors.AsType[interface {
		error
		Timeout() bool
	}](err)
	return ok && te.Timeout()
}

// isConnReset reports whether err is the peer resetting or having closed
// the connection.
func isConnReset(err error) bool {
	return errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// bodyGone reports whether err, the failure of a read of r's body, is
// its client gone: a reset connection (or, over HTTP/2, a reset stream:
// its context ends), a 100 Continue that could not be written to it (a
// reset: the body's read then sees the end of the connection), or a
// connection the drain cut at its deadline (closed under the read). One
// that only ended its body short (a FIN) may still read an answer.
func bodyGone(r *http.Request, err error) bool {
	return isConnReset(err) || errors.Is(err, net.ErrClosed) ||
		r.ProtoMajor == 2 && r.Context().Err() != nil || writeFailed(r)
}
