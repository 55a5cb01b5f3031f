//go:build linux

package loop

import (
	"errors"
	"strconv"

	"github.com/preforkd/preforkd/engine"
	"github.com/preforkd/preforkd/route"
)

// The chunked transfer coding (RFC 9112 §7.1), read incrementally: bytes
// arrive as the socket has them, and the data of each chunk is handed on
// as it comes, in place (no copy), while the framing around it — sizes,
// extensions, line ends, the trailer section — is checked and dropped.
// A trailer section is read to its end and not passed on: the framing it
// belongs to is this hop's.

// errChunk is malformed chunked framing.
var errChunk = errors.New("loop: malformed chunked body")

// chunk decoder states.
const (
	chSize    uint8 = iota // hex digits of a chunk size
	chExt                  // a chunk extension, up to its CR
	chSizeLF               // the LF of a size line
	chData                 // chunk data, left bytes of it
	chDataCR               // the CR after a chunk's data
	chDataLF               // its LF
	chTrailer              // the start of a trailer line (or of the blank line)
	chTName                // a trailer field's name, up to its colon
	chTLine                // a trailer field's value, up to its CR
	chTLF                  // a trailer line's LF
	chEndLF                // the LF of the blank line that ends the body
	chDone
)

// lineEnd is, for the states that read a line's CR or LF, the byte
// they want and the state after it.
var lineEnd = [...]struct{ want, next uint8 }{
	chDataCR: {'\r', chDataLF},
	chDataLF: {'\n', chSize},
	chTLF:    {'\n', chTrailer},
	chEndLF:  {'\n', chDone},
}

// chunkDecoder is where a chunked body stands.
type chunkDecoder struct {
	state   uint8
	digits  uint8 // hex digits of the size read so far
	sawBWS  bool  // whitespace after the size: only an extension may follow
	line    int   // bytes of the size line read so far, but its CRLF
	left    int64 // data bytes left in the chunk, or the size being read
	trailer int   // bytes of trailer section read
}

// decode consumes p up to the end of its first piece of data, or to the
// end of the body: it returns that data (a slice of p, maybe empty) and
// how many bytes of p it consumed, data included. done is set once the
// body ended; what follows in p is not the body's.
func (d *chunkDecoder) decode(p []byte) (data []byte, n int, done bool, err error) {
	for n < len(p) {
		c := p[n]
		if (d.state == chSize || d.state == chExt) && c != '\r' {
			if d.line++; d.line > engine.MaxChunkLine {
				return nil, n, false, errChunk
			}
		}
		switch d.state {
		case chSize:
			switch {
			case engine.HexDigit(c) >= 0 && !d.sawBWS:
				if d.digits == 15 {
					return nil, n, false, errChunk // over 2^60: no such body
				}
				d.left = d.left<<4 | int64(engine.HexDigit(c))
				d.digits++
			case d.digits == 0:
				return nil, n, false, errChunk
			case c == ' ' || c == '\t':
				d.sawBWS = true
			case c == ';':
				d.state = chExt
			case c == '\r':
				d.state = chSizeLF
			default:
				return nil, n, false, errChunk
			}
			n++
		case chExt:
			switch {
			case c == '\r':
				d.state = chSizeLF
			case c == '\n' || c < ' ' && c != '\t' || c == 0x7f:
				return nil, n, false, errChunk
			}
			n++
		case chSizeLF:
			if c != '\n' {
				return nil, n, false, errChunk
			}
			n++
			d.digits, d.sawBWS, d.line = 0, false, 0
			if d.left == 0 {
				d.state = chTrailer
			} else {
				d.state = chData
			}
		case chData:
			k := min(int64(len(p)-n), d.left)
			data = p[n : n+int(k)]
			n += int(k)
			d.left -= k
			if d.left == 0 {
				d.state = chDataCR
			}
			return data, n, false, nil
		case chDataCR, chDataLF, chTLF, chEndLF:
			// A line's end: the one byte it may be.
			if c != lineEnd[d.state].want {
				return nil, n, false, errChunk
			}
			d.state = lineEnd[d.state].next
			n++
			if d.state == chDone {
				return nil, n, true, nil
			}
		case chTrailer, chTName, chTLine:
			if !d.trailerByte(c) {
				return nil, n, false, errChunk
			}
			n++
		case chDone:
			return nil, n, true, nil
		}
	}
	return nil, n, d.state == chDone, nil
}

// trailerByte takes a byte of a trailer line, and counts it as
// engine.MaxTrailer counts them: a line's bytes but its CRLF, and the CR
// of the blank line that ends the section.
func (d *chunkDecoder) trailerByte(c byte) bool {
	switch d.state {
	case chTrailer:
		switch {
		case c == '\r':
			d.state = chEndLF
		case route.IsTokenByte(c):
			d.state = chTName
		case (c == ' ' || c == '\t') && d.trailer > 0:
			// obs-fold: the field before goes on (dropped all the same,
			// as net/http and fasthttp take it).
			d.state = chTLine
		default:
			// A bare LF, no name: a trailer line is a field line, checked
			// as a header line is.
			return false
		}
	case chTName:
		switch {
		case c == ':':
			d.state = chTLine
		case !route.IsTokenByte(c):
			return false
		}
	case chTLine:
		switch {
		case c == '\r':
			d.state = chTLF
			return true
		case c < ' ' && c != '\t' || c == 0x7f:
			return false // a bare LF, a control character
		}
	}
	d.trailer++
	return d.trailer <= engine.MaxTrailer
}

// appendChunkHead appends the size line of a chunk of n bytes.
func appendChunkHead(dst []byte, n int) []byte {
	dst = strconv.AppendUint(dst, uint64(n), 16)
	return append(dst, '\r', '\n')
}

// lastChunk ends a chunked body, with no trailer.
const lastChunk = "0\r\n\r\n"
