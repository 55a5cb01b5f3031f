//go:build !unix

package upconn

import "errors"

// peekFD cannot peek at a socket here: it reports errors.ErrUnsupported,
// so that peek calls every idle connection closed and none is reused
// (each request to an upstream dials anew).
func (c *Conn) peekFD(uintptr) {
	c.peekN, c.peekErr = 0, errors.ErrUnsupported
}
