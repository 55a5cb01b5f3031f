package engine

import (
	"errors"
	"io"
	"net"
	"strconv"
	"sync"
)

// BodyReadError is a failure to read a client's request body while it
// was being sent upstream: the client's fault (400, 408), not the
// upstream's.
type BodyReadError struct{ Err error }

func (e *BodyReadError) Error() string { return "engine: reading the request body: " + e.Err.Error() }
func (e *BodyReadError) Unwrap() error { return e.Err }

// A chunk is framed in place in a send buffer: its size line ends at
// chunkData, its CRLF follows the data.
const (
	chunkData    = 16
	sendBufBytes = chunkData + 32<<10 + 2
)

var sendBufPool = sync.Pool{New: func() any { b := make([]byte, sendBufBytes); return &b }}

var lastChunk = []byte("0\r\n\r\n")

// SendBody writes a request's head to w, then its body as it comes from
// the client: pre (what was read ahead), then the rest read from rest,
// length bytes in all, or re-chunked when length is negative (unknown).
// A chunk goes in one write. A failure to read rest is a
// *BodyReadError, as is a body that ends before length. A w with a
// ClientTurn method is told before each read of rest: what comes next is
// the client's to send, not the upstream's to take.
func SendBody(w io.Writer, head, pre []byte, rest io.Reader, length int64) error {
	chunked := length < 0
	turn, _ := w.(interface{ ClientTurn() })
	bp := sendBufPool.Get().(*[]byte)
	defer sendBufPool.Put(bp)
	buf := *bp
	if _, err := w.Write(head); err != nil {
		return err
	}
	if len(pre) > 0 {
		if err := writeChunk(w, buf, pre, chunked); err != nil {
			return err
		}
	}
	left := length - int64(len(pre))
	for chunked || left > 0 {
		data := buf[chunkData : len(buf)-2]
		if !chunked && int64(len(data)) > left {
			data = data[:left]
		}
		if turn != nil {
			turn.ClientTurn()
		}
		n, err := rest.Read(data)
		if n > 0 {
			left -= int64(n)
			if werr := writeChunkInPlace(w, buf, n, chunked); werr != nil {
				return werr
			}
		}
		if err == io.EOF {
			if !chunked && left > 0 {
				return &BodyReadError{io.ErrUnexpectedEOF}
			}
			break
		}
		if err != nil {
			return &BodyReadError{err}
		}
	}
	if chunked {
		_, err := w.Write(lastChunk)
		return err
	}
	return nil
}

// writeChunk writes p (copied through buf when chunked).
func writeChunk(w io.Writer, buf, p []byte, chunked bool) error {
	if !chunked {
		_, err := w.Write(p)
		return err
	}
	for len(p) > 0 {
		n := copy(buf[chunkData:len(buf)-2], p)
		p = p[n:]
		if err := writeChunkInPlace(w, buf, n, chunked); err != nil {
			return err
		}
	}
	return nil
}

// writeChunkInPlace writes the n bytes at buf[chunkData:], framed as a
// chunk when chunked, in one write.
func writeChunkInPlace(w io.Writer, buf []byte, n int, chunked bool) error {
	if !chunked {
		_, err := w.Write(buf[chunkData : chunkData+n])
		return err
	}
	var hex [chunkData]byte
	h := strconv.AppendInt(hex[:0], int64(n), 16)
	h = append(h, '\r', '\n')
	start := chunkData - len(h)
	copy(buf[start:], h)
	end := chunkData + n
	buf[end], buf[end+1] = '\r', '\n'
	_, err := w.Write(buf[start : end+2])
	return err
}

// SendWhileReading sends a request whose body streams (send) while it
// reads the response head (read) on conn: an upstream may answer before
// it has the whole body (a 413, a 401). The rest of the body is then not
// sent: a write fails from there on, and the sender stops at its next.
// Then, and when reading the answer fails, stop, when not nil, ends at
// once the sender's wait for the client's next bytes (a client that
// pauses mid-body would otherwise hold the answer until it sends more or
// client_body_timeout ends its read). The client's body is then left
// unread: its connection must close after the answer. A client that fails to send its body (a *BodyReadError) has
// conn closed at once, so that the upstream neither waits for the rest
// nor takes what it got for a whole request, and its error comes first
// (400 or 408). reuse is false when conn must not serve another request.
func SendWhileReading(conn net.Conn, send, read func() error, stop func()) (reuse bool, err error) {
	sent := make(chan error, 1)
	var mu sync.Mutex
	answered := false // an early answer was read: its body is still to come on conn
	go func() {
		err := send()
		var be *BodyReadError
		if errors.As(err, &be) {
			mu.Lock()
			if !answered {
				conn.Close()
			}
			mu.Unlock()
		}
		sent <- err
	}()
	err = read()
	var werr error
	select {
	case werr = <-sent:
	default:
		if err == nil {
			// An early answer: stop sending. The read of the client's
			// body that stop ends fails, and must not close conn: the
			// answer's body is still to be read from it.
			mu.Lock()
			answered = true
			mu.Unlock()
			if cw, ok := conn.(interface{ CloseWrite() error }); ok {
				_ = cw.CloseWrite()
			}
		} else {
			conn.Close() // the sender stops at its next write
		}
		if stop != nil {
			stop()
		}
		werr = <-sent
		if err == nil {
			return false, nil
		}
	}
	var be *BodyReadError
	switch {
	case errors.As(werr, &be):
		return false, werr // the client's fault comes first
	case err != nil:
		return false, err
	}
	return werr == nil, nil
}
