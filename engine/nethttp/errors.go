package nethttp

import (
	"errors"
	"net"
	"net/http"
	"syscall"
	"time"
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
		r.ProtoMajor == 2 && streamEnded(r) || writeFailed(r)
}

// streamEnded reports whether r's HTTP/2 stream was reset, or its
// connection closed. x/net ends the stream's context just after it fails
// the read of its body, so a read that failed waits a moment for it. A
// stream that only ended short of its content-length is not ended: the
// wait runs out, and the client, still there, gets its 400.
func streamEnded(r *http.Request) bool {
	t := time.NewTimer(100 * time.Millisecond)
	defer t.Stop()
	select {
	case <-r.Context().Done():
		return true
	case <-t.C:
		return false
	}
}
