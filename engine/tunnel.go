package engine

import (
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Tunnel carries an upgraded connection, once the upstream's 101 was sent,
// for the engines that block (the event loop carries its own): bytes both
// ways until each side's end was passed on to the other as a half-close,
// or until an error, or until neither side sent anything for timeout
// (nginx closes an idle upgraded connection after proxy_read_timeout the
// same way). A side is its connection and the reader its bytes come from,
// which holds what was read past the heads. A write to the client waits
// at most sendTimeout (its send_timeout, as on any connection: a client
// that sends but never reads is cut), every other read and write at most
// timeout. Both connections are closed when it returns.
func Tunnel(client net.Conn, fromClient io.Reader, up net.Conn, fromUp io.Reader, timeout, sendTimeout time.Duration) {
	t := &tunnel{client: client, up: up, timeout: timeout, start: tunnelNow()}
	var wg sync.WaitGroup
	wg.Go(func() { t.copy(up, client, fromClient, timeout) })
	t.copy(client, up, fromUp, sendTimeout)
	wg.Wait()
	client.Close()
	up.Close()
}

// tunnelNow is the clock a tunnel's quiet time is measured by; a test
// steps it.
var tunnelNow = time.Now

type tunnel struct {
	client, up net.Conn
	timeout    time.Duration
	start      time.Time    // with its monotonic reading: a wall-clock step neither cuts a busy tunnel nor keeps an idle one
	last       atomic.Int64 // the last bytes either way, in ns since start
	once       sync.Once
	dead       atomic.Bool
}

var tunnelBufPool = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

// copy carries src, read from srcConn, to dst, each write waiting at most
// wait. A read that waited the
// timeout is made again while the other direction carried bytes meanwhile.
// At src's end dst is half-closed, so that the other direction can
// finish; at an error both are closed.
func (t *tunnel) copy(dst, srcConn net.Conn, src io.Reader, wait time.Duration) {
	bp := tunnelBufPool.Get().(*[]byte)
	defer tunnelBufPool.Put(bp)
	for {
		_ = srcConn.SetReadDeadline(time.Now().Add(t.timeout))
		n, err := src.Read(*bp)
		if n > 0 {
			t.last.Store(int64(t.since()))
			_ = dst.SetWriteDeadline(time.Now().Add(wait))
			if _, werr := dst.Write((*bp)[:n]); werr != nil {
				t.abort()
				return
			}
		}
		var te interface{ Timeout() bool }
		switch {
		case err == nil:
		case errors.As(err, &te) && te.Timeout() && !t.dead.Load() && t.since()-time.Duration(t.last.Load()) < t.timeout:
			// This side was quiet, the other was not: the tunnel lives.
		case err == io.EOF:
			if cw, ok := dst.(interface{ CloseWrite() error }); ok && cw.CloseWrite() == nil {
				return
			}
			t.abort()
			return
		default:
			t.abort()
			return
		}
	}
}

// since is the time since the tunnel began, by the monotonic clock.
func (t *tunnel) since() time.Duration { return tunnelNow().Sub(t.start) }

// abort closes both connections: the other direction's copy ends too.
func (t *tunnel) abort() {
	t.once.Do(func() {
		t.dead.Store(true)
		t.client.Close()
		t.up.Close()
	})
}
