package proxy

import (
	"net"
	"sync"

	"github.com/preforkd/preforkd/engine"
	"github.com/preforkd/preforkd/internal/upconn"
)

// tunnel takes over the client connection once the upstream's 101 is sent
// (fasthttp writes it after the handler returns) and carries it
// (engine.Tunnel). The client's bytes are read through fasthttp's hijacked
// connection, which holds what it read past the request; deadlines, writes
// and closing go to the conn itself, whose Close does the bookkeeping
// (fasthttp's own Close of a hijacked connection does nothing).
func (s *Server) tunnel(r *request, uc *upconn.Conn) {
	c := r.c
	r.ctx.Hijack(func(client net.Conn) {
		engine.Tunnel(c, client, uc.Conn, uc.Buf, s.opts.Client.Timeout)
	})
}

var tunnelBufPool = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}
