package nethttp

import (
	"errors"
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
