package core

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"

	"github.com/preforkd/preforkd/metrics"
	"github.com/preforkd/preforkd/shm"
)

// A large cached body is not copied out of the region whole: the lookup
// copies the entry's head (streamOver, headPart), and the engine sends
// the body a piece at a time, read from the shared blocks as the client
// takes the pieces before (cacheStream, a BodyStream). A worker's memory for a client
// that reads slowly is a piece, not max_body.

const (
	// streamOver: an entry longer than it is streamed; a shorter one is
	// copied whole (the fast path).
	streamOver = 64 << 10
	// headPart is how much of a streamed entry a lookup copies: its head
	// when that fits (else as much as the head is).
	headPart = 16 << 10
	// streamPiece is the most a BodyStream hands over at a time.
	streamPiece = 64 << 10
	// streamScratch is where a range's tail is read through.
	streamScratch = 4 << 10
)

var (
	streamBufs = sync.Pool{New: func() any { b := make([]byte, streamPiece+streamScratch); return &b }}
	// cacheStreams are the streams, off the Exchange: a field of its own
	// type would link the cache's reading into every program (an
	// Exchange goes through an interface, its pool, and the linker keeps
	// what reflection could reach from it).
	cacheStreams = sync.Pool{New: func() any { return new(cacheStream) }}
)

// ErrBodyCut is what BodyStream.Next returns when the entry changed while
// its body was sent (evicted, purged, replaced: its blocks may hold other
// bytes now): the engine closes the connection, so that the client sees
// a body shorter than its Content-Length, never a wrong one.
var ErrBodyCut = errors.New("core: the cached entry changed while its body was sent")

// BodyStream is a body an engine sends a piece at a time (Response.Stream):
// Next after Next, each once what the one before gave was written (or
// copied into a buffer of the connection's), until io.EOF. Any other
// error (ErrBodyCut) ends it before its last piece, and the engine must
// then cut the connection, so that the client sees a body shorter than
// its Content-Length, never a wrong one. It is the Exchange's, valid
// until Finish.
//
// An interface, so that only a program that builds the cache stage links
// the cached body's reading (shm's CacheReader and its checks).
type BodyStream interface {
	// Len is the length of the body.
	Len() int
	// Next returns the next piece of the body, valid until the next call
	// (or Finish); io.EOF after the last. The engine asks for a piece
	// only once the one before was written (or copied into a buffer of
	// the connection's).
	Next() ([]byte, error)
	// Sent is how much of the body went: the pieces the engine took, all
	// of them once Next returned io.EOF; fewer when it was cut off or the
	// client went away (the access log's bytes).
	Sent() int
}

// cacheStream is a large cached body as a BodyStream: its pieces are the
// entry's bytes, read from the shared blocks and checked, and a change of
// the entry ends it with ErrBodyCut.
type cacheStream struct {
	c    *Core
	r    shm.CacheReader
	tk   shm.Ticket
	head []byte // the entry's head as the lookup copied it
	skip int    // bytes of the body before what is sent (a range's start)
	n    int    // the bytes sent
	left int    // of them, still to hand over
	last int    // the length of the piece handed over last
	sent int    // of them, those the engine took: it asks for more only once a piece went
	bp   *[]byte
	err  error
	on   bool // CacheRead began r
}

// Len implements BodyStream.
func (s *cacheStream) Len() int { return s.n }

// Next implements BodyStream: ErrBodyCut when the entry changed.
func (s *cacheStream) Next() ([]byte, error) {
	s.sent += s.last // the engine asks for a piece once the one before went
	s.last = 0
	if s.err != nil {
		return nil, s.err
	}
	if s.left == 0 {
		return nil, io.EOF
	}
	if !s.on {
		s.on = true
		s.bp = streamBufs.Get().(*[]byte)
		if err := s.c.region.Responses().CacheRead(s.tk, s.head, &s.r); err != nil {
			return nil, s.cut()
		}
	}
	buf := *s.bp
	for s.skip > 0 {
		k := min(s.skip, len(buf))
		if _, err := s.r.Read(buf[:k]); err != nil {
			return nil, s.cut()
		}
		s.skip -= k
	}
	p := buf[:min(s.left, streamPiece)]
	if _, err := s.r.Read(p); err != nil {
		return nil, s.cut()
	}
	s.left -= len(p)
	// A range that ends before the entry: the rest is read through for
	// the checksum before the last piece goes.
	for s.left == 0 && s.r.Left() > 0 {
		if _, err := s.r.Read(buf[streamPiece:][:min(s.r.Left(), streamScratch)]); err != nil {
			return nil, s.cut()
		}
	}
	s.last = len(p)
	return p, nil
}

// Sent implements BodyStream.
func (s *cacheStream) Sent() int { return s.sent }

// cut ends the stream with ErrBodyCut, counted and logged.
func (s *cacheStream) cut() error {
	s.err = ErrBodyCut
	c := s.c
	c.row.Add(metrics.CacheCutSends, 0, 1)
	if suppressed, ok := c.cutLog.allow(c.now()); ok {
		c.logger().LogAttrs(context.Background(), slog.LevelWarn, "a cached body was cut off: its entry changed while it was sent",
			slog.Int("sent", s.sent), slog.Int("length", s.n), slog.Uint64("suppressed", suppressed))
	}
	return s.err
}

// release gives the stream and its buffer back, and counts what of the
// body went (CacheSentBytes).
func (s *cacheStream) release() {
	if s.sent > 0 {
		s.c.row.Add(metrics.CacheSentBytes, 0, uint64(s.sent))
	}
	if s.bp != nil {
		streamBufs.Put(s.bp)
	}
	*s = cacheStream{}
	cacheStreams.Put(s)
}

// releaseStream gives back the stream of the cached body served, if any
// (through an interface, for the reason of cacheStreams).
func (ex *Exchange) releaseStream() {
	if s, ok := ex.cache.stream.(interface{ release() }); ok {
		s.release()
	}
	ex.cache.stream = nil
}
