package engine_test

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/preforkd/preforkd/engine"
)

// writes records each Write, so that a test sees how a body was framed
// into writes.
type writes struct{ w [][]byte }

func (w *writes) Write(p []byte) (int, error) {
	w.w = append(w.w, bytes.Clone(p))
	return len(p), nil
}

func (w *writes) String() string { return string(bytes.Join(w.w, nil)) }

func TestSendBody(t *testing.T) {
	big := strings.Repeat("x", 40<<10) // more than one chunk's room
	for _, tc := range []struct {
		name   string
		pre    string
		rest   string
		length int64
		want   string
		writes int  // when not 0
		bytes  bool // the rest comes a byte a read
	}{
		{name: "length, all read ahead", pre: "hello", length: 5, want: "HEADhello", writes: 2},
		{name: "length, read ahead and the rest", pre: "he", rest: "llo", length: 5, want: "HEADhello"},
		{name: "length, nothing read ahead", rest: "hello", length: 5, want: "HEADhello"},
		{name: "length, the rest stops at it", rest: "hello, and more", length: 5, want: "HEADhello"},
		{name: "length, a byte a read", pre: "h", rest: "ello, and more", length: 5, want: "HEADhello", writes: 6, bytes: true},
		{name: "chunked, a byte a read", rest: "ab", length: -1, want: "HEAD1\r\na\r\n1\r\nb\r\n0\r\n\r\n", bytes: true},
		{name: "chunked", pre: "he", rest: "llo", length: -1, want: "HEAD2\r\nhe\r\n3\r\nllo\r\n0\r\n\r\n", writes: 4},
		{name: "chunked, empty", length: -1, want: "HEAD0\r\n\r\n", writes: 2},
		{name: "chunked, a long read ahead", pre: big, length: -1,
			want: "HEAD8000\r\n" + big[:32<<10] + "\r\n2000\r\n" + big[32<<10:] + "\r\n0\r\n\r\n", writes: 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var w writes
			var rest io.Reader = strings.NewReader(tc.rest)
			if tc.bytes {
				rest = iotest.OneByteReader(rest)
			}
			err := engine.SendBody(&w, []byte("HEAD"), []byte(tc.pre), rest, tc.length)
			if err != nil {
				t.Fatal(err)
			}
			if got := w.String(); got != tc.want {
				t.Errorf("sent %q, want %q", got, tc.want)
			}
			if tc.writes != 0 && len(w.w) != tc.writes {
				t.Errorf("%d writes, want %d: %q", len(w.w), tc.writes, w.w)
			}
		})
	}
}

// A body that ends early, or cannot be read, is the client's fault.
func TestSendBodyReadFails(t *testing.T) {
	for _, tc := range []struct {
		name   string
		rest   io.Reader
		length int64
		want   error
	}{
		{"short", strings.NewReader("hel"), 5, io.ErrUnexpectedEOF},
		{"a read error", iotest.ErrReader(io.ErrClosedPipe), 5, io.ErrClosedPipe},
		{"a read error, chunked", iotest.ErrReader(io.ErrClosedPipe), -1, io.ErrClosedPipe},
	} {
		err := engine.SendBody(io.Discard, nil, nil, tc.rest, tc.length)
		var be *engine.BodyReadError
		if !errors.As(err, &be) || !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want a BodyReadError of %v", tc.name, err, tc.want)
		}
	}
	// The upstream's failure is not the client's.
	err := engine.SendBody(failWriter{}, []byte("HEAD"), nil, strings.NewReader("x"), 1)
	var be *engine.BodyReadError
	if err == nil || errors.As(err, &be) {
		t.Errorf("a failed write: %v", err)
	}
}

type failWriter struct{}

func (failWriter) Write([]byte) (int, error) { return 0, io.ErrClosedPipe }
