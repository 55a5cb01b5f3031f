package engine_test

import (
	"bufio"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/preforkd/preforkd/engine"
)

func TestChunkedReader(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		want     string // the body decoded
		err      error  // what reading it ends with, nil for its end
		rest     string // what is left on the connection after its end
	}{
		{name: "chunks", in: "5\r\nhello\r\n1\r\n!\r\n0\r\n\r\nNEXT", want: "hello!", rest: "NEXT"},
		{name: "hex sizes", in: "A\r\n0123456789\r\n0\r\n\r\n", want: "0123456789"},
		{name: "extensions and spaces", in: "5;a=b \r\nhello\r\n0 ; last\r\n\r\n", want: "hello"},
		{name: "a trailer is dropped", in: "2\r\nhi\r\n0\r\nX-T: 1\r\nX-U: 2\r\n\r\nNEXT", want: "hi", rest: "NEXT"},
		{name: "empty", in: "0\r\n\r\n", want: ""},
		{name: "a size line ended by a bare LF", in: "5\nhello\r\n0\r\n\r\n", err: engine.ErrChunked},
		{name: "data not followed by CRLF", in: "2\r\nhiX\r\n0\r\n\r\n", want: "hi", err: engine.ErrChunked},
		{name: "data followed by a bare LF", in: "2\r\nhi\n0\r\n\r\n", want: "hi", err: engine.ErrChunked},
		{name: "no size", in: "\r\nhello\r\n", err: engine.ErrChunked},
		{name: "not hex", in: "5g\r\nhello\r\n0\r\n\r\n", err: engine.ErrChunked},
		{name: "a negative size", in: "-5\r\nhello\r\n0\r\n\r\n", err: engine.ErrChunked},
		{name: "a signed size", in: "+5\r\nhello\r\n0\r\n\r\n", err: engine.ErrChunked},
		{name: "a 0x prefix", in: "0x5\r\nhello\r\n0\r\n\r\n", err: engine.ErrChunked},
		{name: "a space inside the size", in: "1 2\r\nhello\r\n0\r\n\r\n", err: engine.ErrChunked},
		{name: "a size of 16 digits", in: "0000000000000005\r\nhello\r\n0\r\n\r\n", err: engine.ErrChunked},
		{name: "cut in the data", in: "5\r\nhel", want: "hel", err: io.ErrUnexpectedEOF},
		{name: "cut in a size line", in: "5\r\nhello\r\n1", want: "hello", err: io.ErrUnexpectedEOF},
		{name: "cut in the trailer", in: "0\r\nX-T: 1\r\n", err: io.ErrUnexpectedEOF},
		{name: "a trailer of many short lines", in: "0\r\n" + strings.Repeat("X-T: 1\r\n", 200) + "\r\nNEXT", want: "", rest: "NEXT"},
		{name: "a trailer section over 16 KiB", in: "0\r\n" + strings.Repeat("X-T: 1\r\n", 3000) + "\r\n", err: engine.ErrChunked},
		// MaxTrailer counts a line's bytes but its CRLF, and the CR of
		// the blank line (the loop's decoder too: engine/loop's tests).
		{name: "a trailer just within MaxTrailer", in: "0\r\n" + strings.Repeat("X: 1\r\n", (engine.MaxTrailer-1)/4) + "\r\n", want: ""},
		{name: "a trailer over MaxTrailer", in: "0\r\n" + strings.Repeat("X: 1\r\n", (engine.MaxTrailer-1)/4+1) + "\r\n", err: engine.ErrChunked},
		// One line as long as MaxTrailer allows: longer than the
		// connection's buffer (16 KiB with its CRLF), as the loop takes it.
		{name: "one trailer line of MaxTrailer", in: "0\r\nX: " + strings.Repeat("a", engine.MaxTrailer-4) + "\r\n\r\nNEXT", want: "", rest: "NEXT"},
		{name: "one trailer line over MaxTrailer", in: "0\r\nX: " + strings.Repeat("a", engine.MaxTrailer-3) + "\r\n\r\n", err: engine.ErrChunked},
		{name: "a trailer ended by a bare LF", in: "0\r\nX-T: 1\r\n\n", err: engine.ErrChunked},
		{name: "a bare CR in a trailer line", in: "0\r\n\r\r\n\r\n", err: engine.ErrChunked},
		// A trailer line is a field line, checked as a header line is.
		{name: "a trailer line with no colon", in: "0\r\n0\r\n\r\n", err: engine.ErrChunked},
		{name: "a trailer field with no name", in: "0\r\n:x\r\n\r\n", err: engine.ErrChunked},
		{name: "a control character in a trailer field", in: "0\r\nX-T: a\x01b\r\n\r\n", err: engine.ErrChunked},
		{name: "a trailer that begins with a fold", in: "0\r\n x\r\n\r\n", err: engine.ErrChunked},
		{name: "a folded trailer field", in: "0\r\nX-T: a\r\n b\r\n\r\nNEXT", want: "", rest: "NEXT"},
		{name: "a bare CR in a size line", in: "3;a\rb\r\nabc\r\n0\r\n\r\n", err: engine.ErrChunked},
		{name: "a control character in an extension", in: "3;a=\x00\r\nabc\r\n0\r\n\r\n", err: engine.ErrChunked},
		{name: "a size line longer than the buffer", in: "5;" + strings.Repeat("x", 20000) + "\r\nhello\r\n0\r\n\r\n", err: engine.ErrChunked},
		// MaxChunkLine bounds a size line but its CRLF, whatever the
		// buffer (the loop's decoder too: engine/loop's tests).
		{name: "a size line just within MaxChunkLine", in: "1;" + strings.Repeat("x", engine.MaxChunkLine-2) + "\r\nA\r\n0\r\n\r\n", want: "A"},
		{name: "a size line over MaxChunkLine", in: "1;" + strings.Repeat("x", engine.MaxChunkLine-1) + "\r\nA\r\n0\r\n\r\n", err: engine.ErrChunked},
	} {
		t.Run(tc.name, func(t *testing.T) {
			br := bufio.NewReaderSize(strings.NewReader(tc.in), 16<<10)
			c := engine.NewChunkedReader(br)
			var got []byte
			var err error
			p := make([]byte, 3) // smaller than a chunk: one chunk takes several reads
			for err == nil {
				var n int
				n, err = c.Read(p)
				got = append(got, p[:n]...)
			}
			if err == io.EOF {
				err = nil
			}
			if string(got) != tc.want || !errors.Is(err, tc.err) || (tc.err == nil) != (err == nil) {
				t.Fatalf("read %q, %v; want %q, %v", got, err, tc.want, tc.err)
			}
			if tc.err == nil {
				if n, err := c.Read(p); n != 0 || err != io.EOF {
					t.Errorf("a read after the end: %d, %v", n, err)
				}
				if rest, _ := io.ReadAll(br); string(rest) != tc.rest {
					t.Errorf("left %q on the connection, want %q", rest, tc.rest)
				}
			}
		})
	}
}

// A pooled reader starts afresh at Reset.
func TestChunkedReaderReset(t *testing.T) {
	var c engine.ChunkedReader
	c.Reset(bufio.NewReader(strings.NewReader("2\r\nhi\r\n0\r\n\r\n")))
	if b, err := io.ReadAll(&c); string(b) != "hi" || err != nil {
		t.Fatalf("first body: %q, %v", b, err)
	}
	c.Reset(bufio.NewReader(strings.NewReader("3\r\nyou\r\n0\r\n\r\n")))
	if b, err := io.ReadAll(&c); string(b) != "you" || err != nil {
		t.Fatalf("second body: %q, %v", b, err)
	}
}
