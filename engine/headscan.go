package engine

import (
	"io"
	"net"
	"time"
)

// HeadScan follows the bytes an engine's HTTP library reads from a client
// (fasthttp, net/http), for what the library does not check: a header
// line ended by a bare LF, which the library either waits on (fasthttp
// waits for a CRLF CRLF that such a section never sends) or takes
// (net/http). It checks the bytes of a header section, from the read
// after Start to the CRLF CRLF that ends it, and remembers the last bytes
// of every read: a library reads ahead, so a pipelined section may begin
// in a read made for the request before it, and its CR and LF may come in
// two reads.
//
// Bytes read ahead after a section are taken for the next section only
// when the request had no body (Bodyless): after a body, where the body
// ends among them is the library's to know. A bare LF in a section that
// follows a body in one read goes unchecked.
type HeadScan struct {
	// Bodyless is set by the engine once a request's head is parsed: the
	// request has no body, so what was read after its section is the
	// next request's section. Start clears it.
	Bodyless bool

	active bool
	n      int // bytes of the awaited section read so far, to its end
	aheadN int // bytes read ahead, to the next section's end
	// ahead: checking the bytes read after a section ended, up to the
	// next CRLF CRLF; aheadBareLF, whether they have a bare LF.
	ahead, aheadBareLF bool
	refuse             bool    // the awaited section has a bare LF: refuse it at the next read
	last               [3]byte // the last bytes read, the latest at the end
}

// Start begins checking with the next read: a new header section is
// awaited (its first bytes may have come already, with the request
// before it).
func (h *HeadScan) Start() {
	h.active = true
	h.refuse = h.Bodyless && h.aheadBareLF
	h.n = 0
	if h.Bodyless {
		h.n = h.aheadN
	}
	h.ahead, h.aheadBareLF, h.aheadN, h.Bodyless = false, false, 0, false
}

// Refuse reports whether the section now awaited came whole with the
// request before it and has a bare LF: the next read should refuse it.
func (h *HeadScan) Refuse() bool { return h.refuse }

// Begun reports whether a byte of the section now awaited was read: a
// timeout then cuts a request short, where before it only ends an idle
// connection.
func (h *HeadScan) Begun() bool { return h.active && h.n > 0 }

// Len is how many bytes of the last section awaited were read, through
// the CRLF CRLF that ends it once it came: what max_header_bytes bounds.
func (h *HeadScan) Len() int { return h.n }

// Scan reads b, and reports a bare LF in a header section; it stops
// checking at the end of the section (what follows is a body, or the
// next request).
func (h *HeadScan) Scan(b []byte) (bareLF bool) {
	for i, x := range b {
		if !h.active && !h.ahead {
			for _, y := range b[max(i, len(b)-len(h.last)):] {
				h.last = [3]byte{h.last[1], h.last[2], y}
			}
			return false
		}
		if h.active {
			h.n++
		} else {
			h.aheadN++
		}
		if x == '\n' {
			switch {
			case h.last[2] != '\r' && h.active:
				return true
			case h.last[2] != '\r':
				h.ahead, h.aheadBareLF = false, true
			case h.last[0] == '\r' && h.last[1] == '\n':
				// CRLF CRLF: the section ended; what follows is a body,
				// or the next request's section.
				h.active, h.ahead = false, h.active
			}
		}
		h.last = [3]byte{h.last[1], h.last[2], x}
	}
	return false
}

// LingerTime and LingerBytes bound the reading that a close after an
// error answer does first (LingerClose).
const (
	LingerTime  = 500 * time.Millisecond
	LingerBytes = 256 << 10
)

// LingerClose half-closes nc and discards what the peer still sends for a
// moment (LingerTime, LingerBytes): closing a socket with unread data in
// it resets the connection, and a reset can destroy the answer the peer
// has not read yet. The caller closes nc after.
func LingerClose(nc net.Conn) {
	cw, ok := nc.(interface{ CloseWrite() error })
	if !ok || cw.CloseWrite() != nil {
		return
	}
	if nc.SetReadDeadline(time.Now().Add(LingerTime)) == nil {
		_, _ = io.CopyN(io.Discard, nc, LingerBytes)
	}
}
