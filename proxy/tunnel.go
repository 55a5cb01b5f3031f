package proxy

import (
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/preforkd/preforkd/internal/upconn"
)

// tunnel takes over the client connection once the upstream's 101 is sent
// (fasthttp writes it after the handler returns) and carries bytes both
// ways until either side closes, or until neither has sent anything for
// UpstreamTimeout (nginx closes an idle upgraded connection after
// proxy_read_timeout the same way).
func (s *Server) tunnel(r *request, uc *upconn.Conn) {
	c := r.c
	r.ctx.Hijack(func(client net.Conn) {
		t := &tunnelState{s: s, c: c, uc: uc}
		t.last.Store(time.Now().UnixNano())
		var wg sync.WaitGroup
		wg.Go(func() { t.copy(uc, client, c.Conn, uc.Conn) })
		t.copy(client, uc.Buf, nil, c.Conn)
		wg.Wait()
		uc.Conn.Close()
		c.Close()
	})
}

// tunnelState is one upgraded connection.
type tunnelState struct {
	s    *Server
	c    *conn
	uc   *upconn.Conn
	last atomic.Int64 // unix nanoseconds of the last bytes either way
	once sync.Once
	dead atomic.Bool
}

var tunnelBufPool = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

// copy carries src to dst. deadline, when set, is moved before every read
// (the upstream side moves its own). At src's end dst is half-closed, so
// that the other direction can finish; at an error both are closed.
func (t *tunnelState) copy(dst io.Writer, src io.Reader, deadline net.Conn, dstConn net.Conn) {
	bp := tunnelBufPool.Get().(*[]byte)
	defer tunnelBufPool.Put(bp)
	timeout := t.s.opts.Client.Timeout
	for {
		if deadline != nil {
			_ = deadline.SetReadDeadline(time.Now().Add(timeout))
		}
		n, err := src.Read(*bp)
		if n > 0 {
			t.last.Store(time.Now().UnixNano())
			if _, werr := dst.Write((*bp)[:n]); werr != nil {
				t.abort()
				return
			}
		}
		switch {
		case err == nil:
		case isTimeout(err) && !t.dead.Load() && time.Since(time.Unix(0, t.last.Load())) < timeout:
			// This side was quiet, the other was not: the tunnel lives.
		case err == io.EOF:
			if cw, ok := dstConn.(interface{ CloseWrite() error }); ok && cw.CloseWrite() == nil {
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

// abort closes both connections: the other direction's copy ends too.
func (t *tunnelState) abort() {
	t.once.Do(func() {
		t.dead.Store(true)
		t.c.Conn.Close()
		t.uc.Conn.Close()
	})
}
