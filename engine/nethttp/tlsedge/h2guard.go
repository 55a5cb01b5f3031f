package tlsedge

import (
	"crypto/tls"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http2/hpack"
)

// The HTTP/2 floods, each bounded per connection by a guard that reads
// the frames a client sends (after TLS, before the HTTP/2 server does)
// and cuts off the client that floods:
//
//   - rapid reset (CVE-2023-44487): streams opened and reset at once,
//     each a request the server starts and abandons. The server (x/net's)
//     never runs more handlers than MaxConcurrentStreams and refuses a
//     queue past four times that; the guard also cuts a client that reset
//     more than h2MaxResets streams and at least half of those it opened,
//     as no browser does. A stream the server resets for an error the
//     client made on it (a WINDOW_UPDATE of 0, DATA past its window:
//     CVE-2025-8671, "MadeYouReset") is a request started and abandoned
//     all the same: the guard follows the frames the server writes too,
//     and counts its resets that blame the client among the client's.
//   - CONTINUATION floods (CVE-2023-45288): a header block never ended,
//     or made of many frames. Cut past h2MaxContinuations frames or
//     max_header_bytes plus a frame of raw bytes in one block.
//   - HPACK bombs: a small block that decodes into a huge header list
//     (one large dynamic-table entry named again and again). A list over
//     max_header_bytes is answered 431 (nethttp.Server); the guard
//     decodes each block too (the same table, 4 KiB) and cuts a client
//     whose list, or one string of it, decodes to more than twice that:
//     no client sends one by mistake. The HTTP/2 server's own bound is
//     set past it (Configure), so that what the guard lets through gets
//     the 431, not a connection error.
//
// A cut-off client's connection is closed; the server sees it end. Memory
// per connection: the decoder's table (4 KiB) and a few counters.

const (
	h2MaxResets        = 100
	h2MaxContinuations = 32
	h2Preface          = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
)

// Frame types the guard reads.
const (
	frameData         = 0x0
	frameHeaders      = 0x1
	frameRSTStream    = 0x3
	frameContinuation = 0x9

	flagEndHeaders = 0x4
	flagPadded     = 0x8
	flagPriority   = 0x20
)

// The kinds of flood, each logged at most once a second.
const (
	floodReset = iota
	floodContinuation
	floodHPACK
	floodKinds
)

// errFlood is why a guard cut a client off.
type errFlood struct {
	kind int
	why  string
}

func (e *errFlood) Error() string { return "tlsedge: HTTP/2 client cut off: " + e.why }

// h2Guard is an HTTP/2 connection as the server reads it, through the
// guard. It is read by one goroutine (the server's frame reader).
type h2Guard struct {
	*tls.Conn
	maxList  uint32 // the header list size the server takes (max_header_bytes)
	maxBlock int    // raw bytes of one header block
	onCut    func(*errFlood)

	preface int     // bytes of the client preface still to pass
	hdr     [9]byte // the frame header being read
	hdrN    int     // bytes of it read
	left    uint32  // payload bytes of the current frame left
	typ     byte    // the current frame's type
	flags   byte    // and flags
	flen    int     // the current frame's payload length
	off     int     // payload bytes of it seen
	from    int     // where its header block fragment starts in the payload
	to      int     // and ends (-1 until a padded frame's pad length is read)
	block   bool    // in a header block (HEADERS not ended)
	frames  int     // frames of the current block
	raw     int     // raw bytes of the current block
	decoded uint32  // decoded size of the current block's list
	dec     *hpack.Decoder
	streams int // header blocks opened (requests and trailers)
	resets  int // RST_STREAM frames
	cut     atomic.Pointer[errFlood]

	// The server's frames, followed by the goroutine that writes them
	// (x/net writes one frame batch at a time; wmu orders them anyway),
	// for the streams it resets with an error: provoked is read by the
	// reading goroutine.
	wmu      sync.Mutex
	out      outFrames
	provoked atomic.Int64

	// headerTimeout is read_header_timeout, kept as on HTTP/1: a header
	// block, and on a new connection the first one, must have arrived
	// within it, or the connection is closed (the read deadline set while
	// one is awaited). The HTTP/2 server has no such bound of its own: a
	// block never ended would hold the connection until idle_timeout.
	headerTimeout time.Duration
	awaiting      bool
}

// newH2Guard guards c; headerTimeout 0 sets no read deadline.
func newH2Guard(c *tls.Conn, maxHeaderBytes int, headerTimeout time.Duration, onCut func(*errFlood)) *h2Guard {
	g := &h2Guard{Conn: c, maxList: uint32(maxHeaderBytes), maxBlock: maxHeaderBytes + 16<<10, onCut: onCut, preface: len(h2Preface),
		headerTimeout: headerTimeout}
	g.await() // the first request
	// The table size the server advertises (x/net's default, 4 KiB).
	g.dec = hpack.NewDecoder(4096, func(f hpack.HeaderField) { g.decoded += f.Size() })
	// A longer string takes the list past the cut: refused as it comes.
	g.dec.SetMaxStringLength(2 * maxHeaderBytes)
	return g
}

// Read reads for the server and looks at what it read.
func (g *h2Guard) Read(p []byte) (int, error) {
	if e := g.cut.Load(); e != nil {
		return 0, e
	}
	n, err := g.Conn.Read(p)
	if ne, ok := err.(net.Error); ok && ne.Timeout() && g.awaiting {
		// read_header_timeout ran out (the only read deadline set on
		// the connection): closed quietly, as on HTTP/1. The HTTP/2
		// server would log a timeout at warn, an end of file not.
		err = io.EOF
	}
	if n > 0 {
		if ferr := g.look(p[:n]); ferr != nil {
			g.cut.Store(ferr)
			g.Conn.Close()
			if g.onCut != nil {
				g.onCut(ferr)
			}
			return 0, ferr
		}
	}
	return n, err
}

// Write writes for the server and follows the frames it wrote.
func (g *h2Guard) Write(p []byte) (int, error) {
	n, err := g.Conn.Write(p)
	if n > 0 {
		g.wmu.Lock()
		resets := g.out.follow(p[:n])
		g.wmu.Unlock()
		if resets > 0 {
			g.provoked.Add(int64(resets))
		}
	}
	return n, err
}

// ConnectionState is the TLS connection's: the HTTP/2 server checks it.
func (g *h2Guard) ConnectionState() tls.ConnectionState { return g.Conn.ConnectionState() }

// NetConn is the connection under TLS.
func (g *h2Guard) NetConn() net.Conn { return g.Conn.NetConn() }

// TLSConn is the TLS connection guarded: the one the nethttp.Server
// tracks (nethttp.Edge).
func (g *h2Guard) TLSConn() *tls.Conn { return g.Conn }

// look follows the frames in b.
func (g *h2Guard) look(b []byte) *errFlood {
	for len(b) > 0 {
		if g.preface > 0 {
			n := min(g.preface, len(b))
			g.preface -= n
			b = b[n:]
			continue
		}
		if g.left == 0 && g.hdrN < 9 {
			n := copy(g.hdr[g.hdrN:], b)
			g.hdrN += n
			b = b[n:]
			if g.hdrN < 9 {
				return nil
			}
			if err := g.frameStart(); err != nil {
				return err
			}
			if g.left == 0 {
				if err := g.frameEnd(); err != nil {
					return err
				}
			}
			continue
		}
		n := min(int(g.left), len(b))
		if err := g.payload(b[:n]); err != nil {
			return err
		}
		g.left -= uint32(n)
		b = b[n:]
		if g.left == 0 {
			if err := g.frameEnd(); err != nil {
				return err
			}
		}
	}
	return nil
}

// await starts the wait for a header block, unless one runs.
func (g *h2Guard) await() {
	if g.headerTimeout > 0 && !g.awaiting {
		g.awaiting = true
		g.Conn.SetReadDeadline(time.Now().Add(g.headerTimeout))
	}
}

// frameStart takes a frame header.
func (g *h2Guard) frameStart() *errFlood {
	h := g.hdr[:]
	g.left = uint32(h[0])<<16 | uint32(h[1])<<8 | uint32(h[2])
	g.typ, g.flags = h[3], h[4]
	g.flen, g.off, g.from, g.to = int(g.left), 0, 0, int(g.left)
	switch g.typ {
	case frameHeaders:
		g.await()
		g.streams++
		g.block, g.frames, g.raw, g.decoded = true, 0, 0, 0
		if g.flags&flagPadded != 0 {
			g.from, g.to = 1, -1 // the pad length comes first
		}
		if g.flags&flagPriority != 0 {
			g.from += 5
		}
	case frameContinuation:
		if !g.block {
			return nil // out of order: the server refuses it
		}
	case frameRSTStream:
		g.resets++
	}
	if g.typ == frameHeaders || g.typ == frameRSTStream {
		if r := g.resets + int(g.provoked.Load()); r > h2MaxResets && 2*r >= g.streams {
			return &errFlood{floodReset, "rapid reset: most of the streams it opened were reset, by it or for its errors"}
		}
	}
	if g.typ == frameHeaders || g.typ == frameContinuation {
		g.frames++
		g.raw += g.flen
		switch {
		case g.frames > h2MaxContinuations:
			return &errFlood{floodContinuation, "CONTINUATION flood: a header block in too many frames"}
		case g.raw > g.maxBlock:
			return &errFlood{floodContinuation, "CONTINUATION flood: a header block over max_header_bytes"}
		}
	}
	return nil
}

// payload takes payload bytes of the current frame: the header block's
// are decoded.
func (g *h2Guard) payload(b []byte) *errFlood {
	at := g.off
	g.off += len(b)
	if g.typ != frameHeaders && g.typ != frameContinuation || !g.block {
		return nil
	}
	if g.to < 0 && at == 0 {
		g.to = g.flen - int(b[0]) // a padded frame: its padding ends it
	}
	from, to := max(g.from-at, 0), min(g.to-at, len(b))
	if from >= to {
		return nil
	}
	if _, err := g.dec.Write(b[from:to]); err != nil {
		return &errFlood{floodHPACK, "a header block that does not decode: " + err.Error()}
	}
	if g.decoded > 2*g.maxList {
		return &errFlood{floodHPACK, "HPACK bomb: a header list that decodes far over max_header_bytes"}
	}
	return nil
}

// frameEnd ends the current frame.
func (g *h2Guard) frameEnd() *errFlood {
	g.hdrN = 0
	if (g.typ == frameHeaders || g.typ == frameContinuation) && g.block && g.flags&flagEndHeaders != 0 {
		g.block = false
		if g.awaiting {
			g.awaiting = false
			g.Conn.SetReadDeadline(time.Time{})
		}
		if err := g.dec.Close(); err != nil {
			return &errFlood{floodHPACK, "a header block that does not decode: " + err.Error()}
		}
	}
	return nil
}

// outFrames follows the frames the server writes.
type outFrames struct {
	hdr  [9]byte // the frame header being written
	hdrN int     // bytes of it written
	left uint32  // payload bytes of the current frame left
	rst  bool    // the current frame is a RST_STREAM
	code uint32  // its error code, as its bytes come
	// reset are the streams the server reset last (any code), a ring:
	// its later resets of one of them (STREAM_CLOSED for each DATA frame
	// the client had under way when the server ended the stream, an
	// early answer's) abandon no request again, and count nothing.
	// Made at the first reset: most connections have none.
	reset  []uint32
	resetN int
}

// outResetRing is how many of the server's last reset streams are kept:
// more than the streams a client has open at once (DefaultMaxConcurrentStreams).
const outResetRing = 256

// follow takes bytes the server wrote and returns how many RST_STREAM
// frames ended in them, each the first on its stream, whose error code
// blames the client: PROTOCOL_ERROR,
// FLOW_CONTROL_ERROR, STREAM_CLOSED, FRAME_SIZE_ERROR. Not NO_ERROR (a
// stream answered before the client sent all its body: an early answer),
// nor INTERNAL_ERROR (a response the upstream cut short, a handler's
// failure), which are no doing of the client's.
func (o *outFrames) follow(b []byte) (resets int) {
	for len(b) > 0 {
		if o.hdrN < 9 {
			n := copy(o.hdr[o.hdrN:], b)
			o.hdrN += n
			b = b[n:]
			if o.hdrN < 9 {
				break
			}
			o.left = uint32(o.hdr[0])<<16 | uint32(o.hdr[1])<<8 | uint32(o.hdr[2])
			o.rst, o.code = o.hdr[3] == frameRSTStream && o.left == 4, 0
			if o.left == 0 {
				o.hdrN = 0
			}
			continue
		}
		n := min(int(o.left), len(b))
		if o.rst {
			for _, c := range b[:n] {
				o.code = o.code<<8 | uint32(c)
			}
		}
		o.left -= uint32(n)
		b = b[n:]
		if o.left == 0 {
			o.hdrN = 0
			if o.rst && o.firstReset() && clientsFault(o.code) {
				resets++
			}
		}
	}
	return resets
}

// firstReset reports whether the RST_STREAM just written is the first
// the server writes on its stream (of those it reset last), and keeps
// the stream.
func (o *outFrames) firstReset() bool {
	id := (uint32(o.hdr[5])<<24 | uint32(o.hdr[6])<<16 | uint32(o.hdr[7])<<8 | uint32(o.hdr[8])) & (1<<31 - 1)
	if o.reset == nil {
		o.reset = make([]uint32, outResetRing)
	}
	for _, r := range o.reset[:min(o.resetN, len(o.reset))] {
		if r == id {
			return false
		}
	}
	o.reset[o.resetN%len(o.reset)] = id
	o.resetN++
	return true
}

// clientsFault reports whether a RST_STREAM's error code blames the
// client (RFC 9113 §7).
func clientsFault(code uint32) bool {
	switch code {
	case 0x1, 0x3, 0x5, 0x6: // PROTOCOL_ERROR, FLOW_CONTROL_ERROR, STREAM_CLOSED, FRAME_SIZE_ERROR
		return true
	}
	return false
}
