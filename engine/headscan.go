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
// (net/http), and the section's length. It checks the bytes of a header
// section, from the read after Start to the CRLF CRLF that ends it, and
// remembers the last bytes of every read: a library reads ahead, so
// pipelined sections may come whole in a read made for the request
// before them, and a CR and its LF may come in two reads.
//
// What is read after the awaited section is split into sections too,
// each the next request's if the one before it has no body (Bodyless):
// Start takes the first of them for the section now awaited. After a
// body, where the body ends among them is the library's to know: they
// are dropped, and a bare LF in a section that follows a body in one
// read goes unchecked, as do sections read ahead past the first
// maxAhead or past maxAheadBytes (a body, most likely: past those, a
// read costs nothing but keeping its last bytes).
//
// It also notes a section's framing lines for a library that takes
// ambiguous framing (net/http): Content-Length with Transfer-Encoding,
// Transfer-Encoding in an HTTP/1.0 request, and obs-fold (Framing).
type HeadScan struct {
	// Bodyless is set by the engine once a request's head is parsed: the
	// request has no body, so what was read after its section is the
	// next request's. Start clears it.
	Bodyless bool

	cur    headSection   // the section awaited
	active bool          // cur is not whole yet: what is read goes on with it
	ahead  []headSection // sections read after cur, in order; the last may not be whole
	full   bool          // more was read ahead than is followed: the rest goes unchecked
	aheadN int           // bytes read ahead since Start
	last   uint64        // the last 8 bytes read, the latest lowest
	col    int           // bytes of the line being read so far
	ruled  uint8         // the framing names the line cannot start with (framingLength, framingEncoding)
}

// headSection is what HeadScan knows of one header section.
type headSection struct {
	n      int  // its bytes read so far, to its CRLF CRLF
	bareLF bool // a line of it ends with a bare LF
	whole  bool // its CRLF CRLF was read
	// framing: its framing lines (framingLength, framingEncoding), and
	// framingPast once its request line was read, framing10 if that
	// said HTTP/1.0.
	framing uint8
}

const (
	framingLength = 1 << iota
	framingEncoding
	framingPast
	framing10
	framingFold // a line that begins with a blank: obs-fold
)

// framingNames are the names of the framing lines, as a line starts
// (lower case): framingLength's, then framingEncoding's.
var framingNames = [2]string{"content-length:", "transfer-encoding:"}

// http10 is how a request line of HTTP/1.0 ends, to its CR: the last 8
// bytes read before its LF.
const http10 = 'T'<<56 | 'T'<<48 | 'P'<<40 | '/'<<32 | '1'<<24 | '.'<<16 | '0'<<8 | '\r'

// maxAhead and maxAheadBytes bound what is read ahead that HeadScan
// follows, between two Starts.
const (
	maxAhead      = 64
	maxAheadBytes = 64 << 10
)

// Start begins checking the next section: the first read ahead if the
// request before had no body, else what the next read brings.
func (h *HeadScan) Start() {
	switch {
	case h.Bodyless && len(h.ahead) > 0:
		h.cur = h.ahead[0]
		h.ahead = h.ahead[:copy(h.ahead, h.ahead[1:])]
	default:
		h.cur = headSection{}
		h.col, h.ruled = 0, 0
		if !h.Bodyless {
			h.ahead, h.full = h.ahead[:0], false
		}
	}
	h.active = !h.cur.whole
	h.Bodyless, h.aheadN = false, 0
}

// Refuse reports whether the section now awaited came, whole or in part,
// with the request before it and has a bare LF: the next read should
// refuse it (a library may parse it from what it read without reading
// again).
func (h *HeadScan) Refuse() bool { return h.cur.bareLF }

// Framing is the refusal of the section now awaited for its framing
// lines, nil for none: ErrObsFold for a folded line, ErrCLTE for
// Content-Length with Transfer-Encoding, ErrEncoding10 for
// Transfer-Encoding in HTTP/1.0. Each of them a library may read
// otherwise than a front end did (and serve the bytes after it as
// another request).
func (h *HeadScan) Framing() *BadRequest {
	switch f := h.cur.framing; {
	case f&framingFold != 0:
		return ErrObsFold
	case f&framingEncoding == 0:
		return nil
	case f&framingLength != 0:
		return ErrCLTE
	case f&framing10 != 0:
		return ErrEncoding10
	}
	return nil
}

// Begun reports whether a byte of the section now awaited was read and
// its end was not: a timeout then cuts a request short, where before it
// only ends an idle connection.
func (h *HeadScan) Begun() bool { return h.active && h.cur.n > 0 }

// Whole reports whether the section now awaited came whole: a read
// that fails after it fails its request's body.
func (h *HeadScan) Whole() bool { return h.cur.whole }

// Len is how many bytes of the section awaited were read, through the
// CRLF CRLF that ends it once it came: what max_header_bytes bounds.
func (h *HeadScan) Len() int { return h.cur.n }

// Scan reads b, and reports a bare LF in the section awaited.
func (h *HeadScan) Scan(b []byte) (bareLF bool) {
	for i, x := range b {
		sec := &h.cur
		if !h.active {
			if sec = h.aheadSection(); sec == nil {
				// Past what is followed: only the last bytes count.
				for _, y := range b[max(i, len(b)-8):] {
					h.last = h.last<<8 | uint64(y)
				}
				return false
			}
			h.aheadN++
		}
		sec.n++
		if x == '\n' {
			if sec.framing&framingPast == 0 && h.ruled != 0 {
				// The request line; an empty one before it is not (net/http
				// drops those after a POST).
				sec.framing |= framingPast
				if h.last == http10 {
					sec.framing |= framing10
				}
			}
			h.col, h.ruled = 0, 0
			switch {
			case byte(h.last) != '\r':
				sec.bareLF = true
				if sec == &h.cur {
					return true
				}
			case byte(h.last>>16) == '\r' && byte(h.last>>8) == '\n' && sec.framing&framingPast != 0:
				// CRLF CRLF after the request line: the section ended
				// (CRLFs before it are empty lines). What follows is a
				// body, or the next section.
				sec.whole = true
				if sec == &h.cur {
					h.active = false
				}
			}
		} else if h.ruled != framingLength|framingEncoding {
			h.framingName(sec, x)
		}
		h.last = h.last<<8 | uint64(x)
	}
	return false
}

// framingName takes x, the next byte of a line of sec that may still
// begin with a framing name.
func (h *HeadScan) framingName(sec *headSection, x byte) {
	if sec.framing&framingPast == 0 {
		if x != '\r' {
			h.ruled = framingLength | framingEncoding // the request line
		}
		return
	}
	switch {
	case h.col == 0 && (x == ' ' || x == '\t'):
		sec.framing |= framingFold
	case 'A' <= x && x <= 'Z':
		x += 'a' - 'A'
	}
	for i, name := range framingNames {
		bit := uint8(1) << i
		switch {
		case h.ruled&bit != 0:
		case h.col >= len(name) || name[h.col] != x:
			h.ruled |= bit
		case h.col == len(name)-1:
			sec.framing |= bit
			h.ruled |= bit
		}
	}
	h.col++
}

// aheadSection is the section read ahead that the next byte belongs to,
// or nil past maxAhead.
func (h *HeadScan) aheadSection() *headSection {
	if n := len(h.ahead); n > 0 && !h.ahead[n-1].whole {
		return &h.ahead[n-1]
	}
	if h.full || len(h.ahead) == maxAhead || h.aheadN >= maxAheadBytes {
		h.full = true
		return nil
	}
	h.ahead = append(h.ahead, headSection{})
	return &h.ahead[len(h.ahead)-1]
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
