package core

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"sync"

	"github.com/preforkd/preforkd/metrics"
	"github.com/preforkd/preforkd/shm"
)

// A large cached body is not copied out of the region for each client:
// the lookup copies the entry's head (streamOver, headPart), and the
// engine sends the body a piece at a time, as the client takes the pieces
// before (cacheStream, a BodyStream), from one copy of the entry that
// every connection of this worker sending it shares (snapshots): what a
// worker holds for slow clients is a copy of each large entry they read,
// not one for each of them. A copy is the entry as it was when it was
// read, checked whole: an entry refreshed, replaced or evicted meanwhile
// (its blocks reused) does not change what its readers get, as nginx's
// readers of a replaced cache file go on reading the file they opened.

const (
	// streamOver: an entry longer than it is streamed; a shorter one is
	// copied whole for each request (the fast path).
	streamOver = 64 << 10
	// headPart is how much of a streamed entry a lookup copies: its head
	// when that fits (else as much as the head is).
	headPart = 16 << 10
	// streamPiece is the most a BodyStream hands over at a time: what a
	// connection's output holds of it at most.
	streamPiece = 64 << 10
)

// cacheStreams are the streams, off the Exchange: a field of its own type
// would link the cache's reading into every program (an Exchange goes
// through an interface, its pool, and the linker keeps what reflection
// could reach from it).
var cacheStreams = sync.Pool{New: func() any { return new(cacheStream) }}

// snapshots are a worker's copies of the large entries it sends, by the
// entry's table, record and state (a ticket: a record refilled is
// another), each shared by the streams that send it and dropped when the
// last is done. One for the process, so that a program without the cache
// stage links none of it (a Core's field would be linked with the Core).
type snapshots struct {
	mu sync.Mutex
	m  map[snapKey]*snapshot
}

// snapKey names an entry: its table (a region's, which a stream's Core
// keeps while the key is in the map) and its ticket.
type snapKey struct {
	tab *shm.Responses
	tk  shm.Ticket
}

var largeCopies snapshots

// testHook, set by this package's tests only, is called at the named
// moments of a large entry's lookup: "head" between its two lookups (a
// head over headPart), "copy" as a copy of the entry begins.
var testHook func(stage string)

type snapshot struct {
	copied chan struct{} // closed once a copy is published: the waiters wait for it
	done   bool          // a copy is published in data (snapshots.mu)
	data   []byte        // the entry, whole and checked; nil: it changed before its copy
	refs   int
}

// get returns the copy of the entry tk names, copied out of tab first
// when no stream of this worker holds one. A stream that comes while
// another goroutine copies it waits for that copy when it may (wait: a
// goroutine of its own), so that a burst of readers of one entry holds
// one copy. One that may not (an event loop's, whose other connections
// would stall behind another goroutine's copy, however long that one is
// held up) makes a copy of its own, as it would were it the first: its
// loop waits for its own work only. The first copy done is the one
// published and shared; the other is dropped at once, so what a loop
// spends on it is memory for a moment, an entry at most per loop. nil
// when the entry changed since tk.
func (ss *snapshots) get(tab *shm.Responses, tk shm.Ticket, wait bool) *snapshot {
	key := snapKey{tab, tk}
	ss.mu.Lock()
	if ss.m == nil {
		ss.m = map[snapKey]*snapshot{}
	}
	sn := ss.m[key]
	mine := sn == nil || !sn.done && !wait // copied here
	if sn == nil {
		sn = &snapshot{copied: make(chan struct{})}
		ss.m[key] = sn
	}
	sn.refs++
	ss.mu.Unlock()
	if mine {
		if testHook != nil {
			testHook("copy")
		}
		data, _ := tab.CacheCopy(tk, nil)
		ss.publish(sn, data)
	} else {
		<-sn.copied
	}
	if sn.data == nil {
		ss.put(key, sn)
		return nil
	}
	return sn
}

// publish makes data sn's copy, unless another was published first.
func (ss *snapshots) publish(sn *snapshot, data []byte) {
	ss.mu.Lock()
	if !sn.done {
		sn.data, sn.done = data, true
		close(sn.copied)
	}
	ss.mu.Unlock()
}

// put ends a stream's hold of sn, the copy of key's entry.
func (ss *snapshots) put(key snapKey, sn *snapshot) {
	ss.mu.Lock()
	if sn.refs--; sn.refs == 0 {
		delete(ss.m, key)
	}
	ss.mu.Unlock()
}

// ErrBodyCut is what BodyStream.Next returns when the entry changed
// between its lookup and the copy of its body (evicted, purged, replaced:
// its blocks may hold other bytes now): the engine closes the connection,
// so that the client sees a body shorter than its Content-Length, never a
// wrong one.
var ErrBodyCut = errors.New("core: the cached entry changed before its body was copied")

// BodyStream is a body an engine sends a piece at a time (Response.Stream):
// Next after Next, each once what the one before gave was written (or
// copied into a buffer of the connection's), until io.EOF. Any other
// error (ErrBodyCut) ends it before its last piece, and the engine must
// then cut the connection, so that the client sees a body shorter than
// its Content-Length, never a wrong one. It is the Exchange's, valid
// until Finish.
//
// An interface, so that only a program that builds the cache stage links
// the cached body's reading.
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

// cacheStream is a large cached body as a BodyStream: its pieces are
// those of the worker's copy of the entry (snapshots), taken before the
// lookup serves it (takeCopy).
type cacheStream struct {
	c    *Core
	tk   shm.Ticket
	at   int // where the body's next piece is in the entry (the body's offset, and a range's start)
	end  int // where what is sent of the body ends
	n    int // the bytes sent
	last int // the length of the piece handed over last
	sent int // of them, those the engine took: it asks for more only once a piece went
	told int // of them, those counted in CacheSentBytes
	snap *snapshot
	err  error
}

// Len implements BodyStream.
func (s *cacheStream) Len() int { return s.n }

// Next implements BodyStream.
func (s *cacheStream) Next() ([]byte, error) {
	s.sent += s.last // the engine asks for a piece once the one before went
	s.last = 0
	if s.err != nil {
		return nil, s.err
	}
	if s.at == s.end {
		return nil, io.EOF
	}
	p := s.snap.data[s.at:min(s.end, s.at+streamPiece)]
	s.at += len(p)
	s.last = len(p)
	return p, nil
}

// takeCopy takes the worker's copy of the large entry the lookup is about
// to serve (ex.cache.part), before anything of the answer is made, into
// ex.cache.stream: false when the entry changed since its lookup (a
// refresh that landed meanwhile, an eviction), which is then looked up
// again rather than cut once its head is sent. Nothing is copied for an
// answer without a body (HEAD, a 304).
func (ex *Exchange) takeCopy() bool {
	e := &ex.cache.ent
	if !ex.cache.part || ex.req.Method() == http.MethodHead || e.Status >= 200 && e.Status < 300 && ex.notModified(e) {
		return true
	}
	if _, ok := ex.copyEntry(); !ok {
		ex.releaseStream()
		return false
	}
	return true
}

// copyEntry makes ex.cache.stream a stream of the worker's copy of the
// entry found, in place of one taken before; false when the entry changed
// since it was found.
func (ex *Exchange) copyEntry() (*cacheStream, bool) {
	e := &ex.cache.ent
	ex.releaseStream()
	s := cacheStreams.Get().(*cacheStream)
	*s = cacheStream{c: ex.c, tk: ex.cache.entryTk}
	ex.cache.stream = s
	s.snap = largeCopies.get(ex.c.region.Responses(), s.tk, !ex.nowait)
	return s, s.snap != nil && len(s.snap.data) >= e.BodyAt+e.BodySize
}

// Sent implements BodyStream.
func (s *cacheStream) Sent() int { return s.sent }

// cut ends the stream with ErrBodyCut, counted and logged.
func (s *cacheStream) cut() error {
	s.err = ErrBodyCut
	c := s.c
	c.row.Add(metrics.CacheCutSends, 0, 1)
	if suppressed, ok := c.cutLog.allow(c.now()); ok {
		c.logger().LogAttrs(context.Background(), slog.LevelWarn, "a cached body was cut off: its entry changed before its body was read",
			slog.Int("sent", s.sent), slog.Int("length", s.n), slog.Uint64("suppressed", suppressed))
	}
	return s.err
}

// count counts what of the body went and is not counted yet
// (CacheSentBytes).
func (s *cacheStream) count() {
	if s.sent > s.told {
		s.c.row.Add(metrics.CacheSentBytes, 0, uint64(s.sent-s.told))
		s.told = s.sent
	}
}

// release gives the stream and its hold of the copy back, and counts
// what of the body went.
func (s *cacheStream) release() {
	s.count()
	if s.snap != nil {
		largeCopies.put(snapKey{s.c.region.Responses(), s.tk}, s.snap)
	}
	*s = cacheStream{}
	cacheStreams.Put(s)
}

// countStream counts what of the cached body served went, when the
// exchange is counted: before its access entry is written, so that a
// page scraped after the line has it.
func (ex *Exchange) countStream() {
	if s, ok := ex.cache.stream.(interface{ count() }); ok {
		s.count()
	}
}

// releaseStream gives back the stream of the cached body served, if any
// (through an interface, for the reason of cacheStreams).
func (ex *Exchange) releaseStream() {
	if s, ok := ex.cache.stream.(interface{ release() }); ok {
		s.release()
	}
	ex.cache.stream = nil
}
