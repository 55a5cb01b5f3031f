package engine

import (
	"bufio"
	"bytes"
	"errors"
	"io"
)

// ErrChunked is malformed chunked framing (RFC 9112 §7.1).
var ErrChunked = errors.New("engine: malformed chunked body")

// MaxTrailer bounds the trailer section of a chunked body, in bytes (its
// lines without their CRLF, and the CR of the blank line that ends it),
// as every engine reads it: more is a malformed body.
const MaxTrailer = 16 << 10

// MaxChunkLine bounds a chunk-size line (its size, the whitespace after it
// and its extensions, without its CRLF), as every engine that reads chunks
// itself reads it, and as net/http bounds it: longer is a malformed body.
// Extensions carry no data, so without it a body of extensions alone is
// read without end (RFC 9112 §7.1.1 asks a server to limit them).
const MaxChunkLine = 4 << 10

// ChunkedReader decodes a chunked body read from a buffered connection:
// Read returns the data of its chunks, at most one chunk's a call, then
// io.EOF once the last chunk and the trailer section (dropped: the
// framing it belongs to is this hop's) are read. Every line must end in
// CRLF; a malformed line, or a trailer section over MaxTrailer, is
// ErrChunked, and a body cut short io.ErrUnexpectedEOF.
type ChunkedReader struct {
	r    *bufio.Reader
	left int64 // bytes left of the current chunk
	crlf bool  // a chunk's CRLF is due before the next size line
	eof  bool
}

// NewChunkedReader returns a ChunkedReader of the body that starts at r.
func NewChunkedReader(r *bufio.Reader) *ChunkedReader {
	c := new(ChunkedReader)
	c.Reset(r)
	return c
}

// Reset makes c read a new body, which starts at r.
func (c *ChunkedReader) Reset(r *bufio.Reader) { *c = ChunkedReader{r: r} }

// Read implements io.Reader.
func (c *ChunkedReader) Read(p []byte) (int, error) {
	if c.eof {
		return 0, io.EOF
	}
	if c.left == 0 {
		if c.crlf {
			if line, err := c.line(); err != nil || len(line) != 0 {
				return 0, errOr(err, ErrChunked)
			}
			c.crlf = false
		}
		size, err := c.size()
		if err != nil {
			return 0, err
		}
		if size == 0 {
			if err := c.trailer(); err != nil {
				return 0, err
			}
			c.eof = true
			return 0, io.EOF
		}
		c.left = size
	}
	if int64(len(p)) > c.left {
		p = p[:c.left]
	}
	n, err := c.r.Read(p)
	c.left -= int64(n)
	if c.left == 0 {
		c.crlf = true
	}
	if err == io.EOF {
		err = io.ErrUnexpectedEOF
	}
	return n, err
}

// size reads a chunk-size line, extensions ignored (but for control
// characters).
func (c *ChunkedReader) size() (int64, error) {
	line, err := c.line()
	if err != nil {
		return 0, err
	}
	if len(line) > MaxChunkLine {
		return 0, ErrChunked
	}
	if i := bytes.IndexByte(line, ';'); i >= 0 {
		if !FieldValueOK(line[i+1:]) {
			return 0, ErrChunked // a control character in an extension
		}
		line = line[:i]
	}
	line = bytes.TrimRight(line, " \t")
	if len(line) == 0 || len(line) > 15 {
		return 0, ErrChunked
	}
	// 1*HEXDIG (RFC 9112 §7.1): no sign, no prefix; 15 digits at most
	// cannot overflow.
	var n int64
	for _, c := range line {
		d := HexDigit(c)
		if d < 0 {
			return 0, ErrChunked
		}
		n = n<<4 | int64(d)
	}
	return n, nil
}

// HexDigit is the value of the hexadecimal digit c, or -1.
func HexDigit(c byte) int {
	switch {
	case '0' <= c && c <= '9':
		return int(c - '0')
	case 'a' <= c && c <= 'f':
		return int(c-'a') + 10
	case 'A' <= c && c <= 'F':
		return int(c-'A') + 10
	}
	return -1
}

// trailer reads trailer lines up to the empty one. Each is a field line,
// checked as a header line is but for obs-fold, which goes with the field
// before (as net/http and fasthttp take it); all are dropped.
func (c *ChunkedReader) trailer() error {
	for size, fields := 0, 0; ; {
		line, err := c.line()
		if err != nil {
			return err
		}
		if size += max(len(line), 1); size > MaxTrailer {
			return ErrChunked
		}
		switch {
		case len(line) == 0:
			return nil
		case line[0] == ' ' || line[0] == '\t':
			if fields == 0 || !FieldValueOK(line) {
				return ErrChunked
			}
		default:
			if _, f := ParseFieldLine(line); f != FieldOK {
				return ErrChunked
			}
			fields++
		}
	}
}

// line reads a line ended by CRLF, with no other CR, and returns it
// without its CRLF. A line longer than the buffer is gathered, up to
// MaxTrailer: one trailer line may be that long, whatever the buffer.
func (c *ChunkedReader) line() ([]byte, error) {
	line, err := c.r.ReadSlice('\n')
	if err == bufio.ErrBufferFull {
		long := bytes.Clone(line)
		for err == bufio.ErrBufferFull && len(long) <= MaxTrailer+2 {
			line, err = c.r.ReadSlice('\n')
			long = append(long, line...)
		}
		line = long
	}
	switch {
	case err == bufio.ErrBufferFull:
		return nil, ErrChunked
	case err != nil:
		return nil, errOr(err, nil)
	case len(line) < 2 || line[len(line)-2] != '\r':
		return nil, ErrChunked
	case bytes.IndexByte(line[:len(line)-2], '\r') >= 0:
		return nil, ErrChunked // a CR of no CRLF
	}
	return line[:len(line)-2], nil
}

// errOr is err, io.ErrUnexpectedEOF for io.EOF (the body was cut short),
// or or when err is nil.
func errOr(err, or error) error {
	switch err {
	case io.EOF:
		return io.ErrUnexpectedEOF
	case nil:
		return or
	}
	return err
}
